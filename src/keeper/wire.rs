//! What a keeper and its server say to each other: JSON messages over a
//! `SOCK_SEQPACKET` socket pair (one message per read), the `/dev/fuse` descriptor
//! passed beside `Take` (`SCM_RIGHTS`).
//!
//! ```text
//! server                                   keeper
//!   Hello { wire, digest, secrets } ──►      (mounts, if not mounted yet)
//!                                   ◄──    Secrets { held } (if the server takes
//!                                          them and the keeper holds any; then:)
//!                                   ◄──    Take { init, reply, report, numbering,
//!                                                 secrets }
//!                                          + descriptor (+ the last numbering table)
//!                                          or Grow { names } (then Hello again)
//!                                          or Refuse { why }
//!                                   ◄──    Report { report } (later, any time)
//!   Serving { reply }               ──►      (after a death or a reload: resend)
//!   Ready                           ──►      (the first: `pkgfs mount` returns)
//!   Changed { digest, next_ino }    ──►      + the numbering table (a memfd), before
//!                                            the kernel sees a new generation
//!   Grew { dir, name }              ──►      (a store's lookup, replayed by the next)
//!   Secret { held }                 ──►      (a pull secret the store's CRI proxy
//!                                            kept, for the next server; only to a
//!                                            keeper whose `Take` said it holds them)
//!   Panicked { message }            ──►      (kept as the cause if it dies)
//! ```
//!
//! [`WIRE`] names this format: a server that does not speak the keeper's refuses to
//! take over (`pkgfs reload` then reports it and the old server keeps serving). Fields
//! added since are optional (`serde(default)`), and a message added since is sent only
//! to a side that said it takes it, so a keeper and a server of adjacent releases
//! still hand over.

use std::io::IoSlice;
use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use serde::{Deserialize, Serialize};

/// The version of this protocol and of the state it hands over.
pub const WIRE: u32 = 1;

/// The environment variable that gives a server its end of the keeper's socket.
pub const SERVER_FD_ENV: &str = "PKGFS_KEEPER_FD";

/// From a server to its keeper.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum ToKeeper {
    /// The sources are loaded: give me the connection.
    Hello {
        /// The protocol the server speaks ([`WIRE`]).
        wire: u32,
        /// What inode numbering depends on (`PkgFs::numbering_digest`).
        digest: String,
        /// The server takes pull secrets ([`ToServer::Secrets`]): a store's.
        #[serde(default)]
        secrets: bool,
    },
    /// A pull secret given to the server (a store's CRI proxy): the keeper holds it for
    /// the servers after this one.
    Secret {
        /// The secret.
        held: HeldSecret,
    },
    /// The session is up and reading requests; `reply` is its answer to INIT.
    Serving {
        /// The INIT answer (the first server's is kept to check later ones against).
        reply: Vec<u8>,
    },
    /// Everything is up (the status channel answers).
    Ready,
    /// A lookup is about to grow the tree (`pkgfs store`): the directory's path and the
    /// name, for a next server to grow the same names in the same order.
    Grew {
        /// The directory's path in the tree.
        dir: Vec<u8>,
        /// The name looked up.
        name: Vec<u8>,
    },
    /// After an activation: the inodes of older generations the kernel still holds (a
    /// file open in a removed package), with the archives they are read from beside this
    /// message, for a next server to serve them too. Replaces the last such list.
    Retired {
        /// One per inode.
        entries: Vec<RetiredEntry>,
    },
    /// The server panicked (it may die of it): the message, for `pkgfs status`.
    Panicked {
        /// The panic's message and place.
        message: String,
    },
    /// A new generation (an activation, a store's growth), before the kernel sees it:
    /// its numbering table travels beside this message (a memfd of little-endian u64,
    /// one per local node), for the next server to number the same tree the same way.
    Changed {
        /// The new generation's tree digest.
        digest: String,
        /// The next fresh inode number after it.
        next_ino: u64,
    },
}

