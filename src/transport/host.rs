//! What the host's kernel does with a FUSE round trip, read from `/sys/module`: the
//! settings that decide how long each request waits for its answer, reported by
//! `pkgfs status` and named once in the log at mount when they cost time.
//!
//! A cold `find` is two READDIRPLUS round trips per directory, and on a guest with two
//! vCPUs each round trip wakes the other, halted vCPU twice (the server for the request,
//! the reader for the answer). That wake-up, not pkgfs, is most of a request's time
//! (docs/design/cold-walks.md). Two host settings remove it, and pkgfs changes neither
//! (they are the host's, and apply to every FUSE filesystem and every idle CPU):
//!
//! - `fuse.wake_here` (a parameter of some kernels' fuse module, not of mainline
//!   Linux): a request's reader and server are woken on the CPU that woke them, so a
//!   round trip stays on one CPU.
//! - `haltpoll.guest_halt_poll_ns`: an idle guest vCPU polls that long before it halts.
//!   It costs the host CPU time while guests idle.
//!
//! docs/SEMANTICS.md ("Host settings") has the measurements and how to set them.

use std::path::Path;

use serde::Serialize;

/// Where the kernel lists module parameters.
pub const SYS_MODULE: &str = "/sys/module";

/// The host settings a FUSE round trip's time depends on; `None`: this kernel has no
/// such parameter (or it cannot be read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct HostSettings {
    /// `fuse.wake_here`: a round trip's wake-ups stay on the waking CPU.
    pub fuse_wake_here: Option<bool>,
    /// `haltpoll.guest_halt_poll_ns`: how long an idle vCPU polls before halting.
    pub guest_halt_poll_ns: Option<u64>,
    /// `fuse.enable_uring`: the kernel accepts FUSE over io_uring.
    pub fuse_enable_uring: Option<bool>,
}

impl HostSettings {
    /// This host's settings.
    pub fn read() -> Self {
        Self::read_in(Path::new(SYS_MODULE))
    }

    /// The settings under `root`, laid out as `/sys/module` is.
    pub fn read_in(root: &Path) -> Self {
        let param = |module: &str, name: &str| {
            std::fs::read_to_string(root.join(module).join("parameters").join(name))
                .ok()
                .map(|s| s.trim().to_string())
        };
        HostSettings {
            fuse_wake_here: param("fuse", "wake_here").and_then(|v| flag(&v)),
            guest_halt_poll_ns: param("haltpoll", "guest_halt_poll_ns")
                .and_then(|v| v.parse().ok()),
            fuse_enable_uring: param("fuse", "enable_uring").and_then(|v| flag(&v)),
        }
    }

    /// Whether a round trip wakes a halted CPU on this host: neither setting that keeps
    /// it awake or on one CPU is on (unknown counts as off only where the kernel has the
    /// parameter; on a host with neither parameter nothing is known, and nothing said).
    pub fn round_trips_wake_idle_cpus(&self) -> bool {
        let polls = self.guest_halt_poll_ns.is_some_and(|ns| ns > 0);
        let here = self.fuse_wake_here == Some(true);
        let known = self.fuse_wake_here.is_some() || self.guest_halt_poll_ns.is_some();
        known && !polls && !here
    }

    /// One line for the log and the status report, or None when the host's settings
    /// cost FUSE round trips nothing pkgfs knows of.
    pub fn advice(&self) -> Option<String> {
        if !self.round_trips_wake_idle_cpus() {
            return None;
        }
        Some(if self.fuse_wake_here.is_some() {
            "each FUSE round trip wakes an idle CPU; `echo Y > /sys/module/fuse/parameters/wake_here` \
             keeps it on one CPU, a cold find about twice as fast (docs/SEMANTICS.md, \"Host settings\")"
                .to_string()
        } else {
            "each FUSE round trip wakes a halted vCPU (guest halt polling is off: \
             docs/SEMANTICS.md, \"Host settings\")"
                .to_string()
        })
    }

    /// The settings as the status report's line says them.
    pub fn describe(&self) -> String {
        let on = |b: Option<bool>| match b {
            Some(true) => "on",
            Some(false) => "off",
            None => "absent",
        };
        let poll = match self.guest_halt_poll_ns {
            Some(0) => "off".to_string(),
            Some(ns) => format!("{ns} ns"),
            None => "absent".to_string(),
        };
        format!(
            "fuse.wake_here {}, guest halt polling {poll}, fuse.enable_uring {}",
            on(self.fuse_wake_here),
            on(self.fuse_enable_uring)
        )
    }
}

/// A boolean module parameter as sysfs shows it (`Y`/`N`, or `1`/`0`).
fn flag(v: &str) -> Option<bool> {
    match v {
        "Y" | "y" | "1" => Some(true),
        "N" | "n" | "0" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sysfs(params: &[(&str, &str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (module, name, value) in params {
            let dir = d.path().join(module).join("parameters");
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(name), format!("{value}\n")).unwrap();
        }
        d
    }

    #[test]
    fn parameters_are_read_as_sysfs_shows_them_and_a_missing_one_is_none() {
        let d = sysfs(&[
            ("fuse", "wake_here", "N"),
            ("fuse", "enable_uring", "Y"),
            ("haltpoll", "guest_halt_poll_ns", "0"),
        ]);
        let s = HostSettings::read_in(d.path());
        assert_eq!(s.fuse_wake_here, Some(false));
        assert_eq!(s.fuse_enable_uring, Some(true));
        assert_eq!(s.guest_halt_poll_ns, Some(0));
        assert_eq!(
            s.describe(),
            "fuse.wake_here off, guest halt polling off, fuse.enable_uring on"
        );
        let none = HostSettings::read_in(&d.path().join("nothing"));
        assert_eq!(none, HostSettings::default());
        assert_eq!(
            none.describe(),
            "fuse.wake_here absent, guest halt polling absent, fuse.enable_uring absent"
        );
        let d = sysfs(&[
            ("fuse", "wake_here", "1"),
            ("haltpoll", "guest_halt_poll_ns", "x"),
        ]);
        let s = HostSettings::read_in(d.path());
        assert_eq!(s.fuse_wake_here, Some(true));
        assert_eq!(s.guest_halt_poll_ns, None);
    }

    #[test]
    fn advice_is_given_only_when_round_trips_wake_an_idle_cpu() {
        let with = |here, poll| HostSettings {
            fuse_wake_here: here,
            guest_halt_poll_ns: poll,
            fuse_enable_uring: None,
        };
        // This kind of machine as it comes: both known, both off.
        let advice = with(Some(false), Some(0)).advice().unwrap();
        assert!(advice.contains("wake_here"), "{advice}");
        // Either setting on: nothing to say.
        assert_eq!(with(Some(true), Some(0)).advice(), None);
        assert_eq!(with(Some(false), Some(200_000)).advice(), None);
        // A kernel without wake_here whose guest does not halt-poll.
        let advice = with(None, Some(0)).advice().unwrap();
        assert!(!advice.contains("wake_here"), "{advice}");
        assert!(advice.contains("halt polling"), "{advice}");
        // Bare metal or an unknown host: nothing known, nothing said.
        assert_eq!(with(None, None).advice(), None);
    }
}
