//! What an installer does to a wheel's files, as pure functions over bytes: the wheel's
//! metadata (`WHEEL`, `METADATA`'s name, `entry_points.txt`, `RECORD`), where each member
//! goes (the PyPA binary distribution format: the root to purelib or platlib by
//! `Root-Is-Purelib`, `NAME.data/KEY/…` to the scheme's KEY directory), the `#!python`
//! rewrite of scripts, the console and GUI launchers, and the rewritten `RECORD`.
//!
//! The installer emulated byte for byte is pip (23.x, whose launchers are distlib's and
//! have not changed in years; `pip/_internal/operations/install/wheel.py`): its
//! `fix_script`, its `ScriptMaker` settings (no variants, mode 0755), its RECORD rows
//! (sorted, CSV with `\r\n` line ends, changed files hashed again, generated files
//! listed). Differences are documented in docs/SEMANTICS.md ("Python environments").

use base64::Engine as _;
use sha2::Digest as _;

/// The scheme keys a wheel's `.data` directory may use, and what pip calls them.
pub const SCHEME_KEYS: [&str; 5] = ["purelib", "platlib", "headers", "scripts", "data"];

/// Whether pip makes a member executable, from its ZIP external attributes: their high
/// half is a regular file's mode with an execute bit (`zip_item_is_executable`; a mode
/// without a file type, as some writers store, is not).
pub fn executable(external: u32) -> bool {
    let mode = external >> 16;
    mode & 0o170000 == 0o100000 && mode & 0o111 != 0
}

/// `WHEEL`: whether the root of the wheel goes to purelib (else platlib). A `Wheel-Version`
/// of another major version is refused, as the specification asks.
pub fn root_is_purelib(wheel: &[u8]) -> Result<bool, String> {
    let text = String::from_utf8_lossy(wheel);
    let mut version = None;
    let mut purelib = false;
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        match k.trim() {
            "Wheel-Version" => version = Some(v.trim().to_string()),
            "Root-Is-Purelib" => purelib = v.trim().eq_ignore_ascii_case("true"),
            _ => {}
        }
    }
    match version.as_deref().and_then(|v| v.split('.').next()) {
        Some("1") => Ok(purelib),
        Some(v) => Err(format!("Wheel-Version {v}.x is not supported")),
        None => Err("its WHEEL file has no Wheel-Version".into()),
    }
}

/// The project name in `METADATA` (`Name:` of the first header block).
pub fn metadata_name(metadata: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(metadata);
    for line in text.lines() {
        if line.is_empty() {
            break;
        }
        if let Some(v) = line.strip_prefix("Name:") {
            let v = v.trim();
            return (!v.is_empty()).then(|| v.to_string());
        }
    }
    None
}

/// The version in `METADATA` (`Version:` of the first header block).
pub fn metadata_version(metadata: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(metadata);
    for line in text.lines() {
        if line.is_empty() {
            break;
        }
        if let Some(v) = line.strip_prefix("Version:") {
            let v = v.trim();
            return (!v.is_empty()).then(|| v.to_string());
        }
    }
    None
}

/// PEP 503's normal form of a project name: lower case, runs of `-_.` as one `-`.
pub fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            sep = true;
        } else {
            if sep && !out.is_empty() {
                out.push('-');
            }
            sep = false;
            out.extend(c.to_lowercase());
        }
    }
    out
}

/// A console or GUI script of `entry_points.txt`: `NAME = MODULE:ATTR`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryPoint {
    /// The launcher's file name in `bin/`.
    pub name: String,
    /// The module imported.
    pub module: String,
    /// The callable in it (`obj` or `obj.attr`).
    pub attr: String,
}

fn word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Parse `NAME = MODULE:ATTR [extras]` as distlib's `get_export_entry` does (names of
/// word characters and `-.+`; a callable suffix required, as pip requires it).
fn entry_point(name: &str, value: &str) -> Result<EntryPoint, String> {
    if name.is_empty()
        || name == "."
        || name == ".."
        || !name
            .chars()
            .all(|c| word(c) || matches!(c, '-' | '.' | '+'))
    {
        return Err(format!("entry point name {name:?} is not a script name"));
    }
    let callable = value.split('[').next().unwrap_or("").trim();
    let Some((module, attr)) = callable.split_once(':') else {
        return Err(format!(
            "entry point {name} = {value}: a callable suffix (MODULE:ATTR) is required"
        ));
    };
    let dotted =
        |s: &str| !s.is_empty() && s.split('.').all(|p| !p.is_empty() && p.chars().all(word));
    if !dotted(module) || !dotted(attr) {
        return Err(format!("entry point {name} = {value} is not MODULE:ATTR"));
    }
    Ok(EntryPoint {
        name: name.to_string(),
        module: module.to_string(),
        attr: attr.to_string(),
    })
}

