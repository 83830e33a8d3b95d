//! fstab and mount(8): the helper's command line and the `-o` options.
//!
//! `mount -t fuse.pkgfs SOURCE DIR -o OPTIONS` runs `/sbin/mount.fuse.pkgfs` with
//! mount(8)'s own argument convention; [`helper_args`] turns that into a `pkgfs mount`
//! command line, and [`apply_option`] applies one `-o` option (also given to `pkgfs mount
//! -o`) to a [`MountConfig`]. docs/SEMANTICS.md lists the options.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use crate::config::{
    Access, DEFAULT_DISK_CACHE, MountConfig, UsageError, parse_duration, parse_duration_or_zero,
    parse_size,
};
use crate::layout::Kind as LayoutKind;
use crate::source::image::Transport;

/// Names under which the binary acts as a mount(8) helper (`mount -t fuse.pkgfs` runs
/// `/sbin/mount.fuse.pkgfs`, `mount -t pkgfs` runs `/sbin/mount.pkgfs`).
pub const HELPER_NAMES: &[&str] = &["mount.fuse.pkgfs", "mount.pkgfs"];

/// If the program was started as a mount helper, translate the helper's command line
/// (`SOURCE MOUNTPOINT [-sfnv] [-o OPTIONS] [-t TYPE]`, as mount(8) passes it) into
/// the equivalent `pkgfs mount` arguments. `SOURCE` may list several sources separated
/// by `:`. Returns `None` for any other program name, and an empty list for `-f` (fake:
/// do nothing).
pub fn helper_args(
    args: &[std::ffi::OsString],
) -> Option<Result<Vec<std::ffi::OsString>, UsageError>> {
    use std::ffi::OsString;
    let name = std::path::Path::new(args.first()?).file_name()?.to_str()?;
    if !HELPER_NAMES.contains(&name) {
        return None;
    }
    let mut positional: Vec<OsString> = Vec::new();
    let mut options: Vec<OsString> = Vec::new();
    let mut fake = false;
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("-o") => match it.next() {
                Some(o) => options.push(o.clone()),
                None => return Some(Err("-o needs a value".into())),
            },
            // -t TYPE: the subtype is ours whatever it says.
            Some("-t") => {
                it.next();
            }
            Some(f) if f.starts_with('-') && f.len() > 1 => {
                for c in f[1..].chars() {
                    match c {
                        // -f: fake (do everything but mount); -n: no mtab; -s: sloppy;
                        // -v: verbose.
                        'f' => fake = true,
                        'n' | 's' | 'v' => {}
                        _ => return Some(Err(format!("unknown helper flag -{c}").into())),
                    }
                }
            }
            _ => positional.push(a.clone()),
        }
    }
    let [source, mountpoint] = positional.as_slice() else {
        return Some(Err(format!(
            "usage: {name} SOURCE MOUNTPOINT [-o OPTIONS] (got {} arguments)",
            positional.len()
        )
        .into()));
    };
    if fake {
        // Nothing to do: an empty command line.
        return Some(Ok(Vec::new()));
    }
    let mut out: Vec<OsString> = vec!["pkgfs".into(), "mount".into()];
    for o in options {
        out.push("-o".into());
        out.push(o);
    }
    // An fstab source field holds one word: several sources are `:`-separated. An image
    // keeps its own colons: `oci:/img:latest:/pkgs` is the image `oci:/img:latest` (the
    // parts after its path that are not absolute paths are its reference) and `/pkgs`.
    out.extend(split_fstab_sources(source.as_encoded_bytes()));
    out.push(mountpoint.clone());
    Some(Ok(out))
}

/// Split an fstab source field (see [`helper_args`]).
fn split_fstab_sources(src: &[u8]) -> Vec<OsString> {
    let parts: Vec<&[u8]> = src
        .split(|&b| b == b':')
        .filter(|p| !p.is_empty())
        .collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < parts.len() {
        let is_image = [
            Transport::Oci,
            Transport::OciArchive,
            Transport::DockerArchive,
        ]
        .iter()
        .any(|t| t.prefix().as_bytes() == parts[i]);
        let is_registry =
            parts[i] == b"docker" && parts.get(i + 1).is_some_and(|p| p.starts_with(b"//"));
        let is_url = matches!(parts[i], b"s3" | b"http" | b"https")
            && parts.get(i + 1).is_some_and(|p| p.starts_with(b"//"));
        if is_url {
            // SCHEME://HOST[:PORT]/PATH: a port is the digits after the host.
            let mut word = [parts[i], parts[i + 1]].join(&b':');
            i += 2;
            let port = |p: &&[u8]| {
                let d = p.iter().take_while(|b| b.is_ascii_digit()).count();
                d > 0 && (d == p.len() || p[d] == b'/')
            };
            if parts.get(i).is_some_and(port) {
                word.push(b':');
                word.extend_from_slice(parts[i]);
                i += 1;
            }
            out.push(std::ffi::OsStr::from_bytes(&word).to_os_string());
        } else if (is_image || is_registry) && i + 1 < parts.len() {
            let mut word = [parts[i], parts[i + 1]].join(&b':');
            i += 2;
            while i < parts.len() && !parts[i].starts_with(b"/") {
                word.push(b':');
                word.extend_from_slice(parts[i]);
                i += 1;
            }
            out.push(std::ffi::OsStr::from_bytes(&word).to_os_string());
        } else {
            out.push(std::ffi::OsStr::from_bytes(parts[i]).to_os_string());
            i += 1;
        }
    }
    out
}

