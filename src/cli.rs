//! Command-line arguments (clap) and their translation into plain configuration.
//!
//! Stage one is [`Cli`], exactly what the user typed; stage two is
//! [`crate::config::Command`], validated values in [`crate::config`] that the
//! rest of the program uses without knowing about clap (the ripgrep/fd split). The
//! mount(8) helper's command line and the `-o` options are [`crate::fstab`]'s.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::{
    Access, Command, DEFAULT_CACHE, DEFAULT_DISK_CACHE, DEFAULT_PREFETCH, DEFAULT_REMOTE_TIMEOUT,
    DEFAULT_SNAPSHOTTER_ADDRESS, DEFAULT_SNAPSHOTTER_ROOT, Merge, MountConfig, SnapshotterConfig,
    UsageError, default_threads, parse_duration, parse_duration_or_zero, parse_size,
};
use crate::io::registry::RegistryConfig;
use crate::io::remote::RemoteConfig;
use crate::layout::{Config as LayoutConfig, Kind as LayoutKind};
use crate::source::image::{ImageRef, Platform};
use crate::tree::Ownership;

/// pkgfs — serve package archives (ZIP, wheels, jars, tarballs…) and container images as one merged read-only tree.
#[derive(Debug, Parser)]
#[command(name = "pkgfs", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    /// Log level: error, warn, info, debug or trace (RUST_LOG overrides it).
    #[arg(long, global = true, value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// No progress bars, and only errors on the terminal (a log file still gets the
    /// daemon's usual level).
    #[arg(short, long, global = true)]
    pub quiet: bool,
    #[command(subcommand)]
    command: CliCommand,
}

#[derive(Debug, Subcommand)]
enum CliCommand {
    /// Mount archives and directories of archives, merged, at MOUNTPOINT.
    ///
    /// Each SOURCE is an archive file, a directory whose archives (found by content,
    /// not extension) are mounted, a container image: oci:DIR[:TAG] (an OCI image
    /// layout), oci-archive:FILE[:TAG], docker-archive:FILE[:NAME:TAG|:@N], its layers
    /// mounted in place with whiteouts honoured, or a remote store (s3://BUCKET/PREFIX/,
    /// http(s)://HOST/DIR/ listed from its index page, http(s)://HOST/FILE), read
    /// lazily. Later sources win when two provide the
    /// same path; inside a directory, archives are layered in byte order of their names.
    /// Returns once the mount answers; the daemon stays in the background unless
    /// --foreground.
    ///
    /// Directory sources are watched: packages added, removed or replaced there are
    /// activated in the mounted tree without a remount (see --no-watch). Installed as
    /// /sbin/mount.fuse.pkgfs, the binary is the mount(8) helper for type fuse.pkgfs.
    Mount(Box<MountArgs>),
    /// Serve an additional layer store for podman, buildah and CRI-O at MOUNTPOINT.
    ///
    /// With `additionallayerstores = ["MOUNTPOINT:ref"]` under [storage.options.overlay]
    /// in storage.conf (or `--storage-opt overlay.additionallayerstore=MOUNTPOINT:ref`),
    /// `podman pull` of an image from a registry takes each layer from here instead of
    /// downloading and unpacking it, and containers read it lazily: MOUNTPOINT/
    /// BASE64(REF)/DIGEST/ holds diff/ (the layer, overlay-native), info and blob, made
    /// when first looked up. Registries, credentials, TLS and caches as for `pkgfs mount
    /// docker://…`. Returns once the store answers; the daemon stays in the background
    /// unless --foreground.
    Store(Box<StoreArgs>),
    /// Unmount a pkgfs mount (lazily if it is busy).
    #[command(alias = "unmount")]
    Umount(UmountArgs),
    /// Replace the process serving a mount with the installed pkgfs, without a reader
    /// seeing an error (after an upgrade; or to try again after the keeper gave up).
    ///
    /// The mount's keeper starts the installed binary beside the running server; once
    /// the new one serves, the old one is stopped and the kernel sends it again what it
    /// had not answered. A new server that cannot take over (its sources changed, or
    /// another handover format) exits, the old one keeps serving, and this command says
    /// why and fails.
    Reload(ReloadArgs),
    /// List the merged tree (recursively from PATH) with the package of each entry.
    ///
    /// The last argument is taken as PATH when there are several and it does not exist
    /// on disk.
    Ls(LsArgs),
    /// Write one file of the merged tree to standard output.
    Cat(CatArgs),
    /// Verify every member (decompress, check CRC), report skipped archives and entries
    /// and path conflicts. Exits non-zero if anything is unreadable or was skipped.
    Check(CheckArgs),
    /// Show what a running mount serves and how it is doing: active packages (entries,
    /// conflicts won and lost), skipped archives, cache, bytes read and decompressed,
    /// request counts, errors, the host settings a FUSE round trip depends on. Given a `pkgfs snapshotter`'s socket: its snapshots, and
    /// per layer lazy or unpacked, and why.
    Status(StatusArgs),
    /// Write DIR (or convert a tar archive) as a pkgfs package: a seekable-zstd tar with
    /// an embedded index.
    ///
    /// `zstd -dc OUT | tar x` unpacks it with standard tools; `pkgfs mount` reads any file
    /// by decompressing only the frames that hold it. Output is reproducible: the same
    /// tree gives the same bytes. Symlinks are stored as links unless --follow-symlinks.
    /// A tar archive (plain, gzip or zstd: a source tarball, a container image layer) is
    /// converted entry by entry, in its order, without unpacking it to disk; entries
    /// with unsafe paths, devices and FIFOs are skipped with a warning. bzip2 and xz
    /// tarballs come through a pipe: `xz -dc src.tar.xz | pkgfs pack - -o OUT`.
    Pack(PackArgs),
    /// Seal a directory of archives: a signed list of them and a hash tree of each, which
    /// `pkgfs mount --verify` checks every byte against.
    ///
    /// Writes DIR/pkgfs.seal (the list: revision, block size, each archive's size, sha256,
    /// tree root and name), DIR/pkgfs.seal.sig (its SSHSIG signature, namespace pkgfs:
    /// `ssh-keygen -Y verify -n pkgfs` checks it too) and DIR/pkgfs.seal.d/ (the block
    /// hashes of each archive of more than one block). Upload all three beside the
    /// archives to seal a remote store.
    Seal(SealArgs),
    /// Serve containerd's snapshots API on a Unix socket, as a proxy plugin: containerd
    /// then pulls and imports images with `--snapshotter NAME` into snapshots kept here.
    ///
    /// containerd's config.toml names it in a table `[proxy_plugins.pkgfs]` with
    /// `type = "snapshot"` and `address = "SOCKET"` (docs/design/snapshotter.md).
    ///
    /// With --store, a layer whose pull names its image (CRI, `ctr-remote images rpull`)
    /// is bind-mounted from that `pkgfs store` and read lazily: containerd downloads
    /// none of it. Other layers are unpacked by containerd into ROOT/snapshots/ID/fs, as
    /// by its own overlayfs snapshotter; containers get overlay mounts either way. The
    /// records are in ROOT/metadata.redb; `pkgfs status SOCKET` says, per layer, lazy or
    /// unpacked and why. Runs in the foreground until SIGINT or SIGTERM (layers stay
    /// mounted: containers read on) and removes its socket on the way out; refuses to
    /// start if another server answers on the socket, replaces a stale one.
    Snapshotter(SnapshotterArgs),
    /// Print a shell completion script: `pkgfs completions bash > /etc/bash_completion.d/pkgfs`.
    Completions(CompletionsArgs),
    /// Write the man pages (pkgfs.1, pkgfs-mount.1…), made from these definitions, to DIR.
    #[command(hide = true)]
    Manpages(ManpagesArgs),
}