/// The `console_scripts` and `gui_scripts` of `entry_points.txt` (an INI file, read as
/// `importlib.metadata` reads it: `#` and `;` comments, `[section]`, `name = value`).
pub fn entry_points(text: &[u8]) -> Result<(Vec<EntryPoint>, Vec<EntryPoint>), String> {
    let text = String::from_utf8_lossy(text);
    let (mut console, mut gui) = (Vec::new(), Vec::new());
    let mut section = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(s) = line.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            section = s.trim().to_string();
            continue;
        }
        let into = match section.as_str() {
            "console_scripts" => &mut console,
            "gui_scripts" => &mut gui,
            _ => continue,
        };
        let Some((name, value)) = line.split_once('=') else {
            return Err(format!("entry_points.txt: {line:?} is not NAME = VALUE"));
        };
        let ep = entry_point(name.trim(), value.trim())?;
        // A later line of the same name replaces the earlier (a dict in pip).
        into.retain(|e: &EntryPoint| e.name != ep.name);
        into.push(ep);
    }
    Ok((console, gui))
}

/// Rows of a `RECORD` file (CSV as Python's `csv.reader` reads it, line by line).
pub fn parse_record(text: &[u8]) -> Vec<Vec<String>> {
    let text = String::from_utf8_lossy(text);
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|line| {
            // Most rows quote nothing (plotly's RECORD has 15,000).
            if !line.contains('"') {
                return line.split(',').map(str::to_string).collect();
            }
            let mut fields = Vec::new();
            let mut field = String::new();
            let mut chars = line.chars().peekable();
            let mut quoted = false;
            let mut at_start = true;
            while let Some(c) = chars.next() {
                match c {
                    '"' if quoted && chars.peek() == Some(&'"') => {
                        chars.next();
                        field.push('"');
                    }
                    '"' if quoted => quoted = false,
                    '"' if at_start => {
                        quoted = true;
                        at_start = false;
                        continue;
                    }
                    ',' if !quoted => {
                        fields.push(std::mem::take(&mut field));
                        at_start = true;
                        continue;
                    }
                    c => field.push(c),
                }
                at_start = false;
            }
            fields.push(field);
            fields
        })
        .collect()
}

/// A `RECORD` file as pip writes it: rows sorted, CSV with minimal quoting, `\r\n` ends.
pub fn write_record(rows: &mut [(String, String, String)]) -> Vec<u8> {
    rows.sort();
    let mut out = String::new();
    for (a, b, c) in rows.iter() {
        for (n, f) in [a, b, c].into_iter().enumerate() {
            if n > 0 {
                out.push(',');
            }
            if f.contains([',', '"', '\r', '\n']) {
                out.push('"');
                out.push_str(&f.replace('"', "\"\""));
                out.push('"');
            } else {
                out.push_str(f);
            }
        }
        out.push_str("\r\n");
    }
    out.into_bytes()
}

/// `sha256=` and the URL-safe base64 of the digest, unpadded (RECORD's hash form).
pub fn record_hash(data: &[u8]) -> String {
    let d = sha2::Sha256::digest(data);
    format!(
        "sha256={}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(d)
    )
}

/// pip's `fix_script`: a first line starting `#!python` becomes `#!PYTHON` (anything
/// after `#!python` on that line is dropped, as pip drops it); other scripts are kept.
pub fn fix_script(data: &[u8], python: &[u8]) -> Option<Vec<u8>> {
    if !data.starts_with(b"#!python") {
        return None;
    }
    let rest = data
        .iter()
        .position(|&b| b == b'\n')
        .map_or(&[][..], |i| &data[i + 1..]);
    let mut out = Vec::with_capacity(python.len() + 3 + rest.len());
    out.extend_from_slice(b"#!");
    out.extend_from_slice(python);
    out.push(b'\n');
    out.extend_from_slice(rest);
    Some(out)
}

/// distlib's shebang for `python`: `#!PYTHON` when it has no space and the line fits in
/// 127 bytes, else the `/bin/sh` trampoline (the path quoted if it has a space).
pub fn shebang(python: &[u8]) -> Vec<u8> {
    let spaced = python.contains(&b' ');
    let exe: Vec<u8> = if spaced {
        [&b"\""[..], python, b"\""].concat()
    } else {
        python.to_vec()
    };
    if !spaced && exe.len() + 3 <= 127 {
        [&b"#!"[..], &exe, b"\n"].concat()
    } else {
        [
            &b"#!/bin/sh\n'''exec' "[..],
            &exe,
            b" \"$0\" \"$@\"\n' '''\n",
        ]
        .concat()
    }
}

/// A console or GUI launcher as pip writes it on Linux (distlib's template).
pub fn launcher(ep: &EntryPoint, python: &[u8]) -> Vec<u8> {
    let import_name = ep.attr.split('.').next().unwrap_or(&ep.attr);
    let body = format!(
        "# -*- coding: utf-8 -*-\nimport re\nimport sys\nfrom {} import {}\nif __name__ == '__main__':\n    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n    sys.exit({}())\n",
        ep.module, import_name, ep.attr
    );
    [shebang(python), body.into_bytes()].concat()
}

