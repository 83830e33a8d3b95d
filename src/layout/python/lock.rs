//! Lock files of a Python environment, and what they need of the interpreter: PEP 751's
//! `pylock.toml` and `requirements.txt` with hashes (`pip-compile --generate-hashes`,
//! `uv export`, `uv pip compile --generate-hashes`), read into the wheels each project
//! must come from; environment markers evaluated for the interpreter; a wheel file
//! name's tags checked against the tags the interpreter supports.
//!
//! Pure functions over text, unit-tested without an interpreter: the environment
//! ([`Markers`]) and the tag list come from `interp`.

use std::collections::{BTreeMap, HashMap};

use super::wheel::normalize;

/// A lock file larger than this is refused.
pub const MAX_LOCK: u64 = 64 << 20;

/// One locked project: which version, and the wheels it may come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Locked {
    /// As the lock writes it.
    pub name: String,
    /// The version pinned.
    pub version: String,
    /// Acceptable sha256 digests of the wheel file (hex, lower case).
    pub sha256: Vec<String>,
    /// `pylock.toml`: the wheel file names it lists (any other is not this lock's).
    pub files: Option<Vec<String>>,
}

/// The environment markers' variables for the interpreter (PEP 508).
pub type Markers = HashMap<String, String>;

/// Read a lock: `pylock.toml` (PEP 751) if its name says so (`pylock.toml`,
/// `pylock.NAME.toml`), else `requirements.txt` syntax. Entries whose markers are false
/// for `env` are left out. Keyed by normal project name; a project locked twice (for
/// this environment) is an error.
pub fn read(
    file_name: &str,
    text: &str,
    env: &Markers,
) -> Result<BTreeMap<String, Locked>, String> {
    let list = if file_name.starts_with("pylock.") && file_name.ends_with(".toml") {
        pylock(text, env)?
    } else {
        requirements(text, env)?
    };
    let mut out = BTreeMap::new();
    for l in list {
        let key = normalize(&l.name);
        if out.contains_key(&key) {
            return Err(format!("{} is locked twice", l.name));
        }
        out.insert(key, l);
    }
    Ok(out)
}

/// `requirements.txt` with hashes: `NAME==VERSION [; MARKER] --hash=sha256:HEX …`, lines
/// continued with `\`, `#` comments; every requirement pinned with `==` and hashed (as
/// pip's `--require-hashes` demands). Options other than `--hash` (an index URL,
/// `--no-binary`…) are ignored; `-r`/`-c` includes, URLs and editable installs refused.
pub fn requirements(text: &str, env: &Markers) -> Result<Vec<Locked>, String> {
    let mut joined = String::new();
    let mut lines = Vec::new();
    for raw in text.lines() {
        let line = match raw.find(" #").or_else(|| raw.starts_with('#').then_some(0)) {
            Some(i) => &raw[..i],
            None => raw,
        };
        if let Some(cont) = line.trim_end().strip_suffix('\\') {
            joined.push_str(cont);
            joined.push(' ');
            continue;
        }
        joined.push_str(line);
        lines.push(std::mem::take(&mut joined));
    }
    lines.push(joined);
    let mut out = Vec::new();
    for line in lines {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if line.starts_with('-') {
            let opt = line.split_whitespace().next().unwrap_or(line);
            if matches!(
                opt,
                "-r" | "-c" | "-e" | "--requirement" | "--constraint" | "--editable"
            ) {
                return Err(format!(
                    "{line:?}: includes and editable installs are not read"
                ));
            }
            continue;
        }
        let mut hashes = Vec::new();
        let mut spec = String::new();
        for word in line.split_whitespace() {
            if let Some(h) = word.strip_prefix("--hash=") {
                match h.split_once(':') {
                    Some(("sha256", hex))
                        if hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit()) =>
                    {
                        hashes.push(hex.to_ascii_lowercase());
                    }
                    // Other algorithms are pip's too, but wheels are checked by sha256.
                    Some((_, _)) => {}
                    None => return Err(format!("{line:?}: bad --hash")),
                }
            } else if word.starts_with("--") {
                continue;
            } else {
                spec.push_str(word);
                spec.push(' ');
            }
        }
        let (req, marker) = match spec.split_once(';') {
            Some((r, m)) => (r.trim(), Some(m.trim())),
            None => (spec.trim(), None),
        };
        if let Some(m) = marker
            && !evaluate(m, env)?
        {
            continue;
        }
        if req.contains("://") || req.contains(" @ ") || req.contains('@') {
            return Err(format!(
                "{req:?}: a URL requirement needs a build, not a wheel"
            ));
        }
        let Some((name, version)) = req.split_once("==") else {
            return Err(format!("{req:?} is not pinned with =="));
        };
        let name = name.split('[').next().unwrap_or(name).trim();
        let version = version.trim();
        if name.is_empty() || version.is_empty() || version.contains([',', '*']) {
            return Err(format!("{req:?} is not pinned to one version"));
        }
        if hashes.is_empty() {
            return Err(format!("{name}=={version} has no --hash=sha256:"));
        }
        out.push(Locked {
            name: name.to_string(),
            version: version.to_string(),
            sha256: hashes,
            files: None,
        });
    }
    Ok(out)
}

