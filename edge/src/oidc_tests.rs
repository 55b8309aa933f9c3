//! OIDC verification against keys made here: ES256 (ring) and RS256
//! (openssl), a JWKS file and a JWKS URL on loopback, and every refusal.

use cellmesh_proto::ids::{TenantId, UserId};
use std::io::Write;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use cellmesh_proto::reason::Reason;
use cellmesh_proto::status::error_detail;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, KeyPair, RsaKeyPair};
use serde_json::{Value, json};

use super::*;

const ISSUER: &str = "https://idp.test";
const AUDIENCE: &str = "cellmesh";
const NOW: u64 = 1_900_000_000;

enum Signer {
    Es(EcdsaKeyPair),
    Rs(RsaKeyPair),
}

impl Signer {
    fn es256() -> Self {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .unwrap();
        Signer::Es(
            EcdsaKeyPair::from_pkcs8(
                &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
                pkcs8.as_ref(),
                &rng,
            )
            .unwrap(),
        )
    }

    fn rs256() -> Self {
        // PKCS#1 DER: what ring reads for RSA.
        let out = std::process::Command::new("sh")
            .args([
                "-c",
                "openssl genrsa -traditional 2048 2>/dev/null | openssl rsa -traditional -outform DER 2>/dev/null",
            ])
            .output()
            .expect("openssl makes an RSA key");
        Signer::Rs(RsaKeyPair::from_der(&out.stdout).expect("a PKCS#1 RSA key"))
    }

    fn jwk(&self, kid: &str) -> Value {
        match self {
            Signer::Es(k) => {
                let point = k.public_key().as_ref();
                json!({"kty": "EC", "crv": "P-256", "kid": kid,
                       "x": B64.encode(&point[1..33]), "y": B64.encode(&point[33..])})
            }
            Signer::Rs(k) => {
                let c = signature::RsaPublicKeyComponents::<Vec<u8>>::from(k.public());
                json!({"kty": "RSA", "kid": kid, "n": B64.encode(&c.n), "e": B64.encode(&c.e)})
            }
        }
    }

    fn alg(&self) -> &'static str {
        match self {
            Signer::Es(_) => "ES256",
            Signer::Rs(_) => "RS256",
        }
    }

    fn sign(&self, header: &Value, claims: &Value) -> String {
        let input = format!(
            "{}.{}",
            B64.encode(header.to_string()),
            B64.encode(claims.to_string())
        );
        let rng = SystemRandom::new();
        let sig = match self {
            Signer::Es(k) => k.sign(&rng, input.as_bytes()).unwrap().as_ref().to_vec(),
            Signer::Rs(k) => {
                let mut sig = vec![0; k.public().modulus_len()];
                k.sign(
                    &signature::RSA_PKCS1_SHA256,
                    &rng,
                    input.as_bytes(),
                    &mut sig,
                )
                .unwrap();
                sig
            }
        };
        format!("{input}.{}", B64.encode(sig))
    }

    fn token(&self, kid: &str, claims: Value) -> String {
        self.sign(
            &json!({"alg": self.alg(), "kid": kid, "typ": "JWT"}),
            &claims,
        )
    }
}

fn claims() -> Value {
    json!({"iss": ISSUER, "aud": AUDIENCE, "sub": "4242", "exp": NOW + 600, "iat": NOW})
}

fn with(mut base: Value, key: &str, value: Value) -> Value {
    base[key] = value;
    base
}

fn jwks_file(keys: &[Value]) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    write!(f, "{}", json!({"keys": keys})).unwrap();
    f
}

fn provider(jwks_file: &str, jwks_url: &str) -> OidcProvider {
    OidcProvider {
        tenant: TenantId(7),
        issuer: ISSUER.into(),
        audience: AUDIENCE.into(),
        jwks_file: jwks_file.into(),
        jwks_url: jwks_url.into(),
        user_claim: "sub".into(),
        leeway_secs: 30,
    }
}

fn reason(e: Status) -> String {
    error_detail(&e).reason
}