#[derive(Debug, Args)]
struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
struct SnapshotterArgs {
    /// Where the snapshots and their database live (made if missing).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_SNAPSHOTTER_ROOT)]
    root: PathBuf,
    /// The Unix socket to serve on (containerd's proxy_plugins address).
    #[arg(long, value_name = "SOCKET", default_value = DEFAULT_SNAPSHOTTER_ADDRESS)]
    address: PathBuf,
    /// Read layers lazily from the `pkgfs store` mounted at MOUNTPOINT (start it first:
    /// `pkgfs store MOUNTPOINT` with the registry options the images need). A layer
    /// whose pull names its image (CRI's labels, or those of `ctr-remote images rpull`)
    /// is bind-mounted from the store and containerd downloads nothing of it; any other
    /// layer is unpacked by containerd as usual. The log says which, and why.
    #[arg(long, value_name = "MOUNTPOINT")]
    store: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct ManpagesArgs {
    /// Where to write them.
    dir: PathBuf,
}

#[derive(Debug, Args)]
struct PackArgs {
    /// The directory to pack (its contents become the package's root), or a tar archive
    /// (plain, gzip or zstd) to convert; `-` reads the tar archive from standard input.
    #[arg(value_name = "DIR|TARBALL")]
    dir: PathBuf,
    /// The package file to write.
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    /// zstd compression level (1-22).
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(i32).range(1..=22))]
    level: i32,
    /// Compression threads (default: all CPUs).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Decompressed bytes per frame: the unit of random access (K, M suffixes).
    #[arg(long, value_name = "SIZE", default_value = "256K")]
    frame_size: String,
    /// Clamp modification times to at most this (seconds since the epoch), as
    /// SOURCE_DATE_EPOCH does for reproducible builds.
    #[arg(long, value_name = "SECONDS")]
    mtime: Option<i64>,
    /// Record this owner for every entry (UID:GID), e.g. 0:0.
    #[arg(long, value_name = "UID:GID")]
    owner: Option<String>,
    /// Store what symlinks point to instead of the links: `inside` follows only links
    /// that stay inside DIR (others are an error), `all` follows every link. By default
    /// no symlink is followed.
    #[arg(long, value_name = "WHICH", value_parser = ["inside", "all"])]
    follow_symlinks: Option<String>,
}

#[derive(Debug, Args)]
struct MountArgs {
    /// Archive files, directories of archives, images (oci:DIR[:TAG],
    /// docker://HOST/REPO[:TAG|@DIGEST]…) or remote stores (s3://BUCKET/PREFIX/,
    /// http(s)://HOST/DIR/, http(s)://HOST/FILE), lowest layer first.
    #[arg(required = true, num_args = 1.., value_name = "SOURCE")]
    sources: Vec<PathBuf>,
    /// Where to mount.
    #[arg(value_name = "MOUNTPOINT")]
    mountpoint: PathBuf,
    /// Directory read-ahead: after a file is first read, push the files that follow it
    /// in its directory into the kernel's page cache, in windows growing up to SIZE
    /// while a reader walks the directory (0: off).
    #[arg(long, value_name = "SIZE", default_value = DEFAULT_PREFETCH)]
    prefetch: String,
    /// Show every file as owned by this user id.
    #[arg(long, value_name = "UID")]
    uid: Option<u32>,
    /// Show every file as owned by this group id.
    #[arg(long, value_name = "GID")]
    gid: Option<u32>,
    /// Let other users access the mount (needs user_allow_other in /etc/fuse.conf unless root).
    #[arg(long)]
    allow_other: bool,
    /// Mount a fixed set of packages: do not watch source directories for packages
    /// being added, removed or replaced.
    #[arg(long)]
    no_watch: bool,
    /// OCI image layers: a `.wh.NAME` entry hides NAME of the layers below, a
    /// `.wh..wh..opq` entry everything they put in its directory (whiteouts are not shown).
    /// Always on when a source is an image.
    #[arg(long)]
    whiteouts: bool,
    /// Remote sources: list them again every DURATION (e.g. 60s, 5m) and activate
    /// objects added, removed or replaced, as in a watched directory (default: the
    /// listing at mount is kept).
    #[arg(long, value_name = "DURATION")]
    poll: Option<String>,
    #[command(flatten)]
    verify: VerifyArgs,
    #[command(flatten)]
    layout: LayoutArgs,
    #[command(flatten)]
    serve: ServeArgs,
}

/// `--verify` and its companions: `mount` and the offline tools take the same.
#[derive(Debug, Args)]
struct VerifyArgs {
    /// Mount only what a seal signed by one of these keys lists, every byte checked
    /// against it before use (an allowed-signers file, as `ssh-keygen -Y verify` reads):
    /// each source a directory or remote store sealed by `pkgfs seal`, or an image
    /// pinned by digest.
    #[arg(long, value_name = "ALLOWED_SIGNERS")]
    verify: Option<PathBuf>,
    /// With --verify: take a seal older than the newest this machine accepted for the
    /// source (a rollback, refused otherwise).
    #[arg(long, requires = "verify")]
    allow_rollback: bool,
    /// With --verify: the seal of a local source is this file (with FILE.sig and
    /// FILE.d/ beside it) instead of SOURCE/pkgfs.seal.
    #[arg(long, value_name = "FILE", requires = "verify")]
    seal_file: Option<PathBuf>,
}

