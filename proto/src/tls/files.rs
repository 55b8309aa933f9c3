//! The files behind a TLS configuration, read again when they change. A
//! certificate renewed on disk, or a revocation list with one more serial,
//! reaches the next handshake without a restart: [`Watched`] looks at the
//! files' size and modification time at most once per [`CHECK_EVERY`], and
//! rebuilds what depends on them. A rebuild that fails (a key written
//! before its certificate, a truncated file) keeps the last good build in
//! service and says why once.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// How often the files are looked at, at most.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// What is known of a file: its size and modification time (`None`: it
/// could not be read).
type Stamp = Vec<Option<(u64, SystemTime)>>;

type Build<T> = Box<dyn Fn() -> Result<T, String> + Send + Sync>;

/// A value built from files, rebuilt when one of them changes.
pub struct Watched<T> {
    paths: Vec<PathBuf>,
    build: Build<T>,
    current: RwLock<(Stamp, Arc<T>)>,
    state: Mutex<CheckState>,
    /// When the files are next looked at (ms since `born`): calls before
    /// then read the current build without taking a lock.
    born: Instant,
    next_check_ms: AtomicU64,
}

struct CheckState {
    last_error: Option<String>,
}

impl<T> Watched<T> {
    /// Builds the value once (an error is the caller's to report) and
    /// watches `paths` (empty paths are skipped).
    pub fn new(
        paths: &[&str],
        build: impl Fn() -> Result<T, String> + Send + Sync + 'static,
    ) -> Result<Self, String> {
        let paths: Vec<PathBuf> = paths
            .iter()
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .collect();
        let stamp = stamp(&paths);
        let value = build()?;
        Ok(Self {
            paths,
            build: Box::new(build),
            current: RwLock::new((stamp, Arc::new(value))),
            born: Instant::now(),
            next_check_ms: AtomicU64::new(CHECK_EVERY.as_millis() as u64),
            state: Mutex::new(CheckState { last_error: None }),
        })
    }

    /// The current build, rebuilt first if the files changed since.
    pub fn get(&self) -> Arc<T> {
        self.check(false);
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone()
    }

    /// Looks at the files now (`force`) or if [`CHECK_EVERY`] has passed;
    /// rebuilds if they changed. Whether the value was replaced.
    pub fn check(&self, force: bool) -> bool {
        let now_ms = self.born.elapsed().as_millis() as u64;
        if !force && now_ms < self.next_check_ms.load(Ordering::Relaxed) {
            return false;
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // Another call may have checked while this one waited.
        if !force && now_ms < self.next_check_ms.load(Ordering::Relaxed) {
            return false;
        }
        self.next_check_ms
            .store(now_ms + CHECK_EVERY.as_millis() as u64, Ordering::Relaxed);
        let now = stamp(&self.paths);
        if self.current.read().unwrap_or_else(|e| e.into_inner()).0 == now {
            return false;
        }
        match (self.build)() {
            Ok(value) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = (now, Arc::new(value));
                state.last_error = None;
                tracing::info!(files = ?self.paths, "watched files changed: reloaded");
                true
            }
            Err(e) => {
                if state.last_error.as_ref() != Some(&e) {
                    tracing::warn!(error = %e, "watched files changed but do not load; the previous ones stay in use");
                    state.last_error = Some(e);
                }
                false
            }
        }
    }
}

fn stamp(paths: &[PathBuf]) -> Stamp {
    paths
        .iter()
        .map(|p| {
            let meta = std::fs::metadata(p).ok()?;
            Some((meta.len(), meta.modified().ok()?))
        })
        .collect()
}

/// Reads `path` for the config field `field`.
pub fn read(field: &str, path: &str) -> Result<Vec<u8>, String> {
    if path.is_empty() {
        return Err(format!("{field}: is required"));
    }
    std::fs::read(path).map_err(|e| format!("{field}: cannot read {path}: {e}"))
}

/// The certificates of a PEM file.
pub fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not PEM certificates: {e}"))?;
    if certs.is_empty() {
        return Err("holds no certificate".into());
    }
    Ok(certs)
}

/// The revocation lists of a PEM file (none for an empty one).
pub fn revocation_lists(pem: &[u8]) -> Result<Vec<CertificateRevocationListDer<'static>>, String> {
    CertificateRevocationListDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not PEM revocation lists: {e}"))
}