/// From a keeper to its server.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum ToServer {
    /// The connection (its descriptor beside this message).
    Take {
        /// The kernel's INIT request, to replay.
        init: Vec<u8>,
        /// The answer the kernel already has, if one was sent: a later server checks
        /// its own equals it. `None`: the server is the first and sends its answer.
        reply: Option<Vec<u8>>,
        /// What `pkgfs status` shows of the keeper.
        report: KeeperReport,
        /// The tree changed under an earlier server: number it by the table beside
        /// this message (the second descriptor), and go on from this inode number.
        numbering: Option<u64>,
        /// Inodes of older generations to serve too; their archives' descriptors follow
        /// (after the table, if any), in the order `RetiredEntry::archive` counts.
        retired: Vec<RetiredEntry>,
        /// The keeper holds pull secrets: send it each one ([`ToKeeper::Secret`]).
        #[serde(default)]
        secrets: bool,
    },
    /// Pull secrets earlier servers were given, oldest first (before `Grow` or
    /// `Take`; several messages when they are many: [`secrets_messages`]).
    Secrets {
        /// The secrets.
        held: Vec<HeldSecret>,
    },
    /// Your tree is not the last one: grow these names in this order (what lookups grew
    /// under earlier servers), then say `Hello` again.
    Grow {
        /// (directory path, name), oldest first.
        names: Vec<(Vec<u8>, Vec<u8>)>,
    },
    /// What `pkgfs status` now shows of the keeper (after a restart's pause is known).
    Report {
        /// The keeper's state.
        report: KeeperReport,
    },
    /// Do not take over (and exit).
    Refuse {
        /// Why.
        why: String,
    },
}

/// A pull secret for one repository, as it crosses between a keeper and its server
/// (`crate::io::registry::keychain`); its `Debug` hides the secret.
#[derive(Clone, Serialize, Deserialize, PartialEq)]
pub struct HeldSecret {
    /// The registry host and the repository.
    pub of: (String, String),
    /// `Secret::parts`: the kind and two strings.
    pub secret: (String, String, String),
}

impl std::fmt::Debug for HeldSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HeldSecret({:?}, {}, <hidden>)", self.of, self.secret.0)
    }
}

impl HeldSecret {
    /// `secret` for `host`'s `repo`.
    pub fn of(host: &str, repo: &str, secret: &crate::io::registry::keychain::Secret) -> Self {
        let (kind, a, b) = secret.parts();
        HeldSecret {
            of: (host.to_string(), repo.to_string()),
            secret: (kind.to_string(), a, b),
        }
    }

    /// The secret, if its parts make one.
    pub fn secret(&self) -> Option<crate::io::registry::keychain::Secret> {
        let (kind, a, b) = &self.secret;
        crate::io::registry::keychain::Secret::from_parts(kind, a, b)
    }

    /// The bytes it takes in a message.
    pub fn size(&self) -> usize {
        serde_json::to_vec(self).map_or(usize::MAX, |v| v.len())
    }
}

/// Most repositories whose secret a keeper holds (as a server's keychain,
/// `crate::io::registry::keychain::MAX_HELD`); the one given longest ago goes first.
pub const SECRETS_HELD: usize = crate::io::registry::keychain::MAX_HELD;

/// Keep `secret` in `held` (oldest first): it replaces the one for the same repository,
/// and past [`SECRETS_HELD`] the oldest goes.
pub fn hold(held: &mut Vec<HeldSecret>, secret: HeldSecret) {
    held.retain(|h| h.of != secret.of);
    if held.len() >= SECRETS_HELD {
        held.remove(0);
    }
    held.push(secret);
}

/// Most bytes of secrets in one message: a message is read into 64 KiB ([`recv`]).
pub const SECRETS_PER_MESSAGE: usize = 32 * 1024;

