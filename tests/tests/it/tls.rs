//! Mutual TLS between components, end to end on `cellmesh dev --tls`: a
//! message goes through an edge to a cell of another region; a plaintext
//! caller and a certificate from another CA are refused; with the
//! deployment's own certificates, each role calls only what it may (an
//! edge neither writes routes nor calls the cells' peer API, a cell
//! registers and delivers only as itself, Raft messages come only from
//! the router they name); a certificate renewed on disk is served without a
//! restart, and one revoked is refused on new and open connections.

use cellmesh_proto::reason::Reason;
use std::path::Path;

use cellmesh_proto::raft::v1 as raft;
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::status::error_detail;
use cellmesh_proto::tls::{Peer, Role, SERVER_NAME};
use cellmesh_proto::v1::cell_peer_client::CellPeerClient;
use cellmesh_proto::v1::messaging_client::MessagingClient;
use cellmesh_proto::v1::routing_client::RoutingClient;
use cellmesh_proto::v1::*;
use cellmesh_tests::deploy::authed;
use cellmesh_tests::dev::{port_base, start_dev, wait_info};
use cellmesh_tests::router::SecretInterceptor;
use serde_json::Value;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

type Secured<C> = fn(InterceptedService<Channel, SecretInterceptor>) -> C;

/// A channel to `url` presenting `name`'s certificate from `tls` (the
/// deployment's CA, or `ca` instead).
async fn dial(url: &str, tls: &Path, name: &str, ca: &Path) -> Result<Channel, String> {
    let read = |p: std::path::PathBuf| std::fs::read(&p).unwrap();
    let config = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(ca.join("ca.pem"))))
        .identity(Identity::from_pem(
            read(tls.join(format!("{name}.pem"))),
            read(tls.join(format!("{name}.key"))),
        ))
        .domain_name(SERVER_NAME);
    let url = url.replace("http://", "https://");
    Channel::from_shared(url)
        .unwrap()
        .tls_config(config)
        .unwrap()
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))
}

async fn client<C>(url: &Value, tls: &Path, name: &str, secret: &str, make: Secured<C>) -> C {
    let channel = dial(url.as_str().unwrap(), tls, name, tls).await.unwrap();
    make(InterceptedService::new(
        channel,
        SecretInterceptor(ClusterSecret::new(secret)),
    ))
}

fn refused(e: &tonic::Status) -> (tonic::Code, String) {
    (e.code(), error_detail(e).reason)
}

fn denied() -> (tonic::Code, String) {
    (
        tonic::Code::PermissionDenied,
        Reason::RoleNotAllowed.as_str().into(),
    )
}

