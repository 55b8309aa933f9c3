//! OIDC tokens from a tenant's own identity provider, beside cellmesh's
//! HMAC tokens. Each `[[oidc]]` entry trusts one issuer for one tenant: a
//! JWT signed RS256 or ES256 by a key of the issuer's key set (a JWKS
//! file or URL), for the configured audience, unexpired, whose
//! `user_claim` holds the user id. Anything else is refused with a stable
//! reason: an untrusted issuer, another audience, an algorithm other than
//! those two (`none`, HS256 made with a public key), a key the set does not
//! have. A `kid` the set lacks makes the edge read the set again, at most
//! once a minute per issuer, so a provider's key rotation needs no restart.

use cellmesh_proto::ids::{TenantId, UserId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use cellmesh_proto::reason::Reason;
use cellmesh_proto::status::to_status;
use cellmesh_proto::v1::ErrorCode;
use ring::signature::{self, UnparsedPublicKey};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tonic::Status;

/// How often an issuer's key set may be read again for an unknown `kid`.
const REREAD_EVERY: Duration = Duration::from_secs(60);

/// One `[[oidc]]` entry of the edge's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OidcProvider {
    pub tenant: TenantId,
    /// The `iss` the provider's tokens carry.
    pub issuer: String,
    /// The `aud` a token must name.
    pub audience: String,
    /// The provider's JSON Web Key Set, in a file …
    #[serde(default)]
    pub jwks_file: String,
    /// … or at a URL.
    #[serde(default)]
    pub jwks_url: String,
    /// The claim that holds the user id (a number, or a string of digits).
    #[serde(default = "sub")]
    pub user_claim: String,
    /// Clock skew allowed on `exp` and `nbf`.
    #[serde(default = "leeway")]
    pub leeway_secs: u64,
}

fn sub() -> String {
    "sub".into()
}

fn leeway() -> u64 {
    30
}

impl OidcProvider {
    pub fn validate(&self) -> Result<(), cellmesh_proto::config::ConfigError> {
        let invalid = |message: String| cellmesh_proto::config::ConfigError::Invalid {
            field: "oidc",
            message,
        };
        if self.tenant == TenantId(0) || self.issuer.is_empty() || self.audience.is_empty() {
            return Err(invalid(
                "each [[oidc]] entry needs a tenant, an issuer and an audience".into(),
            ));
        }
        if self.jwks_file.is_empty() == self.jwks_url.is_empty() {
            return Err(invalid(format!(
                "[[oidc]] of tenant {}: set one of jwks_file and jwks_url",
                self.tenant
            )));
        }
        if !self.jwks_url.is_empty()
            && !self.jwks_url.starts_with("https://")
            && !self.jwks_url.starts_with("http://")
        {
            return Err(invalid(format!(
                "[[oidc]] of tenant {}: jwks_url must be an http(s) URL",
                self.tenant
            )));
        }
        Ok(())
    }
}

/// Who a valid OIDC token says the caller is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub tenant: TenantId,
    pub user: UserId,
    /// Expiry and issue time, seconds since the epoch.
    pub exp: u64,
    pub iat: u64,
    /// The token's id (what a revocation names) and its key's.
    pub jti: String,
    pub kid: String,
}

/// A verification key of a provider.
#[derive(Clone)]
enum Key {
    Rs256 { n: Vec<u8>, e: Vec<u8> },
    Es256 { point: Vec<u8> },
}

struct Provider {
    config: OidcProvider,
    keys: Mutex<Keys>,
}

#[derive(Default)]
struct Keys {
    by_kid: HashMap<String, Key>,
    read_at: Option<Instant>,
}

/// The identity providers the edge trusts.
pub struct Oidc {
    providers: Vec<Arc<Provider>>,
    http: reqwest::Client,
    /// How often a key set may be read again ([`REREAD_EVERY`]).
    reread_every: Duration,
}

fn refused(reason: Reason, message: impl Into<String>) -> Status {
    to_status(ErrorCode::Unauthenticated, reason, message.into(), 0, None)
}

fn malformed(message: &str) -> Status {
    refused(Reason::MalformedToken, message)
}