#[tokio::test]
async fn tokens_of_a_trusted_issuer_name_their_tenant_and_user_and_nothing_else_passes() {
    let (es, rs) = (Signer::es256(), Signer::rs256());
    let file = jwks_file(&[es.jwk("ec-1"), rs.jwk("rsa-1")]);
    let oidc = Oidc::load(&[provider(file.path().to_str().unwrap(), "")]).await;

    for (signer, kid) in [(&es, "ec-1"), (&rs, "rsa-1")] {
        let c = oidc
            .verify(&signer.token(kid, claims()), NOW)
            .await
            .unwrap();
        assert_eq!(
            (c.tenant, c.user, c.exp),
            (TenantId(7), UserId(4242), NOW + 600),
            "{kid}"
        );
    }
    // A numeric claim, and an audience list naming ours.
    let list = with(
        with(claims(), "sub", json!(77)),
        "aud",
        json!(["other", AUDIENCE]),
    );
    assert_eq!(
        oidc.verify(&es.token("ec-1", list), NOW)
            .await
            .unwrap()
            .user,
        UserId(77)
    );

    let refused = |token: String, want: Reason| {
        let oidc = &oidc;
        async move {
            let e = oidc.verify(&token, NOW).await.unwrap_err();
            assert_eq!(reason(e), want.as_str(), "{token}");
        }
    };
    refused(
        es.token("ec-1", with(claims(), "iss", json!("https://evil.test"))),
        Reason::TokenWrongIssuer,
    )
    .await;
    refused(
        es.token("ec-1", with(claims(), "aud", json!("someone-else"))),
        Reason::TokenWrongAudience,
    )
    .await;
    refused(
        es.token("ec-1", with(claims(), "exp", json!(NOW - 31))),
        Reason::TokenExpired,
    )
    .await;
    refused(
        es.token("ec-1", with(claims(), "nbf", json!(NOW + 600))),
        Reason::TokenExpired,
    )
    .await;
    refused(es.token("ec-9", claims()), Reason::TokenUnknownKey).await;
    refused(
        es.token("ec-1", with(claims(), "sub", json!("alice"))),
        Reason::MalformedToken,
    )
    .await;
    // Signed by another key under a known kid.
    refused(
        Signer::es256().token("ec-1", claims()),
        Reason::BadSignature,
    )
    .await;
    // An ES256 header naming the RSA key.
    refused(
        es.sign(&json!({"alg": "ES256", "kid": "rsa-1"}), &claims()),
        Reason::TokenAlgorithmRefused,
    )
    .await;
    // `none`, unsigned.
    let none = format!(
        "{}.{}.",
        B64.encode(json!({"alg": "none", "kid": "ec-1"}).to_string()),
        B64.encode(claims().to_string())
    );
    refused(none, Reason::TokenAlgorithmRefused).await;
    // HS256 with the public key as the HMAC secret.
    let input = format!(
        "{}.{}",
        B64.encode(json!({"alg": "HS256", "kid": "rsa-1"}).to_string()),
        B64.encode(claims().to_string())
    );
    let public = rs.jwk("rsa-1")["n"].as_str().unwrap().to_string();
    let mac = ring::hmac::sign(
        &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, public.as_bytes()),
        input.as_bytes(),
    );
    refused(
        format!("{input}.{}", B64.encode(mac.as_ref())),
        Reason::TokenAlgorithmRefused,
    )
    .await;
    refused("a.b.c".into(), Reason::MalformedToken).await;
}

#[tokio::test]
async fn a_rotated_key_is_read_again_at_most_once_per_interval() {
    let (old, new) = (Signer::es256(), Signer::es256());
    let file = jwks_file(&[old.jwk("k1")]);
    let path = file.path().to_str().unwrap().to_string();
    let rotated = || {
        std::fs::write(
            &path,
            json!({"keys": [old.jwk("k1"), new.jwk("k2")]}).to_string(),
        )
        .unwrap()
    };

    // Read a minute ago at most: the new kid waits for the next reading.
    let slow = Oidc::load(&[provider(&path, "")]).await;
    rotated();
    let e = slow
        .verify(&new.token("k2", claims()), NOW)
        .await
        .unwrap_err();
    assert_eq!(reason(e), Reason::TokenUnknownKey.as_str());

    std::fs::write(&path, json!({"keys": [old.jwk("k1")]}).to_string()).unwrap();
    let eager = Oidc::load_with(&[provider(&path, "")], Duration::ZERO).await;
    assert!(eager.verify(&new.token("k2", claims()), NOW).await.is_err());
    rotated();
    let c = eager.verify(&new.token("k2", claims()), NOW).await.unwrap();
    assert_eq!(c.user, UserId(4242));
}

#[tokio::test]
async fn a_key_set_is_fetched_from_its_url() {
    let es = Signer::es256();
    let body = json!({"keys": [es.jwk("k1")]}).to_string();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/jwks.json", listener.local_addr().unwrap());
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut s, _)) = listener.accept().await {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(response.as_bytes()).await;
        }
    });
    let oidc = Oidc::load(&[provider("", &url)]).await;
    let c = oidc.verify(&es.token("k1", claims()), NOW).await.unwrap();
    assert_eq!((c.tenant, c.user), (TenantId(7), UserId(4242)));
}

#[test]
fn a_provider_needs_one_key_set_source() {
    assert!(provider("f", "").validate().is_ok());
    assert!(provider("", "").validate().is_err());
    assert!(provider("f", "https://x").validate().is_err());
    assert!(provider("", "ftp://x").validate().is_err());
}