/// `pylock.toml` (PEP 751): each `[[packages]]` entry with `name`, `version`, optional
/// `marker`, and `wheels` (`name`, `hashes.sha256`); an entry that needs a build (only
/// `sdist`, `vcs`, `directory` or `archive`) is refused by name.
pub fn pylock(text: &str, env: &Markers) -> Result<Vec<Locked>, String> {
    let doc: toml::Table = toml::from_str(text).map_err(|e| format!("pylock.toml: {e}"))?;
    match doc.get("lock-version").and_then(|v| v.as_str()) {
        Some(v) if v.split('.').next() == Some("1") => {}
        Some(v) => return Err(format!("pylock.toml: lock-version {v} is not supported")),
        None => return Err("pylock.toml: no lock-version".into()),
    }
    let packages = match doc.get("packages") {
        Some(toml::Value::Array(a)) => a.as_slice(),
        None => &[],
        Some(_) => return Err("pylock.toml: packages is not an array".into()),
    };
    let mut out = Vec::new();
    for p in packages {
        let t = p
            .as_table()
            .ok_or("pylock.toml: a package is not a table")?;
        let s = |k: &str| t.get(k).and_then(|v| v.as_str()).map(str::to_string);
        let name = s("name").ok_or("pylock.toml: a package without a name")?;
        if let Some(m) = s("marker")
            && !evaluate(&m, env)?
        {
            continue;
        }
        let version = s("version").ok_or_else(|| format!("{name}: no version"))?;
        let Some(toml::Value::Array(wheels)) = t.get("wheels") else {
            let kind = ["sdist", "vcs", "directory", "archive"]
                .into_iter()
                .find(|k| t.contains_key(*k))
                .unwrap_or("no wheels");
            return Err(format!(
                "{name} {version}: its lock entry needs a build ({kind}), not a wheel"
            ));
        };
        let (mut files, mut sha256) = (Vec::new(), Vec::new());
        for w in wheels {
            let file = w
                .get("name")
                .and_then(|v| v.as_str())
                .map(str::to_string)
                .or_else(|| {
                    let url = w.get("url").or_else(|| w.get("path"))?.as_str()?;
                    url.rsplit('/').next().map(str::to_string)
                })
                .ok_or_else(|| format!("{name} {version}: a wheel without a name"))?;
            let hash = w
                .get("hashes")
                .and_then(|h| h.get("sha256"))
                .and_then(|v| v.as_str())
                .ok_or_else(|| format!("{name} {version}: {file} has no sha256 hash"))?;
            files.push(file);
            sha256.push(hash.to_ascii_lowercase());
        }
        out.push(Locked {
            name,
            version,
            sha256,
            files: Some(files),
        });
    }
    Ok(out)
}