/// The serial numbers `crls` name.
pub fn revoked_serials(
    crls: &[CertificateRevocationListDer<'static>],
) -> Result<std::collections::HashSet<Vec<u8>>, String> {
    let mut serials = std::collections::HashSet::new();
    for crl in crls {
        let (_, list) = x509_parser::parse_x509_crl(crl.as_ref())
            .map_err(|e| format!("not a revocation list: {e}"))?;
        serials.extend(
            list.iter_revoked_certificates()
                .map(|r| r.raw_serial().to_vec()),
        );
    }
    Ok(serials)
}

/// Who may connect to a server: anyone (a client-facing server), or only
/// holders of a certificate `ca` signed and no list in `crls` revoked.
pub enum Clients {
    Anyone,
    SignedBy {
        ca: Vec<CertificateDer<'static>>,
        crls: Vec<CertificateRevocationListDer<'static>>,
    },
}

/// A rustls server configuration presenting `cert` (PEM chain) with `key`,
/// speaking HTTP/2.
pub fn server_config(
    cert_field: &str,
    cert: &[u8],
    key_field: &str,
    key: &[u8],
    clients: Clients,
) -> Result<Arc<ServerConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates(cert).map_err(|e| format!("{cert_field}: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(key)
        .map_err(|e| format!("{key_field}: holds no usable private key: {e}"))?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match clients {
        Clients::Anyone => builder.with_no_client_auth(),
        Clients::SignedBy { ca, crls } => {
            let verifier = WebPkiClientVerifier::builder_with_provider(roots(ca)?, provider)
                .with_crls(crls)
                .build()
                .map_err(|e| format!("tls.ca_file / tls.crl_file: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("{cert_field} / {key_field}: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// The trust anchors of `tls.ca_file`.
fn roots(ca: Vec<CertificateDer<'static>>) -> Result<Arc<RootCertStore>, String> {
    let mut roots = RootCertStore::empty();
    for cert in ca {
        roots
            .add(cert)
            .map_err(|e| format!("tls.ca_file: unusable CA certificate: {e}"))?;
    }
    Ok(Arc::new(roots))
}

/// A rustls client configuration presenting `cert` (PEM chain) with `key`,
/// speaking HTTP/2 to servers whose certificate `ca` signed and no list in
/// `crls` revoked.
pub fn client_config(
    cert: &[u8],
    key: &[u8],
    ca: Vec<CertificateDer<'static>>,
    crls: Vec<CertificateRevocationListDer<'static>>,
) -> Result<Arc<ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates(cert).map_err(|e| format!("tls.cert_file: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(key)
        .map_err(|e| format!("tls.key_file: holds no usable private key: {e}"))?;
    let verifier = WebPkiServerVerifier::builder_with_provider(roots(ca)?, provider.clone())
        .with_crls(crls)
        .build()
        .map_err(|e| format!("tls.ca_file / tls.crl_file: {e}"))?;
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_webpki_verifier(verifier)
        .with_client_auth_cert(chain, key)
        .map_err(|e| format!("tls.cert_file / tls.key_file: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn a_changed_file_is_rebuilt_and_a_broken_one_keeps_the_last_good_build() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("value");
        std::fs::write(&path, "1").unwrap();
        let builds = Arc::new(AtomicUsize::new(0));
        let counted = builds.clone();
        let file = path.clone();
        let watched = Watched::new(&[path.to_str().unwrap()], move || {
            counted.fetch_add(1, Ordering::SeqCst);
            let text = std::fs::read_to_string(&file).map_err(|e| e.to_string())?;
            text.trim().parse::<u32>().map_err(|e| e.to_string())
        })
        .unwrap();
        assert_eq!(*watched.get(), 1);
        // Unchanged files are not read again.
        assert!(!watched.check(true));
        assert_eq!(builds.load(Ordering::SeqCst), 1);
        std::fs::write(&path, "22").unwrap();
        assert!(watched.check(true));
        assert_eq!(*watched.get(), 22);
        std::fs::write(&path, "not a number").unwrap();
        assert!(!watched.check(true));
        assert_eq!(
            *watched.get(),
            22,
            "a broken file keeps the last good value"
        );
        std::fs::write(&path, "333").unwrap();
        assert!(watched.check(true));
        assert_eq!(*watched.get(), 333);
    }

    #[test]
    fn bad_material_names_the_field() {
        let e = server_config("edge.cert", b"junk", "edge.key", b"junk", Clients::Anyone)
            .err()
            .unwrap();
        assert_eq!(e, "edge.cert: holds no certificate");
        assert!(read("tls.crl_file", "/nonexistent/crl.pem").is_err());
    }
}
