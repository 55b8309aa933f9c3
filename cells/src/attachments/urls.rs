//! Signed URLs of the local file store. A URL names the method, the object
//! key, the part (0: the whole object), the exact length a PUT must carry
//! and an expiry; the cell's key signs all of them (HMAC-SHA256), so a URL
//! cannot be bent to another object, part, size or time.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::sigv4::hex;

/// What a signed URL allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub method: String,
    pub key: String,
    pub part: u32,
    pub len: u64,
    pub expires_ms: u64,
}

/// Why a URL is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Malformed,
    BadSignature,
    Expired,
}

impl Refusal {
    pub fn reason(self) -> cellmesh_proto::reason::Reason {
        use cellmesh_proto::reason::Reason;
        match self {
            Self::Malformed => Reason::MalformedRequest,
            Self::BadSignature => Reason::BadSignature,
            Self::Expired => Reason::SignatureExpired,
        }
    }
}

#[derive(Clone)]
pub struct UrlSigner {
    key: Vec<u8>,
}

impl UrlSigner {
    pub fn new(key: Vec<u8>) -> Self {
        Self { key }
    }

    /// Loads the signing key from `path`, creating it (32 random bytes,
    /// owner-only) on first start.
    pub fn load_or_create(path: &std::path::Path) -> std::io::Result<Self> {
        match std::fs::read(path) {
            Ok(key) if key.len() >= 16 => return Ok(Self::new(key)),
            Ok(_) => {
                return Err(std::io::Error::other(format!(
                    "{}: a signing key has at least 16 bytes",
                    path.display()
                )));
            }
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            Err(_) => {}
        }
        let key: [u8; 32] = rand::random();
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let tmp = path.with_extension("tmp");
        {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            file.write_all(&key)?;
            file.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        Ok(Self::new(key.to_vec()))
    }

    fn signature(&self, g: &Grant) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("any key length");
        mac.update(
            format!(
                "{}\n{}\n{}\n{}\n{}",
                g.method, g.key, g.part, g.len, g.expires_ms
            )
            .as_bytes(),
        );
        hex(&mac.finalize().into_bytes())
    }

    /// `base/v1/files/<key>?part=..&len=..&exp=..&sig=..`
    pub fn url(
        &self,
        base: &str,
        method: &str,
        key: &str,
        part: u32,
        len: u64,
        expires_ms: u64,
    ) -> String {
        let grant = Grant {
            method: method.into(),
            key: key.into(),
            part,
            len,
            expires_ms,
        };
        format!(
            "{base}/v1/files/{key}?part={part}&len={len}&exp={expires_ms}&sig={}",
            self.signature(&grant)
        )
    }

    /// The grant a request (method, key, raw query) carries, if its
    /// signature holds and it has not expired at `now_ms`.
    pub fn verify(
        &self,
        method: &str,
        key: &str,
        query: &str,
        now_ms: u64,
    ) -> Result<Grant, Refusal> {
        let mut part = None;
        let mut len = None;
        let mut exp = None;
        let mut sig = None;
        for pair in query.split('&') {
            let (k, v) = pair.split_once('=').ok_or(Refusal::Malformed)?;
            match k {
                "part" => part = v.parse::<u32>().ok(),
                "len" => len = v.parse::<u64>().ok(),
                "exp" => exp = v.parse::<u64>().ok(),
                "sig" => sig = Some(v),
                _ => {}
            }
        }
        let (Some(part), Some(len), Some(expires_ms), Some(sig)) = (part, len, exp, sig) else {
            return Err(Refusal::Malformed);
        };
        if key.is_empty()
            || key
                .split('/')
                .any(|s| s.is_empty() || s == "." || s == "..")
        {
            return Err(Refusal::Malformed);
        }
        let grant = Grant {
            method: method.into(),
            key: key.into(),
            part,
            len,
            expires_ms,
        };
        let expected = self.signature(&grant);
        // Constant-time comparison.
        let same = expected.len() == sig.len()
            && expected
                .bytes()
                .zip(sig.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if !same {
            return Err(Refusal::BadSignature);
        }
        if now_ms > expires_ms {
            return Err(Refusal::Expired);
        }
        Ok(grant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(url: &str) -> (&str, &str) {
        let (path, query) = url.split_once('?').unwrap();
        (path.trim_start_matches("http://h/v1/files/"), query)
    }

    #[test]
    fn a_url_grants_exactly_what_it_names_until_it_expires() {
        let signer = UrlSigner::new(vec![7; 32]);
        let url = signer.url("http://h", "PUT", "t1/c2/u3", 2, 1024, 10_000);
        let (key, q) = query(&url);
        let grant = signer.verify("PUT", key, q, 9_999).unwrap();
        assert_eq!((grant.part, grant.len), (2, 1024));
        assert_eq!(signer.verify("PUT", key, q, 10_001), Err(Refusal::Expired));
        // Another method, object, part, size or key: refused.
        assert_eq!(signer.verify("GET", key, q, 0), Err(Refusal::BadSignature));
        assert_eq!(
            signer.verify("PUT", "t1/c2/u4", q, 0),
            Err(Refusal::BadSignature)
        );
        let bent = q.replace("part=2", "part=3");
        assert_eq!(
            signer.verify("PUT", key, &bent, 0),
            Err(Refusal::BadSignature)
        );
        let longer = q.replace("len=1024", "len=4096");
        assert_eq!(
            signer.verify("PUT", key, &longer, 0),
            Err(Refusal::BadSignature)
        );
        let later = q.replace("exp=10000", "exp=99999");
        assert_eq!(
            signer.verify("PUT", key, &later, 0),
            Err(Refusal::BadSignature)
        );
        let other = UrlSigner::new(vec![8; 32]);
        assert_eq!(other.verify("PUT", key, q, 0), Err(Refusal::BadSignature));
        assert_eq!(
            signer.verify("PUT", key, "part=1", 0),
            Err(Refusal::Malformed)
        );
        assert_eq!(
            signer.verify("PUT", "../etc", q, 0),
            Err(Refusal::Malformed)
        );
    }

    #[test]
    fn the_key_is_created_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let a = UrlSigner::load_or_create(&path).unwrap();
        let b = UrlSigner::load_or_create(&path).unwrap();
        assert_eq!(a.key, b.key);
        assert_eq!(a.key.len(), 32);
    }
}
