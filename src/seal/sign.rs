//! Signatures of seals: SSHSIG (OpenSSH's `ssh-keygen -Y sign` format) by an ed25519 key,
//! namespace `pkgfs`, through the `ssh-key` crate; and the allowed-signers file of
//! `ssh-keygen -Y verify` (`ssh-keygen(1)`, "ALLOWED SIGNERS"), the keys a mount trusts.

use std::path::Path;

use ssh_key::{HashAlg, LineEnding, PrivateKey, PublicKey, SshSig};

use crate::error::{Error, Result};

/// The SSHSIG namespace of seals: a signature made for anything else does not verify.
pub const NAMESPACE: &str = "pkgfs";

/// Sign `msg` with the OpenSSH private key in `key` (unencrypted; ed25519 or any key
/// type OpenSSH signs with): the armored SSHSIG.
pub fn sign(key: &Path, msg: &[u8]) -> Result<String> {
    let k = PrivateKey::read_openssh_file(key).map_err(|e| {
        Error::Format(format!(
            "{}: not an OpenSSH private key: {e}",
            key.display()
        ))
    })?;
    if k.is_encrypted() {
        return Err(Error::Unsupported(format!(
            "{}: the key is encrypted; give an unencrypted copy (or use ssh-keygen -Y sign \
             -n pkgfs, which writes the same signature)",
            key.display()
        )));
    }
    let sig = k
        .sign(NAMESPACE, HashAlg::Sha512, msg)
        .map_err(|e| Error::Format(format!("signing with {}: {e}", key.display())))?;
    sig.to_pem(LineEnding::LF)
        .map_err(|e| Error::Format(format!("encoding the signature: {e}")))
}

/// One line of an allowed-signers file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signer {
    /// The principals (`user@example.com`, patterns as written).
    pub principals: String,
    /// The namespaces it may sign for (`None`: any).
    pub namespaces: Option<Vec<String>>,
    /// Valid from / until (seconds since the epoch), when limited.
    pub valid_after: Option<i64>,
    /// See [`Signer::valid_after`].
    pub valid_before: Option<i64>,
    /// Its key.
    pub key: PublicKey,
}

/// The keys a mount trusts: an allowed-signers file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedSigners(pub Vec<Signer>);

impl AllowedSigners {
    /// Read `path`.
    pub fn read(path: &Path) -> Result<AllowedSigners> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Io(e).with_path(path))?;
        Self::parse(&text).map_err(|e| e.with_path(path))
    }

    /// Parse the text of an allowed-signers file. Certificate authorities
    /// (`cert-authority`) are refused: seals are signed by plain keys.
    pub fn parse(text: &str) -> Result<AllowedSigners> {
        let mut out = Vec::new();
        for (n, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |m: &str| Error::Format(format!("allowed signers, line {}: {m}", n + 1));
            let (principals, rest) = split_field(line);
            let mut rest = rest;
            let mut signer_opts = (None, None, None);
            // Options until the key type.
            loop {
                let (field, after) = split_field(rest);
                if field.is_empty() {
                    return Err(bad("no key"));
                }
                if field.starts_with("ssh-")
                    || field.starts_with("ecdsa-")
                    || field.starts_with("sk-")
                {
                    break;
                }
                for opt in split_options(field) {
                    let (k, v) = opt.split_once('=').unwrap_or((opt.as_str(), ""));
                    let v = v.trim_matches('"');
                    match k.to_ascii_lowercase().as_str() {
                        "namespaces" => {
                            signer_opts.0 = Some(v.split(',').map(str::to_string).collect())
                        }
                        "valid-after" => {
                            signer_opts.1 =
                                Some(timestamp(v).ok_or_else(|| bad("bad valid-after"))?)
                        }
                        "valid-before" => {
                            signer_opts.2 =
                                Some(timestamp(v).ok_or_else(|| bad("bad valid-before"))?)
                        }
                        "cert-authority" => {
                            return Err(bad("cert-authority keys are not supported"));
                        }
                        other => return Err(bad(&format!("unknown option {other:?}"))),
                    }
                }
                rest = after;
            }
            let key = PublicKey::from_openssh(rest)
                .map_err(|e| bad(&format!("not a public key: {e}")))?;
            out.push(Signer {
                principals: principals.to_string(),
                namespaces: signer_opts.0,
                valid_after: signer_opts.1,
                valid_before: signer_opts.2,
                key,
            });
        }
        if out.is_empty() {
            return Err(Error::Format("allowed signers: no key".into()));
        }
        Ok(AllowedSigners(out))
    }

    /// Check the armored signature `sig` of `msg`: the principals of the allowed signer
    /// whose key made it, or why not.
    pub fn verify(&self, msg: &[u8], sig: &[u8]) -> Result<String> {
        let sig = std::str::from_utf8(sig)
            .ok()
            .and_then(|s| SshSig::from_pem(s).ok())
            .ok_or_else(|| Error::Format("the signature is not an SSH signature".into()))?;
        if sig.namespace() != NAMESPACE {
            return Err(Error::Corrupt(format!(
                "the signature is for namespace {:?}, not {NAMESPACE:?}",
                sig.namespace()
            )));
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let fingerprint = sig.public_key().fingerprint(HashAlg::Sha256);
        let signer = self
            .0
            .iter()
            .find(|s| s.key.key_data() == sig.public_key())
            .ok_or_else(|| {
                Error::Corrupt(format!(
                    "signed by {fingerprint}, which is not an allowed signer"
                ))
            })?;
        if signer
            .namespaces
            .as_ref()
            .is_some_and(|ns| !ns.iter().any(|n| n == NAMESPACE))
        {
            return Err(Error::Corrupt(format!(
                "{} ({fingerprint}) may not sign for namespace {NAMESPACE:?}",
                signer.principals
            )));
        }
        if signer.valid_after.is_some_and(|t| now < t)
            || signer.valid_before.is_some_and(|t| now >= t)
        {
            return Err(Error::Corrupt(format!(
                "{} ({fingerprint}) is not valid now",
                signer.principals
            )));
        }
        signer.key.verify(NAMESPACE, msg, &sig).map_err(|_| {
            Error::Corrupt(format!(
                "the signature by {} does not match the seal",
                signer.principals
            ))
        })?;
        Ok(signer.principals.clone())
    }
}