/// Compare two dotted release numbers (`3.11` < `3.11.7` < `3.12`); `None` when either is
/// not one.
fn release_cmp(a: &str, b: &str) -> Option<std::cmp::Ordering> {
    let nums = |s: &str| -> Option<Vec<u64>> { s.split('.').map(|p| p.parse().ok()).collect() };
    let (mut x, mut y) = (nums(a)?, nums(b)?);
    let n = x.len().max(y.len());
    x.resize(n, 0);
    y.resize(n, 0);
    Some(x.cmp(&y))
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Str(String),
    Var(String),
    Op(String),
    And,
    Or,
    Open,
    Close,
}

fn tokens(m: &str) -> Result<Vec<Tok>, String> {
    let c: Vec<char> = m.chars().collect();
    let mut i = 0;
    let mut out = Vec::new();
    while i < c.len() {
        let ch = c[i];
        if ch.is_whitespace() {
            i += 1;
        } else if ch == '(' || ch == ')' {
            out.push(if ch == '(' { Tok::Open } else { Tok::Close });
            i += 1;
        } else if ch == '"' || ch == '\'' {
            let end = c[i + 1..]
                .iter()
                .position(|&x| x == ch)
                .ok_or_else(|| format!("marker {m:?}: unterminated string"))?;
            out.push(Tok::Str(c[i + 1..i + 1 + end].iter().collect()));
            i += end + 2;
        } else if "=!<>~".contains(ch) {
            let mut j = i;
            while j < c.len() && "=!<>~".contains(c[j]) {
                j += 1;
            }
            out.push(Tok::Op(c[i..j].iter().collect()));
            i = j;
        } else {
            let mut j = i;
            while j < c.len() && (c[j].is_alphanumeric() || c[j] == '_' || c[j] == '.') {
                j += 1;
            }
            if j == i {
                return Err(format!("marker {m:?}: unexpected {ch:?}"));
            }
            let w: String = c[i..j].iter().collect();
            i = j;
            match w.as_str() {
                "and" => out.push(Tok::And),
                "or" => out.push(Tok::Or),
                "in" => out.push(Tok::Op("in".into())),
                "not" => out.push(Tok::Op("not".into())),
                _ => out.push(Tok::Var(w)),
            }
        }
    }
    // `not in` is one operator.
    let mut merged = Vec::new();
    let mut it = out.into_iter().peekable();
    while let Some(t) = it.next() {
        if t == Tok::Op("not".into()) && it.peek() == Some(&Tok::Op("in".into())) {
            it.next();
            merged.push(Tok::Op("not in".into()));
        } else {
            merged.push(t);
        }
    }
    Ok(merged)
}

struct Parser<'a> {
    toks: Vec<Tok>,
    at: usize,
    env: &'a Markers,
    text: &'a str,
}