/// Apply one `-o` option (`key` or `key=value`) to `cfg`.
pub fn apply_option(cfg: &mut MountConfig, opt: &str) -> Result<(), UsageError> {
    let (key, value) = match opt.split_once('=') {
        Some((k, v)) => (k, Some(v)),
        None => (opt, None),
    };
    let need = || value.ok_or_else(|| format!("mount option {key} needs a value"));
    let number = || -> Result<u32, String> {
        need()?
            .parse()
            .map_err(|_| format!("mount option {key} needs a number"))
    };
    match key {
        "allow_other" => cfg.access = Access::All,
        "allow_root" => cfg.access = Access::RootAndOwner,
        "noexec" => cfg.noexec = true,
        "exec" => cfg.noexec = false,
        "noatime" => cfg.noatime = true,
        "suid" => cfg.suid = true,
        "nosuid" => cfg.suid = false,
        "dev" => cfg.dev = true,
        "nodev" => cfg.dev = false,
        "atime" | "relatime" | "strictatime" => cfg.noatime = false,
        "fsname" => cfg.fsname = need()?.to_string(),
        "uid" => {
            cfg.owner.uid = number()?;
            cfg.owner.force_uid = true;
        }
        "gid" => {
            cfg.owner.gid = number()?;
            cfg.owner.force_gid = true;
        }
        "cache_size" => cfg.cache_bytes = parse_size(need()?)?,
        "prefetch" => cfg.prefetch_bytes = parse_size(need()?)?,
        "threads" => cfg.threads = number()? as usize,
        "log_file" => cfg.log_file = Some(PathBuf::from(need()?)),
        "foreground" => cfg.foreground = true,
        "no_watch" | "nowatch" => cfg.watch = false,
        "watch" => cfg.watch = true,
        "index_cache" => cfg.index_cache = Some(PathBuf::from(need()?)),
        "no_index_cache" => cfg.index_cache = None,
        "no_kept_tree" => cfg.kept_tree = false,
        "whiteouts" => cfg.merge.whiteouts = true,
        "no_io_uring" => cfg.io_uring = false,
        "full_entries" => cfg.plain_entries = false,
        "no_keeper" => cfg.keeper = false,
        "restart_limit" => cfg.restart_limit = crate::config::parse_restart_limit(need()?)?,
        "disk_cache" => {
            let budget = cfg
                .remote
                .disk_cache
                .as_ref()
                .map_or(parse_size(DEFAULT_DISK_CACHE)?, |(_, b)| *b);
            cfg.remote.disk_cache = Some((PathBuf::from(need()?), budget));
        }
        "disk_cache_size" => {
            let budget = parse_size(need()?)?;
            if let Some((_, b)) = cfg.remote.disk_cache.as_mut() {
                *b = budget;
            }
        }
        "no_disk_cache" => cfg.remote.disk_cache = None,
        "remote_timeout" => cfg.remote.read_timeout = parse_duration(need()?)?,
        "poll" => cfg.poll = Some(parse_duration(need()?)?),
        "layout" => {
            cfg.merge.layout.kind = LayoutKind::parse(need()?)
                .ok_or_else(|| format!("unknown layout {:?}", value.unwrap_or("")))?;
        }
        "strip_components" => cfg.merge.layout.strip = number()? as usize,
        "lockfile" => cfg.merge.layout.lockfile = Some(PathBuf::from(need()?)),
        "allow_missing" => cfg.merge.layout.allow_missing = true,
        "python" => cfg.merge.layout.python = Some(PathBuf::from(need()?)),
        "no_compile" => cfg.merge.layout.no_compile = true,
        "authfile" => cfg.merge.registry.auth_file = Some(PathBuf::from(need()?)),
        "cert_dir" => cfg.merge.registry.cert_dir = Some(PathBuf::from(need()?)),
        "no_background_fetch" => cfg.merge.registry.background_fetch = false,
        "start_window" => cfg.merge.registry.start_window = parse_duration_or_zero(need()?)?,
        "tls_verify" => {
            cfg.merge.registry.tls_verify = match value.unwrap_or("true") {
                "true" | "1" | "yes" => true,
                "false" | "0" | "no" => false,
                v => return Err(format!("tls_verify={v}: true or false").into()),
            }
        }
        // Always in force, or meaningless for a read-only FUSE mount: accepted so
        // fstab lines and mount(8) helpers work.
        "ro"
        | "rw"
        | "defaults"
        | "auto"
        | "noauto"
        | "user"
        | "users"
        | "nouser"
        | "nofail"
        | "_netdev"
        | "default_permissions"
        | "async"
        | "sync" => {}
        k if k.starts_with("x-") || k.starts_with("comment=") => {}
        _ => return Err(format!("unknown mount option {opt:?}").into()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fstab_source_fields_keep_an_image_s_colons() {
        let split = |s: &str| -> Vec<String> {
            split_fstab_sources(s.as_bytes())
                .into_iter()
                .map(|o| o.into_string().unwrap())
                .collect()
        };
        assert_eq!(split("/a:/b"), ["/a", "/b"]);
        assert_eq!(split("oci:/img:latest:/pkgs"), ["oci:/img:latest", "/pkgs"]);
        assert_eq!(
            split("/base:docker-archive:/x.tar:pkgfs/debian:latest"),
            ["/base", "docker-archive:/x.tar:pkgfs/debian:latest"]
        );
        assert_eq!(split("oci-archive:/i.tar"), ["oci-archive:/i.tar"]);
        assert_eq!(
            split("/base:http://h:8080/pkgs/:s3://b/p/:https://h/x.zip"),
            [
                "/base",
                "http://h:8080/pkgs/",
                "s3://b/p/",
                "https://h/x.zip"
            ]
        );
        assert_eq!(split("http://h:80"), ["http://h:80"]);
        assert_eq!(
            split("docker://127.0.0.1:5000/a/b:v1:/pkgs"),
            ["docker://127.0.0.1:5000/a/b:v1", "/pkgs"]
        );
    }
}