/// The first space-separated field (quotes keep spaces), and the rest.
fn split_field(s: &str) -> (&str, &str) {
    let s = s.trim_start();
    let mut quoted = false;
    for (i, c) in s.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ' ' | '\t' if !quoted => return (&s[..i], s[i..].trim_start()),
            _ => {}
        }
    }
    (s, "")
}

/// Comma-separated options, quotes kept together.
fn split_options(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in s.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                cur.push(c);
            }
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// `YYYYMMDD[HHMM[SS]]` (ssh-keygen's form, UTC with a `Z`), seconds since the epoch.
fn timestamp(v: &str) -> Option<i64> {
    let v = v.trim_end_matches(['Z', 'z']);
    if !(8..=14).contains(&v.len()) || !v.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let n = |a: usize, b: usize| v.get(a..b).map_or(Some(0), |s| s.parse::<i64>().ok());
    let (y, m, d) = (n(0, 4)?, n(4, 6)?, n(6, 8)?);
    let (hh, mm, ss) = (n(8, 10)?, n(10, 12)?, n(12, 14)?);
    let date = chrono::NaiveDate::from_ymd_opt(y as i32, m as u32, d as u32)?;
    let t = date.and_hms_opt(hh as u32, mm as u32, ss as u32)?;
    Some(t.and_utc().timestamp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_signers_lines_parse_as_ssh_keygen_reads_them() {
        let key =
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHn6cwq1A/4g+jTT1tqYdtEpo3ZCAH6WU0nHd5kZUwzN";
        let text = format!(
            "# trusted\n\nme@example.com,ci@example.com namespaces=\"pkgfs,file\",valid-after=\"20200101\" {key} comment\n\
             other@x {key}\n"
        );
        let a = AllowedSigners::parse(&text).unwrap();
        assert_eq!(a.0.len(), 2);
        assert_eq!(a.0[0].principals, "me@example.com,ci@example.com");
        assert_eq!(
            a.0[0].namespaces.as_deref(),
            Some(&["pkgfs".to_string(), "file".into()][..])
        );
        assert_eq!(a.0[0].valid_after, Some(1_577_836_800));
        assert!(a.0[1].namespaces.is_none());
        assert!(AllowedSigners::parse(&format!("x cert-authority {key}")).is_err());
        assert!(AllowedSigners::parse("x ssh-ed25519 notbase64").is_err());
        assert!(AllowedSigners::parse("# nothing\n").is_err());
    }
}