impl VerifyArgs {
    fn into_config(self) -> Result<Option<crate::source::verify::VerifyConfig>, UsageError> {
        let Some(allowed) = self.verify else {
            return Ok(None);
        };
        let signers = crate::seal::sign::AllowedSigners::read(&allowed)
            .map_err(|e| format!("--verify: {e}"))?;
        Ok(Some(crate::source::verify::VerifyConfig {
            signers: std::sync::Arc::new(signers),
            state: crate::source::verify::VerifyConfig::default_state(),
            allow_rollback: self.allow_rollback,
            seal_file: self.seal_file,
        }))
    }
}

/// `pkgfs seal`.
#[derive(Debug, Args)]
struct SealArgs {
    /// The directory of archives to seal.
    #[arg(value_name = "DIR")]
    dir: PathBuf,
    /// The OpenSSH private key that signs (`ssh-keygen -t ed25519`; not encrypted).
    #[arg(long, value_name = "KEY")]
    key: PathBuf,
    /// The seal's revision (default: the time now in seconds, and above the seal
    /// already there).
    #[arg(long, value_name = "N")]
    revision: Option<u64>,
    /// Write the seal to FILE (FILE.sig and FILE.d/ beside it) instead of DIR/pkgfs.seal.
    #[arg(long, value_name = "FILE")]
    seal_file: Option<PathBuf>,
    /// Bytes per hashed block (K, M suffixes; a power of two from 4K to 16M; default 64K).
    #[arg(long, value_name = "SIZE")]
    block_size: Option<String>,
    /// Hashing threads (default: the number of CPUs).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
}

/// `pkgfs store`.
#[derive(Debug, Args)]
struct StoreArgs {
    /// Where to mount the store (the path storage.conf names).
    #[arg(value_name = "MOUNTPOINT")]
    mountpoint: PathBuf,
    /// Serve the CRI image service on this socket (kubelet's --image-service-endpoint)
    /// and pass every call on to containerd's, keeping the credentials of each pull
    /// (kubelet's image pull secrets) for the layers of that image's repository.
    #[arg(long, value_name = "SOCKET")]
    cri_image_proxy: Option<PathBuf>,
    /// containerd's socket, where --cri-image-proxy passes calls on.
    #[arg(long, value_name = "SOCKET", default_value = crate::config::CONTAINERD_SOCKET, requires = "cri_image_proxy")]
    cri_upstream: PathBuf,
    #[command(flatten)]
    serve: ServeArgs,
}

