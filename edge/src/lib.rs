//! The edge access layer (`cellmesh edge`): the client-facing messaging API
//! and sync stream. It verifies each client's token, resolves the owning
//! cell from a watch-fed route cache and proxies there with the deployment
//! secret; cells are never exposed to clients.

pub mod auth;
pub mod directory;
mod metrics;
pub mod oidc;
mod open_streams;
pub mod proxy;
pub mod revoked;
mod search;
mod services;
mod web;
pub mod web_app;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cellmesh_proto::config::{ConfigError, check, check_grpc_urls, check_listen, check_range};
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1::attachments_server::AttachmentsServer;
use cellmesh_proto::v1::messaging_server::MessagingServer;
use cellmesh_proto::v1::sync_server::SyncServer;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use auth::TokenKey;
use cellmesh_route_client::client::RouteClient;
use proxy::Proxy;
use services::EdgeApi;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EdgeConfig {
    pub listen: SocketAddr,
    pub region: String,
    /// Routing API endpoints of the router replicas.
    pub routers: Vec<String>,
    /// The deployment's shared secret, sent on every call to cells and routers.
    pub cluster_secret: String,
    /// Verifies client tokens (`cellmesh ctl token` signs with the same).
    pub token_secret: String,
    /// More token keys by id (16+ bytes each): tokens name the key that
    /// signed them, so a new key is added here, issued with, and the old
    /// one dropped once its tokens expired.
    pub token_keys: std::collections::BTreeMap<String, String>,
    /// Tokens stating a longer life than this are refused
    /// (`TOKEN_LIFETIME_TOO_LONG`).
    pub max_token_lifetime_secs: u64,
    /// Token ids (`jti`) refused (`TOKEN_REVOKED`).
    pub revoked_tokens: Vec<String>,
    /// More revoked token ids, one per line (`#` comments), read again
    /// when the file changes: a token listed there is refused from then
    /// on, and its open sync streams end (`TOKEN_REVOKED`).
    pub revoked_tokens_file: String,
    /// The users each tenant has (see [`directory`]): `<tenant> <user>`
    /// lines, `<tenant> *` for a tenant open to any user. Set, a token for
    /// a user it does not list is refused (`UNKNOWN_USER`); read again when
    /// it changes. Empty (the default): any user a valid token names.
    pub directory_file: String,
    /// How long one client request may spend retrying WRONG_CELL / FROZEN.
    pub retry_deadline_ms: u64,
    pub retry_attempts: usize,
    /// Largest request accepted from a client.
    pub max_request_bytes: usize,
    /// Cell address → the address this edge dials instead (a proxy on the
    /// path to another region).
    pub links: std::collections::BTreeMap<String, String>,
    /// Where Prometheus scrapes `/metrics` (`host:port`, HTTP); empty (the
    /// default) turns it off.
    pub metrics_listen: String,
    /// OpenTelemetry trace export (`[telemetry]`); off without an endpoint.
    pub telemetry: cellmesh_telemetry::trace::TraceConfig,
    /// Mutual TLS on the deployment's internal links (`[tls]`: the CA, this
    /// process's certificate and key); none set: plaintext.
    pub tls: cellmesh_proto::tls::TlsConfig,
    /// Runs without `[tls]`: every internal link in plaintext, readable and
    /// forgeable by anyone on the network path. A config file must say so
    /// (`insecure_plaintext = true`) or configure `[tls]`; one that does
    /// neither is refused. `cellmesh dev` without `--tls` sets it.
    #[serde(default, skip_serializing_if = "cellmesh_proto::config::is_off")]
    pub insecure_plaintext: bool,
    /// TLS for clients (`[client_tls]`: the certificate and key clients
    /// see, reloaded when renewed); none set: clients speak plaintext.
    pub client_tls: cellmesh_proto::tls::PublicTlsConfig,
    /// Tenants' own identity providers (`[[oidc]]`): their JWTs are taken
    /// beside cellmesh tokens (see [`oidc`]).
    pub oidc: Vec<oidc::OidcProvider>,
    /// Origins whose pages may call the edge with gRPC-Web (CORS), e.g.
    /// `https://chat.example.com`; `"*"`: any. Empty (the default): no
    /// page of another origin.
    pub web_origins: Vec<String>,
    /// Serve the web chat app on the client port (`GET /`).
    pub web_app: bool,
    /// Serve the app from this directory instead of the one built in.
    pub web_root: String,
}

