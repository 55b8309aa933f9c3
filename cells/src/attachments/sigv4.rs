//! AWS Signature Version 4 query-string signing (presigned URLs) for the S3
//! requests clients make directly: a PUT of one object, a PUT of one part
//! of a multipart upload (whose `partNumber` and `uploadId` the signature
//! covers), a GET. Also used by the cell for the one S3 call object_store
//! lacks (ListParts).

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

#[derive(Debug, Clone)]
pub struct Credentials {
    pub key_id: String,
    pub secret: String,
    pub token: Option<String>,
}

/// Signs URLs of one bucket.
#[derive(Debug, Clone)]
pub struct Presigner {
    pub credentials: Credentials,
    pub region: String,
    /// `scheme://host[:port]`, and whether the bucket is a path segment
    /// (an explicit endpoint) or a host name (AWS).
    base: String,
    path_style: bool,
    pub bucket: String,
}

impl Presigner {
    /// `endpoint` empty: AWS's virtual-hosted endpoint for `region`.
    pub fn new(credentials: Credentials, region: &str, endpoint: &str, bucket: &str) -> Self {
        let region = if region.is_empty() {
            "us-east-1"
        } else {
            region
        };
        if endpoint.is_empty() {
            let base = format!("https://{bucket}.s3.{region}.amazonaws.com");
            return Self::virtual_hosted(credentials, region, &base, bucket);
        }
        Self {
            credentials,
            region: region.to_string(),
            base: endpoint.trim_end_matches('/').to_string(),
            path_style: true,
            bucket: bucket.to_string(),
        }
    }

    /// Signs URLs of `base` (`https://<bucket>.<host>`): the bucket is in
    /// the host name.
    pub fn virtual_hosted(
        credentials: Credentials,
        region: &str,
        base: &str,
        bucket: &str,
    ) -> Self {
        Self {
            credentials,
            region: region.to_string(),
            base: base.to_string(),
            path_style: false,
            bucket: bucket.to_string(),
        }
    }

    /// A URL for `method` on `key` with `query` (unsigned pairs the request
    /// carries), valid for `expires_secs` from `now_secs`.
    pub fn sign(
        &self,
        method: &str,
        key: &str,
        query: &[(&str, String)],
        now_secs: u64,
        expires_secs: u64,
    ) -> String {
        let path = if self.path_style {
            format!("/{}/{}", encode(&self.bucket, true), encode(key, false))
        } else {
            format!("/{}", encode(key, false))
        };
        let host = self
            .base
            .split_once("://")
            .map(|(_, h)| h)
            .unwrap_or(&self.base);
        let (date, stamp) = amz_date(now_secs);
        let scope = format!("{date}/{}/s3/aws4_request", self.region);
        let mut pairs: Vec<(String, String)> = query
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        pairs.push(("X-Amz-Algorithm".into(), "AWS4-HMAC-SHA256".into()));
        pairs.push((
            "X-Amz-Credential".into(),
            format!("{}/{scope}", self.credentials.key_id),
        ));
        pairs.push(("X-Amz-Date".into(), stamp.clone()));
        pairs.push(("X-Amz-Expires".into(), expires_secs.to_string()));
        pairs.push(("X-Amz-SignedHeaders".into(), "host".into()));
        if let Some(token) = &self.credentials.token {
            pairs.push(("X-Amz-Security-Token".into(), token.clone()));
        }
        let mut encoded: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (encode(k, true), encode(v, true)))
            .collect();
        encoded.sort();
        let canonical_query = encoded
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&");
        let canonical_request =
            format!("{method}\n{path}\n{canonical_query}\nhost:{host}\n\nhost\nUNSIGNED-PAYLOAD");
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{}",
            hex(&Sha256::digest(canonical_request.as_bytes()))
        );
        let mut signing_key = format!("AWS4{}", self.credentials.secret).into_bytes();
        for part in [date.as_str(), self.region.as_str(), "s3", "aws4_request"] {
            signing_key = mac(&signing_key, part.as_bytes());
        }
        let signature = hex(&mac(&signing_key, to_sign.as_bytes()));
        format!(
            "{}{path}?{canonical_query}&X-Amz-Signature={signature}",
            self.base
        )
    }
}

fn mac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// URI encoding as SigV4 wants it: unreserved characters kept, `/` kept in
/// paths (`slash` false) and encoded elsewhere.
fn encode(s: &str, slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b'/' if !slash => out.push('/'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// (`YYYYMMDD`, `YYYYMMDDTHHMMSSZ`) of a Unix time.
fn amz_date(secs: u64) -> (String, String) {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let date = format!("{year:04}{month:02}{day:02}");
    let stamp = format!(
        "{date}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    );
    (date, stamp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_aws_documentation_example() {
        // "Authenticating Requests: Using Query Parameters (AWS Signature
        // Version 4)", example: GET examplebucket/test.txt, 2013-05-24,
        // valid for 86400 s.
        let signer = Presigner::virtual_hosted(
            Credentials {
                key_id: "AKIAIOSFODNN7EXAMPLE".into(),
                secret: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
                token: None,
            },
            "us-east-1",
            "https://examplebucket.s3.amazonaws.com",
            "examplebucket",
        );
        // 2013-05-24T00:00:00Z
        let url = signer.sign("GET", "test.txt", &[], 1_369_353_600, 86_400);
        assert!(url.starts_with("https://examplebucket.s3.amazonaws.com/test.txt?"));
        assert!(url.contains("X-Amz-Date=20130524T000000Z"), "{url}");
        assert!(
            url.ends_with(
                "X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"
            ),
            "{url}"
        );
    }

    #[test]
    fn part_urls_sign_their_part_and_upload() {
        let signer = Presigner::new(
            Credentials {
                key_id: "k".into(),
                secret: "s".into(),
                token: None,
            },
            "eu-west-1",
            "http://127.0.0.1:9000",
            "files",
        );
        let a = signer.sign(
            "PUT",
            "t/1/c/2/9",
            &[("partNumber", "1".into()), ("uploadId", "u".into())],
            0,
            60,
        );
        let b = signer.sign(
            "PUT",
            "t/1/c/2/9",
            &[("partNumber", "2".into()), ("uploadId", "u".into())],
            0,
            60,
        );
        assert!(a.starts_with("http://127.0.0.1:9000/files/t/1/c/2/9?"));
        assert!(a.contains("partNumber=1&") && a.contains("uploadId=u&"));
        let sig = |u: &str| u.rsplit_once('=').unwrap().1.to_string();
        assert_ne!(sig(&a), sig(&b));
        assert_eq!(amz_date(951_782_400).1, "20000229T000000Z");
    }
}
