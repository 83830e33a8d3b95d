//! The `pkgfs` command: parse arguments, build a plain configuration, run, map the
//! outcome to an exit status (0 success, 1 failure or problems found, 2 usage).

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use pkgfs::cli::{Cli, Command};
use pkgfs::{daemon, tools};

fn init_logging(level: Option<&str>, default: &str) {
    let env = env_logger::Env::default().default_filter_or(level.unwrap_or(default));
    let mut builder = env_logger::Builder::from_env(env);
    if std::env::var_os("RUST_LOG").is_none() {
        // fuser warns when its own unmount-on-exit finds the mount already gone, which is
        // the normal end of `pkgfs umount`; keep its real errors.
        builder.filter_module("fuser::mnt", log::LevelFilter::Error);
    }
    builder.format_timestamp_millis().init();
}

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let (cli, args) = match pkgfs::cli::helper_args(&args) {
        None => (Cli::parse_from(&args), args),
        Some(Ok(translated)) if translated.is_empty() => return ExitCode::SUCCESS,
        Some(Ok(translated)) => (Cli::parse_from(&translated), translated),
        Some(Err(e)) => {
            eprintln!("pkgfs: {e}");
            return ExitCode::from(2);
        }
    };
    let level = cli.log_level.clone();
    let quiet = cli.quiet;
    pkgfs::progress::set_quiet(quiet);
    let command = match cli.into_command() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("pkgfs: {e}");
            return ExitCode::from(2);
        }
    };
    // A mount daemon logs activations at info level into its log; before it is ready, a
    // background mount only shows warnings on the user's terminal.
    let is_mount = matches!(command, Command::Mount(_));
    let default = match (is_mount, quiet) {
        (true, _) => "info",
        (false, true) => "error",
        (false, false) => "warn",
    };
    init_logging(level.as_deref(), default);
    if let Command::Mount(c) = &command
        && !c.foreground
        && level.is_none()
        && std::env::var_os("RUST_LOG").is_none()
    {
        daemon::quiet_until_ready(quiet);
    }
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let result: Result<bool, Box<dyn std::error::Error>> = match command {
        Command::Mount(cfg) => daemon::mount(&cfg, &args)
            .map(|()| true)
            .map_err(Into::into),
        Command::Umount { mountpoint, lazy } => daemon::unmount(&mountpoint, lazy)
            .map(|()| true)
            .map_err(Into::into),
        Command::Status { mountpoint, style } => match pkgfs::status::query(&mountpoint, style) {
            Ok(s) => out
                .write_all(s.as_bytes())
                .map(|()| true)
                .map_err(Into::into),
            Err(e) => Err(e.into()),
        },
        Command::Ls {
            sources,
            path,
            merge,
        } => tools::ls(&sources, &merge, &path, &mut out).map_err(Into::into),
        Command::Cat {
            sources,
            path,
            merge,
        } => tools::cat(&sources, &merge, &path, &mut out)
            .map(|()| true)
            .map_err(Into::into),
        Command::Check { sources, merge } => {
            tools::check(&sources, &merge, &mut out).map_err(Into::into)
        }
        Command::Completions(shell) => {
            pkgfs::cli::completions(shell, &mut out);
            Ok(true)
        }
        Command::Manpages(dir) => pkgfs::cli::manpages(&dir)
            .map(|pages| {
                for p in pages {
                    eprintln!("{}", p.display());
                }
                true
            })
            .map_err(Into::into),
        Command::Pack(cfg) => match pkgfs::tools::pack::pack(&cfg) {
            Ok(st) => {
                eprintln!(
                    "{}: {} entries, {} bytes of data, {} frames, {} bytes ({:.1}% of the tar stream)",
                    cfg.output.display(),
                    st.entries,
                    st.data_bytes,
                    st.frames,
                    st.output_bytes,
                    100.0 * st.output_bytes as f64 / st.stream_bytes.max(1) as f64
                );
                Ok(true)
            }
            Err(e) => Err(e.into()),
        },
        Command::Seal(cfg) => match pkgfs::tools::seal::seal(&cfg) {
            Ok(r) => {
                eprintln!(
                    "{}: revision {}, {} archives, {} bytes sealed",
                    r.path.display(),
                    r.revision,
                    r.archives,
                    r.bytes
                );
                Ok(true)
            }
            Err(e) => Err(e.into()),
        },
    };
    let flushed = out.flush();
    // Ranges fetched from remote sources and still waiting for the disk cache's writer.
    pkgfs::io::diskcache::flush_all();
    match (result, flushed) {
        (Ok(true), Ok(())) => ExitCode::SUCCESS,
        (Ok(false), Ok(())) => ExitCode::FAILURE,
        // A reader that stopped reading (`pkgfs ls | head`) is not a failure.
        (Err(e), _) if broken_pipe(&*e) => ExitCode::SUCCESS,
        (Err(e), _) => {
            eprintln!("pkgfs: {e}");
            ExitCode::FAILURE
        }
        (_, Err(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        (_, Err(e)) => {
            eprintln!("pkgfs: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Whether `e` is, or was caused by, writing to a closed pipe.
fn broken_pipe(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(e) = cur {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        {
            return true;
        }
        cur = e.source();
    }
    false
}