/// What `pkgfs mount` and `pkgfs store` share: the daemon, its caches, its remote
/// sources.
#[derive(Debug, Args)]
struct ServeArgs {
    /// Stay in the foreground; unmount on SIGINT/SIGTERM/SIGHUP.
    #[arg(short, long)]
    foreground: bool,
    /// No keeper: the process that serves the mount holds its connection, and the mount
    /// dies with it (ENOTCONN). By default a small keeper holds it and starts
    /// a new server when one dies; FUSE over io_uring is only used without a keeper.
    #[arg(long)]
    no_keeper: bool,
    /// How many servers the keeper starts within a window before it gives up and every
    /// request fails with EIO (until `pkgfs reload`): COUNT/DURATION.
    #[arg(long, value_name = "COUNT/DURATION", default_value = "3/60s")]
    restart_limit: String,
    /// Byte budget of the decompressed-block cache (K, M, G suffixes).
    #[arg(long, value_name = "SIZE", default_value = DEFAULT_CACHE)]
    cache_size: String,
    /// Threads serving FUSE requests (default: the number of CPUs, at least 4).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Mount options, comma separated: allow_other, allow_root, noexec, exec, noatime,
    /// suid, dev (both off by default), fsname=NAME, uid=N, gid=N, cache_size=SIZE, prefetch=SIZE, threads=N, log_file=PATH, no_watch,
    /// index_cache=DIR, no_index_cache, no_kept_tree, whiteouts, no_io_uring, full_entries, no_keeper,
    /// restart_limit=COUNT/DURATION, disk_cache=DIR,
    /// disk_cache_size=SIZE, no_disk_cache, remote_timeout=DURATION, poll=DURATION,
    /// layout=KIND, strip_components=N, lockfile=FILE, allow_missing, python=PATH, no_compile, authfile=FILE,
    /// cert_dir=DIR, tls_verify=BOOL, no_background_fetch, start_window=DURATION; options
    /// mount(8) passes (ro, defaults, nofail, _netdev, x-*) are accepted.
    #[arg(short = 'o', value_name = "OPTIONS")]
    options: Vec<String>,
    /// Where the background daemon writes its log (default: discarded once mounted).
    #[arg(long, value_name = "PATH")]
    log_file: Option<PathBuf>,
    /// Where to keep indexes that cost a pass over an archive (tarballs, layers, seekable
    /// tar.zst archives without a pkgfs index) (default: $XDG_CACHE_HOME/pkgfs/index or
    /// ~/.cache/pkgfs/index).
    #[arg(long, value_name = "DIR", conflicts_with = "no_index_cache")]
    index_cache: Option<PathBuf>,
    /// Do not cache indexes (index such archives again at every mount).
    #[arg(long)]
    no_index_cache: bool,
    /// Do not keep the merged tree for the next mount (by default a mount whose packages,
    /// options and binary are unchanged since an earlier one loads the tree that mount
    /// kept in the index cache, and reads each package's index on first use).
    #[arg(long)]
    no_kept_tree: bool,
    /// The platform to take from a multi-platform image, OS/ARCH[/VARIANT] (default:
    /// this machine's).
    #[arg(long, value_name = "PLATFORM")]
    platform: Option<String>,
    /// Take requests through FUSE over io_uring when the kernel offers it (Linux 6.14+
    /// with the fuse module parameter enable_uring=1; otherwise /dev/fuse is used), or
    /// never (off).
    #[arg(long, value_name = "WHEN", default_value = "auto", value_parser = ["auto", "off"])]
    io_uring: String,
    /// Hand out every entry of a directory listing with its attributes. By default a
    /// listing hands out files and symlinks without them (the kernel lists them without
    /// creating an inode each: a cold `find` is faster) until a lookup shows someone
    /// wants their attributes, and then with them for a while.
    #[arg(long)]
    full_entries: bool,
    /// Remote sources: where to keep the ranges fetched, shared by mounts and kept
    /// across them (default: $XDG_CACHE_HOME/pkgfs/remote or ~/.cache/pkgfs/remote).
    #[arg(long, value_name = "DIR", conflicts_with = "no_disk_cache")]
    disk_cache: Option<PathBuf>,
    /// Byte budget of the disk cache (K, M, G suffixes); the least recently used
    /// ranges go first.
    #[arg(long, value_name = "SIZE", default_value = DEFAULT_DISK_CACHE)]
    disk_cache_size: String,
    /// Remote sources: keep fetched ranges in memory only.
    #[arg(long)]
    no_disk_cache: bool,
    /// Remote sources: the longest a read waits for the server, retries included,
    /// before it fails with EIO (a duration: 30, 30s, 500ms, 2m).
    #[arg(long, value_name = "DURATION", default_value = DEFAULT_REMOTE_TIMEOUT)]
    remote_timeout: String,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[derive(Debug, Args)]
struct StatusArgs {
    /// The mountpoint, or the socket of a `pkgfs snapshotter` (then: each snapshot, and
    /// for each layer whether it is read lazily, from which image, or was unpacked by
    /// containerd, and why).
    #[arg(value_name = "MOUNTPOINT|SOCKET")]
    mountpoint: PathBuf,
    /// Print JSON (one object, every package) instead of text.
    #[arg(long, conflicts_with = "packages")]
    json: bool,
    /// List every package and skipped archive (without it, text lists at most 20 of each:
    /// all of them, or those with the most path conflicts).
    #[arg(long)]
    packages: bool,
}

#[derive(Debug, Args)]
struct ReloadArgs {
    /// The mountpoint.
    mountpoint: PathBuf,
}

#[derive(Debug, Args)]
struct UmountArgs {
    /// The mountpoint.
    mountpoint: PathBuf,
    /// Detach at once even if busy (otherwise only as a fallback).
    #[arg(short = 'l', long)]
    lazy: bool,
}

/// How the offline tools merge layers, as the matching `mount` options do.
#[derive(Debug, Args)]
struct MergeArgs {
    /// Treat `.wh.` entries as OCI whiteouts, as `mount --whiteouts` does (always on for
    /// images).
    #[arg(long)]
    whiteouts: bool,
    /// The platform to take from a multi-platform image, as `mount --platform`.
    #[arg(long, value_name = "PLATFORM")]
    platform: Option<String>,
    #[command(flatten)]
    layout: LayoutArgs,
    #[command(flatten)]
    registry: RegistryArgs,
    #[command(flatten)]
    verify: VerifyArgs,
}

impl MergeArgs {
    fn into_merge(self) -> Result<Merge, UsageError> {
        Ok(Merge {
            whiteouts: self.whiteouts,
            platform: platform(self.platform)?,
            layout: self.layout.into_config()?,
            registry: self.registry.into_config()?,
            verify: self.verify.into_config()?,
        })
    }
}

/// Where each package goes: `mount` and the offline tools take the same options.
#[derive(Debug, Args)]
struct LayoutArgs {
    /// Where each package goes: merge (every archive folded into one tree, the later
    /// package winning), each (every archive in a directory named after its file, less
    /// its extension), npm (npm tarballs as a node_modules directory, from their
    /// package.json, or as npm ci lays out --lockfile), cargo (.crate files as cargo's
    /// registry/src/INDEX/, with .cargo-ok), python (wheels as the virtual environment
    /// python -m venv and pip install make, at the mountpoint; needs --python). each and
    /// cargo index a package when its directory is first looked into.
    #[arg(long, value_name = "KIND", default_value = LayoutKind::default().name(),
          value_parser = clap::builder::PossibleValuesParser::new(LayoutKind::ALL.map(LayoutKind::name)))]
    layout: String,
    /// merge and each: drop the first N components of every path inside an archive, as
    /// tar's --strip-components does (shorter paths are left out).
    #[arg(long, value_name = "N", default_value_t = 0)]
    strip_components: usize,
    /// npm: the package-lock.json (lockfile versions 2 and 3) whose node_modules the
    /// mount is: nested as npm ci nests it, each tarball checked against its integrity.
    /// python: a pylock.toml (PEP 751) or a requirements.txt with --hash=sha256: lines:
    /// only its wheels are installed, each checked against its hashes.
    #[arg(long, value_name = "FILE")]
    lockfile: Option<PathBuf>,
    /// npm and python with --lockfile: mount even if packages it names are in no source
    /// (they are left out, with a warning naming them); without it such a mount fails.
    #[arg(long)]
    allow_missing: bool,
    /// python: the base interpreter the environment is for (/usr/bin/python3.11): its
    /// venv module makes the environment's own files, and scripts run with it.
    #[arg(long, value_name = "PATH")]
    python: Option<PathBuf>,
    /// python: serve no __pycache__ (as pip install --no-compile). By default each
    /// wheel's modules are compiled once per interpreter, in the background after the
    /// mount, into the index cache (INDEX_CACHE/python/), and served from there.
    #[arg(long)]
    no_compile: bool,
}

impl LayoutArgs {
    fn into_config(self) -> Result<LayoutConfig, UsageError> {
        let kind = LayoutKind::parse(&self.layout)
            .ok_or_else(|| UsageError(format!("unknown layout {:?}", self.layout)))?;
        check_layout(LayoutConfig {
            kind,
            strip: self.strip_components,
            lockfile: self.lockfile,
            allow_missing: self.allow_missing,
            python: self.python,
            venv: None,
            no_compile: self.no_compile,
            bytecode: None,
            index_cache: None,
        })
    }
}

/// How registries (`docker://` sources) are reached: skopeo's and podman's flags.
#[derive(Debug, Args)]
struct RegistryArgs {
    /// docker:// sources: the user name and password for every registry (otherwise
    /// they come from --authfile, $REGISTRY_AUTH_FILE, the auth.json podman login
    /// writes, or ~/.docker/config.json).
    #[arg(long, value_name = "USER:PASSWORD")]
    creds: Option<String>,
    /// docker:// sources: the auth file to read credentials from (podman's auth.json
    /// or docker's config.json format).
    #[arg(long, value_name = "FILE")]
    authfile: Option<PathBuf>,
    /// docker:// sources: verify registries' certificates and require HTTPS (false:
    /// unverified TLS, and plain HTTP when HTTPS fails).
    #[arg(long, value_name = "BOOL", default_value = "true", num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set,
          value_parser = clap::builder::BoolishValueParser::new())]
    tls_verify: bool,
    /// docker:// sources: CA certificates (*.crt) and a client key pair (*.cert,
    /// *.key) for registries, instead of /etc/containers/certs.d/HOST:PORT/.
    #[arg(long, value_name = "DIR")]
    cert_dir: Option<PathBuf>,
    /// docker:// sources: fetch only what is read of layers read lazily (zstd:chunked,
    /// eStargz, SOCI); by default the rest of each is fetched in the background once
    /// the image is mounted.
    #[arg(long)]
    no_background_fetch: bool,
    /// docker:// sources: how long after a layer read lazily opens its reads are
    /// recorded, per image digest in the index cache, and fetched ahead of the reads at
    /// the image's next start, all at once (a duration; 0: never record or replay).
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    start_window: String,
}