fn register(cell: &str, address: &str) -> RouteCommand {
    RouteCommand {
        command: Some(route_command::Command::RegisterCell(RegisterCell {
            cell_id: cell.into(),
            region: "eu-west".into(),
            address: address.into(),
            version: cellmesh_proto::version::BINARY.into(),
            owner_lease_ms: 0,
        })),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_mutual_tls_each_role_calls_only_what_it_may() {
    let dir = tempfile::tempdir().unwrap();
    let mut dev = start_dev(dir.path(), port_base(), &["--tls"]);
    let info = wait_info(dir.path(), dev.child()).await;
    let tls = dir.path().join("tls");
    let secret = info["cluster_secret"].as_str().unwrap().to_string();
    assert_eq!(
        info["tls"]["cert_file"].as_str(),
        Some(tls.join("operator-admin.pem").to_str().unwrap())
    );

    // Clients reach the edge in plaintext; the edge reaches the owner (in
    // another region) over TLS.
    let demo = &info["demo"];
    let conv = demo["conversations"][0]["id"].as_u64().unwrap();
    let alice = demo["tokens"]["1"].as_str().unwrap().to_string();
    let edge = Channel::from_shared(info["edges"]["eu-west"].as_str().unwrap().to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let sent = MessagingClient::new(edge)
        .send(authed(
            SendRequest {
                conversation_id: conv,
                client_req_id: "tls-1".into(),
                r#type: MessageType::Text as i32,
                body: b"over mutual TLS".to_vec(),
                ..Default::default()
            },
            &alice,
        ))
        .await
        .expect("a send through the edge")
        .into_inner();
    assert_eq!(sent.seq, 1);

    let cell = &info["cells"]["eu-west/c1"];
    let router = &info["routers"][0];
    strangers_get_no_answer(cell, dir.path(), &tls, &secret).await;

    // An edge: no route writes, no peer API, no Raft.
    let mut routes = client(router, &tls, "edge-eu-west", &secret, RoutingClient::new).await;
    let e = routes
        .apply(register("eu-west/c1", "http://127.0.0.1:1"))
        .await
        .unwrap_err();
    assert_eq!(refused(&e), denied(), "edge writes a route: {e:?}");
    assert!(
        routes.get_table(GetTableRequest::default()).await.is_ok(),
        "edge reads"
    );
    let mut peer = client(cell, &tls, "edge-eu-west", &secret, CellPeerClient::new).await;
    let e = peer.stats(StatsRequest {}).await.unwrap_err();
    assert_eq!(refused(&e), denied(), "edge calls CellPeer: {e:?}");

    // A cell: registers only itself, delivers only as itself, no Raft.
    let mut routes = client(router, &tls, "cell-eu-west-c1", &secret, RoutingClient::new).await;
    let e = routes
        .apply(register("eu-west/c2", "http://127.0.0.1:1"))
        .await
        .unwrap_err();
    assert_eq!(refused(&e), denied(), "a cell registers another: {e:?}");
    let mut peer = client(
        &info["cells"]["eu-west/c2"],
        &tls,
        "cell-eu-west-c1",
        &secret,
        CellPeerClient::new,
    )
    .await;
    assert!(
        peer.stats(StatsRequest {}).await.is_ok(),
        "cells call peers"
    );
    let e = peer
        .deliver_batch(DeliverBatchRequest {
            source_cell: "us-east/c1".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused(&e), denied(), "a cell delivers as another: {e:?}");
    raft_peers_speak_only_for_themselves(router, &tls, &secret).await;
    // The operator reads and writes.
    let mut routes = client(router, &tls, "operator-admin", &secret, RoutingClient::new).await;
    let table = routes
        .get_table(GetTableRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(table.cells.len(), 6);

    a_renewed_certificate_is_served_without_a_restart(cell, &tls, &secret).await;

    a_revoked_certificate_is_refused_everywhere(router, cell, &tls, &secret).await;
    assert!(routes.get_table(GetTableRequest::default()).await.is_ok());
}

/// Plaintext, even with the deployment secret, and a certificate another
/// CA signed get no answer from a cell.
async fn strangers_get_no_answer(cell: &Value, dir: &Path, tls: &Path, secret: &str) {
    let plain = Channel::from_shared(cell.as_str().unwrap().to_string())
        .unwrap()
        .connect()
        .await;
    if let Ok(channel) = plain {
        let mut peer = CellPeerClient::with_interceptor(
            channel,
            SecretInterceptor(ClusterSecret::new(secret)),
        );
        assert!(
            peer.stats(StatsRequest {}).await.is_err(),
            "plaintext answered"
        );
    }
    // A certificate another CA signed: the handshake fails.
    let other = dir.join("other-ca");
    let rogue = cellmesh_deployment::dev::pki::Pki::create(&other).unwrap();
    rogue.issue(&Peer::new(Role::Operator, "admin")).unwrap();
    // (TLS 1.3: the client may finish its side before the server refuses.)
    if let Ok(channel) = dial(cell.as_str().unwrap(), &other, "operator-admin", tls).await {
        assert!(
            CellPeerClient::new(channel)
                .stats(StatsRequest {})
                .await
                .is_err(),
            "a foreign certificate answered"
        );
    }
}

/// A cell may not vote in the routers' Raft; a router votes only as itself.
async fn raft_peers_speak_only_for_themselves(router: &Value, tls: &Path, secret: &str) {
    let raft_addr = raft_address(router.as_str().unwrap());
    let vote = |node_id| raft::VoteRequest {
        vote: Some(raft::Vote {
            term: 1,
            node_id,
            committed: false,
        }),
        last_log_id: None,
    };
    let mut as_cell = client(
        &Value::String(raft_addr.clone()),
        tls,
        "cell-eu-west-c1",
        secret,
        raft::raft_peer_client::RaftPeerClient::new,
    )
    .await;
    let e = as_cell.vote(vote(2)).await.unwrap_err();
    assert_eq!(refused(&e), denied(), "a cell votes: {e:?}");
    // A router speaks only for itself.
    let mut as_router = client(
        &Value::String(raft_addr),
        tls,
        "router-2",
        secret,
        raft::raft_peer_client::RaftPeerClient::new,
    )
    .await;
    let e = as_router.vote(vote(3)).await.unwrap_err();
    assert_eq!(refused(&e), denied(), "router 2 votes as 3: {e:?}");
    assert!(
        as_router.vote(vote(2)).await.is_ok(),
        "router 2's own (stale) vote is answered"
    );
}

/// Renewed in place: the cell presents its new certificate from the next
/// handshake on, without a restart, and keeps serving.
async fn a_renewed_certificate_is_served_without_a_restart(cell: &Value, tls: &Path, secret: &str) {
    let cell_url = cell.as_str().unwrap();
    let before = served_serial(cell_url, tls).await;
    pki(tls, &["issue", "--role", "cell", "--id", "eu-west/c1"]);
    let renewed = cellmesh_proto::tls::serial_of(&first_der(&tls.join("cell-eu-west-c1.pem")))
        .unwrap()
        .to_vec();
    assert_ne!(before, renewed);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while served_serial(cell_url, tls).await != renewed {
        assert!(
            std::time::Instant::now() < deadline,
            "the cell still presents its old certificate"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let mut peer = client(cell, tls, "operator-admin", secret, CellPeerClient::new).await;
    assert!(
        peer.stats(StatsRequest {}).await.is_ok(),
        "renewed cell serves"
    );
}

/// Revoked: the edge's certificate is refused by every server, on new
/// connections (the handshake) and on open ones (each call).
async fn a_revoked_certificate_is_refused_everywhere(
    router: &Value,
    cell: &Value,
    tls: &Path,
    secret: &str,
) {
    let cell_url = cell.as_str().unwrap();
    let mut edge_open = client(router, tls, "edge-eu-west", secret, RoutingClient::new).await;
    assert!(
        edge_open
            .get_table(GetTableRequest::default())
            .await
            .is_ok()
    );
    pki(
        tls,
        &[
            "revoke",
            "--cert",
            tls.join("edge-eu-west.pem").to_str().unwrap(),
        ],
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let e = loop {
        match edge_open.get_table(GetTableRequest::default()).await {
            Err(e) => break e,
            Ok(_) => assert!(
                std::time::Instant::now() < deadline,
                "a revoked certificate still answered"
            ),
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert_eq!(
        refused(&e),
        (
            tonic::Code::PermissionDenied,
            Reason::CertificateRevoked.as_str().into()
        ),
        "{e:?}"
    );
    // The cell reads the new list within a second too: from then on a
    // handshake with the revoked certificate fails, or its call is refused
    // before any handler (which would answer INVALID_ARGUMENT).
    loop {
        let Ok(channel) = dial(cell_url, tls, "edge-eu-west", tls).await else {
            break;
        };
        let answer = MessagingClient::new(channel)
            .send(SendRequest::default())
            .await;
        if answer.is_err_and(|e| e.code() != tonic::Code::InvalidArgument) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a revoked certificate still completes a handshake and a call"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Runs `cellmesh pki --dir <tls> <args>`.
fn pki(tls: &Path, args: &[&str]) {
    let out = std::process::Command::new(cellmesh_tests::cellmesh_bin())
        .args(["pki", "--dir"])
        .arg(tls)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cellmesh pki {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn first_der(pem_file: &Path) -> Vec<u8> {
    let pem = std::fs::read(pem_file).unwrap();
    x509_parser::pem::parse_x509_pem(&pem).unwrap().1.contents
}

/// The serial number of the certificate the server at `url` presents (a
/// handshake as the operator).
async fn served_serial(url: &str, tls: &Path) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(tls.join("ca.pem")).unwrap())
        .unwrap();
    let chain = vec![CertificateDer::from_pem_file(tls.join("operator-admin.pem")).unwrap()];
    let key = PrivateKeyDer::from_pem_file(tls.join("operator-admin.key")).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)
    .unwrap();
    let tcp = tokio::net::TcpStream::connect(url.trim_start_matches("http://"))
        .await
        .unwrap();
    let stream = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(ServerName::try_from(SERVER_NAME).unwrap(), tcp)
        .await
        .unwrap();
    let served = stream.get_ref().1.peer_certificates().unwrap()[0].clone();
    cellmesh_proto::tls::serial_of(served.as_ref())
        .unwrap()
        .to_vec()
}

/// The Raft address of the router whose API is `api`.
fn raft_address(api: &str) -> String {
    let port: u16 = api.rsplit(':').next().unwrap().parse().unwrap();
    // dev puts each router's Raft port right after its API port.
    format!("http://127.0.0.1:{}", port + 1)
}
