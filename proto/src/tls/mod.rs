//! Mutual TLS between the deployment's processes, and what each role may
//! call. A process configured with `[tls]` (the deployment's CA, its own
//! certificate and key) installs it once at start ([`install`]): every
//! internal server it runs then takes only connections that present a
//! certificate the CA signed ([`crate::server::builder`]), and every
//! channel it dials ([`endpoint`]) speaks TLS with its own certificate.
//!
//! A certificate names its holder in a URI subject alternative name,
//! `cellmesh:<role>/<id>` (`cellmesh:router/1`, `cellmesh:cell/eu-west/c1`,
//! `cellmesh:edge/eu-west`, `cellmesh:control-plane/1`,
//! `cellmesh:operator/admin`), and the DNS name [`SERVER_NAME`], which
//! clients verify whatever address they dial. [`Authorize`], the layer on
//! every internal server, refuses a service the caller's role may not call
//! (`PERMISSION_DENIED` / `ROLE_NOT_ALLOWED`) and hands the caller's
//! [`Peer`] to the handlers, which check what depends on the request (a
//! cell registers only itself; Raft messages come only from the router the
//! message names). Without `[tls]`, nothing here applies: the shared
//! secret (opt-in) is the only check.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use serde::{Deserialize, Serialize};
use tonic::transport::Endpoint;

pub mod dial;
pub mod files;

pub use dial::Dial;

use crate::reason::Reason;
use crate::status::to_status;
use crate::v1::ErrorCode;

/// The DNS name every certificate carries and every client verifies.
pub const SERVER_NAME: &str = "cellmesh.internal";
/// The scheme of the identity URI.
const SCHEME: &str = "cellmesh:";

/// `[tls]` of a role's config: the CA, certificate and key files, or none
/// (no TLS); a revocation list optionally.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM of the deployment's CA: peers must present a certificate it
    /// signed.
    pub ca_file: String,
    /// PEM certificate naming this process (`cellmesh:<role>/<id>`).
    pub cert_file: String,
    /// PEM private key of `cert_file`.
    pub key_file: String,
    /// Optional PEM certificate revocation lists the CA issued: a client
    /// certificate they name is refused. Read again when it changes, like
    /// the other three.
    pub crl_file: String,
}

/// A role a certificate names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Router,
    Cell,
    Edge,
    ControlPlane,
    /// An operator's tools: `cellmesh ctl`, drills, benchmarks.
    Operator,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Router => "router",
            Role::Cell => "cell",
            Role::Edge => "edge",
            Role::ControlPlane => "control-plane",
            Role::Operator => "operator",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [
            Role::Router,
            Role::Cell,
            Role::Edge,
            Role::ControlPlane,
            Role::Operator,
        ]
        .into_iter()
        .find(|r| r.as_str() == s)
    }
}

/// Who is calling, as its certificate says.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Peer {
    pub role: Role,
    pub id: String,
}

impl Peer {
    pub fn new(role: Role, id: &str) -> Self {
        Self {
            role,
            id: id.to_string(),
        }
    }

    /// The identity URI a certificate carries.
    pub fn uri(&self) -> String {
        format!("{SCHEME}{}/{}", self.role.as_str(), self.id)
    }

    /// `cellmesh:<role>/<id>`.
    pub fn parse(uri: &str) -> Option<Self> {
        let (role, id) = uri.strip_prefix(SCHEME)?.split_once('/')?;
        let role = Role::parse(role)?;
        (!id.is_empty()).then(|| Self::new(role, id))
    }

    /// The identity in a DER certificate (its first `cellmesh:` URI).
    pub fn of_certificate(der: &[u8]) -> Option<Self> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let san = cert.subject_alternative_name().ok()??;
        san.value.general_names.iter().find_map(|name| match name {
            x509_parser::extensions::GeneralName::URI(uri) => Self::parse(uri),
            _ => None,
        })
    }

    /// The caller of a request on a TLS connection (`None` on plaintext):
    /// what its certificate named at the handshake.
    pub fn of_request(extensions: &http::Extensions) -> Option<Self> {
        extensions.get::<crate::server::ConnInfo>()?.peer.clone()
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.role.as_str(), self.id)
    }
}

/// What `[tls]` names, as last read: the client side for the channels this
/// process dials ([`dial`]), the server side for its servers.
pub struct Material {
    client: Arc<rustls::ClientConfig>,
    server: Arc<rustls::ServerConfig>,
    /// Serial numbers the revocation lists name.
    revoked: std::collections::HashSet<Vec<u8>>,
    /// Whom the certificate names.
    pub me: Peer,
}