/// `held` as [`ToServer::Secrets`] messages of at most [`SECRETS_PER_MESSAGE`] bytes of
/// secrets each, in order; a secret larger than that alone is left out (and logged,
/// without its bytes).
pub fn secrets_messages(held: Vec<HeldSecret>) -> Vec<ToServer> {
    let mut out = Vec::new();
    let (mut batch, mut bytes) = (Vec::new(), 0);
    for h in held {
        let n = h.size();
        if n > SECRETS_PER_MESSAGE {
            log::warn!(
                "a pull secret for {}/{} is {n} bytes: too large to hand over",
                h.of.0,
                h.of.1
            );
            continue;
        }
        if bytes + n > SECRETS_PER_MESSAGE {
            out.push(ToServer::Secrets {
                held: std::mem::take(&mut batch),
            });
            bytes = 0;
        }
        bytes += n;
        batch.push(h);
    }
    if !batch.is_empty() {
        out.push(ToServer::Secrets { held: batch });
    }
    out
}

/// [`RetiredEntry::archive`] of an inode not in a local archive.
pub const NO_ARCHIVE: u32 = u32::MAX;

/// An inode of an older generation the kernel holds: where a next server finds it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RetiredEntry {
    /// The inode.
    pub ino: u64,
    /// Which of the archives passed beside the message holds it ([`NO_ARCHIVE`]: none,
    /// it is in `object`).
    pub archive: u32,
    /// The version of the store's object that holds it (an S3 or HTTP source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<crate::io::remote::ObjectVersion>,
    /// The archive's file name (its extensions say its format).
    pub name: String,
    /// Its path in that archive's own tree (merged alone, the mount's strip applied), or
    /// for a package with a directory of its own (a graft), in that directory, or for
    /// one a layout folded in at a place (npm's `node_modules/NAME`), in that place.
    pub path: Vec<u8>,
    /// It lies in a package's own directory (`--layout each`, `cargo`).
    pub in_graft: bool,
}

/// How many restarts' pauses the report keeps.
pub const PAUSES_KEPT: usize = 16;

/// The keeper as `pkgfs status` shows it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct KeeperReport {
    /// The keeper's process.
    pub keeper_pid: u32,
    /// Servers started after the first (deaths and reloads).
    pub restarts: u32,
    /// Of those, reloads asked for.
    pub reloads: u32,
    /// Why the last server before this one ended (signal, exit status, reload).
    pub last_cause: Option<String>,
    /// How long readers waited for this server: from the last death (or reload) to
    /// serving, in milliseconds.
    pub last_pause_ms: Option<u64>,
    /// The pauses of the last restarts (at most [`PAUSES_KEPT`]), oldest first.
    pub pauses_ms: Vec<u64>,
    /// Restarts allowed within the window before the keeper gives up.
    pub restart_limit: String,
}

/// Why a message could not be sent or read.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The socket failed.
    #[error("keeper socket: {0}")]
    Io(#[from] std::io::Error),
    /// The other side closed it.
    #[error("the other side closed the keeper socket")]
    Closed,
    /// Not a message of this protocol.
    #[error("unreadable keeper message: {0}")]
    Garbled(String),
}

/// Send `msg`, with `fds` beside it.
pub fn send<T: Serialize>(
    sock: BorrowedFd<'_>,
    msg: &T,
    fds: &[BorrowedFd<'_>],
) -> Result<(), WireError> {
    let bytes = serde_json::to_vec(msg).map_err(|e| WireError::Garbled(e.to_string()))?;
    let iov = [IoSlice::new(&bytes)];
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage] = if raw.is_empty() { &[] } else { &cmsg };
    sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None)
        .map_err(|e| WireError::Io(e.into()))?;
    Ok(())
}

/// Receive one message, and the descriptors beside it (blocks).
pub fn recv<T: for<'de> Deserialize<'de>>(
    sock: BorrowedFd<'_>,
) -> Result<(T, Vec<OwnedFd>), WireError> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut space = nix::cmsg_space!([RawFd; 4]);
    let (n, fds) = loop {
        let mut iov = [IoSliceMut::new(&mut buf)];
        match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(m) => {
                let mut fds = Vec::new();
                if let Ok(cmsgs) = m.cmsgs() {
                    for c in cmsgs {
                        if let ControlMessageOwned::ScmRights(raw) = c {
                            // SAFETY: the kernel just installed these descriptors in our
                            // table for us.
                            fds.extend(raw.into_iter().map(|r| unsafe { OwnedFd::from_raw_fd(r) }));
                        }
                    }
                }
                break (m.bytes, fds);
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(WireError::Io(e.into())),
        }
    };
    if n == 0 {
        return Err(WireError::Closed);
    }
    let msg = serde_json::from_slice(&buf[..n]).map_err(|e| WireError::Garbled(e.to_string()))?;
    Ok((msg, fds))
}

