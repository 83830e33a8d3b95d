//! The `pkgfs` command: read the command line ([`pkgfs::app::start`]), run the command,
//! turn the outcome into the exit status ([`pkgfs::app::finish`]).

use std::io::Write;
use std::process::ExitCode;

use pkgfs::app::{self, Outcome, done};
use pkgfs::config::Command;
use pkgfs::{cli, daemon, status, tools};

fn main() -> ExitCode {
    let (command, args) = match app::start() {
        Ok(started) => started,
        Err(code) => return code,
    };
    if !matches!(command, Command::Mount(_)) {
        // The offline tools open packages on threads too; a mount grows its table
        // once its descriptor limit is raised (daemon's stage 1).
        pkgfs::io::blob::reserve_descriptor_slots();
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let result: Outcome = match command {
        Command::Mount(cfg) => done(daemon::mount(&cfg, &args)),
        Command::Umount { mountpoint, lazy } => done(daemon::unmount(&mountpoint, lazy)),
        Command::Reload { mountpoint } => done(daemon::reload(&mountpoint)),
        Command::Status { mountpoint, style } => status::query(&mountpoint, style)
            .map_err(Into::into)
            .and_then(|s| done(out.write_all(s.as_bytes()))),
        Command::Ls {
            sources,
            path,
            merge,
        } => tools::ls(&sources, &merge, &path, &mut out).map_err(Into::into),
        Command::Cat {
            sources,
            path,
            merge,
        } => done(tools::cat(&sources, &merge, &path, &mut out)),
        Command::Check { sources, merge } => {
            tools::check(&sources, &merge, &mut out).map_err(Into::into)
        }
        Command::Completions(shell) => {
            cli::completions(shell, &mut out);
            Ok(true)
        }
        Command::Manpages(dir) => done(cli::manpages(&dir).map(|pages| {
            pages.iter().for_each(|p| eprintln!("{}", p.display()));
        })),
        Command::Pack(cfg) => {
            done(tools::pack::pack(&cfg).map(|st| eprintln!("{}", st.summary(&cfg.output))))
        }
        Command::Snapshotter(cfg) => done(pkgfs::snapshot::server::run(&cfg)),
        Command::Seal(cfg) => done(tools::seal::seal(&cfg).map(|r| eprintln!("{r}"))),
    };
    app::finish(result, out)
}
