//! `pkgfs pack`: write a directory, or convert a tar archive, as a pkgfs package
//! (docs/FORMAT.md).
//!
//! The tree is walked in byte order of names and written as a POSIX pax tar stream. The
//! stream is cut into frames of about `--frame-size` decompressed bytes, *at entry
//! boundaries* when an entry fits, so a small file is read by decompressing one frame;
//! an entry larger than a frame spans several whole frames. Frames are compressed
//! independently on every core (with zstd checksums), written in order, then followed by
//! the pkgfs index and the seekable-zstd seek table. Output is deterministic: the same
//! tree gives the same bytes, whatever the thread count.
//!
//! Symlinks are stored as symlinks and not followed, so nothing outside DIR is read;
//! `--follow-symlinks inside` stores what links point to when that stays inside DIR
//! (a link leading outside is an error), `--follow-symlinks all` follows every link.
//! Hard links (same device and inode) are stored once, then as tar hard links. Devices,
//! FIFOs and sockets are skipped with a warning.
//!
//! A tar archive (plain, gzip or zstd) is converted in one pass: its entries are written
//! in their order with the same metadata (the `--owner` and `--mtime` options apply),
//! paths and hard-link targets normalised as the mount normalises them. An entry the
//! mount would refuse (`..`, absolute, NUL) or cannot show (devices, FIFOs) is skipped
//! with a warning, so a converted package never carries a name that could escape.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::mpsc;

use log::warn;

use crate::format::floor::codec::encode_index;
use crate::format::floor::frames::encode_seek_table;
use crate::format::floor::tar::{TarError, TarKind, TarWriter, WriteEntry};
use crate::format::{Entry, EntryKind, Foreign, Loc};
use crate::tree::path::PathError;

/// Read size when copying file data.
const CHUNK: usize = 1 << 20;

/// Settings of `pkgfs pack`.
#[derive(Debug, Clone)]
pub struct PackConfig {
    /// Directory to pack.
    pub dir: PathBuf,
    /// Output file.
    pub output: PathBuf,
    /// zstd level.
    pub level: i32,
    /// Compression threads.
    pub threads: usize,
    /// Target decompressed frame size.
    pub frame_size: usize,
    /// Clamp every mtime to at most this.
    pub mtime_clamp: Option<i64>,
    /// Force this owner on every entry.
    pub owner: Option<(u32, u32)>,
    /// Which symlinks to follow (store what they point to) instead of storing as links.
    pub follow: Follow,
}

/// Which symlinks `pack` follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Follow {
    /// None: every symlink is stored as a symlink (the default).
    Never,
    /// Symlinks whose target resolves inside DIR; one leading outside is an error.
    Inside,
    /// Every symlink, wherever it leads.
    All,
}

/// What was packed.
#[derive(Debug, Default, Clone, Copy)]
pub struct PackStats {
    /// Entries written.
    pub entries: u64,
    /// Bytes of file data.
    pub data_bytes: u64,
    /// Size of the tar stream.
    pub stream_bytes: u64,
    /// Size of the output file.
    pub output_bytes: u64,
    /// Number of frames.
    pub frames: u64,
}

impl PackStats {
    /// The line `pkgfs pack` prints when it is done.
    pub fn summary(&self, output: &Path) -> String {
        format!(
            "{}: {} entries, {} bytes of data, {} frames, {} bytes ({:.1}% of the tar stream)",
            output.display(),
            self.entries,
            self.data_bytes,
            self.frames,
            self.output_bytes,
            100.0 * self.output_bytes as f64 / self.stream_bytes.max(1) as f64
        )
    }
}

/// One entry found by the walk.
struct Item {
    rel: Vec<u8>,
    source: PathBuf,
    entry: Entry,
}