impl RegistryArgs {
    fn into_config(self) -> Result<RegistryConfig, UsageError> {
        if let Some(c) = &self.creds
            && crate::io::registry::auth::Credentials::parse(c).is_none()
        {
            return Err(UsageError("--creds wants USER:PASSWORD".into()));
        }
        Ok(RegistryConfig {
            creds: self.creds,
            auth_file: self.authfile,
            tls_verify: self.tls_verify,
            cert_dir: self.cert_dir,
            background_fetch: !self.no_background_fetch,
            start_window: parse_duration_or_zero(&self.start_window)?,
        })
    }
}

/// The layout options that only some layouts take.
fn check_layout(cfg: LayoutConfig) -> Result<LayoutConfig, UsageError> {
    if cfg.strip > 0 && !matches!(cfg.kind, LayoutKind::Merge | LayoutKind::Each) {
        return Err(format!(
            "--strip-components is for --layout merge and each, not {}",
            cfg.kind.name()
        )
        .into());
    }
    if !matches!(cfg.kind, LayoutKind::Npm | LayoutKind::Python)
        && (cfg.lockfile.is_some() || cfg.allow_missing)
    {
        return Err("--lockfile and --allow-missing are for --layout npm and python".into());
    }
    if cfg.allow_missing && cfg.lockfile.is_none() {
        return Err("--allow-missing needs --lockfile".into());
    }
    if (cfg.kind == LayoutKind::Python) != cfg.python.is_some() {
        return Err("--layout python and --python go together".into());
    }
    if cfg.no_compile && cfg.kind != LayoutKind::Python {
        return Err("--no-compile is for --layout python".into());
    }
    Ok(cfg)
}

/// A python layout's environment is the mountpoint: its absolute path, as `python -m
/// venv` makes it absolute. Its bytecode packs are in the index cache (none without
/// one, or with `--no-compile`), and so are its wheels' digests.
fn venv_at(cfg: &mut MountConfig) -> Result<(), UsageError> {
    if cfg.merge.layout.kind == LayoutKind::Python {
        let at = std::path::absolute(&cfg.mountpoint)
            .map_err(|e| format!("{}: {e}", cfg.mountpoint.display()))?;
        cfg.merge.layout.venv = Some(at);
        cfg.merge.layout.bytecode = match (&cfg.index_cache, cfg.merge.layout.no_compile) {
            (Some(dir), false) => Some(dir.join("python")),
            _ => None,
        };
        cfg.merge.layout.index_cache = cfg.index_cache.clone();
    }
    Ok(())
}

fn platform(p: Option<String>) -> Result<Option<Platform>, UsageError> {
    p.map(|p| Platform::parse(&p).map_err(UsageError::from))
        .transpose()
}

#[derive(Debug, Args)]
struct LsArgs {
    /// Archive files, directories or images, then optionally a path inside the merged
    /// tree.
    #[arg(required = true, num_args = 1.., value_name = "SOURCE... [PATH]")]
    args: Vec<PathBuf>,
    #[command(flatten)]
    merge: MergeArgs,
}

#[derive(Debug, Args)]
struct CatArgs {
    /// Archive files, directories or images, then the path of the file inside the merged
    /// tree.
    #[arg(required = true, num_args = 2.., value_name = "SOURCE... PATH")]
    args: Vec<PathBuf>,
    #[command(flatten)]
    merge: MergeArgs,
}

#[derive(Debug, Args)]
struct CheckArgs {
    /// Archive files, directories or images.
    #[arg(required = true, num_args = 1.., value_name = "SOURCE")]
    sources: Vec<PathBuf>,
    #[command(flatten)]
    merge: MergeArgs,
}

/// Write the completion script of `shell` for pkgfs to `out`.
pub fn completions(shell: clap_complete::Shell, out: &mut dyn std::io::Write) {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    clap_complete::generate(shell, &mut cmd, "pkgfs", out);
}

/// Write the man pages of pkgfs and of each of its (visible) commands into `dir`:
/// `pkgfs.1`, `pkgfs-mount.1`… Made from the same definitions as `--help`.
pub fn manpages(dir: &std::path::Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let cmd = <Cli as clap::CommandFactory>::command().name("pkgfs");
    let mut written = Vec::new();
    let mut page = |c: clap::Command, name: String| -> std::io::Result<()> {
        let path = dir.join(format!("{name}.1"));
        let mut out = Vec::new();
        clap_mangen::Man::new(c.name(name.clone())).render(&mut out)?;
        std::fs::write(&path, out)?;
        written.push(path);
        Ok(())
    };
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        page(sub.clone(), format!("pkgfs-{}", sub.get_name()))?;
    }
    page(cmd, "pkgfs".into())?;
    Ok(written)
}

impl Cli {
    /// Validate the arguments into a [`Command`].
    pub fn into_command(self) -> Result<Command, UsageError> {
        Ok(match self.command {
            CliCommand::Mount(m) => Command::Mount(Box::new(mount_config(*m)?)),
            CliCommand::Store(s) => Command::Mount(Box::new(store_config(*s)?)),
            CliCommand::Seal(s) => Command::Seal(Box::new(seal_config(s)?)),
            CliCommand::Umount(u) => Command::Umount {
                mountpoint: u.mountpoint,
                lazy: u.lazy,
            },
            CliCommand::Reload(r) => Command::Reload {
                mountpoint: r.mountpoint,
            },
            CliCommand::Ls(l) => {
                let mut args = l.args;
                let path = if args.len() > 1
                    && args
                        .last()
                        .is_some_and(|p| !p.exists() && ImageRef::parse(p.as_os_str()).is_none())
                {
                    args.pop()
                        .map(|p| p.into_os_string().into_encoded_bytes())
                        .unwrap_or_default()
                } else {
                    Vec::new()
                };
                Command::Ls {
                    sources: args,
                    path,
                    merge: l.merge.into_merge()?,
                }
            }
            CliCommand::Cat(c) => {
                let mut args = c.args;
                let path = args
                    .pop()
                    .map(|p| p.into_os_string().into_encoded_bytes())
                    .ok_or("cat needs a path")?;
                Command::Cat {
                    sources: args,
                    path,
                    merge: c.merge.into_merge()?,
                }
            }
            CliCommand::Check(c) => Command::Check {
                sources: c.sources,
                merge: c.merge.into_merge()?,
            },
            CliCommand::Status(s) => Command::Status {
                mountpoint: s.mountpoint,
                style: match (s.json, s.packages) {
                    (true, _) => crate::status::Style::Json,
                    (false, true) => crate::status::Style::All,
                    (false, false) => crate::status::Style::Summary,
                },
            },
            CliCommand::Pack(p) => Command::Pack(pack_config(p)?),
            CliCommand::Snapshotter(s) => Command::Snapshotter(snapshotter_config(s)?),
            CliCommand::Completions(c) => Command::Completions(c.shell),
            CliCommand::Manpages(m) => Command::Manpages(m.dir),
        })
    }
}

