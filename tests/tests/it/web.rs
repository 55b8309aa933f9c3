//! Browsers at the edge: gRPC-Web over HTTP/1.1 (unary calls, errors with
//! their stable reason, and the sync stream as a server stream), CORS that
//! answers only the listed origins, and a tenant's OIDC tokens accepted
//! beside cellmesh's own.

use cellmesh_proto::ids::TenantId;
use std::time::Duration;

use base64::Engine;
use cellmesh_edge::EdgeConfig;
use cellmesh_edge::oidc::OidcProvider;
use cellmesh_proto::reason::Reason;
use cellmesh_proto::v1::*;
use cellmesh_tests::deploy::{TOKEN_SECRET, create_via_edge, messaging, token};
use cellmesh_tests::router::SECRET;
use futures::StreamExt;
use prost::Message as _;

const APP: &str = "http://app.test:8080";

async fn web_edge(
    d: &cellmesh_tests::deploy::Deployment,
    oidc: Vec<OidcProvider>,
) -> cellmesh_edge::RunningEdge {
    cellmesh_edge::start(EdgeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        routers: d.cluster.endpoints(),
        cluster_secret: SECRET.into(),
        token_secret: TOKEN_SECRET.into(),
        web_origins: vec![APP.into()],
        oidc,
        ..EdgeConfig::default()
    })
    .await
    .expect("edge starts")
}

/// A gRPC-Web request body: one uncompressed message frame.
fn frame(message: &impl prost::Message) -> Vec<u8> {
    let bytes = message.encode_to_vec();
    let mut out = vec![0u8];
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(&bytes);
    out
}

/// The frames of a gRPC-Web body: (is trailers, payload).
fn frames(mut body: &[u8]) -> Vec<(bool, Vec<u8>)> {
    let mut out = Vec::new();
    while body.len() >= 5 {
        let len = u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
        if body.len() < 5 + len {
            break;
        }
        out.push((body[0] & 0x80 != 0, body[5..5 + len].to_vec()));
        body = &body[5 + len..];
    }
    out
}

async fn call(
    http: &reqwest::Client,
    edge: &str,
    path: &str,
    token: &str,
    body: Vec<u8>,
) -> reqwest::Response {
    http.post(format!("{edge}{path}"))
        .header("content-type", "application/grpc-web+proto")
        .header("x-grpc-web", "1")
        .header("origin", APP)
        .header("authorization", format!("Bearer {token}"))
        .body(body)
        .send()
        .await
        .expect("the edge answers over HTTP/1.1")
}

/// The message of a unary gRPC-Web answer, or its status and reason.
async fn unary<R: prost::Message + Default>(
    response: reqwest::Response,
) -> Result<R, (String, String)> {
    let headers = response.headers().clone();
    let body = response.bytes().await.unwrap();
    let frames = frames(&body);
    let trailers = frames
        .iter()
        .find(|(t, _)| *t)
        .map(|(_, b)| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default();
    let field = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .or_else(|| {
                trailers.lines().find_map(|l| {
                    l.strip_prefix(&format!("{name}:"))
                        .map(|v| v.trim().to_string())
                })
            })
    };
    let status = field("grpc-status").unwrap_or_default();
    if status != "0" {
        let details = field("grpc-status-details-bin").unwrap_or_default();
        let details = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(details.trim_end_matches('='))
            .unwrap_or_default();
        let status = tonic::Status::with_details(
            tonic::Code::from(status.parse::<i32>().unwrap_or(2)),
            "",
            details.into(),
        );
        return Err((
            status.code().to_string(),
            cellmesh_proto::status::error_detail(&status).reason,
        ));
    }
    let data = frames.into_iter().find(|(t, _)| !*t).expect("a message").1;
    Ok(R::decode(&data[..]).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_talks_grpc_web_to_the_edge_and_only_listed_origins_may() {
    let d = cellmesh_tests::deploy::deploy(None).await;
    let edge = web_edge(&d, Vec::new()).await;
    let url = edge.endpoint();
    let (alice, bob) = (token(1, 10), token(1, 11));
    let mut m = messaging(&edge).await;
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    let http = reqwest::Client::new();

    // Bob's sync stream, as a browser reads it: a server stream of frames.
    let subscribe = frame(&SubscribeRequest::default());
    let stream = call(&http, &url, "/cellmesh.v1.Sync/Subscribe", &bob, subscribe).await;
    assert_eq!(stream.headers()["access-control-allow-origin"], APP);
    let mut chunks = stream.bytes_stream();

    let send = SendRequest {
        conversation_id: conv,
        client_req_id: "web-1".into(),
        r#type: MessageType::Text as i32,
        body: b"hello from a page".to_vec(),
        ..Default::default()
    };
    let r = call(
        &http,
        &url,
        "/cellmesh.v1.Messaging/Send",
        &alice,
        frame(&send),
    )
    .await;
    let sent: SendResponse = unary(r).await.expect("sent over gRPC-Web");
    assert_eq!(sent.seq, 1);

    let pushed = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = Vec::new();
        while let Some(Ok(chunk)) = chunks.next().await {
            buf.extend_from_slice(&chunk);
            for (_, payload) in frames(&buf).into_iter().filter(|(t, _)| !t) {
                let push = SyncPush::decode(&payload[..]).unwrap();
                if let Some(sync_push::Push::Event(e)) = push.push
                    && e.kind == SyncEventKind::Message as i32
                {
                    return e;
                }
            }
        }
        panic!("the stream ended");
    })
    .await
    .expect("the push arrives on the stream");
    assert_eq!((pushed.conversation_id, pushed.seq), (conv, 1));

    // Errors keep their stable reason.
    let pull = PullRequest {
        conversation_id: conv,
        ..Default::default()
    };
    let r = call(
        &http,
        &url,
        "/cellmesh.v1.Messaging/Pull",
        &token(1, 99),
        frame(&pull),
    )
    .await;
    let e = unary::<PullResponse>(r).await.unwrap_err();
    assert_eq!(e.1, Reason::NotAMember.as_str(), "{e:?}");
    let r = call(
        &http,
        &url,
        "/cellmesh.v1.Messaging/Pull",
        "nonsense",
        frame(&pull),
    )
    .await;
    assert_eq!(
        unary::<PullResponse>(r).await.unwrap_err().1,
        Reason::MalformedToken.as_str()
    );

    // CORS: the listed origin's preflight is answered, another's is not.
    let preflight = |origin: &'static str| {
        http.request(
            reqwest::Method::OPTIONS,
            format!("{url}/cellmesh.v1.Messaging/Send"),
        )
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization,content-type,x-grpc-web",
        )
        .send()
    };
    let ok = preflight(APP).await.unwrap();
    assert_eq!(ok.headers()["access-control-allow-origin"], APP);
    let allowed = ok.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        allowed.contains("authorization") && allowed.contains("x-grpc-web"),
        "{allowed}"
    );
    let evil = preflight("http://evil.test").await.unwrap();
    assert!(
        evil.headers().get("access-control-allow-origin").is_none(),
        "{:?}",
        evil.headers()
    );
    edge.stop().await;
}