/// A numbering table in a memfd (little-endian u64s), to pass beside a message.
pub fn table_memfd(table: &[u64]) -> std::io::Result<OwnedFd> {
    use std::io::Write;
    // SAFETY: a valid C string; memfd_create returns a new descriptor or -1.
    let fd = unsafe { libc::memfd_create(c"pkgfs-numbering".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor we own.
    let mut f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let bytes: Vec<u8> = table.iter().flat_map(|n| n.to_le_bytes()).collect();
    f.write_all(&bytes)?;
    Ok(f.into())
}

/// The numbering table in a memfd [`table_memfd`] wrote (read from its start, whatever
/// the shared file offset).
pub fn read_table(fd: &OwnedFd) -> std::io::Result<Vec<u64>> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::from(fd.try_clone()?);
    let len = f.metadata()?.len() as usize;
    let mut bytes = vec![0u8; len];
    f.read_exact_at(&mut bytes, 0)?;
    Ok(bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect())
}

/// The user id of the process at the other end of `s` (status and the keeper's reload
/// channel answer only it and root).
pub fn peer_uid(s: &std::os::unix::net::UnixStream) -> Option<u32> {
    peer(s).map(|c| c.uid)
}

/// The process at the other end of `s` (for a connection to a listening socket: the
/// one that listens), as the kernel noted it (`SO_PEERCRED`).
pub fn peer(s: &std::os::unix::net::UnixStream) -> Option<libc::ucred> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt into a correctly sized local struct.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast::<libc::c_void>(),
            &mut len,
        )
    };
    (r == 0).then_some(cred)
}