/// `pkgfs snapshotter`: the socket's path must fit in a `sockaddr_un`.
fn snapshotter_config(s: SnapshotterArgs) -> Result<SnapshotterConfig, UsageError> {
    // sun_path holds 108 bytes, the terminating NUL included.
    if s.address.as_os_str().len() > 107 {
        return Err(format!(
            "--address {}: a Unix socket path is at most 107 bytes",
            s.address.display()
        )
        .into());
    }
    if s.address.as_os_str().is_empty() || s.root.as_os_str().is_empty() {
        return Err("--root and --address must not be empty".into());
    }
    if s.store.as_ref().is_some_and(|p| !p.is_absolute()) {
        return Err("--store must be an absolute path (it goes into mount options)".into());
    }
    Ok(SnapshotterConfig {
        root: s.root,
        address: s.address,
        store: s.store,
    })
}

fn pack_config(p: PackArgs) -> Result<crate::tools::pack::PackConfig, UsageError> {
    let frame_size = parse_size(&p.frame_size)?;
    if !(4096..=64 << 20).contains(&frame_size) {
        return Err("--frame-size must be between 4K and 64M".into());
    }
    let owner = match p.owner {
        None => None,
        Some(o) => {
            let (u, g) = o.split_once(':').ok_or("--owner takes UID:GID")?;
            let num = |x: &str| {
                x.parse::<u32>()
                    .map_err(|_| format!("--owner: bad id {x:?}"))
            };
            Some((num(u)?, num(g)?))
        }
    };
    Ok(crate::tools::pack::PackConfig {
        dir: p.dir,
        output: p.output,
        level: p.level,
        threads: p
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
            .max(1),
        frame_size: frame_size as usize,
        mtime_clamp: p.mtime,
        owner,
        follow: match p.follow_symlinks.as_deref() {
            Some("inside") => crate::tools::pack::Follow::Inside,
            Some(_) => crate::tools::pack::Follow::All,
            None => crate::tools::pack::Follow::Never,
        },
    })
}

fn mount_config(m: MountArgs) -> Result<MountConfig, UsageError> {
    let any_image = m
        .sources
        .iter()
        .any(|s| ImageRef::parse(s.as_os_str()).is_some());
    let fsname = format!(
        "pkgfs:{}",
        m.sources
            .first()
            .map_or_else(String::new, |p| p.display().to_string())
    );
    let mut cfg = serve_config(m.sources, m.mountpoint, fsname, &m.serve)?;
    cfg.merge.layout = m.layout.into_config()?;
    venv_at(&mut cfg)?;
    cfg.prefetch_bytes = parse_size(&m.prefetch)?;
    if let Some(uid) = m.uid {
        cfg.owner.uid = uid;
        cfg.owner.force_uid = true;
    }
    if let Some(gid) = m.gid {
        cfg.owner.gid = gid;
        cfg.owner.force_gid = true;
    }
    if m.allow_other {
        cfg.access = Access::All;
    }
    cfg.watch = !m.no_watch;
    // Always for images: their layers say what they remove so.
    cfg.merge.whiteouts = m.whiteouts || any_image;
    cfg.poll = m.poll.as_deref().map(parse_duration).transpose()?;
    cfg.merge.verify = m.verify.into_config()?;
    finish_config(cfg, m.serve)
}

/// `pkgfs seal`.
fn seal_config(s: SealArgs) -> Result<crate::tools::seal::SealConfig, UsageError> {
    let block = match &s.block_size {
        Some(b) => parse_size(b)?,
        None => crate::seal::DEFAULT_BLOCK,
    };
    if !block.is_power_of_two() || !(4096..=16 << 20).contains(&block) {
        return Err(format!("--block-size {block}: a power of two from 4K to 16M").into());
    }
    Ok(crate::tools::seal::SealConfig {
        dir: s.dir,
        key: s.key,
        revision: s.revision,
        seal_file: s.seal_file,
        block,
        threads: s
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get())),
    })
}

/// `pkgfs store`: a mount with no sources whose tree grows on lookup.
fn store_config(s: StoreArgs) -> Result<MountConfig, UsageError> {
    let mut cfg = serve_config(Vec::new(), s.mountpoint, "pkgfs:store".into(), &s.serve)?;
    cfg.store = true;
    cfg.cri_proxy = match s.cri_image_proxy {
        Some(listen) => Some(crate::config::CriProxyConfig {
            listen: std::path::absolute(&listen)
                .map_err(|e| format!("--cri-image-proxy {}: {e}", listen.display()))?,
            upstream: std::path::absolute(&s.cri_upstream)
                .map_err(|e| format!("--cri-upstream {}: {e}", s.cri_upstream.display()))?,
        }),
        None => None,
    };
    // Files are read once each by overlayfs on the way up: no directory read-ahead.
    cfg.prefetch_bytes = 0;
    let cfg = finish_config(cfg, s.serve)?;
    if cfg.merge.layout != LayoutConfig::default() || cfg.poll.is_some() || cfg.merge.whiteouts {
        return Err("pkgfs store takes no layout, poll or whiteouts options".into());
    }
    Ok(cfg)
}