/// `os.path.relpath(target, base)` for absolute, normalised component lists.
pub fn relpath(target: &[Vec<u8>], base: &[Vec<u8>]) -> Vec<u8> {
    let common = target.iter().zip(base).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<&[u8]> = vec![b".."; base.len() - common];
    parts.extend(target[common..].iter().map(Vec::as_slice));
    if parts.is_empty() {
        return b".".to_vec();
    }
    parts.join(&b'/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wheel_metadata_and_names() {
        assert_eq!(
            root_is_purelib(b"Wheel-Version: 1.0\nGenerator: x\nRoot-Is-Purelib: true\n"),
            Ok(true)
        );
        assert_eq!(
            root_is_purelib(b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\n"),
            Ok(false)
        );
        assert!(root_is_purelib(b"Wheel-Version: 2.0\n").is_err());
        assert!(root_is_purelib(b"Root-Is-Purelib: true\n").is_err());
        assert_eq!(
            metadata_name(b"Metadata-Version: 2.1\nName: Jinja2\nVersion: 3\n\nName: body"),
            Some("Jinja2".into())
        );
        assert_eq!(normalize("Zope.Interface__x"), "zope-interface-x");
    }

    #[test]
    fn entry_points_as_pip_reads_them() {
        let (c, g) = entry_points(
            b"# c\n[console_scripts]\njp = jp:main\nfoo-bar = pkg.cli:app.run [extra]\n\n[gui_scripts]\nqt = qtconsole.qtconsoleapp:main\n[other]\nx = y\n",
        )
        .unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c[1].module, "pkg.cli");
        assert_eq!(c[1].attr, "app.run");
        assert_eq!(g[0].name, "qt");
        for bad in [
            &b"[console_scripts]\n../evil = a:b\n"[..],
            b"[console_scripts]\nx = nocallable\n",
            b"[console_scripts]\nx/y = a:b\n",
            b"[gui_scripts]\nbroken\n",
        ] {
            assert!(
                entry_points(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn launchers_and_scripts_as_pip_writes_them() {
        let ep = EntryPoint {
            name: "foo".into(),
            module: "pkg.cli".into(),
            attr: "app.run".into(),
        };
        let l = String::from_utf8(launcher(&ep, b"/v/bin/python")).unwrap();
        assert!(
            l.starts_with("#!/v/bin/python\n# -*- coding: utf-8 -*-\n"),
            "{l}"
        );
        assert!(l.contains("from pkg.cli import app\n"));
        assert!(l.ends_with("    sys.exit(app.run())\n"));
        let spaced = shebang(b"/my venv/bin/python");
        assert_eq!(
            spaced,
            b"#!/bin/sh\n'''exec' \"/my venv/bin/python\" \"$0\" \"$@\"\n' '''\n"
        );
        let long = format!("/{}/bin/python", "x".repeat(130));
        assert!(shebang(long.as_bytes()).starts_with(b"#!/bin/sh\n"));
        assert_eq!(
            fix_script(b"#!python -E\nprint(1)\n", b"/v/bin/python").unwrap(),
            b"#!/v/bin/python\nprint(1)\n"
        );
        assert_eq!(fix_script(b"#!/bin/sh\n", b"/v/bin/python"), None);
    }

    #[test]
    fn record_rows_round_trip_as_csv() {
        let rows = parse_record(b"a/b.py,sha256=x,12\r\n\"c,d.py\",,\nRECORD,,\n");
        assert_eq!(rows[1], vec!["c,d.py", "", ""]);
        let mut out: Vec<(String, String, String)> = rows
            .into_iter()
            .map(|r| (r[0].clone(), r[1].clone(), r[2].clone()))
            .collect();
        assert_eq!(
            write_record(&mut out),
            b"RECORD,,\r\na/b.py,sha256=x,12\r\n\"c,d.py\",,\r\n"
        );
        assert_eq!(
            record_hash(b""),
            "sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"
        );
        let v = |s: &str| {
            s.split('/')
                .filter(|c| !c.is_empty())
                .map(|c| c.as_bytes().to_vec())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            relpath(&v("/v/bin/jp"), &v("/v/lib/python3.11/site-packages")),
            b"../../../bin/jp"
        );
        assert_eq!(relpath(&v("/v/lib/x/a.py"), &v("/v/lib/x")), b"a.py");
    }

    #[test]
    fn executable_as_pip_reads_the_external_attributes() {
        assert!(executable(0o100755 << 16));
        assert!(!executable(0o100644 << 16));
        // protobuf's wheels: permission bits without a file type.
        assert!(!executable(0o777 << 16));
        assert!(!executable(0o120777 << 16));
        assert!(!executable(0));
    }
}