impl Default for EdgeConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:7200".parse().expect("valid default"),
            region: "local".into(),
            routers: vec!["http://127.0.0.1:7300".into()],
            cluster_secret: String::new(),
            token_secret: String::new(),
            token_keys: Default::default(),
            max_token_lifetime_secs: 90 * 24 * 3600,
            revoked_tokens: Vec::new(),
            revoked_tokens_file: String::new(),
            directory_file: String::new(),
            retry_deadline_ms: 5_000,
            retry_attempts: 20,
            max_request_bytes: 256 * 1024,
            links: Default::default(),
            metrics_listen: String::new(),
            telemetry: Default::default(),
            tls: Default::default(),
            // Configs built in code (tests, `cellmesh dev`) say what they
            // want; a file that does not say it gets `false`.
            insecure_plaintext: true,
            client_tls: Default::default(),
            oidc: Vec::new(),
            web_origins: Vec::new(),
            web_app: false,
            web_root: String::new(),
        }
    }
}

impl EdgeConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        cellmesh_proto::config::load_toml(path, Self::validate)
    }

    /// The directory `directory_file` names, read now (`None` when unset).
    pub fn directory(&self) -> Result<Option<Arc<directory::Users>>, ConfigError> {
        if self.directory_file.is_empty() {
            return Ok(None);
        }
        directory::Users::load(&self.directory_file)
            .map(Some)
            .map_err(|message| ConfigError::Invalid {
                field: "directory_file",
                message,
            })
    }

    /// The revoked token ids, following `revoked_tokens_file` when set.
    pub fn revocations(&self) -> Result<Arc<revoked::Revoked>, ConfigError> {
        let fixed = revoked::Revoked::new(&self.revoked_tokens);
        if self.revoked_tokens_file.is_empty() {
            return Ok(Arc::new(fixed));
        }
        fixed
            .with_file(&self.revoked_tokens_file)
            .map(Arc::new)
            .map_err(|message| ConfigError::Invalid {
                field: "revoked_tokens_file",
                message,
            })
    }

    /// Every field, then whether the internal links are secured (or
    /// knowingly not).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_fields()?;
        cellmesh_proto::config::check_transport(&self.tls, self.insecure_plaintext)
    }

    fn validate_fields(&self) -> Result<(), ConfigError> {
        cellmesh_proto::config::check_tls(
            &self.tls,
            cellmesh_proto::tls::Role::Edge,
            Some(&self.region),
        )?;
        self.client_tls
            .validate()
            .map_err(|message| ConfigError::Invalid {
                field: "client_tls",
                message,
            })?;
        check(
            "routers",
            !self.routers.is_empty(),
            "must name at least one router",
        )?;
        check_grpc_urls("routers", &self.routers)?;
        check(
            "token_secret",
            self.token_secret.len() >= 16,
            "must be at least 16 bytes",
        )?;
        check(
            "token_keys",
            self.token_keys
                .iter()
                .all(|(id, secret)| !id.is_empty() && secret.len() >= 16),
            "each key needs an id and at least 16 bytes",
        )?;
        check_range(
            "max_token_lifetime_secs",
            self.max_token_lifetime_secs,
            60,
            365 * 24 * 3600,
        )?;
        self.directory()?;
        check_range("retry_deadline_ms", self.retry_deadline_ms, 1, 600_000)?;
        check_range("retry_attempts", self.retry_attempts, 1, 1_000)?;
        check_range("max_request_bytes", self.max_request_bytes, 1024, 64 << 20)?;
        check_listen("metrics_listen", &self.metrics_listen)?;
        self.telemetry.validate()?;
        for provider in &self.oidc {
            provider.validate()?;
        }
        web::check_origins(&self.web_origins)?;
        if !self.web_root.is_empty() && !Path::new(&self.web_root).join("index.html").is_file() {
            return Err(ConfigError::Invalid {
                field: "web_root",
                message: format!("{} holds no index.html", self.web_root),
            });
        }
        Ok(())
    }

    /// The files `web_app` serves: `web_root`, or the app built in.
    pub fn app_files(&self) -> web_app::Files {
        if self.web_root.is_empty() {
            web_app::Files::BuiltIn
        } else {
            web_app::Files::Dir(self.web_root.clone().into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_config_is_valid_and_bad_values_name_their_field() {
        let example: EdgeConfig =
            cellmesh_proto::config::parse_toml(include_str!("../../config/edge.toml")).unwrap();
        example.validate().unwrap();
        assert_eq!(
            example.retry_deadline_ms,
            EdgeConfig::default().retry_deadline_ms
        );
        let err = EdgeConfig::default().validate().unwrap_err().to_string();
        assert!(err.contains("token_secret"), "{err}");
        let bad = EdgeConfig {
            routers: vec!["127.0.0.1:7300".into()],
            ..example
        };
        assert!(bad.validate().unwrap_err().to_string().contains("routers"));
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EdgeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot reach the route table: {0}")]
    Routing(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("grpc: {0}")]
    Grpc(String),
    #[error("tls: {0}")]
    Tls(String),
    #[error("cannot serve metrics: {0}")]
    Metrics(String),
}

pub struct RunningEdge {
    pub addr: SocketAddr,
    pub routes: RouteClient,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl RunningEdge {
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut self.task).await;
    }
}

pub async fn start(config: EdgeConfig) -> Result<RunningEdge, EdgeError> {
    config.validate()?;
    cellmesh_proto::tls::install(&config.tls).map_err(EdgeError::Tls)?;
    let client_tls = config.client_tls.watch().map_err(EdgeError::Tls)?;
    let secret = ClusterSecret::new(&config.cluster_secret);
    let mut tokens = TokenKey::new(&config.token_secret)
        .with_keys(&config.token_keys)
        .limited(config.max_token_lifetime_secs, &config.revoked_tokens)
        .with_revoked(config.revocations()?);
    if let Some(users) = config.directory()? {
        tokens = tokens.with_directory(users);
    }
    tokens = tokens.with_oidc(Arc::new(oidc::Oidc::load(&config.oidc).await));
    let routes = RouteClient::connect(config.routers.clone(), secret.clone())
        .await
        .map_err(|e| EdgeError::Routing(e.message().to_string()))?;
    let proxy = Arc::new(Proxy::new(
        routes.clone(),
        secret,
        tokens,
        Duration::from_millis(config.retry_deadline_ms),
        config.retry_attempts,
        config.links.clone(),
    ));
    let streams = Arc::new(open_streams::OpenStreams::default());
    let tokens = proxy.clone();
    let sweeper = streams
        .spawn_sweeper(move |claims| (tokens.tokens()).still_admits(claims, auth::now_secs()));
    let api = EdgeApi {
        proxy,
        streams: streams.clone(),
    };
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| EdgeError::Bind {
            addr: config.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| EdgeError::Bind {
        addr: config.listen,
        source,
    })?;
    let standard = cellmesh_proto::server::standard_services::<MessagingServer<EdgeApi>>(&[
        <SyncServer<EdgeApi> as tonic::server::NamedService>::NAME,
        <AttachmentsServer<EdgeApi> as tonic::server::NamedService>::NAME,
    ])
    .await
    .map_err(|e| EdgeError::Grpc(e.to_string()))?;
    routes.report_process(
        "edge",
        &format!("{}/{addr}", config.region),
        &addr.to_string(),
    );
    standard.reporter.set_serving::<SyncServer<EdgeApi>>().await;
    standard
        .reporter
        .set_serving::<AttachmentsServer<EdgeApi>>()
        .await;
    let attachments = AttachmentsServer::new(api.clone());
    let messaging =
        MessagingServer::new(api.clone()).max_decoding_message_size(config.max_request_bytes);
    let sync = SyncServer::new(api).max_decoding_message_size(config.max_request_bytes);
    let metrics = cellmesh_telemetry::admin::serve_configured(&config.metrics_listen)
        .await
        .map_err(EdgeError::Metrics)?;
    let (tx, rx) = oneshot::channel();
    let web_origins = config.web_origins.clone();
    let app = web_app::AppLayer::new(config.web_app.then(|| config.app_files()));
    let task = tokio::spawn(async move {
        // Clients reach the edge without certificates (over TLS when
        // `[client_tls]` is set); its calls to cells and routers carry the
        // edge's.
        // Browsers speak gRPC-Web over HTTP/1.1 or HTTP/2; their pages'
        // origins are checked first (CORS).
        let result = cellmesh_proto::server::public_builder()
            .accept_http1(true)
            .layer(web::cors(&web_origins))
            .layer(app)
            .layer(tonic_web::GrpcWebLayer::new())
            .layer(cellmesh_telemetry::server::ServerLayer)
            .add_service(standard.health)
            .add_service(standard.reflection)
            .add_service(standard.reflection_v1alpha)
            .add_service(messaging)
            .add_service(sync)
            .add_service(attachments)
            .serve_with_incoming_shutdown(
                cellmesh_proto::server::incoming_with(
                    listener,
                    cellmesh_proto::server::IDLE,
                    client_tls,
                ),
                async move {
                    let _ = rx.await;
                    // Device streams never end on their own: ended here,
                    // the stop waits only for calls in flight, and each
                    // device reconnects at once.
                    streams.end_all(open_streams::stopping());
                },
            )
            .await;
        if let Some((_, server)) = metrics {
            server.abort();
        }
        sweeper.abort();
        if let Err(e) = result {
            tracing::error!(error = %e, "edge server stopped");
        }
    });
    tracing::info!(%addr, region = %config.region, "edge serving");
    Ok(RunningEdge {
        addr,
        routes,
        stop: Some(tx),
        task,
    })
}