impl Parser<'_> {
    fn err(&self, what: &str) -> String {
        format!("marker {:?}: {what}", self.text)
    }

    fn or(&mut self) -> Result<bool, String> {
        let mut v = self.and()?;
        while self.toks.get(self.at) == Some(&Tok::Or) {
            self.at += 1;
            v |= self.and()?;
        }
        Ok(v)
    }

    fn and(&mut self) -> Result<bool, String> {
        let mut v = self.atom()?;
        while self.toks.get(self.at) == Some(&Tok::And) {
            self.at += 1;
            v &= self.atom()?;
        }
        Ok(v)
    }

    fn value(&mut self) -> Result<(String, bool), String> {
        match self.toks.get(self.at).cloned() {
            Some(Tok::Str(s)) => {
                self.at += 1;
                Ok((s, false))
            }
            Some(Tok::Var(v)) => {
                self.at += 1;
                // `extra` is empty: a lock names what to install, not extras.
                let val = if v == "extra" {
                    String::new()
                } else {
                    self.env
                        .get(&v)
                        .cloned()
                        .ok_or_else(|| self.err(&format!("unknown variable {v}")))?
                };
                Ok((val, true))
            }
            _ => Err(self.err("expected a value")),
        }
    }

    fn atom(&mut self) -> Result<bool, String> {
        if self.toks.get(self.at) == Some(&Tok::Open) {
            self.at += 1;
            let v = self.or()?;
            if self.toks.get(self.at) != Some(&Tok::Close) {
                return Err(self.err("unbalanced parentheses"));
            }
            self.at += 1;
            return Ok(v);
        }
        let (l, _) = self.value()?;
        let Some(Tok::Op(op)) = self.toks.get(self.at).cloned() else {
            return Err(self.err("expected an operator"));
        };
        self.at += 1;
        let (r, _) = self.value()?;
        use std::cmp::Ordering::*;
        let cmp = release_cmp(&l, &r);
        Ok(match op.as_str() {
            "==" => cmp.map_or(l == r, |o| o == Equal),
            "!=" => cmp.map_or(l != r, |o| o != Equal),
            "===" => l == r,
            "<" => cmp == Some(Less),
            "<=" => matches!(cmp, Some(Less | Equal)),
            ">" => cmp == Some(Greater),
            ">=" => matches!(cmp, Some(Greater | Equal)),
            "~=" => {
                // ~=X.Y.Z: >= X.Y.Z and == X.Y.*
                let prefix: Vec<&str> = r.split('.').collect();
                let head = prefix[..prefix.len().saturating_sub(1).max(1)].join(".");
                matches!(cmp, Some(Greater | Equal))
                    && (l == head || l.starts_with(&format!("{head}.")))
            }
            "in" => r.contains(&l),
            "not in" => !r.contains(&l),
            o => return Err(self.err(&format!("unknown operator {o}"))),
        })
    }
}

/// Evaluate a PEP 508 environment marker for `env`.
pub fn evaluate(marker: &str, env: &Markers) -> Result<bool, String> {
    let mut p = Parser {
        toks: tokens(marker)?,
        at: 0,
        env,
        text: marker,
    };
    let v = p.or()?;
    if p.at != p.toks.len() {
        return Err(p.err("trailing words"));
    }
    Ok(v)
}