/// Walk `dir` in byte order of names, depth first, a directory before its contents.
fn walk(dir: &Path, cfg: &PackConfig) -> std::io::Result<Vec<Item>> {
    let mut out = Vec::new();
    let mut links: HashMap<(u64, u64), Vec<u8>> = HashMap::new();
    let mut stack: Vec<(PathBuf, Vec<u8>)> = vec![(dir.to_path_buf(), Vec::new())];
    let root = std::fs::canonicalize(dir)?;
    let mut seen_dirs = std::collections::HashSet::new();
    while let Some((path, rel)) = stack.pop() {
        let mut names: Vec<OsString> = std::fs::read_dir(&path)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<std::io::Result<_>>()?;
        names.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        let mut subdirs = Vec::new();
        for name in names {
            let mut source = path.join(&name);
            let mut meta = std::fs::symlink_metadata(&source)?;
            if meta.file_type().is_symlink() && cfg.follow != Follow::Never {
                let target = std::fs::canonicalize(&source).map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!("cannot follow {}: {e}", source.display()),
                    )
                })?;
                if cfg.follow == Follow::Inside && !target.starts_with(&root) {
                    return Err(std::io::Error::other(format!(
                        "{} points outside {} (to {}); --follow-symlinks all follows it",
                        source.display(),
                        dir.display(),
                        target.display()
                    )));
                }
                meta = std::fs::metadata(&target)?;
                if meta.is_dir() && !seen_dirs.insert((meta.dev(), meta.ino())) {
                    return Err(std::io::Error::other(format!(
                        "{} leads to a directory already packed (a symlink loop?)",
                        source.display()
                    )));
                }
                source = target;
            }
            let mut r = rel.clone();
            if !r.is_empty() {
                r.push(b'/');
            }
            r.extend_from_slice(name.as_bytes());
            let ft = meta.file_type();
            let (kind, link) = if ft.is_dir() {
                seen_dirs.insert((meta.dev(), meta.ino()));
                (EntryKind::Dir, Vec::new())
            } else if ft.is_symlink() {
                let t = std::fs::read_link(&source)?;
                (EntryKind::Symlink, t.as_os_str().as_bytes().to_vec())
            } else if ft.is_file() {
                match (meta.nlink() > 1)
                    .then(|| links.get(&(meta.dev(), meta.ino())))
                    .flatten()
                {
                    Some(first) => (EntryKind::HardLink, first.clone()),
                    None => {
                        if meta.nlink() > 1 {
                            links.insert((meta.dev(), meta.ino()), r.clone());
                        }
                        (EntryKind::File, Vec::new())
                    }
                }
            } else {
                warn!("{}: device, FIFO or socket; not packed", source.display());
                continue;
            };
            let (uid, gid) = cfg.owner.unwrap_or((meta.uid(), meta.gid()));
            let mtime = cfg
                .mtime_clamp
                .map_or(meta.mtime(), |c| meta.mtime().min(c));
            let entry = Entry {
                path: r.clone(),
                kind,
                perm: (meta.mode() & 0o7777) as u16,
                mtime,
                uid: Some(uid),
                gid: Some(gid),
                size: if kind == EntryKind::File {
                    meta.len()
                } else {
                    0
                },
                data: Loc::None,
                link,
                rdev: 0,
                xattrs: Vec::new(),
            };
            if kind == EntryKind::Dir {
                subdirs.push((source.clone(), r.clone()));
            }
            out.push(Item {
                rel: r,
                source,
                entry,
            });
        }
        // Depth first in name order: push in reverse so the first subdirectory is next.
        stack.extend(subdirs.into_iter().rev());
    }
    // The stack order visits a directory's files before its subdirectories' contents,
    // but entries must appear sorted by path with parents first: sort by components.
    out.sort_by(|a, b| a.rel.split(|&c| c == b'/').cmp(b.rel.split(|&c| c == b'/')));
    Ok(out)
}

/// The tar stream's sink: collects bytes into frames and hands full frames on.
struct Frames {
    current: Vec<u8>,
    target: usize,
    done: Vec<Vec<u8>>,
}

impl Frames {
    fn cut(&mut self) {
        if !self.current.is_empty() {
            let f = std::mem::replace(&mut self.current, Vec::with_capacity(self.target));
            self.done.push(f);
        }
    }
}

/// A `Write` handle onto shared [`Frames`], so the packer can cut frames between the
/// tar writer's entries.
#[derive(Clone)]
struct FrameSink(Rc<RefCell<Frames>>);

