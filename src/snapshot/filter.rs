//! containerd's filter language, as `List` receives it: `ctr snapshots ls`, containerd's
//! garbage collector and remote-snapshot clients send these strings unchanged.
//!
//! A filter is a comma-separated list of selectors that must all match (AND); a request's
//! several filters match if any of them does (OR); no filter matches everything. A
//! selector is `FIELDPATH`, `FIELDPATH==VALUE`, `FIELDPATH!=VALUE` or
//! `FIELDPATH~=REGEX`:
//!
//! ```text
//! selectors := selector ("," selector)*
//! selector  := fieldpath (operator value)?
//! fieldpath := field ("." field)*
//! field     := quoted | [A-Za-z0-9_]+
//! operator  := "==" | "!=" | "~="
//! value     := quoted | [^\s,]+
//! quoted    := "…" (Go escapes), and for ~= also /…/ or |…|
//! ```
//!
//! The grammar, the scanner's quirks (a value runs to the next comma or space; a
//! selector with no operator tests presence; `!=` also matches an absent field; a
//! regular expression that does not compile matches nothing) and the snapshot fields
//! (`name`, `parent`, `kind` as `view`/`active`/`committed`, `labels.KEY` with the key's
//! remaining components joined by dots, so `labels."containerd.io/gc.root"` and
//! `labels.a.b` both work) follow containerd 1.6's `filters` package and
//! `metadata/adaptors.go`. The fields come from a [`Fields`] implementation, so this
//! module knows nothing of snapshots beyond that.

use std::borrow::Cow;

use regex::Regex;

/// A filter string that does not parse: containerd answers `InvalidArgument`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("filter {input:?} at byte {pos}: {msg}")]
pub struct FilterError {
    /// The filter as given.
    pub input: String,
    /// Where parsing stopped.
    pub pos: usize,
    /// What was expected there.
    pub msg: String,
}

/// What a filter reads of an object: the value at a field path, if the object has one.
pub trait Fields {
    /// The value at `path` (`["labels", "containerd.io/gc.root"]`), or `None` if absent.
    fn field(&self, path: &[String]) -> Option<Cow<'_, str>>;
}

/// Several filters, any of which may match (an empty list matches everything).
#[derive(Debug, Clone, Default)]
pub struct Filters(Vec<Vec<Selector>>);

/// One selector: a field path and what to test of its value.
#[derive(Debug, Clone)]
pub struct Selector {
    path: Vec<String>,
    op: Op,
}

#[derive(Debug, Clone)]
enum Op {
    Present,
    Equal(String),
    NotEqual(String),
    /// `None`: the expression did not compile, and matches nothing (as containerd).
    Matches(Option<Regex>),
}

impl Filters {
    /// Parse every filter string of a request.
    pub fn parse_all<S: AsRef<str>>(filters: &[S]) -> Result<Filters, FilterError> {
        filters
            .iter()
            .map(|f| Parser::new(f.as_ref()).selectors())
            .collect::<Result<_, _>>()
            .map(Filters)
    }

    /// Whether `obj` passes: some filter has every selector matching.
    pub fn matches(&self, obj: &impl Fields) -> bool {
        self.0.is_empty() || self.0.iter().any(|all| all.iter().all(|s| s.matches(obj)))
    }
}

impl Selector {
    fn matches(&self, obj: &impl Fields) -> bool {
        let value = obj.field(&self.path);
        match &self.op {
            Op::Present => value.is_some(),
            Op::Equal(want) => value.is_some_and(|v| v == want.as_str()),
            // containerd compares the absent field as "": it matches `!=x`.
            Op::NotEqual(want) => value.as_deref().unwrap_or("") != want.as_str(),
            Op::Matches(Some(re)) => re.is_match(value.as_deref().unwrap_or("")),
            Op::Matches(None) => false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Eof,
    Quoted(String),
    Separator(char),
    Operator(String),
    Value(String),
    Field(String),
    Illegal(String),
    Other(char),
}

/// containerd's scanner and recursive-descent parser, over one filter string.
struct Parser<'a> {
    input: &'a str,
    /// Byte offset of the next character.
    at: usize,
    /// After an operator: the next unquoted run is a value, not a field.
    value: bool,
}

impl<'a> Parser<'a> {
    fn new(input: &'a str) -> Self {
        Parser {
            input,
            at: 0,
            value: false,
        }
    }