/// Whether `token` has the shape of a JWT (three base64url parts).
pub fn is_jwt(token: &str) -> bool {
    token.split('.').count() == 3 && !token.starts_with("cm1.")
}

impl Oidc {
    /// Reads every provider's key set once; a set that cannot be read now
    /// is read again on the first token that needs it.
    pub async fn load(configs: &[OidcProvider]) -> Self {
        Self::load_with(configs, REREAD_EVERY).await
    }

    /// [`Self::load`], reading a key set again at most every `reread_every`.
    pub async fn load_with(configs: &[OidcProvider], reread_every: Duration) -> Self {
        let oidc = Self {
            reread_every,
            providers: configs
                .iter()
                .map(|c| {
                    Arc::new(Provider {
                        config: c.clone(),
                        keys: Mutex::new(Keys::default()),
                    })
                })
                .collect(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap_or_default(),
        };
        for p in &oidc.providers {
            if let Err(e) = oidc.reread(p).await {
                tracing::warn!(tenant = %p.config.tenant, error = %e, "cannot read the OIDC key set yet");
            }
        }
        oidc
    }

    pub fn is_empty(&self) -> bool {
        self.providers.is_empty()
    }

    async fn reread(&self, p: &Provider) -> Result<(), String> {
        let text = if p.config.jwks_file.is_empty() {
            let r = self
                .http
                .get(&p.config.jwks_url)
                .send()
                .await
                .map_err(|e| e.to_string())?;
            r.error_for_status()
                .map_err(|e| e.to_string())?
                .text()
                .await
                .map_err(|e| e.to_string())?
        } else {
            tokio::fs::read_to_string(&p.config.jwks_file)
                .await
                .map_err(|e| e.to_string())?
        };
        let keys = parse_jwks(&text)?;
        let mut held = p.keys.lock().unwrap_or_else(|e| e.into_inner());
        held.by_kid = keys;
        held.read_at = Some(Instant::now());
        Ok(())
    }

    /// The key `kid` of `p`, reading the set again (at most once a
    /// minute) when it is not known.
    async fn key(&self, p: &Provider, kid: &str) -> Option<Key> {
        let due = {
            let held = p.keys.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(key) = held.by_kid.get(kid) {
                return Some(key.clone());
            }
            held.read_at
                .is_none_or(|at| at.elapsed() >= self.reread_every)
        };
        if due && let Err(e) = self.reread(p).await {
            tracing::warn!(tenant = %p.config.tenant, error = %e, "cannot read the OIDC key set");
            // Not again for a minute, even when it failed.
            p.keys.lock().unwrap_or_else(|e| e.into_inner()).read_at = Some(Instant::now());
        }
        p.keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_kid
            .get(kid)
            .cloned()
    }

    /// The caller a valid OIDC token names.
    pub async fn verify(&self, token: &str, now_secs: u64) -> Result<Identity, Status> {
        let parts: Vec<&str> = token.split('.').collect();
        let [header, payload, sig] = parts[..] else {
            return Err(malformed("the token is not a JWT"));
        };
        let json =
            |part: &str| -> Option<Value> { serde_json::from_slice(&B64.decode(part).ok()?).ok() };
        let (Some(header), Some(claims)) = (json(header), json(payload)) else {
            return Err(malformed("the JWT's header or claims do not decode"));
        };
        let alg = header.get("alg").and_then(Value::as_str).unwrap_or("");
        if alg != "RS256" && alg != "ES256" {
            return Err(refused(
                Reason::TokenAlgorithmRefused,
                format!("JWT algorithm {alg:?} is not accepted (RS256 or ES256)"),
            ));
        }
        let issuer = claims.get("iss").and_then(Value::as_str).unwrap_or("");
        let audiences: Vec<&str> = match claims.get("aud") {
            Some(Value::String(a)) => vec![a.as_str()],
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        let of_issuer: Vec<_> = self
            .providers
            .iter()
            .filter(|p| p.config.issuer == issuer)
            .collect();
        if of_issuer.is_empty() {
            return Err(refused(
                Reason::TokenWrongIssuer,
                format!("no tenant trusts issuer {issuer:?}"),
            ));
        }
        let Some(p) = of_issuer
            .into_iter()
            .find(|p| audiences.contains(&p.config.audience.as_str()))
        else {
            return Err(refused(
                Reason::TokenWrongAudience,
                "the token is not for this service (aud)",
            ));
        };
        let kid = header.get("kid").and_then(Value::as_str).unwrap_or("");
        let Some(key) = self.key(p, kid).await else {
            return Err(refused(
                Reason::TokenUnknownKey,
                format!("issuer {issuer:?} has no key {kid:?}"),
            ));
        };
        // What was signed: header and claims as sent.
        let signed = token.rsplit_once('.').map_or("", |(signed, _)| signed);
        let signature = B64
            .decode(sig)
            .map_err(|_| malformed("the JWT signature is not base64url"))?;
        let ok = match (&key, alg) {
            (Key::Rs256 { n, e }, "RS256") => signature::RsaPublicKeyComponents { n, e }
                .verify(
                    &signature::RSA_PKCS1_2048_8192_SHA256,
                    signed.as_bytes(),
                    &signature,
                )
                .is_ok(),
            (Key::Es256 { point }, "ES256") => {
                UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                    .verify(signed.as_bytes(), &signature)
                    .is_ok()
            }
            _ => {
                return Err(refused(
                    Reason::TokenAlgorithmRefused,
                    format!("key {kid:?} is not an {alg} key"),
                ));
            }
        };
        if !ok {
            return Err(refused(
                Reason::BadSignature,
                "the JWT's signature does not verify",
            ));
        }
        let leeway = p.config.leeway_secs;
        let exp = claims
            .get("exp")
            .and_then(Value::as_u64)
            .ok_or_else(|| malformed("the JWT has no exp"))?;
        if exp.saturating_add(leeway) <= now_secs {
            return Err(refused(Reason::TokenExpired, "the token has expired"));
        }
        if claims
            .get("nbf")
            .and_then(Value::as_u64)
            .is_some_and(|nbf| nbf > now_secs.saturating_add(leeway))
        {
            return Err(refused(
                Reason::TokenExpired,
                "the token is not valid yet (nbf)",
            ));
        }
        let user = match claims.get(&p.config.user_claim) {
            Some(Value::Number(n)) => n.as_u64(),
            Some(Value::String(s)) => s.parse().ok(),
            _ => None,
        }
        .filter(|&u| u != 0)
        .ok_or_else(|| malformed(&format!("claim {:?} holds no user id", p.config.user_claim)))?;
        Ok(Identity {
            tenant: p.config.tenant,
            user: UserId(user),
            exp,
            iat: claims.get("iat").and_then(Value::as_u64).unwrap_or(0),
            jti: claims
                .get("jti")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            kid: kid.to_string(),
        })
    }
}

/// The RS256 and ES256 keys of a JWKS document, by `kid`.
fn parse_jwks(text: &str) -> Result<HashMap<String, Key>, String> {
    let doc: Value =
        serde_json::from_str(text).map_err(|e| format!("the key set is not JSON: {e}"))?;
    let keys = doc
        .get("keys")
        .and_then(Value::as_array)
        .ok_or("the key set has no `keys`")?;
    let field =
        |k: &Value, name: &str| -> Option<Vec<u8>> { B64.decode(k.get(name)?.as_str()?).ok() };
    let mut out = HashMap::new();
    for k in keys {
        let kid = k
            .get("kid")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let key = match (
            k.get("kty").and_then(Value::as_str),
            k.get("crv").and_then(Value::as_str),
        ) {
            (Some("RSA"), _) => match (field(k, "n"), field(k, "e")) {
                (Some(n), Some(e)) => Key::Rs256 { n, e },
                _ => continue,
            },
            (Some("EC"), Some("P-256")) => match (field(k, "x"), field(k, "y")) {
                (Some(x), Some(y)) if x.len() == 32 && y.len() == 32 => Key::Es256 {
                    point: [&[4u8][..], &x, &y].concat(),
                },
                _ => continue,
            },
            _ => continue,
        };
        out.insert(kid, key);
    }
    Ok(out)
}

#[cfg(test)]
#[path = "oidc_tests.rs"]
mod tests;