impl Material {
    /// The client side: this process's certificate, servers the CA signed
    /// and no revocation list names.
    pub fn client_config(&self) -> Arc<rustls::ClientConfig> {
        self.client.clone()
    }

    /// The server side: this process's certificate, clients the CA signed
    /// and no revocation list names.
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        self.server.clone()
    }
}

/// This process's TLS once installed: the files, watched for changes
/// ([`files::Watched`]).
pub struct Installed {
    /// Who this process is (a renewed certificate must name the same).
    pub me: Peer,
    /// The files it came from (clients that read them themselves: etcd's).
    pub config: TlsConfig,
    material: files::Watched<Material>,
}

static INSTALLED: OnceLock<Installed> = OnceLock::new();

impl TlsConfig {
    pub fn enabled(&self) -> bool {
        !(self.ca_file.is_empty() && self.cert_file.is_empty() && self.key_file.is_empty())
    }

    /// Reads and checks the files: the field at fault and why.
    pub fn load(&self) -> Result<Material, (&'static str, String)> {
        let read = |field: &'static str, path: &str| {
            if path.is_empty() {
                return Err((field, "is required when [tls] is set".to_string()));
            }
            std::fs::read(path).map_err(|e| (field, format!("cannot read {path}: {e}")))
        };
        let ca = read("tls.ca_file", &self.ca_file)?;
        let cert = read("tls.cert_file", &self.cert_file)?;
        let key = read("tls.key_file", &self.key_file)?;
        let crls = match self.crl_file.is_empty() {
            true => Vec::new(),
            false => read("tls.crl_file", &self.crl_file)?,
        };
        let me = first_der(&cert)
            .and_then(|der| Peer::of_certificate(&der))
            .ok_or((
                "tls.cert_file",
                format!("{} names no cellmesh:<role>/<id> identity", self.cert_file),
            ))?;
        let ca_certs = files::certificates(&ca).map_err(|e| ("tls.ca_file", e))?;
        let crls = files::revocation_lists(&crls).map_err(|e| ("tls.crl_file", e))?;
        let revoked = files::revoked_serials(&crls).map_err(|e| ("tls.crl_file", e))?;
        let client = files::client_config(&cert, &key, ca_certs.clone(), crls.clone())
            .map_err(|e| ("tls", e))?;
        let server = files::server_config(
            "tls.cert_file",
            &cert,
            "tls.key_file",
            &key,
            files::Clients::SignedBy { ca: ca_certs, crls },
        )
        .map_err(|e| ("tls", e))?;
        Ok(Material {
            client,
            server,
            revoked,
            me,
        })
    }
}

/// The first certificate of a PEM file, as DER.
fn first_der(pem: &[u8]) -> Option<Vec<u8>> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem).ok()?;
    (pem.label == "CERTIFICATE").then_some(pem.contents)
}

/// The serial number of a DER certificate.
pub fn serial_of(der: &[u8]) -> Option<Arc<[u8]>> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    Some(cert.tbs_certificate.raw_serial().into())
}

/// Installs `config` for this process (its servers and channels); `Ok(None)`
/// when `[tls]` is not set. A second install must name the same identity.
/// The files are watched from then on: a renewed certificate or an updated
/// revocation list is used by the next connection.
pub fn install(config: &TlsConfig) -> Result<Option<&'static Peer>, String> {
    if !config.enabled() {
        return Ok(None);
    }
    let loaded = config
        .load()
        .map_err(|(field, e)| format!("{field}: {e}"))?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let me = loaded.me.clone();
    if let Some(installed) = INSTALLED.get() {
        return match installed.me == me {
            true => Ok(Some(&installed.me)),
            false => Err(format!(
                "this process already runs as {}, not {me}",
                installed.me
            )),
        };
    }
    let watched_config = config.clone();
    let first = std::sync::Mutex::new(Some(loaded));
    let material = files::Watched::new(
        &[
            config.ca_file.as_str(),
            &config.cert_file,
            &config.key_file,
            &config.crl_file,
        ],
        move || {
            if let Some(first) = first.lock().unwrap_or_else(|e| e.into_inner()).take() {
                return Ok(first);
            }
            let material = watched_config
                .load()
                .map_err(|(field, e)| format!("{field}: {e}"))?;
            match material.me == me {
                true => Ok(material),
                false => Err(format!(
                    "{} now names {}, not this process",
                    watched_config.cert_file, material.me
                )),
            }
        },
    )?;
    let installed = INSTALLED.get_or_init(|| Installed {
        me: material.get().me.clone(),
        config: config.clone(),
        material,
    });
    Ok(Some(&installed.me))
}