impl Write for FrameSink {
    fn write(&mut self, mut buf: &[u8]) -> std::io::Result<usize> {
        let n = buf.len();
        let mut f = self.0.borrow_mut();
        while !buf.is_empty() {
            let room = f.target - f.current.len();
            let take = room.min(buf.len());
            f.current.extend_from_slice(&buf[..take]);
            buf = &buf[take..];
            if f.current.len() >= f.target {
                f.cut();
            }
        }
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn tar_kind(k: EntryKind) -> TarKind {
    match k {
        EntryKind::File => TarKind::File,
        EntryKind::Dir => TarKind::Dir,
        EntryKind::Symlink => TarKind::Symlink,
        EntryKind::HardLink => TarKind::HardLink,
        // Never handed to the writer: the walk and the tar conversion skip them.
        EntryKind::CharDev => TarKind::Other(b'3'),
        EntryKind::BlockDev => TarKind::Other(b'4'),
        EntryKind::Fifo => TarKind::Other(b'6'),
        EntryKind::Socket | EntryKind::Special => TarKind::Other(b'0'),
    }
}

/// One entry for the package writer: its metadata (`data` is filled in by the writer)
/// and a reader of exactly its `size` bytes of data.
type Put<'p> = dyn FnMut(Entry, &mut dyn Read) -> Result<(), PackError> + 'p;

/// Why `pkgfs pack` failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PackError {
    /// Reading the input or writing the package failed.
    #[error("{what}: {source}")]
    Io {
        /// The file or step concerned.
        what: String,
        /// Why.
        source: std::io::Error,
    },
    /// The tar archive given cannot be read.
    #[error("{what}: {source}")]
    Tar {
        /// The input.
        what: String,
        /// Why.
        source: TarError,
    },
    /// The input is not something pack takes (the message says what to do instead).
    #[error("{0}")]
    Input(String),
    /// A compression or writer thread failed to run.
    #[error("{0}")]
    Internal(&'static str),
}

fn ctx(what: &str, source: std::io::Error) -> PackError {
    PackError::Io {
        what: what.to_string(),
        source,
    }
}

/// Pack `cfg.dir` into `cfg.output`: a directory, or a tar archive (plain, gzip or
/// zstd) whose entries are copied over in their order.
pub fn pack(cfg: &PackConfig) -> Result<PackStats, PackError> {
    let stdin = cfg.dir.as_os_str() == "-";
    let shown = if stdin {
        "standard input".to_string()
    } else {
        cfg.dir.display().to_string()
    };
    if !stdin
        && std::fs::metadata(&cfg.dir)
            .map_err(|e| ctx(&shown, e))?
            .is_dir()
    {
        let items = walk(&cfg.dir, cfg).map_err(|e| ctx(&shown, e))?;
        return write_package(cfg, |put| {
            for item in items {
                let mut data: Box<dyn Read> = if item.entry.kind == EntryKind::File {
                    let f = std::fs::File::open(&item.source)
                        .map_err(|e| ctx(&item.source.display().to_string(), e))?;
                    Box::new(Shrink(f.take(item.entry.size), item.source))
                } else {
                    Box::new(std::io::empty())
                };
                put(item.entry, &mut data)?;
            }
            Ok(())
        });
    }
    if cfg.follow != Follow::Never {
        return Err(PackError::Input(
            "--follow-symlinks applies to directories, not to tar archives".into(),
        ));
    }
    let input = if stdin {
        tarball(Box::new(std::io::stdin().lock()), &shown, None, &cfg.output)?
    } else {
        let f = std::fs::File::open(&cfg.dir).map_err(|e| ctx(&shown, e))?;
        tarball(Box::new(f), &shown, Some(&cfg.dir), &cfg.output)?
    };
    write_package(cfg, |put| {
        crate::format::floor::tar::each(input, |te, data| match tar_entry(te, cfg) {
            Ok(Some(e)) => put(e, data).map_err(|e| TarError::Format(e.to_string())),
            Ok(None) => Ok(()),
            Err(why) => {
                warn!(
                    "{shown}: skipping {:?}: {why}",
                    String::from_utf8_lossy(&te.path)
                );
                Ok(())
            }
        })
        .map_err(|source| PackError::Tar {
            what: shown.clone(),
            source,
        })
    })
}

/// A file's data that must not end early (the file shrank while being packed).
struct Shrink(std::io::Take<std::fs::File>, PathBuf);

impl Read for Shrink {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.0.read(buf)?;
        if n == 0 && self.0.limit() > 0 && !buf.is_empty() {
            return Err(std::io::Error::other(format!(
                "{}: file shrank while packing",
                self.1.display()
            )));
        }
        Ok(n)
    }
}

/// The tar stream of the tar archive `f` reads (the file `source`, or standard input;
/// `shown` in messages), decompressed if it is gzip or zstd (recognised by content). For
/// bzip2 and xz, the error gives the pipe that packs it into `output`.
fn tarball<'r>(
    mut f: Box<dyn Read + 'r>,
    shown: &str,
    source: Option<&Path>,
    output: &Path,
) -> Result<Box<dyn Read + 'r>, PackError> {
    let mut head = [0u8; 512];
    let n = read_full(&mut f, &mut head).map_err(|e| ctx(shown, e))?;
    let head = &head[..n];
    let rest = std::io::Cursor::new(head.to_vec()).chain(f);
    let found = Foreign::detect(head);
    let source = source.map(shell_word);
    if let Some(pipe) = found.and_then(|f| f.pipe(source.as_deref(), &shell_word(output))) {
        let how = match source {
            Some(_) => format!("pipe it in with `{pipe}`"),
            None => format!("decompress it in the pipe (`… | {pipe}`)"),
        };
        return Err(PackError::Input(format!(
            "{shown}: compressed with bzip2 or xz; pack reads plain, gzip and zstd tar \
             streams: {how}"
        )));
    }
    match found {
        Some(Foreign::Gzip) => Ok(Box::new(flate2::read::MultiGzDecoder::new(rest))),
        // Seekable or not: a seek table is a skippable frame.
        Some(Foreign::Zstd) => Ok(Box::new(
            zstd::stream::read::Decoder::new(rest).map_err(|e| ctx(shown, e))?,
        )),
        Some(Foreign::Tar) => Ok(Box::new(rest)),
        // bzip2 and xz were answered above with their pipe.
        _ => Err(PackError::Input(format!(
            "{shown} is neither a directory nor a tar archive (plain, gzip or zstd)"
        ))),
    }
}

