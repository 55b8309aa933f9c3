//! Client tokens: `cm1.<claims>.<signature>`, the claims (tenant, user,
//! device, expiry) as base64url JSON, signed with HMAC-SHA256 under the
//! deployment's token secret. `cellmesh ctl token` issues them; the edge
//! verifies every request's token and takes the caller from it.

use cellmesh_proto::reason::Reason;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use cellmesh_proto::status::to_status;
use cellmesh_proto::v1::ErrorCode;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use tonic::Status;

const PREFIX: &str = "cm1";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub tenant: u64,
    pub user: u64,
    pub device: String,
    /// Expiry, seconds since the Unix epoch.
    pub exp: u64,
}

#[derive(Clone)]
pub struct TokenKey {
    secret: Vec<u8>,
}

fn unauthenticated(reason: Reason, message: &str) -> Status {
    to_status(ErrorCode::Unauthenticated, reason, message.into(), 0, None)
}

pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl TokenKey {
    pub fn new(secret: &str) -> Self {
        Self {
            secret: secret.as_bytes().to_vec(),
        }
    }

    fn mac(&self) -> Hmac<Sha256> {
        Hmac::<Sha256>::new_from_slice(&self.secret).expect("HMAC takes keys of any length")
    }

    pub fn issue(&self, claims: &Claims) -> String {
        let body = B64.encode(serde_json::to_vec(claims).expect("claims serialize"));
        let mut mac = self.mac();
        mac.update(format!("{PREFIX}.{body}").as_bytes());
        let signature = B64.encode(mac.finalize().into_bytes());
        format!("{PREFIX}.{body}.{signature}")
    }

    /// The claims of a valid, unexpired token signed with this key.
    pub fn verify(&self, token: &str, now_secs: u64) -> Result<Claims, Status> {
        let mut parts = token.split('.');
        let (Some(PREFIX), Some(body), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(unauthenticated(
                Reason::MalformedToken,
                "the token is not a cellmesh token",
            ));
        };
        let signature = B64.decode(signature).map_err(|_| {
            unauthenticated(
                Reason::MalformedToken,
                "the token signature is not base64url",
            )
        })?;
        let mut mac = self.mac();
        mac.update(format!("{PREFIX}.{body}").as_bytes());
        mac.verify_slice(&signature).map_err(|_| {
            unauthenticated(
                Reason::BadSignature,
                "the token was not issued by this deployment",
            )
        })?;
        let claims: Claims = B64
            .decode(body)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(|| {
                unauthenticated(Reason::MalformedToken, "the token claims do not decode")
            })?;
        if claims.exp <= now_secs {
            return Err(unauthenticated(
                Reason::TokenExpired,
                "the token has expired",
            ));
        }
        if claims.tenant == 0 || claims.user == 0 {
            return Err(unauthenticated(
                Reason::MalformedToken,
                "the token names no tenant or user",
            ));
        }
        Ok(claims)
    }

    /// The claims a token states, unverified (a client showing whom it acts
    /// as; only the edge's verification counts).
    pub fn peek(token: &str) -> Option<Claims> {
        let body = token.split('.').nth(1)?;
        serde_json::from_slice(&B64.decode(body).ok()?).ok()
    }

    /// Verifies the `authorization: Bearer <token>` metadata.
    pub fn verify_metadata(
        &self,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<Claims, Status> {
        let header = metadata
            .get("authorization")
            .ok_or_else(|| unauthenticated(Reason::MissingToken, "no authorization token"))?
            .to_str()
            .map_err(|_| {
                unauthenticated(
                    Reason::MalformedToken,
                    "the authorization header is not text",
                )
            })?;
        let token = header
            .strip_prefix("Bearer ")
            .ok_or_else(|| unauthenticated(Reason::MalformedToken, "expected `Bearer <token>`"))?;
        self.verify(token.trim(), now_secs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellmesh_proto::status::error_detail;

    fn claims(exp: u64) -> Claims {
        Claims {
            tenant: 7,
            user: 42,
            device: "phone".into(),
            exp,
        }
    }

    #[test]
    fn tokens_verify_only_with_their_key_and_before_expiry() {
        let key = TokenKey::new("k1");
        let token = key.issue(&claims(1_000));
        assert_eq!(key.verify(&token, 999).unwrap(), claims(1_000));
        let reason = |r: Result<Claims, Status>| error_detail(&r.unwrap_err()).reason;
        assert_eq!(reason(key.verify(&token, 1_000)), "TOKEN_EXPIRED");
        assert_eq!(
            reason(TokenKey::new("k2").verify(&token, 1)),
            "BAD_SIGNATURE"
        );
        // A forged body under the old signature.
        let parts: Vec<&str> = token.split('.').collect();
        let forged_body = B64.encode(
            serde_json::to_vec(&Claims {
                tenant: 8,
                ..claims(1_000)
            })
            .unwrap(),
        );
        let forged = format!("{}.{}.{}", parts[0], forged_body, parts[2]);
        assert_eq!(reason(key.verify(&forged, 1)), "BAD_SIGNATURE");
        for bad in ["", "cm1", "cm1.a.b.c", "xx.a.b", "cm1.a.!!"] {
            assert_eq!(reason(key.verify(bad, 1)), "MALFORMED_TOKEN", "{bad}");
        }
    }
}