/// This process's TLS, if installed.
pub fn installed() -> Option<&'static Installed> {
    INSTALLED.get()
}

impl Installed {
    /// The server side as the files say now: this process's certificate,
    /// client certificates the CA signed and no revocation list names.
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        self.material.get().server.clone()
    }

    /// Whether the revocation list names the certificate `serial`.
    pub fn is_revoked(&self, serial: &[u8]) -> bool {
        self.material.get().revoked.contains(serial)
    }

    /// Looks at the files now rather than within [`files::CHECK_EVERY`].
    pub fn reload(&self) -> bool {
        self.material.check(true)
    }
}

/// A channel endpoint for `url`, to be connected with [`dial::Dial`]:
/// that speaks TLS with this process's
/// certificate when installed (whether the address says `http://` or
/// `https://`).
pub fn endpoint(url: impl Into<String>) -> Result<Endpoint, tonic::transport::Error> {
    let url = url.into();
    if installed().is_none() {
        return Endpoint::from_shared(url);
    }
    // The dialer does the TLS: tonic must not try its own.
    let url = match url.strip_prefix("https://") {
        Some(rest) => format!("http://{rest}"),
        None => url,
    };
    Endpoint::from_shared(url)
}

/// TLS for clients of a client-facing server (`[client_tls]` of the
/// edge): the certificate it presents; clients present none. Both files or
/// neither (plaintext); watched like `[tls]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PublicTlsConfig {
    /// PEM certificate chain clients verify.
    pub cert_file: String,
    /// PEM private key of `cert_file`.
    pub key_file: String,
}

impl PublicTlsConfig {
    pub fn enabled(&self) -> bool {
        !(self.cert_file.is_empty() && self.key_file.is_empty())
    }

    fn build(&self) -> Result<Arc<rustls::ServerConfig>, String> {
        let cert = files::read("client_tls.cert_file", &self.cert_file)?;
        let key = files::read("client_tls.key_file", &self.key_file)?;
        files::server_config(
            "client_tls.cert_file",
            &cert,
            "client_tls.key_file",
            &key,
            files::Clients::Anyone,
        )
    }

    /// Checks the files (the field at fault in the error).
    pub fn validate(&self) -> Result<(), String> {
        match self.enabled() {
            true => self.build().map(|_| ()),
            false => Ok(()),
        }
    }

    /// The server side for [`crate::server::incoming_with`], `None` when
    /// not enabled.
    pub fn watch(&self) -> Result<Option<crate::server::TlsSource>, String> {
        if !self.enabled() {
            return Ok(None);
        }
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config = self.clone();
        let watched = files::Watched::new(&[self.cert_file.as_str(), &self.key_file], move || {
            config.build()
        })?;
        Ok(Some(Arc::new(move || (*watched.get()).clone())))
    }
}

/// Whether `role` may call `service` at all (what it may do there is the
/// handler's to check).
pub fn may_call(role: Role, service: &str) -> bool {
    use Role::*;
    match service {
        // Client-facing services on cells: through an edge, or an operator's tools.
        "cellmesh.v1.Messaging" | "cellmesh.v1.Sync" => matches!(role, Edge | Operator),
        "cellmesh.v1.CellPeer" => matches!(role, Cell | ControlPlane | Operator),
        "cellmesh.raft.v1.RaftPeer" => role == Router,
        "cellmesh.v1.Operations" | "cellmesh.v1.Backups" => matches!(role, ControlPlane | Operator),
        // Reads for every role; writes checked by the router per command.
        "cellmesh.v1.Routing" => true,
        // Health and reflection.
        _ => true,
    }
}

/// Refuses a caller whose role may not call the service; otherwise puts
/// its [`Peer`] in the request's extensions. A no-op without TLS.
#[derive(Clone, Copy, Debug, Default)]
pub struct Authorize;

impl<S> tower::Layer<S> for Authorize {
    type Service = Authorized<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Authorized { inner }
    }
}