    fn err(&self, pos: usize, msg: impl Into<String>) -> FilterError {
        FilterError {
            input: self.input.to_string(),
            pos,
            msg: msg.into(),
        }
    }

    fn next_char(&mut self) -> Option<char> {
        let c = self.input[self.at..].chars().next()?;
        self.at += c.len_utf8();
        Some(c)
    }

    /// The next character, not consumed (spaces included, as containerd's `peek`).
    fn peek(&self) -> Option<char> {
        self.input[self.at..].chars().next()
    }

    fn take_while(&mut self, keep: impl Fn(char) -> bool) {
        while self.peek().is_some_and(&keep) {
            self.at += self.peek().map_or(0, char::len_utf8);
        }
    }

    fn scan(&mut self) -> (usize, Token) {
        loop {
            let pos = self.at;
            let Some(c) = self.next_char() else {
                return (pos, Token::Eof);
            };
            let tok = match c {
                '/' | '|' | '"' => match self.scan_quoted(c) {
                    Ok(()) => Token::Quoted(self.input[pos..self.at].to_string()),
                    Err(msg) => Token::Illegal(msg),
                },
                ',' | '.' => {
                    self.value = false;
                    Token::Separator(c)
                }
                '=' | '!' | '~' => {
                    self.take_while(|c| matches!(c, '=' | '!' | '~'));
                    self.value = true;
                    Token::Operator(self.input[pos..self.at].to_string())
                }
                c if c.is_whitespace() => continue,
                _ if self.value => {
                    self.take_while(is_value_char);
                    self.value = false;
                    Token::Value(self.input[pos..self.at].to_string())
                }
                c if is_field_char(c) => {
                    self.take_while(is_field_char);
                    Token::Field(self.input[pos..self.at].to_string())
                }
                c => Token::Other(c),
            };
            return (pos, tok);
        }
    }

    fn scan_quoted(&mut self, quote: char) -> Result<(), String> {
        loop {
            match self.next_char() {
                None | Some('\n') => return Err("quoted literal not terminated".into()),
                Some(c) if c == quote => return Ok(()),
                Some('\\') => {
                    // Checked again, and decoded, by `unquote`.
                    self.next_char();
                }
                Some(_) => {}
            }
        }
    }

    fn selectors(&mut self) -> Result<Vec<Selector>, FilterError> {
        let mut all = vec![self.selector()?];
        loop {
            match self.peek() {
                Some(',') => {
                    self.scan();
                    all.push(self.selector()?);
                }
                None => return Ok(all),
                Some(c) => return Err(self.err(self.at, format!("unexpected input: {c}"))),
            }
        }
    }