/// A connected pair for a keeper and one server, close-on-exec (the server's end is
/// made inheritable only in the child).
pub fn pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    crate::transport::session::seqpacket_pair()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsFd;

    #[test]
    fn messages_and_a_descriptor_cross_the_pair() {
        let (a, b) = pair().unwrap();
        let hello = ToKeeper::Hello {
            wire: WIRE,
            digest: "abc".into(),
            secrets: true,
        };
        send(a.as_fd(), &hello, &[]).unwrap();
        let (got, fds): (ToKeeper, _) = recv(b.as_fd()).unwrap();
        assert_eq!(got, hello);
        assert!(fds.is_empty());

        let mut f = tempfile::tempfile().unwrap();
        f.write_all(b"through the socket").unwrap();
        let take = ToServer::Take {
            init: vec![1, 2, 3],
            reply: None,
            report: KeeperReport::default(),
            numbering: Some(7),
            retired: Vec::new(),
            secrets: true,
        };
        let table = table_memfd(&[1, 5, 1 << 40]).unwrap();
        send(b.as_fd(), &take, &[f.as_fd(), table.as_fd()]).unwrap();
        let (got, mut fds): (ToServer, _) = recv(a.as_fd()).unwrap();
        assert_eq!(got, take);
        assert_eq!(fds.len(), 2);
        assert_eq!(read_table(&fds[1]).unwrap(), vec![1, 5, 1 << 40]);
        let mut g = std::fs::File::from(fds.remove(0));
        g.rewind().unwrap();
        let mut s = String::new();
        g.read_to_string(&mut s).unwrap();
        assert_eq!(s, "through the socket");

        drop(b);
        assert!(matches!(
            recv::<ToServer>(a.as_fd()),
            Err(WireError::Closed)
        ));
    }

    #[test]
    fn a_retired_object_crosses_and_an_entry_of_the_previous_format_still_reads() {
        let entry = RetiredEntry {
            ino: 9,
            archive: NO_ARCHIVE,
            object: Some(crate::io::remote::ObjectVersion {
                url: "s3://b/k/a.zip".into(),
                etag: Some("\"e1\"".into()),
                size: 42,
                modified: (1_700_000_000, 5),
            }),
            name: "a.zip".into(),
            path: b"lib/x".to_vec(),
            in_graft: false,
        };
        let text = serde_json::to_string(&entry).unwrap();
        assert_eq!(serde_json::from_str::<RetiredEntry>(&text).unwrap(), entry);
        // Written by a server of the release before objects were handed over.
        let old = r#"{"ino":3,"archive":0,"name":"a.zip","path":[120],"in_graft":true}"#;
        let got: RetiredEntry = serde_json::from_str(old).unwrap();
        assert_eq!((got.ino, got.archive, got.object), (3, 0, None));
    }

    fn held(i: usize, token_len: usize) -> HeldSecret {
        HeldSecret::of(
            "r.example:5000",
            &format!("team/app{i}"),
            &crate::io::registry::keychain::Secret::Bearer("t".repeat(token_len)),
        )
    }

    #[test]
    fn messages_of_the_release_before_secrets_read_as_taking_and_holding_none() {
        let hello: ToKeeper =
            serde_json::from_str(r#"{"Hello":{"wire":1,"digest":"abc"}}"#).unwrap();
        assert_eq!(
            hello,
            ToKeeper::Hello {
                wire: 1,
                digest: "abc".into(),
                secrets: false
            }
        );
        let take: ToServer = serde_json::from_str(
            r#"{"Take":{"init":[1],"reply":null,"report":{"keeper_pid":1,"restarts":0,
            "reloads":0,"last_cause":null,"last_pause_ms":null,"pauses_ms":[],
            "restart_limit":""},"numbering":null,"retired":[]}}"#,
        )
        .unwrap();
        assert!(matches!(take, ToServer::Take { secrets: false, .. }));
    }

    #[test]
    fn many_secrets_cross_in_order_in_messages_that_fit_and_one_too_large_is_left_out() {
        let (a, b) = pair().unwrap();
        let mut all: Vec<HeldSecret> = (0..3000).map(|i| held(i, 40)).collect();
        all.insert(1500, held(99_999, 40_000));
        let msgs = secrets_messages(all.clone());
        assert!(msgs.len() > 3, "{} messages", msgs.len());
        let mut got = Vec::new();
        for m in &msgs {
            send(a.as_fd(), m, &[]).unwrap();
            match recv::<ToServer>(b.as_fd()).unwrap().0 {
                ToServer::Secrets { held } => got.extend(held),
                other => panic!("{other:?}"),
            }
        }
        all.remove(1500);
        assert_eq!(got, all);
        assert_eq!(
            got[7].secret(),
            Some(crate::io::registry::keychain::Secret::Bearer(
                "t".repeat(40)
            ))
        );
    }

    #[test]
    fn a_keeper_holds_the_newest_secret_per_repository_and_a_bounded_number() {
        let mut kept = Vec::new();
        for i in 0..SECRETS_HELD {
            hold(&mut kept, held(i, 4));
        }
        // A newer secret for a repository replaces its older one, and goes last.
        hold(&mut kept, held(3, 9));
        assert_eq!(kept.len(), SECRETS_HELD);
        assert_eq!(kept.last().unwrap(), &held(3, 9));
        assert!(!kept.contains(&held(3, 4)));
        // One more repository: the oldest goes.
        hold(&mut kept, held(SECRETS_HELD, 4));
        assert_eq!(kept.len(), SECRETS_HELD);
        assert_eq!(kept[0], held(1, 4));
    }

    #[test]
    fn a_held_secret_does_not_show_in_debug_output() {
        let h = HeldSecret::of(
            "h",
            "r",
            &crate::io::registry::keychain::Secret::Basic(
                crate::io::registry::auth::Credentials::new("u", "hunter2").unwrap(),
            ),
        );
        let shown = format!("{h:?} {:?}", ToKeeper::Secret { held: h.clone() });
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("basic"), "{shown}");
    }
}