#[derive(Clone, Debug)]
pub struct Authorized<S> {
    inner: S,
}

impl<S, B, R> tower::Service<http::Request<B>> for Authorized<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let answer = authorized_call(&mut self.inner, request);
        Box::pin(async move {
            let mut response = answer.await?;
            response.headers_mut().insert(
                crate::version::HEADER,
                http::HeaderValue::from_static(crate::version::BINARY),
            );
            Ok(response)
        })
    }
}

/// `inner`'s answer, or the refusal of a caller that may not call it.
#[allow(clippy::type_complexity)]
fn authorized_call<S, B, R>(
    inner: &mut S,
    mut request: http::Request<B>,
) -> Pin<Box<dyn Future<Output = Result<http::Response<R>, S::Error>> + Send>>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Default + Send + 'static,
{
    if installed().is_none() {
        return Box::pin(inner.call(request));
    }
    let service = request
        .uri()
        .path()
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or_default()
        .to_string();
    let info = request.extensions().get::<crate::server::ConnInfo>();
    if let Some(serial) = info.and_then(|i| i.serial.as_deref())
        && installed().is_some_and(|tls| tls.is_revoked(serial))
    {
        let who = info
            .and_then(|i| i.peer.as_ref())
            .map_or("a client".into(), |p| p.to_string());
        let status = to_status(
            ErrorCode::PermissionDenied,
            Reason::CertificateRevoked,
            format!("the certificate of {who} is revoked"),
            0,
            None,
        );
        return Box::pin(async move { Ok(status.into_http()) });
    }
    match Peer::of_request(request.extensions()) {
        Some(peer) if may_call(peer.role, &service) => {
            request.extensions_mut().insert(peer);
            Box::pin(inner.call(request))
        }
        peer => {
            let who = peer.map_or("a certificate without a cellmesh identity".into(), |p| {
                p.to_string()
            });
            let status = denied(format!("{who} may not call {service}"));
            Box::pin(async move { Ok(status.into_http()) })
        }
    }
}

/// `PERMISSION_DENIED` / `ROLE_NOT_ALLOWED`.
pub fn denied(message: String) -> tonic::Status {
    to_status(
        ErrorCode::PermissionDenied,
        Reason::RoleNotAllowed,
        message,
        0,
        None,
    )
}

/// The caller of a request as [`Authorize`] recorded it (`None` without
/// TLS).
pub fn caller<T>(request: &tonic::Request<T>) -> Option<&Peer> {
    request.extensions().get::<Peer>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_parse_and_print() {
        let cell = Peer::parse("cellmesh:cell/eu-west/c1").unwrap();
        assert_eq!(cell, Peer::new(Role::Cell, "eu-west/c1"));
        assert_eq!(cell.uri(), "cellmesh:cell/eu-west/c1");
        assert_eq!(
            Peer::parse("cellmesh:control-plane/1").unwrap().role,
            Role::ControlPlane
        );
        for bad in [
            "cell/eu-west/c1",
            "cellmesh:king/1",
            "cellmesh:cell/",
            "cellmesh:edge",
        ] {
            assert_eq!(Peer::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn roles_call_only_their_services() {
        assert!(may_call(Role::Edge, "cellmesh.v1.Messaging"));
        assert!(!may_call(Role::Edge, "cellmesh.v1.CellPeer"));
        assert!(!may_call(Role::Cell, "cellmesh.raft.v1.RaftPeer"));
        assert!(may_call(Role::Router, "cellmesh.raft.v1.RaftPeer"));
        assert!(!may_call(Role::Edge, "cellmesh.v1.Operations"));
        assert!(may_call(Role::Cell, "cellmesh.v1.CellPeer"));
        // A cell's backups: the control plane and operators only.
        assert!(!may_call(Role::Cell, "cellmesh.v1.Backups"));
        assert!(!may_call(Role::Edge, "cellmesh.v1.Backups"));
        assert!(may_call(Role::ControlPlane, "cellmesh.v1.Backups"));
        assert!(may_call(Role::Edge, "grpc.health.v1.Health"));
    }

    #[test]
    fn a_config_names_the_field_at_fault() {
        let config = TlsConfig {
            ca_file: "/nonexistent/ca.pem".into(),
            ..TlsConfig::default()
        };
        assert!(config.enabled());
        assert_eq!(config.load().err().unwrap().0, "tls.ca_file");
        assert!(!TlsConfig::default().enabled());
    }
}
