//! Client tokens: `cm1.<claims>.<signature>`, the claims (tenant, user,
//! device, expiry, issue time, token id, key id) as base64url JSON, signed
//! with HMAC-SHA256 under one of the deployment's token keys: the key id
//! picks it (`""` is `token_secret`; `token_keys` holds the others, so a
//! key is rotated by adding the new one, issuing with it, and dropping the
//! old once its tokens expired). `cellmesh ctl token` issues them; the
//! edge verifies every request's token — its key, signature, expiry, a
//! lifetime no longer than `max_token_lifetime_secs`, that its id is not
//! revoked, and (with a directory) that the tenant has the user — and takes
//! the caller from it. JWTs of a tenant's own identity provider are
//! verified by [`crate::oidc`] and then pass the same checks.

use cellmesh_proto::ids::{TenantId, UserId};
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::directory::Users;
use crate::oidc::Oidc;

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

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub tenant: TenantId,
    pub user: UserId,
    pub device: String,
    /// Expiry, seconds since the Unix epoch.
    pub exp: u64,
    /// Issued at (seconds since the epoch; 0 in older tokens). Set by
    /// [`TokenKey::issue`].
    #[serde(default)]
    pub iat: u64,
    /// The token's id, what a revocation names. Set by [`TokenKey::issue`].
    #[serde(default)]
    pub jti: String,
    /// The id of the key that signed it (`""`: `token_secret`).
    #[serde(default)]
    pub kid: String,
}

#[derive(Clone)]
pub struct TokenKey {
    /// Key id → secret.
    keys: BTreeMap<String, Vec<u8>>,
    /// The key new tokens are signed with.
    issuing: String,
    /// Longest lifetime a token may state (0: any).
    max_lifetime_secs: u64,
    revoked: Arc<crate::revoked::Revoked>,
    /// The users each tenant has, when the edge follows a directory.
    directory: Option<Arc<Users>>,
    /// Tenants' own identity providers.
    oidc: Option<Arc<Oidc>>,
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
    /// One key (id `""`), any lifetime, nothing revoked.
    pub fn new(secret: &str) -> Self {
        Self {
            keys: BTreeMap::from([(String::new(), secret.as_bytes().to_vec())]),
            issuing: String::new(),
            max_lifetime_secs: 0,
            revoked: Arc::new(crate::revoked::Revoked::new(&[])),
            directory: None,
            oidc: None,
        }
    }

    /// Also takes tokens signed with `keys` (id → secret).
    pub fn with_keys(mut self, keys: &BTreeMap<String, String>) -> Self {
        for (id, secret) in keys {
            self.keys.insert(id.clone(), secret.as_bytes().to_vec());
        }
        self
    }

    /// Signs new tokens with the key `id` (one of [`Self::with_keys`]).
    pub fn issuing_with(mut self, id: &str) -> Self {
        self.issuing = id.to_string();
        self
    }

    /// Refuses tokens that state a longer life than `secs` (0: any), and
    /// the tokens whose ids are in `revoked`.
    pub fn limited(mut self, secs: u64, revoked: &[String]) -> Self {
        self.max_lifetime_secs = secs;
        self.revoked = Arc::new(crate::revoked::Revoked::new(revoked));
        self
    }

    /// Refuses the tokens `revoked` lists (it may follow a file).
    pub fn with_revoked(mut self, revoked: Arc<crate::revoked::Revoked>) -> Self {
        self.revoked = revoked;
        self
    }

    /// Whether a stream opened with `claims` may stay open: the token has
    /// not expired, is not revoked, and its user is still in the directory.
    pub fn still_admits(&self, claims: &Claims, now_secs: u64) -> Result<(), Status> {
        if claims.exp <= now_secs {
            return Err(unauthenticated(Reason::TokenExpired, "the token expired"));
        }
        self.admit(claims)
    }

    /// Refuses tokens for users `users` does not list (`UNKNOWN_USER`).
    pub fn with_directory(mut self, users: Arc<Users>) -> Self {
        self.directory = Some(users);
        self
    }