/// A tenant's identity provider: its ES256 JWTs (key set in a file) act as
/// the user its `sub` names, through gRPC and gRPC-Web alike; another
/// issuer's are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_oidc_tokens_are_taken_beside_cellmesh_tokens() {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};

    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let key =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let point = key.public_key().as_ref();
    let jwks = serde_json::json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": "k1",
        "x": B64.encode(&point[1..33]), "y": B64.encode(&point[33..])}]});
    let dir = tempfile::tempdir().unwrap();
    let jwks_file = dir.path().join("jwks.json");
    std::fs::write(&jwks_file, jwks.to_string()).unwrap();
    let jwt = |iss: &str, sub: &str| {
        let now = cellmesh_edge::auth::now_secs();
        let header = serde_json::json!({"alg": "ES256", "kid": "k1"});
        let claims = serde_json::json!({"iss": iss, "aud": "cellmesh", "sub": sub, "exp": now + 300, "iat": now});
        let input = format!(
            "{}.{}",
            B64.encode(header.to_string()),
            B64.encode(claims.to_string())
        );
        let sig = key.sign(&rng, input.as_bytes()).unwrap();
        format!("{input}.{}", B64.encode(sig.as_ref()))
    };

    let d = cellmesh_tests::deploy::deploy(None).await;
    let provider = OidcProvider {
        tenant: TenantId(1),
        issuer: "https://idp.test".into(),
        audience: "cellmesh".into(),
        jwks_file: jwks_file.display().to_string(),
        jwks_url: String::new(),
        user_claim: "sub".into(),
        leeway_secs: 30,
    };
    let edge = web_edge(&d, vec![provider]).await;
    let mut m = messaging(&edge).await;
    // Alice signs in with cellmesh's token, Bob with the provider's.
    let conv = create_via_edge(&mut m, &token(1, 10), vec![11]).await;
    let bob = jwt("https://idp.test", "11");
    let page = cellmesh_tests::deploy::pull_via_edge(&mut m, &bob, conv).await;
    assert_eq!(page.latest_seq, 0);
    let http = reqwest::Client::new();
    let send = SendRequest {
        conversation_id: conv,
        client_req_id: "oidc-1".into(),
        r#type: MessageType::Text as i32,
        body: b"signed in through the provider".to_vec(),
        ..Default::default()
    };
    let r = call(
        &http,
        &edge.endpoint(),
        "/cellmesh.v1.Messaging/Send",
        &bob,
        frame(&send),
    )
    .await;
    let sent: SendResponse = unary(r).await.expect("a send as the JWT's user");
    let page = cellmesh_tests::deploy::pull_via_edge(&mut m, &token(1, 10), conv).await;
    assert_eq!(page.messages[0].sender_id, 11);
    assert_eq!(page.messages[0].seq, sent.seq);

    let foreign = jwt("https://evil.test", "11");
    let r = call(
        &http,
        &edge.endpoint(),
        "/cellmesh.v1.Messaging/Send",
        &foreign,
        frame(&send),
    )
    .await;
    assert_eq!(
        unary::<SendResponse>(r).await.unwrap_err().1,
        Reason::TokenWrongIssuer.as_str()
    );
    edge.stop().await;
}