/// The settings `mount` and `store` share, before `-o` options.
fn serve_config(
    sources: Vec<PathBuf>,
    mountpoint: PathBuf,
    fsname: String,
    s: &ServeArgs,
) -> Result<MountConfig, UsageError> {
    // SAFETY: getuid/getgid cannot fail.
    let (my_uid, my_gid) = unsafe { (libc::getuid(), libc::getgid()) };
    Ok(MountConfig {
        fsname,
        sources,
        merge: Merge {
            platform: platform(s.platform.clone())?,
            ..Merge::default()
        },
        mountpoint,
        foreground: s.foreground,
        cache_bytes: parse_size(&s.cache_size)?,
        prefetch_bytes: parse_size(DEFAULT_PREFETCH)?,
        threads: s.threads.unwrap_or_else(default_threads),
        owner: Ownership {
            uid: my_uid,
            gid: my_gid,
            force_uid: false,
            force_gid: false,
        },
        access: Access::Owner,
        noexec: false,
        noatime: false,
        suid: false,
        dev: false,
        log_file: s.log_file.clone(),
        index_cache: if s.no_index_cache {
            None
        } else {
            s.index_cache
                .clone()
                .or_else(crate::format::IndexCache::default_dir)
        },
        watch: false,
        io_uring: s.io_uring == "auto",
        plain_entries: !s.full_entries,
        keeper: !s.no_keeper,
        kept_tree: !s.no_kept_tree,
        restart_limit: crate::config::parse_restart_limit(&s.restart_limit)?,
        remote: RemoteConfig {
            read_timeout: parse_duration(&s.remote_timeout)?,
            disk_cache: if s.no_disk_cache {
                None
            } else {
                s.disk_cache
                    .clone()
                    .or_else(crate::io::diskcache::DiskCache::default_dir)
                    .map(|d| parse_size(&s.disk_cache_size).map(|b| (d, b)))
                    .transpose()?
            },
            ..RemoteConfig::default()
        },
        poll: None,
        store: false,
        cri_proxy: None,
    })
}