    fn mac(&self, id: &str) -> Option<Hmac<Sha256>> {
        let secret = self.keys.get(id)?;
        Some(Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length"))
    }

    /// A token for `claims`, stamped with its issue time, a fresh id and
    /// the issuing key's id.
    pub fn issue(&self, claims: &Claims) -> String {
        let mut claims = claims.clone();
        claims.kid = self.issuing.clone();
        if claims.iat == 0 {
            claims.iat = now_secs();
        }
        if claims.jti.is_empty() {
            claims.jti = format!("{:016x}", rand::random::<u64>());
        }
        let body = B64.encode(serde_json::to_vec(&claims).expect("claims serialize"));
        let mut mac = self
            .mac(&self.issuing)
            .expect("the issuing key is one of the keys");
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
        let claims: Claims = B64
            .decode(body)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(|| {
                unauthenticated(Reason::MalformedToken, "the token claims do not decode")
            })?;
        let not_ours = || {
            unauthenticated(
                Reason::BadSignature,
                "the token was not issued by this deployment",
            )
        };
        let mut mac = self.mac(&claims.kid).ok_or_else(not_ours)?;
        mac.update(format!("{PREFIX}.{body}").as_bytes());
        mac.verify_slice(&signature).map_err(|_| not_ours())?;
        if claims.exp <= now_secs {
            return Err(unauthenticated(
                Reason::TokenExpired,
                "the token has expired",
            ));
        }
        let max = self.max_lifetime_secs;
        if max > 0
            && (claims.exp > now_secs.saturating_add(max)
                || claims.exp.saturating_sub(claims.iat) > max)
        {
            return Err(unauthenticated(
                Reason::TokenLifetimeTooLong,
                "the token lives longer than this edge allows",
            ));
        }
        self.admit(&claims)?;
        Ok(claims)
    }

    /// The checks every token passes, ours or an identity provider's: not
    /// revoked, a tenant and a user that are not reserved, and (with a
    /// directory) a user the tenant has.
    fn admit(&self, claims: &Claims) -> Result<(), Status> {
        if !claims.jti.is_empty() && self.revoked.contains(&claims.jti) {
            return Err(unauthenticated(
                Reason::TokenRevoked,
                "the token was revoked",
            ));
        }
        // u64::MAX is reserved: the cell's indexer reads as it.
        if claims.tenant == TenantId(0)
            || claims.user == UserId(0)
            || claims.user == UserId(u64::MAX)
        {
            return Err(unauthenticated(
                Reason::MalformedToken,
                "the token names no tenant or user (or a reserved user id)",
            ));
        }
        if let Some(users) = &self.directory
            && !users.admits(claims.tenant, claims.user)
        {
            return Err(unauthenticated(
                Reason::UnknownUser,
                &format!("tenant {} has no user {}", claims.tenant, claims.user),
            ));
        }
        Ok(())
    }

    /// The claims a token states, unverified (a client showing whom it acts
    /// as; only the edge's verification counts).
    pub fn peek(token: &str) -> Option<Claims> {
        let body = token.split('.').nth(1)?;
        serde_json::from_slice(&B64.decode(body).ok()?).ok()
    }

    /// Also takes OIDC tokens of the providers in `oidc`.
    pub fn with_oidc(mut self, oidc: Arc<Oidc>) -> Self {
        self.oidc = (!oidc.is_empty()).then_some(oidc);
        self
    }

    /// Verifies the `authorization: Bearer <token>` metadata: a cellmesh
    /// token, or a JWT of a trusted identity provider.
    pub async fn verify_metadata(
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
        let token = token.trim();
        match &self.oidc {
            Some(oidc) if crate::oidc::is_jwt(token) => {
                let id = oidc.verify(token, now_secs()).await?;
                let claims = Claims {
                    tenant: id.tenant,
                    user: id.user,
                    device: String::new(),
                    exp: id.exp,
                    iat: id.iat,
                    jti: id.jti,
                    kid: id.kid,
                };
                self.admit(&claims)?;
                Ok(claims)
            }
            _ => self.verify(token, now_secs()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellmesh_proto::status::error_detail;

    fn claims(exp: u64) -> Claims {
        Claims {
            tenant: TenantId(7),
            user: UserId(42),
            device: "phone".into(),
            exp,
            ..Claims::default()
        }
    }

    #[test]
    fn tokens_verify_only_with_their_key_and_before_expiry() {
        let key = TokenKey::new("k1");
        let token = key.issue(&claims(1_000));
        let issued = TokenKey::peek(&token).unwrap();
        assert_eq!(
            (issued.tenant, issued.user, issued.exp),
            (TenantId(7), UserId(42), 1_000)
        );
        assert_eq!(issued.jti.len(), 16);
        assert_eq!(key.verify(&token, 999).unwrap(), issued);
        let reason = |r: Result<Claims, Status>| error_detail(&r.unwrap_err()).reason;
        assert_eq!(reason(key.verify(&token, 1_000)), Reason::TokenExpired);
        assert_eq!(
            reason(TokenKey::new("k2").verify(&token, 1)),
            "BAD_SIGNATURE"
        );
        // A forged body under the old signature.
        let parts: Vec<&str> = token.split('.').collect();
        let forged_body = B64.encode(
            serde_json::to_vec(&Claims {
                tenant: TenantId(8),
                ..claims(1_000)
            })
            .unwrap(),
        );
        let forged = format!("{}.{}.{}", parts[0], forged_body, parts[2]);
        assert_eq!(reason(key.verify(&forged, 1)), Reason::BadSignature);
        for bad in ["", "cm1", "cm1.a.b.c", "xx.a.b", "cm1.a.!!"] {
            assert_eq!(reason(key.verify(bad, 1)), Reason::MalformedToken, "{bad}");
        }
    }

    #[test]
    fn keys_rotate_by_id_and_lifetimes_and_revocations_are_enforced() {
        let reason = |r: Result<Claims, Status>| error_detail(&r.unwrap_err()).reason;
        let keys = BTreeMap::from([("k2".to_string(), "second-secret-of-16b".to_string())]);
        let old = TokenKey::new("first-secret-of-16b");
        let rotated = TokenKey::new("first-secret-of-16b")
            .with_keys(&keys)
            .issuing_with("k2");
        let now = now_secs();
        let by_old = old.issue(&claims(now + 60));
        let by_new = rotated.issue(&claims(now + 60));
        assert_eq!(TokenKey::peek(&by_new).unwrap().kid, "k2");
        // The edge with both keys takes both; the old edge not the new key's.
        assert!(rotated.verify(&by_old, now).is_ok());
        assert!(rotated.verify(&by_new, now).is_ok());
        assert_eq!(reason(old.verify(&by_new, now)), Reason::BadSignature);
        // A lifetime over the limit, and a revoked id.
        let strict = rotated
            .clone()
            .limited(3600, &[TokenKey::peek(&by_new).unwrap().jti]);
        let long = rotated.issue(&claims(now + 7200));
        assert_eq!(
            reason(strict.verify(&long, now)),
            Reason::TokenLifetimeTooLong
        );
        assert_eq!(reason(strict.verify(&by_new, now)), Reason::TokenRevoked);
        assert!(strict.verify(&by_old, now).is_ok());
    }
}