    fn selector(&mut self) -> Result<Selector, FilterError> {
        let path = self.fieldpath()?;
        if matches!(self.peek(), None | Some(',' | '.')) {
            return Ok(Selector {
                path,
                op: Op::Present,
            });
        }
        let (pos, tok) = self.scan();
        let op = match tok {
            Token::Operator(op) => op,
            Token::Illegal(msg) => return Err(self.err(pos, msg)),
            _ => return Err(self.err(pos, r#"expected an operator ("=="|"!="|"~=")"#)),
        };
        let regex = match op.as_str() {
            "==" | "!=" => false,
            "~=" => true,
            _ => return Err(self.err(pos, format!("unsupported operator {op:?}"))),
        };
        let (pos, tok) = self.scan();
        let value = match tok {
            Token::Value(v) | Token::Field(v) => v,
            Token::Quoted(q) => self.unquote(pos, &q, regex)?,
            Token::Illegal(msg) => return Err(self.err(pos, msg)),
            Token::Eof => return Err(self.err(pos, "unexpected end of filter")),
            _ => return Err(self.err(pos, "expected value or quoted")),
        };
        let op = match op.as_str() {
            "==" => Op::Equal(value),
            "!=" => Op::NotEqual(value),
            _ => Op::Matches(Regex::new(&value).ok()),
        };
        Ok(Selector { path, op })
    }

    fn fieldpath(&mut self) -> Result<Vec<String>, FilterError> {
        let mut path = vec![self.field()?];
        while self.peek() == Some('.') {
            self.scan();
            path.push(self.field()?);
        }
        Ok(path)
    }

    fn field(&mut self) -> Result<String, FilterError> {
        match self.scan() {
            (_, Token::Field(f)) => Ok(f),
            (pos, Token::Quoted(q)) => self.unquote(pos, &q, false),
            (pos, Token::Illegal(msg)) => Err(self.err(pos, msg)),
            (pos, _) => Err(self.err(pos, "expected field or quoted")),
        }
    }

    /// A quoted literal's text: `"…"` always, `/…/` and `|…|` only as a regular
    /// expression; Go's escapes (`\n`, `\\`, `\"`, `\x41`, `\101`, `\u00e9`…).
    fn unquote(&self, pos: usize, quoted: &str, alt: bool) -> Result<String, FilterError> {
        let bad = |msg: &str| self.err(pos, format!("unquoting failed: {msg}"));
        let mut chars = quoted.chars();
        let quote = chars.next().ok_or_else(|| bad("empty"))?;
        if quote != '"' && !alt {
            return Err(self.err(pos, "invalid quote encountered"));
        }
        let body = &quoted[quote.len_utf8()..];
        let body = body
            .strip_suffix(quote)
            .ok_or_else(|| bad("unterminated"))?;
        let mut out = String::with_capacity(body.len());
        let mut it = body.chars();
        while let Some(c) = it.next() {
            if c == quote {
                return Err(bad("unescaped quote"));
            }
            if c != '\\' {
                out.push(c);
                continue;
            }
            let e = it.next().ok_or_else(|| bad("trailing backslash"))?;
            let mut hex = |n: usize| -> Result<char, FilterError> {
                let digits: String = it.by_ref().take(n).collect();
                u32::from_str_radix(&digits, 16)
                    .ok()
                    .filter(|_| digits.len() == n)
                    .and_then(char::from_u32)
                    .ok_or_else(|| bad("bad escape"))
            };
            out.push(match e {
                'a' => '\x07',
                'b' => '\x08',
                'f' => '\x0c',
                'n' => '\n',
                'r' => '\r',
                't' => '\t',
                'v' => '\x0b',
                '\\' => '\\',
                'x' => hex(2)?,
                'u' => hex(4)?,
                'U' => hex(8)?,
                '0'..='7' => {
                    let rest: String = it.by_ref().take(2).collect();
                    let digits = format!("{e}{rest}");
                    u32::from_str_radix(&digits, 8)
                        .ok()
                        .filter(|v| digits.len() == 3 && *v <= 0xff)
                        .and_then(char::from_u32)
                        .ok_or_else(|| bad("bad octal escape"))?
                }
                c if c == quote => c,
                _ => return Err(bad("illegal escape sequence")),
            });
        }
        Ok(out)
    }
}

fn is_field_char(c: char) -> bool {
    c == '_' || c.is_ascii_alphanumeric()
}

fn is_value_char(c: char) -> bool {
    c != ',' && !c.is_whitespace() && !c.is_control()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A snapshot as the adaptor sees one.
    struct Obj {
        name: &'static str,
        parent: &'static str,
        kind: &'static str,
        labels: BTreeMap<String, String>,
    }

    impl Fields for Obj {
        fn field(&self, path: &[String]) -> Option<Cow<'_, str>> {
            match path.first().map(String::as_str) {
                Some("name") => Some(self.name.into()),
                Some("parent") => Some(self.parent.into()),
                Some("kind") => Some(self.kind.into()),
                Some("labels") => self.labels.get(&path[1..].join(".")).map(|v| v.into()),
                _ => None,
            }
        }
    }

    fn obj(name: &'static str, parent: &'static str, labels: &[(&str, &str)]) -> Obj {
        Obj {
            name,
            parent,
            kind: "committed",
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn matches(filters: &[&str], o: &Obj) -> bool {
        Filters::parse_all(filters).unwrap().matches(o)
    }

    #[test]
    fn equality_inequality_and_presence() {
        let o = obj(
            "default/4/sha256:abc",
            "",
            &[("containerd.io/gc.root", "x")],
        );
        assert!(matches(&[], &o), "no filter matches everything");
        assert!(matches(&["name==default/4/sha256:abc"], &o));
        assert!(matches(&["name == default/4/sha256:abc"], &o));
        assert!(!matches(&["name==other"], &o));
        assert!(matches(&["name!=other"], &o));
        assert!(matches(&["kind==committed"], &o));
        assert!(!matches(&["kind==active"], &o));
        assert!(matches(&[r#"labels."containerd.io/gc.root""#], &o));
        assert!(matches(&[r#"labels."containerd.io/gc.root"==x"#], &o));
        assert!(!matches(&["labels.missing"], &o));
        // An absent field is "" to !=, so it matches.
        assert!(matches(&["labels.missing!=x"], &o));
        // parent is always present, possibly empty.
        assert!(matches(&["parent"], &o));
        assert!(matches(&[r#"parent=="""#], &o));
        assert!(!matches(&["unknownfield"], &o));
    }

    #[test]
    fn label_keys_join_their_components_with_dots() {
        let o = obj(
            "n",
            "",
            &[("a.b.c", "1"), ("containerd.io/snapshot.ref", "r")],
        );
        assert!(matches(&["labels.a.b.c==1"], &o));
        assert!(matches(&[r#"labels."a.b".c==1"#], &o));
        assert!(matches(&[r#"labels."containerd.io/snapshot.ref"==r"#], &o));
    }

    #[test]
    fn commas_are_and_and_several_filters_are_or() {
        let o = obj("n", "p", &[("k", "v")]);
        assert!(matches(&["name==n,parent==p"], &o));
        assert!(!matches(&["name==n,parent==q"], &o));
        assert!(matches(&["name==x", "parent==p"], &o));
        assert!(!matches(&["name==x", "parent==q"], &o));
        assert!(matches(&["name==x", "labels.k==v,kind==committed"], &o));
    }

    #[test]
    fn regular_expressions_with_their_quotes() {
        let o = obj("default/12/sha256:0123", "", &[("k", "hello world")]);
        assert!(matches(&["name~=sha256"], &o));
        assert!(matches(&["name~=|^default/[0-9]+/sha|"], &o));
        assert!(matches(&["labels.k~=/wor.d$/"], &o));
        assert!(matches(&[r#"labels.k~="^hello""#], &o));
        assert!(!matches(&["name~=^sha256"], &o));
        // A regex that does not compile matches nothing (containerd logs it).
        assert!(!matches(&["name~=(("], &o));
    }

    #[test]
    fn quoted_values_take_escapes() {
        let o = obj("a,b \"c\"", "", &[]);
        assert!(matches(&[r#"name=="a,b \"c\"""#], &o));
        assert!(matches(&[r#"name=="\x61,b \u0022c\042""#], &o));
    }

    #[test]
    fn bad_filters_are_refused_with_a_position() {
        for bad in [
            "",
            "name==",
            "name=x",
            "name<>x",
            "name==a b",
            "==x",
            "labels.",
            r#"name=="unterminated"#,
            r#"name=="bad \q escape""#,
            "name==/slashes only for regex/",
            "name==a,",
        ] {
            let e = Filters::parse_all(&[bad]);
            assert!(e.is_err(), "{bad:?} parsed");
        }
        let e = Filters::parse_all(&["name=x"]).unwrap_err();
        assert_eq!(e.pos, 4, "{e}");
        assert!(e.to_string().contains("name=x"));
    }
}
