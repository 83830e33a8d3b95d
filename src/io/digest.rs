//! Content digests as OCI images name blobs (`sha256:<64 hex>`, `sha512:<128 hex>`), and
//! the hashing that checks them.
//!
//! A digest is parsed strictly (the algorithm, lower-case hex of the right length): it
//! names files inside an image layout, so a digest that is not one must never become a
//! path. Hashing goes through the `sha2` crate (SHA-NI or AVX2 code where the CPU has
//! them).

use std::fmt;

use sha2::Digest as _;

use crate::error::{Error, Result};

/// A digest algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// SHA-256: what images use.
    Sha256,
    /// SHA-512: allowed by the OCI specification.
    Sha512,
}

impl Algorithm {
    fn name(self) -> &'static str {
        match self {
            Algorithm::Sha256 => "sha256",
            Algorithm::Sha512 => "sha512",
        }
    }

    fn hex_len(self) -> usize {
        match self {
            Algorithm::Sha256 => 64,
            Algorithm::Sha512 => 128,
        }
    }
}

/// A content digest: `algorithm:hex`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Digest {
    algorithm: Algorithm,
    hex: String,
}

impl Digest {
    /// Parse `sha256:…` or `sha512:…` (lower-case hex of the algorithm's length).
    pub fn parse(s: &str) -> Result<Digest> {
        let bad = || Error::Format(format!("not a digest: {:?}", truncate(s)));
        let (alg, hex) = s.split_once(':').ok_or_else(bad)?;
        let algorithm = match alg {
            "sha256" => Algorithm::Sha256,
            "sha512" => Algorithm::Sha512,
            _ => {
                return Err(Error::Unsupported(format!(
                    "digest algorithm {:?}",
                    truncate(alg)
                )));
            }
        };
        if hex.len() != algorithm.hex_len()
            || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return Err(bad());
        }
        Ok(Digest {
            algorithm,
            hex: hex.to_string(),
        })
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The algorithm's name (`sha256`).
    pub fn algorithm_name(&self) -> &'static str {
        self.algorithm.name()
    }

    /// The hex part.
    pub fn hex(&self) -> &str {
        &self.hex
    }

    /// Where an OCI image layout keeps the blob: `blobs/<algorithm>/<hex>`.
    pub fn blob_path(&self) -> String {
        format!("blobs/{}/{}", self.algorithm.name(), self.hex)
    }

    /// The first 12 hex digits, as tools show digests.
    pub fn short(&self) -> &str {
        &self.hex[..12]
    }

    /// A hasher of this digest's algorithm.
    pub fn hasher(&self) -> Hasher {
        Hasher::new(self.algorithm)
    }

    /// Whether `bytes` have this digest.
    pub fn matches(&self, bytes: &[u8]) -> bool {
        let mut h = self.hasher();
        h.update(bytes);
        h.finish() == *self
    }

    /// An error unless `bytes` have this digest; `what` names them.
    pub fn check(&self, bytes: &[u8], what: &str) -> Result<()> {
        let mut h = self.hasher();
        h.update(bytes);
        let got = h.finish();
        if got == *self {
            Ok(())
        } else {
            Err(mismatch(what, self, &got))
        }
    }
}

/// The error of content that does not have its digest.
pub fn mismatch(what: &str, want: &Digest, got: &Digest) -> Error {
    Error::Corrupt(format!(
        "{what} does not match its digest: expected {want}, content has {got}"
    ))
}

fn truncate(s: &str) -> &str {
    let mut end = s.len().min(80);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.algorithm.name(), self.hex)
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A running hash of one algorithm.
#[derive(Clone)]
pub enum Hasher {
    /// SHA-256.
    Sha256(sha2::Sha256),
    /// SHA-512.
    Sha512(sha2::Sha512),
}

impl fmt::Debug for Hasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Hasher")
    }
}

impl Hasher {
    /// A new hash.
    pub fn new(algorithm: Algorithm) -> Hasher {
        match algorithm {
            Algorithm::Sha256 => Hasher::Sha256(sha2::Sha256::new()),
            Algorithm::Sha512 => Hasher::Sha512(sha2::Sha512::new()),
        }
    }

    /// Add bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        match self {
            Hasher::Sha256(h) => h.update(bytes),
            Hasher::Sha512(h) => h.update(bytes),
        }
    }

    /// The digest of everything added.
    pub fn finish(self) -> Digest {
        let (algorithm, bytes) = match self {
            Hasher::Sha256(h) => (Algorithm::Sha256, h.finalize().to_vec()),
            Hasher::Sha512(h) => (Algorithm::Sha512, h.finalize().to_vec()),
        };
        let hex = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Digest { algorithm, hex }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_parse_strictly_and_check_content() {
        let empty = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        let d = Digest::parse(empty).unwrap();
        assert_eq!(d.to_string(), empty);
        assert_eq!(d.blob_path(), format!("blobs/sha256/{}", &empty[7..]));
        assert_eq!(d.short(), "e3b0c44298fc");
        assert!(d.matches(b""));
        assert!(!d.matches(b"x"));
        let e = d.check(b"x", "layer 1").unwrap_err().to_string();
        assert!(e.contains("layer 1") && e.contains(empty), "{e}");
        for bad in [
            "",
            "sha256",
            "sha256:",
            "sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855",
            "sha256:../../../../etc/passwd",
            "sha256:e3b0",
            "md5:d41d8cd98f00b204e9800998ecf8427e",
        ] {
            assert!(Digest::parse(bad).is_err(), "{bad:?}");
        }
        let d512 = Digest::parse(&format!("sha512:{}", "0".repeat(128))).unwrap();
        assert!(!d512.matches(b""));
        let mut h = Hasher::new(Algorithm::Sha512);
        h.update(b"abc");
        assert!(h.finish().hex().starts_with("ddaf35a193617aba"));
    }
}
