//! `cargo`: `.crate` files as cargo unpacks them into `registry/src/INDEX/`.
//!
//! A mount of the `.crate` files of `$CARGO_HOME/registry/cache/INDEX/` at
//! `$CARGO_HOME/registry/src/INDEX/` is what cargo would have unpacked there: each
//! `NAME-VERSION.crate` at `NAME-VERSION/` (a crate's entries all sit under that
//! directory already, as `cargo package` writes them, so the first component of each is
//! dropped and the rest placed under the name from the file), and in it the `.cargo-ok`
//! file that cargo writes once a crate is unpacked, with the content current cargo
//! writes (`{"v":1}`): cargo then uses the directory as it is instead of unpacking the
//! crate again (which it could not do on a read-only mount). Crates are indexed on first
//! use, like `each`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::{Facts, Layout, Placement, file_name, inline_file};
use crate::format::Entry;
use crate::tree::Place;

/// What cargo writes in `.cargo-ok` once a crate is unpacked (cargo 1.71 and later;
/// older ones wrote `ok`, and newer ones unpack again over anything but this).
pub const CARGO_OK: &[u8] = br#"{"v":1}"#;

/// The `cargo` layout.
#[derive(Default)]
pub struct Cargo {
    taken: HashMap<Vec<u8>, PathBuf>,
}

impl Layout for Cargo {
    fn by_name(&self) -> bool {
        true
    }

    fn takes(&self, file_name: &[u8]) -> bool {
        file_name.len() > 6 && file_name.ends_with(b".crate")
    }

    fn place_name(&mut self, name: &Path) -> Placement {
        let file = file_name(name);
        let Some(dir) = file.strip_suffix(b".crate") else {
            return Placement::Refused("not a .crate file".into());
        };
        if let Err(why) = super::each::claim(&mut self.taken, dir, name) {
            return Placement::Refused(why);
        }
        Placement::Own {
            dir: vec![dir.to_vec()],
            inner: Place {
                strip: 1,
                prefix: Vec::new(),
            },
            extra: vec![inline_file(b".cargo-ok", CARGO_OK, 0o644, 0)],
        }
    }

    fn place(&mut self, name: &Path, _: &mut Vec<Entry>, _: &Facts) -> Placement {
        self.place_name(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crate_goes_to_name_version_with_its_marker() {
        let mut c = Cargo::default();
        match c.place_name(Path::new("/reg/serde-1.0.210.crate")) {
            Placement::Own { dir, inner, extra } => {
                assert_eq!(dir, [b"serde-1.0.210".to_vec()]);
                assert_eq!(inner.strip, 1);
                assert_eq!(extra[0].path, b".cargo-ok");
                assert_eq!(extra[0].size, CARGO_OK.len() as u64);
            }
            p => panic!("{p:?}"),
        }
        assert!(!c.takes(b"serde-1.0.210.tar.gz"));
        assert!(matches!(
            c.place_name(Path::new("/other/serde-1.0.210.crate")),
            Placement::Refused(_)
        ));
    }
}
