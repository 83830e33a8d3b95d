//! Safe normalisation of the paths stored in archives.
//!
//! Archive paths are untrusted bytes. Before an entry joins the tree its path is turned
//! into a list of plain components:
//! - backslashes become slashes (some Windows tools write `a\b.txt`);
//! - empty and `.` components are dropped (`./a//b` is `a/b`);
//! - a path with a `..` component, an absolute path (`/etc/x`, `C:/x`), a NUL byte, or a
//!   component longer than `NAME_MAX` (255 bytes) is refused: the entry is skipped with a
//!   warning. pkgfs does not try to "confine" such names by rewriting them, because any
//!   rewrite could make the entry shadow another package's legitimate file.
//!
//! Names are otherwise kept as raw bytes (ZIP names without the UTF-8 flag are usually in
//! the writer's locale, which on Unix is UTF-8; re-encoding CP437 would mangle them).

use std::fmt;

/// The longest file name component Linux accepts.
pub const NAME_MAX: usize = 255;

/// Why a stored path was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathError {
    /// Starts at the root (`/x`) or a drive (`C:`).
    Absolute,
    /// Has a `..` component.
    ParentComponent,
    /// Contains a NUL byte.
    Nul,
    /// Nothing is left after normalisation (`./`, `/`, empty).
    Empty,
    /// A component is longer than [`NAME_MAX`].
    NameTooLong,
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PathError::Absolute => "absolute path",
            PathError::ParentComponent => "path with a '..' component",
            PathError::Nul => "path with a NUL byte",
            PathError::Empty => "empty path",
            PathError::NameTooLong => "path component longer than 255 bytes",
        })
    }
}

/// Normalise a stored path into its components (see the module documentation).
pub fn components(raw: &[u8]) -> Result<Vec<&[u8]>, PathError> {
    let mut out = Vec::new();
    components_into(raw, &mut out)?;
    Ok(out)
}

/// [`components`] into a vector the caller reuses (cleared first): the tree builder
/// normalises every entry's path, and one allocation per entry shows in a mount.
pub fn components_into<'a>(raw: &'a [u8], out: &mut Vec<&'a [u8]>) -> Result<(), PathError> {
    out.clear();
    if raw.contains(&0) {
        return Err(PathError::Nul);
    }
    if matches!(raw.first(), Some(b'/' | b'\\')) {
        return Err(PathError::Absolute);
    }
    for (i, comp) in raw.split(|&b| b == b'/' || b == b'\\').enumerate() {
        match comp {
            b"" | b"." => continue,
            b".." => return Err(PathError::ParentComponent),
            [letter, b':'] if i == 0 && letter.is_ascii_alphabetic() => {
                return Err(PathError::Absolute);
            }
            c if c.len() > NAME_MAX => return Err(PathError::NameTooLong),
            c => out.push(c),
        }
    }
    if out.is_empty() {
        return Err(PathError::Empty);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(raw: &str) -> Vec<String> {
        components(raw.as_bytes())
            .unwrap()
            .into_iter()
            .map(|c| String::from_utf8(c.to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn plain_and_untidy_paths() {
        assert_eq!(ok("a/b/c.txt"), ["a", "b", "c.txt"]);
        assert_eq!(ok("./a//b/./c/"), ["a", "b", "c"]);
        assert_eq!(ok("a\\windows\\path.txt"), ["a", "windows", "path.txt"]);
        assert_eq!(
            ok("...x/..y"),
            ["...x", "..y"],
            "dots inside names are names"
        );
        assert_eq!(ok("dir:with/colon"), ["dir:with", "colon"]);
    }

    #[test]
    fn hostile_paths_are_refused() {
        let cases: &[(&[u8], PathError)] = &[
            (b"../escape", PathError::ParentComponent),
            (b"a/../../b", PathError::ParentComponent),
            (b"a/..", PathError::ParentComponent),
            (b"..\\x", PathError::ParentComponent),
            (b"/etc/passwd", PathError::Absolute),
            (b"\\abs", PathError::Absolute),
            (b"C:/drive.txt", PathError::Absolute),
            (b"c:\\x", PathError::Absolute),
            (b"a\0b", PathError::Nul),
            (b"./", PathError::Empty),
            (b"", PathError::Empty),
        ];
        for (raw, want) in cases {
            assert_eq!(
                components(raw),
                Err(*want),
                "{:?}",
                String::from_utf8_lossy(raw)
            );
        }
        let long = "x".repeat(256);
        assert_eq!(components(long.as_bytes()), Err(PathError::NameTooLong));
        assert!(components("x".repeat(255).as_bytes()).is_ok());
    }
}