/// The registry settings and the `-o` options (last: they override flags), checked.
fn finish_config(mut cfg: MountConfig, s: ServeArgs) -> Result<MountConfig, UsageError> {
    cfg.merge.registry = s.registry.into_config()?;
    for opt in s
        .options
        .iter()
        .flat_map(|o| o.split(','))
        .filter(|o| !o.is_empty())
    {
        crate::fstab::apply_option(&mut cfg, opt)?;
    }
    if cfg.threads == 0 {
        return Err("--threads must be at least 1".into());
    }
    cfg.merge.layout = check_layout(cfg.merge.layout)?;
    venv_at(&mut cfg)?;
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fstab::helper_args;

    fn cli(args: &[&str]) -> Result<Command, String> {
        Cli::try_parse_from(args)
            .map_err(|e| e.to_string())?
            .into_command()
            .map_err(|e| e.0)
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("256m"), Ok(256 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn snapshotter_takes_a_root_and_a_socket() {
        match cli(&[
            "pkgfs",
            "snapshotter",
            "--root",
            "/r",
            "--address",
            "/s.sock",
            "--store",
            "/var/lib/pkgfs-store",
        ]) {
            Ok(Command::Snapshotter(c)) => {
                assert_eq!(c.root, PathBuf::from("/r"));
                assert_eq!(c.address, PathBuf::from("/s.sock"));
                assert_eq!(c.store, Some(PathBuf::from("/var/lib/pkgfs-store")));
            }
            other => panic!("{other:?}"),
        }
        match cli(&["pkgfs", "snapshotter"]) {
            Ok(Command::Snapshotter(c)) => {
                assert_eq!(c.root, PathBuf::from(DEFAULT_SNAPSHOTTER_ROOT));
                assert_eq!(c.address, PathBuf::from(DEFAULT_SNAPSHOTTER_ADDRESS));
                assert_eq!(c.store, None, "no store: every layer unpacked");
            }
            other => panic!("{other:?}"),
        }
        let e = cli(&["pkgfs", "snapshotter", "--store", "store"]).unwrap_err();
        assert!(e.contains("absolute"), "{e}");
        let long = format!("/{}", "s".repeat(120));
        let e = cli(&["pkgfs", "snapshotter", "--address", &long]).unwrap_err();
        assert!(e.contains("107 bytes"), "{e}");
    }

    #[test]
    fn layouts_from_flags_and_from_fstab_options() {
        let mount = |args: &[&str]| {
            let mut v = vec!["pkgfs", "mount"];
            v.extend_from_slice(args);
            v.extend_from_slice(&["/pkgs", "/m"]);
            match cli(&v) {
                Ok(Command::Mount(c)) => Ok(c.merge.layout),
                Ok(_) => panic!("not a mount"),
                Err(e) => Err(e),
            }
        };
        assert_eq!(mount(&[]).unwrap(), LayoutConfig::default());
        let c = mount(&["--layout", "each", "--strip-components", "1"]).unwrap();
        assert_eq!((c.kind, c.strip), (LayoutKind::Each, 1));
        let c = mount(&[
            "-o",
            "ro,layout=npm,lockfile=/p/package-lock.json,allow_missing",
        ])
        .unwrap();
        assert_eq!(c.kind, LayoutKind::Npm);
        assert_eq!(c.lockfile, Some(PathBuf::from("/p/package-lock.json")));
        assert!(c.allow_missing);
        let c = mount(&["-o", "layout=merge,strip_components=2"]).unwrap();
        assert_eq!((c.kind, c.strip), (LayoutKind::Merge, 2));
        // python: the environment is the mountpoint, made absolute.
        let c = mount(&["--layout", "python", "--python", "/usr/bin/python3"]).unwrap();
        assert_eq!(c.python, Some(PathBuf::from("/usr/bin/python3")));
        assert_eq!(c.venv, Some(PathBuf::from("/m")));
        let c = mount(&["-o", "layout=python,python=/p/python3"]).unwrap();
        assert_eq!(
            (c.kind, c.venv),
            (LayoutKind::Python, Some(PathBuf::from("/m")))
        );
        for bad in [
            &["--layout", "cargo", "--strip-components", "1"][..],
            &["--lockfile", "x.json"],
            &["--layout", "npm", "--allow-missing"],
            &["-o", "layout=pile"],
            &["--layout", "python"],
            &["--python", "/usr/bin/python3"],
        ] {
            assert!(mount(bad).is_err(), "{bad:?}");
        }
        let Ok(Command::Ls { merge, .. }) = cli(&["pkgfs", "ls", "--layout", "cargo", "/pkgs"])
        else {
            panic!("not ls")
        };
        assert_eq!(merge.layout.kind, LayoutKind::Cargo);
    }

    #[test]
    fn mount_options_merge_into_config() {
        let Command::Mount(c) = cli(&[
            "pkgfs",
            "mount",
            "a.zip",
            "dir",
            "/mnt",
            "-o",
            "allow_other,uid=5,cache_size=1M,prefetch=0,nofail,x-systemd.automount",
            "--threads",
            "3",
        ])
        .unwrap() else {
            panic!("not a mount")
        };
        assert_eq!(c.sources, [PathBuf::from("a.zip"), PathBuf::from("dir")]);
        assert_eq!(c.mountpoint, PathBuf::from("/mnt"));
        assert_eq!(c.access, Access::All);
        assert_eq!(
            (c.owner.uid, c.owner.force_uid, c.owner.force_gid),
            (5, true, false)
        );
        assert_eq!(c.cache_bytes, 1 << 20);
        assert_eq!(c.prefetch_bytes, 0);
        assert_eq!(c.threads, 3);
        assert!(!c.merge.whiteouts);
        for opts in [["-o", "ro,whiteouts"], ["--whiteouts", "-f"]] {
            let Ok(Command::Mount(c)) = cli(&["pkgfs", "mount", "a", "/m", opts[0], opts[1]])
            else {
                panic!("not a mount")
            };
            assert!(c.merge.whiteouts, "{opts:?}");
        }
        assert!(!c.suid && !c.dev, "nosuid,nodev unless asked");
        let Ok(Command::Mount(c)) = cli(&["pkgfs", "mount", "a", "/m", "-o", "suid,dev,nodev"])
        else {
            panic!("not a mount")
        };
        assert!(c.suid && !c.dev, "the last of dev/nodev wins");
        assert!(cli(&["pkgfs", "mount", "a", "/m", "-o", "bogus"]).is_err());
        assert!(
            cli(&["pkgfs", "mount", "/m"]).is_err(),
            "a source is required"
        );
    }

    #[test]
    fn mount_helper_command_lines_become_pkgfs_mount() {
        let os = |v: &[&str]| v.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        assert!(helper_args(&os(&["pkgfs", "mount", "a", "b"])).is_none());
        let got = helper_args(&os(&[
            "/sbin/mount.fuse.pkgfs",
            "/pkgs:/extra/x.zip",
            "/srv/pkgs",
            "-n",
            "-o",
            "rw,nofail,no_watch,no_io_uring",
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            got,
            os(&[
                "pkgfs",
                "mount",
                "-o",
                "rw,nofail,no_watch,no_io_uring",
                "/pkgs",
                "/extra/x.zip",
                "/srv/pkgs"
            ])
        );
        let Command::Mount(c) = Cli::try_parse_from(&got).unwrap().into_command().unwrap() else {
            panic!()
        };
        assert!(!c.watch);
        assert!(!c.io_uring);
        assert_eq!(c.sources.len(), 2);
        assert!(c.keeper, "a keeper unless asked otherwise");
        assert_eq!(c.restart_limit, crate::keeper::RestartLimit::default());
        let Command::Mount(c) = cli(&[
            "pkgfs",
            "mount",
            "-o",
            "no_keeper,restart_limit=5/2m",
            "/a",
            "/b",
        ])
        .unwrap() else {
            panic!()
        };
        assert!(!c.keeper);
        assert_eq!(
            (c.restart_limit.count, c.restart_limit.window),
            (5, std::time::Duration::from_secs(120))
        );
        assert!(cli(&["pkgfs", "mount", "--restart-limit", "3", "/a", "/b"]).is_err());
        // -f (fake): nothing to do.
        assert_eq!(
            helper_args(&os(&["mount.pkgfs", "-f", "/a", "/b"])).unwrap(),
            Ok(Vec::new())
        );
        assert!(helper_args(&os(&["mount.pkgfs", "/a"])).unwrap().is_err());
    }

    #[test]
    fn ls_takes_a_trailing_path_only_if_it_is_not_on_disk() {
        let Command::Ls { sources, path, .. } = cli(&["pkgfs", "ls", "/", "no/such/dir"]).unwrap()
        else {
            panic!()
        };
        assert_eq!((sources.len(), path.as_slice()), (1, &b"no/such/dir"[..]));
        let Command::Ls { sources, path, .. } = cli(&["pkgfs", "ls", "/", "/tmp"]).unwrap() else {
            panic!()
        };
        assert_eq!((sources.len(), path.len()), (2, 0));
    }

    #[test]
    fn man_pages_and_completions_come_from_the_definitions() {
        let dir = tempfile::tempdir().unwrap();
        let pages = manpages(dir.path()).unwrap();
        let names: Vec<String> = pages
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        for want in [
            "pkgfs.1",
            "pkgfs-mount.1",
            "pkgfs-pack.1",
            "pkgfs-completions.1",
        ] {
            assert!(names.iter().any(|n| n == want), "{want}: {names:?}");
        }
        assert!(
            !names.iter().any(|n| n.contains("manpages")),
            "hidden: {names:?}"
        );
        let mount = std::fs::read_to_string(dir.path().join("pkgfs-mount.1")).unwrap();
        assert!(
            mount.contains("platform")
                && mount.contains("index\\-cache")
                && mount.contains("lockfile"),
            "{mount}"
        );
        let mut bash = Vec::new();
        completions(clap_complete::Shell::Bash, &mut bash);
        let bash = String::from_utf8(bash).unwrap();
        assert!(bash.contains("mount") && bash.contains("--platform"));
        assert!(matches!(
            cli(&["pkgfs", "completions", "zsh"]),
            Ok(Command::Completions(clap_complete::Shell::Zsh))
        ));
        assert!(cli(&["pkgfs", "completions", "cmd.exe"]).is_err());
    }

    #[test]
    fn store_is_a_mount_without_sources_that_grows() {
        let Ok(Command::Mount(c)) = cli(&[
            "pkgfs",
            "store",
            "/var/lib/pkgfs-store",
            "--tls-verify=false",
            "--platform",
            "linux/arm64",
            "-o",
            "allow_other,disk_cache_size=1G",
        ]) else {
            panic!("store did not parse");
        };
        assert!(c.store && c.sources.is_empty() && !c.watch && !c.merge.whiteouts);
        assert_eq!(c.mountpoint, PathBuf::from("/var/lib/pkgfs-store"));
        assert_eq!(c.prefetch_bytes, 0);
        assert!(!c.merge.registry.tls_verify);
        assert_eq!(c.access, Access::All);
        assert_eq!(c.merge.platform.unwrap().architecture, "arm64");
        assert_eq!(c.remote.disk_cache.unwrap().1, 1 << 30);
        // What only a mount of sources means is refused.
        let err = cli(&["pkgfs", "store", "/m", "-o", "layout=npm"]).unwrap_err();
        assert!(err.contains("no layout"), "{err}");
        assert!(cli(&["pkgfs", "store", "/m", "--whiteouts"]).is_err());
        // A mount is not a store.
        let Ok(Command::Mount(m)) = cli(&["pkgfs", "mount", "/pkgs", "/m"]) else {
            panic!("mount did not parse");
        };
        assert!(!m.store);
    }
}