/// `path` as one shell word, for commands quoted in messages: as it is when it holds only
/// characters no shell treats specially, else in single quotes.
fn shell_word(path: &Path) -> String {
    let s = path.display().to_string();
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_./-+,:@%=".contains(&b));
    if plain {
        s
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Fill `buf` as far as the reader goes; the number of bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// The package entry for a tar archive's entry: its path and link target normalised
/// (an unsafe one is refused, as the mount would refuse it), the owner and time options
/// applied. Devices, FIFOs and sockets are refused. `None` for the root directory
/// (`./`), which a package does not record.
fn tar_entry(
    te: &crate::format::floor::tar::TarEntry,
    cfg: &PackConfig,
) -> Result<Option<Entry>, String> {
    if te.kind == TarKind::Dir && crate::tree::path::components(&te.path) == Err(PathError::Empty) {
        return Ok(None);
    }
    let normal = |p: &[u8]| -> Result<Vec<u8>, String> {
        Ok(crate::tree::path::components(p)
            .map_err(|e| e.to_string())?
            .join(&b'/'))
    };
    let kind = match te.kind {
        TarKind::File => EntryKind::File,
        TarKind::Dir => EntryKind::Dir,
        TarKind::Symlink => EntryKind::Symlink,
        TarKind::HardLink => EntryKind::HardLink,
        TarKind::Other(_) => return Err("device, FIFO or socket; not packed".into()),
    };
    let link = match kind {
        EntryKind::HardLink => normal(&te.link)?,
        _ => te.link.clone(),
    };
    let (uid, gid) = cfg.owner.map_or(
        (u32::try_from(te.uid).ok(), u32::try_from(te.gid).ok()),
        |(u, g)| (Some(u), Some(g)),
    );
    Ok(Some(Entry {
        path: normal(&te.path)?,
        kind,
        perm: (te.mode & 0o7777) as u16,
        mtime: cfg.mtime_clamp.map_or(te.mtime, |c| te.mtime.min(c)),
        uid,
        gid,
        size: te.size,
        data: Loc::None,
        link,
        rdev: 0,
        xattrs: Vec::new(),
    }))
}

/// Write the entries `feed` hands to its `put` as a package at `cfg.output`.
fn write_package(
    cfg: &PackConfig,
    feed: impl FnOnce(&mut Put) -> Result<(), PackError>,
) -> Result<PackStats, PackError> {
    let mut entries: Vec<Entry> = Vec::new();
    let mut tmp = temp_beside(&cfg.output)?;
    let progress = crate::progress::pack_spinner();
    let mut stats = PackStats::default();
    let frames = Rc::new(RefCell::new(Frames {
        current: Vec::with_capacity(cfg.frame_size),
        target: cfg.frame_size,
        done: Vec::new(),
    }));
    let mut tar = TarWriter::new(FrameSink(frames.clone()));
    let mut sizes: Vec<(u32, u32)> = Vec::new();
    let out = tmp.as_file_mut();

    std::thread::scope(|s| -> Result<(), PackError> {
        let (job_tx, done_rx) = spawn_compressors(s, cfg);
        let writer = s.spawn(move || write_in_order(done_rx, out));

        let mut sent = 0u64;
        let send_done = |frames: &Rc<RefCell<Frames>>, sent: &mut u64| -> Result<(), PackError> {
            let ready: Vec<Vec<u8>> = frames.borrow_mut().done.drain(..).collect();
            for f in ready {
                job_tx
                    .send((*sent, f))
                    .map_err(|_| PackError::Internal("the compression workers stopped"))?;
                *sent += 1;
            }
            Ok(())
        };
        let mut buf = vec![0u8; CHUNK];
        let mut put = |mut e: Entry, data: &mut dyn Read| -> Result<(), PackError> {
            // Start a new frame rather than split an entry that would fit in one.
            let whole = 1536 + e.size.div_ceil(512) * 512;
            {
                let mut f = frames.borrow_mut();
                if !f.current.is_empty() && (f.current.len() as u64 + whole) > cfg.frame_size as u64
                {
                    f.cut();
                }
            }
            let data_offset = tar
                .header(&WriteEntry {
                    path: &e.path,
                    kind: tar_kind(e.kind),
                    mode: u32::from(e.perm),
                    uid: u64::from(e.uid.unwrap_or(0)),
                    gid: u64::from(e.gid.unwrap_or(0)),
                    mtime: e.mtime,
                    size: e.size,
                    link: &e.link,
                })
                .map_err(|err| ctx("tar", err))?;
            if e.kind == EntryKind::File {
                copy_data(&e, data, &mut buf, &mut tar, || {
                    send_done(&frames, &mut sent)
                })?;
                e.data = Loc::Stream(data_offset);
                stats.data_bytes += e.size;
            }
            tar.end_entry().map_err(|err| ctx("tar", err))?;
            stats.entries += 1;
            entries.push(e);
            send_done(&frames, &mut sent)?;
            if stats.entries % 256 == 0 {
                progress.set_message(format!(
                    "{} entries, {} MiB of data",
                    stats.entries,
                    stats.data_bytes >> 20
                ));
                progress.tick();
            }
            Ok(())
        };
        feed(&mut put)?;
        tar.finish()
            .map_err(|e| ctx("tar", e))?
            .0
            .borrow_mut()
            .cut();
        send_done(&frames, &mut sent)?;
        drop(job_tx);
        sizes = writer
            .join()
            .map_err(|_| PackError::Internal("the writer thread panicked"))??;
        progress.finish_and_clear();
        Ok(())
    })?;

    stats.frames = sizes.len() as u64;
    stats.stream_bytes = sizes.iter().map(|&(_, d)| u64::from(d)).sum();
    stats.output_bytes = finish_package(tmp, cfg, &entries, &sizes)?;
    Ok(stats)
}

/// A temporary file in the directory of `output`, to be renamed to it.
fn temp_beside(output: &Path) -> Result<tempfile::NamedTempFile, PackError> {
    let out_dir = output
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    tempfile::NamedTempFile::new_in(out_dir).map_err(|e| ctx("temporary file", e))
}

/// A frame to compress, numbered; a frame compressed (or why not), with its number and
/// decompressed size.
type Job = (u64, Vec<u8>);
type Done = (u64, std::io::Result<Vec<u8>>, u32);

/// The compression workers, `cfg.threads` of them in `s`: frames go out numbered through
/// the sender returned, come back numbered through the receiver, and are written in
/// order ([`write_in_order`]).
fn spawn_compressors<'s>(
    s: &'s std::thread::Scope<'s, '_>,
    cfg: &PackConfig,
) -> (mpsc::SyncSender<Job>, mpsc::Receiver<Done>) {
    let (job_tx, job_rx) = mpsc::sync_channel::<Job>(cfg.threads * 2);
    let job_rx = std::sync::Arc::new(std::sync::Mutex::new(job_rx));
    let (done_tx, done_rx) = mpsc::channel::<Done>();
    for _ in 0..cfg.threads.max(1) {
        let (rx, tx) = (job_rx.clone(), done_tx.clone());
        let level = cfg.level;
        s.spawn(move || compress_frames(&rx, &tx, level));
    }
    (job_tx, done_rx)
}

/// One compression worker: frames from `jobs` compressed at `level` until it closes.
fn compress_frames(
    jobs: &std::sync::Mutex<mpsc::Receiver<Job>>,
    done: &mpsc::Sender<Done>,
    level: i32,
) {
    let mut c = match zstd::bulk::Compressor::new(level) {
        Ok(c) => c,
        Err(e) => {
            let _ = done.send((0, Err(e), 0));
            return;
        }
    };
    let _ = c.include_checksum(true);
    let _ = c.include_contentsize(true);
    loop {
        let job = jobs.lock().map(|r| r.recv());
        let Ok(Ok((n, data))) = job else { break };
        let r = c.compress(&data);
        if done.send((n, r, data.len() as u32)).is_err() {
            break;
        }
    }
}

/// Copy the `e.size` bytes of file `e` from `data` into the tar stream through `buf`,
/// calling `chunk_done` after each chunk (full frames go to the workers as they fill).
fn copy_data(
    e: &Entry,
    data: &mut dyn Read,
    buf: &mut [u8],
    tar: &mut TarWriter<FrameSink>,
    mut chunk_done: impl FnMut() -> Result<(), PackError>,
) -> Result<(), PackError> {
    let mut left = e.size;
    while left > 0 {
        let n = data
            .read(&mut buf[..left.min(CHUNK as u64) as usize])
            .map_err(|err| ctx(&String::from_utf8_lossy(&e.path), err))?;
        if n == 0 {
            return Err(ctx(
                &String::from_utf8_lossy(&e.path),
                std::io::ErrorKind::UnexpectedEof.into(),
            ));
        }
        tar.data(&buf[..n]).map_err(|err| ctx("tar", err))?;
        left -= n as u64;
        chunk_done()?;
    }
    Ok(())
}

/// The compressed frames as the workers hand them back (numbered), written to `out` in
/// order: their (compressed, decompressed) sizes.
fn write_in_order(
    done: mpsc::Receiver<Done>,
    out: &mut std::fs::File,
) -> Result<Vec<(u32, u32)>, PackError> {
    let mut pending = BTreeMap::new();
    let mut next = 0u64;
    let mut sizes = Vec::new();
    let mut file = std::io::BufWriter::new(out);
    for (n, r, dsize) in done {
        let c = r.map_err(|e| ctx("compression", e))?;
        pending.insert(n, (c, dsize));
        while let Some((c, d)) = pending.remove(&next) {
            file.write_all(&c).map_err(|e| ctx("write", e))?;
            sizes.push((c.len() as u32, d));
            next += 1;
        }
    }
    file.flush().map_err(|e| ctx("write", e))?;
    Ok(sizes)
}

/// After the frames: the index and the seek table, synced, and the file renamed into
/// place, readable by all. Its size.
fn finish_package(
    mut tmp: tempfile::NamedTempFile,
    cfg: &PackConfig,
    entries: &[Entry],
    sizes: &[(u32, u32)],
) -> Result<u64, PackError> {
    let index = encode_index(entries, cfg.level.min(19)).map_err(|e| ctx("index", e))?;
    let table = encode_seek_table(sizes);
    {
        let f = tmp.as_file_mut();
        f.write_all(&index).map_err(|e| ctx("write", e))?;
        f.write_all(&table).map_err(|e| ctx("write", e))?;
        f.sync_all().map_err(|e| ctx("sync", e))?;
    }
    let file = tmp
        .persist(&cfg.output)
        .map_err(|e| ctx(&cfg.output.display().to_string(), e.error))?;
    // NamedTempFile is created 0600; a package is meant to be read by others.
    let _ = file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644));
    Ok(file.metadata().map(|m| m.len()).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn shell_words_survive_a_shell() {
        // Each path, quoted, comes back through `sh` as the same single argument.
        for path in [
            "/tmp/a.tar.zst",
            "/tmp/my out.tar.zst",
            "/tmp/it's here",
            "/tmp/$HOME `x` \"q\"",
            "",
        ] {
            let word = shell_word(Path::new(path));
            let out = Command::new("sh")
                .arg("-c")
                .arg(format!("printf %s {word}"))
                .output()
                .unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout), path, "{word}");
        }
        assert_eq!(shell_word(Path::new("/a/b-1.tar.zst")), "/a/b-1.tar.zst");
    }
}
