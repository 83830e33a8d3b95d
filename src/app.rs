//! The process around a command: the command line read (directly or as a mount(8)
//! helper), logging set up, and the outcome turned into an exit status: 0 success, 1
//! failure or problems found, 2 usage. `main.rs` only dispatches between these.

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

use crate::cli::Cli;
use crate::config::Command;

/// What a command came to: `Ok(false)` is "ran, found problems" (exit status 1).
pub type Outcome = Result<bool, Box<dyn std::error::Error>>;

/// Read the command line into a validated [`Command`] (with the arguments as given, or
/// as translated from a mount helper's), and set up logging for it. `Err` is the exit
/// status to leave with at once (a usage error, already printed; or a helper's `-f`).
pub fn start() -> Result<(Command, Vec<OsString>), ExitCode> {
    let args: Vec<OsString> = std::env::args_os().collect();
    let (cli, args) = match crate::fstab::helper_args(&args) {
        None => (Cli::parse_from(&args), args),
        Some(Ok(translated)) if translated.is_empty() => return Err(ExitCode::SUCCESS),
        Some(Ok(translated)) => (Cli::parse_from(&translated), translated),
        Some(Err(e)) => return Err(usage(&e)),
    };
    let level = cli.log_level.clone();
    let quiet = cli.quiet;
    crate::progress::set_quiet(quiet);
    let command = cli.into_command().map_err(|e| usage(&e))?;
    // A mount daemon logs activations at info level into its log, the snapshotter its
    // start and stop; before it is ready, a background mount only shows warnings on the
    // user's terminal.
    let is_mount = matches!(command, Command::Mount(_) | Command::Snapshotter(_));
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
        crate::daemon::quiet_until_ready(quiet);
    }
    Ok((command, args))
}

fn usage(e: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("pkgfs: {e}");
    ExitCode::from(2)
}

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

/// Flush the command's output and turn its outcome into the exit status, printing the
/// error (once, on one line) if there is one.
pub fn finish(result: Outcome, mut out: impl Write) -> ExitCode {
    let flushed = out.flush();
    // Ranges fetched from remote sources and still waiting for the disk cache's writer.
    crate::io::diskcache::flush_all();
    match (result, flushed) {
        (Ok(true), Ok(())) => ExitCode::SUCCESS,
        (Ok(false), Ok(())) => ExitCode::FAILURE,
        // A reader that stopped reading (`pkgfs ls | head`) is not a failure.
        (Err(e), _) if broken_pipe(&*e) => ExitCode::SUCCESS,
        // The background daemon printed its own line.
        (Err(e), _)
            if matches!(
                e.downcast_ref::<crate::daemon::DaemonError>(),
                Some(crate::daemon::DaemonError::Reported)
            ) =>
        {
            ExitCode::FAILURE
        }
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

/// The outcome of a command that either succeeds or fails.
pub fn done<E: std::error::Error + 'static>(r: Result<(), E>) -> Outcome {
    r.map(|()| true).map_err(Into::into)
}
