//! `each`: every archive in a directory of its own, named after its file.
//!
//! The name is the archive's file name without its archive extension, the longest of
//! [`EXTENSIONS`] that ends it, compared without regard to case (`http-1.2.0.tar.gz` →
//! `http-1.2.0`, `a.zip` → `a`, `x.tar.zst` → `x`, `b.TGZ` → `b`). Files of a directory
//! source whose names end in none of them are not packages (nothing is opened to find
//! out: packages are listed, not read, at mount); an archive named on the command line is
//! taken whatever its name (a name without such an extension is kept whole). A name that
//! is empty once the extension is gone, `.` or `..` is refused, and so is a second
//! package whose directory name is already taken (the first in layer order keeps it).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::{Facts, Layout, Placement, file_name, plain_component};
use crate::format::Entry;
use crate::tree::Place;

/// Archive extensions, longest first where one ends another.
pub const EXTENSIONS: &[&str] = &[
    ".tar.gz",
    ".tar.zst",
    ".tar.zstd",
    ".tgz",
    ".tzst",
    ".tar",
    ".zip",
    ".jar",
    ".war",
    ".ear",
    ".aar",
    ".whl",
    ".egg",
    ".crate",
    ".apk",
    ".xpi",
    ".nupkg",
    ".vsix",
    ".gem",
    ".pkg.tar.zst",
];

/// The archive extension that ends `name`, if any (the longest).
pub fn extension(name: &[u8]) -> Option<&'static str> {
    EXTENSIONS
        .iter()
        .filter(|e| {
            name.len() > e.len() && name[name.len() - e.len()..].eq_ignore_ascii_case(e.as_bytes())
        })
        .max_by_key(|e| e.len())
        .copied()
}

/// The directory name of archive file `name`: without its extension.
pub fn dir_name(name: &[u8]) -> &[u8] {
    match extension(name) {
        Some(e) => &name[..name.len() - e.len()],
        None => name,
    }
}

/// The `each` layout.
pub struct Each {
    strip: usize,
    taken: HashMap<Vec<u8>, PathBuf>,
}

impl Each {
    /// Entries inside each directory lose their first `strip` components.
    pub fn new(strip: usize) -> Self {
        Each {
            strip,
            taken: HashMap::new(),
        }
    }
}

/// The directory `name` (a package's own) unless taken: refused otherwise.
pub(super) fn claim(
    taken: &mut HashMap<Vec<u8>, PathBuf>,
    dir: &[u8],
    package: &Path,
) -> Result<(), String> {
    if !plain_component(dir) {
        return Err(format!(
            "its directory name {:?} is not a plain file name",
            String::from_utf8_lossy(dir)
        ));
    }
    if let Some(first) = taken.get(dir) {
        return Err(format!(
            "its directory {} is taken by {}",
            String::from_utf8_lossy(dir),
            first.display()
        ));
    }
    taken.insert(dir.to_vec(), package.to_path_buf());
    Ok(())
}

impl Layout for Each {
    fn by_name(&self) -> bool {
        true
    }

    fn takes(&self, file_name: &[u8]) -> bool {
        extension(file_name).is_some()
    }

    fn place_name(&mut self, name: &Path) -> Placement {
        let dir = dir_name(file_name(name));
        match claim(&mut self.taken, dir, name) {
            Ok(()) => Placement::Own {
                dir: vec![dir.to_vec()],
                inner: Place {
                    strip: self.strip,
                    prefix: Vec::new(),
                },
                extra: Vec::new(),
            },
            Err(why) => Placement::Refused(why),
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
    fn names_lose_their_longest_archive_extension() {
        for (file, dir) in [
            ("http-1.2.0.tar.gz", "http-1.2.0"),
            ("a.zip", "a"),
            ("x.tar.zst", "x"),
            ("b.TGZ", "b"),
            ("serde-1.0.0.crate", "serde-1.0.0"),
            ("pkg.tar", "pkg"),
            ("readme", "readme"),
            ("v1.2.gz", "v1.2.gz"),
        ] {
            assert_eq!(dir_name(file.as_bytes()), dir.as_bytes(), "{file}");
        }
        assert!(
            extension(b".tar.gz").is_none(),
            "a bare extension names nothing"
        );
    }

    #[test]
    fn a_taken_or_empty_name_is_refused_naming_the_first() {
        let mut e = Each::new(0);
        assert!(matches!(
            e.place_name(Path::new("/s/a.zip")),
            Placement::Own { .. }
        ));
        match e.place_name(Path::new("/t/a.tar.gz")) {
            Placement::Refused(why) => assert!(why.contains("/s/a.zip"), "{why}"),
            p => panic!("{p:?}"),
        }
        assert!(matches!(
            e.place_name(Path::new("/s/..")),
            Placement::Refused(_)
        ));
    }
}