/// A wheel file name's project, version and tags (`py-abi-platform`, each of the dotted
/// sets expanded), or why it is not one.
pub fn wheel_name(file: &str) -> Result<(String, String, Vec<String>), String> {
    let stem = file
        .strip_suffix(".whl")
        .ok_or_else(|| format!("{file}: not a .whl"))?;
    let parts: Vec<&str> = stem.split('-').collect();
    if !(parts.len() == 5 || parts.len() == 6) {
        return Err(format!(
            "{file}: not NAME-VERSION[-BUILD]-PY-ABI-PLATFORM.whl"
        ));
    }
    let n = parts.len();
    let mut tags = Vec::new();
    for py in parts[n - 3].split('.') {
        for abi in parts[n - 2].split('.') {
            for plat in parts[n - 1].split('.') {
                tags.push(format!("{py}-{abi}-{plat}"));
            }
        }
    }
    Ok((parts[0].to_string(), parts[1].to_string(), tags))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> Markers {
        [
            ("python_version", "3.11"),
            ("python_full_version", "3.11.7"),
            ("sys_platform", "linux"),
            ("platform_machine", "x86_64"),
            ("os_name", "posix"),
            ("implementation_name", "cpython"),
            ("platform_system", "Linux"),
        ]
        .into_iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
    }

    #[test]
    fn markers_as_pep_508_evaluates_them() {
        let e = env();
        for (m, want) in [
            ("python_version >= '3.8'", true),
            ("python_version < \"3.10\"", false),
            (
                "python_full_version >= '3.11.5' and sys_platform == 'linux'",
                true,
            ),
            (
                "sys_platform == 'win32' or (os_name == 'posix' and platform_machine != 'arm64')",
                true,
            ),
            ("'linux' in sys_platform", true),
            ("platform_system not in 'Windows Darwin'", true),
            ("python_version ~= '3.9'", true),
            ("extra == 'test'", false),
        ] {
            assert_eq!(evaluate(m, &e), Ok(want), "{m}");
        }
        assert!(evaluate("python_version >=", &e).is_err());
        assert!(evaluate("nonsense == '1'", &e).is_err());
        assert!(evaluate("(python_version == '3.11'", &e).is_err());
    }

    #[test]
    fn requirements_with_hashes_are_read_and_markers_applied() {
        let text = "# comment\n--index-url https://x\nsix==1.17.0 \\\n    --hash=sha256:4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274 \\\n    --hash=sha256:ff70335d468e7eb6ec65b95b99d3a2836546063f63acc5171de367e834932a81\n    # via -r x\ncolorama==0.4.6 ; sys_platform == 'win32' --hash=sha256:4f1d9991f5acc0ca119f9d443620b77f9d6b33703e51011c16baf57afb285fc6\nAttrs[extra]==24.3.0 --hash=sha256:ac96cd038792094f438ad1f6ff80837353805ac950cd2aa0e0625ef19850c308\n";
        let l = read("requirements.txt", text, &env()).unwrap();
        assert_eq!(l.len(), 2, "{l:?}");
        assert_eq!(l["six"].sha256.len(), 2);
        assert_eq!(l["attrs"].version, "24.3.0");
        for bad in [
            "six>=1.0 --hash=sha256:4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274",
            "six==1.17.0",
            "-r other.txt",
            "pkg @ https://x/pkg.whl --hash=sha256:4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274",
            "six==1.17.0 --hash=sha256:4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274\nSix==1.16.0 --hash=sha256:4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274",
        ] {
            assert!(read("requirements.txt", bad, &env()).is_err(), "{bad}");
        }
    }

    #[test]
    fn pylock_entries_are_read_and_builds_refused() {
        let text = r#"
lock-version = "1.0"
created-by = "test"
[[packages]]
name = "six"
version = "1.17.0"
wheels = [{ name = "six-1.17.0-py2.py3-none-any.whl", url = "https://x/six-1.17.0-py2.py3-none-any.whl", hashes = { sha256 = "4721F391ED90541FDDACAB5ACF947AA0D3DC7D27B2E1E8EDA2BE8970586C3274" } }]
[[packages]]
name = "colorama"
version = "0.4.6"
marker = "sys_platform == 'win32'"
sdist = { name = "colorama-0.4.6.tar.gz", hashes = { sha256 = "00" } }
"#;
        let l = read("pylock.toml", text, &env()).unwrap();
        assert_eq!(l.len(), 1);
        assert_eq!(
            l["six"].files.as_deref(),
            Some(&["six-1.17.0-py2.py3-none-any.whl".to_string()][..])
        );
        assert_eq!(
            l["six"].sha256[0],
            "4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274"
        );
        let sdist = text.replace("marker = \"sys_platform == 'win32'\"\n", "");
        let e = read("pylock.toml", &sdist, &env()).unwrap_err();
        assert!(e.contains("colorama 0.4.6") && e.contains("sdist"), "{e}");
        assert!(read("pylock.toml", "lock-version = \"2.0\"\n", &env()).is_err());
    }

    #[test]
    fn wheel_names_and_tags() {
        let (n, v, t) = wheel_name("six-1.17.0-py2.py3-none-any.whl").unwrap();
        assert_eq!((n.as_str(), v.as_str()), ("six", "1.17.0"));
        assert_eq!(t, ["py2-none-any", "py3-none-any"]);
        let (_, _, t) =
            wheel_name("greenlet-3.1.1-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
                .unwrap();
        assert_eq!(
            t,
            [
                "cp312-cp312-manylinux_2_17_x86_64",
                "cp312-cp312-manylinux2014_x86_64"
            ]
        );
        assert!(wheel_name("x-1.0.tar.gz").is_err());
        assert!(wheel_name("x-1.0-py3.whl").is_err());
    }
}
