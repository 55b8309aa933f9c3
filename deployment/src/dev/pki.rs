//! `cellmesh dev --tls`: a certificate authority made for this run and one
//! certificate per process, in `<data dir>/tls` (keys mode 0600). Each
//! certificate names its holder (`cellmesh:<role>/<id>`) and the DNS name
//! every client verifies; `operator.pem` is for the operator's tools
//! (`cellmesh ctl`, and `cellmesh dev` itself). The CA's key stays there
//! (`ca.key`) with its revocation list (`crl.pem`, named by every `[tls]`),
//! so `cellmesh pki` can renew a certificate in place or revoke one while
//! the deployment runs: the processes read the files again. A real
//! deployment issues these from its own CA and points `[tls]` at the
//! files.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context, bail};
use cellmesh_proto::tls::{Peer, SERVER_NAME, TlsConfig};
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, CertificateRevocationListParams, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyIdMethod, KeyPair, KeyUsagePurpose, RevocationReason,
    RevokedCertParams, SanType, SerialNumber,
};

const CA_CERT: &str = "ca.pem";
const CA_KEY: &str = "ca.key";
const CRL: &str = "crl.pem";
/// How long a revocation list is current; `cellmesh pki revoke` issues a
/// new one each time.
const CRL_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);

pub struct Pki {
    dir: PathBuf,
    ca: Certificate,
    ca_key: KeyPair,
}

/// The CA's certificate from its key: the same subject and key, so what it
/// signs chains to the `ca.pem` clients trust.
fn ca_certificate(key: &KeyPair) -> anyhow::Result<Certificate> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "cellmesh dev CA");
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(params.self_signed(key)?)
}

/// Writes `bytes` to `path` (mode 0600) whole: a process reading the file
/// sees the old content or the new, never half.
fn replace(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    super::write_private(&tmp, bytes)?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot replace {}", path.display()))
}

impl Pki {
    /// A new CA in `dir` (any older one there is replaced), with an empty
    /// revocation list.
    pub fn create(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let ca_key = KeyPair::generate()?;
        let ca = ca_certificate(&ca_key)?;
        replace(&dir.join(CA_CERT), ca.pem().as_bytes())?;
        replace(&dir.join(CA_KEY), ca_key.serialize_pem().as_bytes())?;
        let pki = Self {
            dir: dir.to_path_buf(),
            ca,
            ca_key,
        };
        pki.write_crl(Vec::new(), 1)?;
        Ok(pki)
    }

    /// The CA a `create` left in `dir`.
    pub fn open(dir: &Path) -> anyhow::Result<Self> {
        let key_file = dir.join(CA_KEY);
        let pem = std::fs::read_to_string(&key_file).with_context(|| {
            format!(
                "cannot read {} (made by `cellmesh dev --tls`)",
                key_file.display()
            )
        })?;
        let ca_key = KeyPair::from_pem(&pem).context("ca.key holds no usable key")?;
        Ok(Self {
            dir: dir.to_path_buf(),
            ca: ca_certificate(&ca_key)?,
            ca_key,
        })
    }

    /// A new CA in `dir` for a deployment of its own; refused when `dir`
    /// already holds one (its certificates would no longer chain).
    pub fn init(dir: &Path) -> anyhow::Result<Self> {
        if dir.join(CA_KEY).exists() {
            bail!(
                "{} already holds a CA (ca.key): issue from it, or choose another --dir",
                dir.display()
            );
        }
        Self::create(dir)
    }

    /// The file stem of `peer`'s certificate and key (`cell-eu-west-1-c1`).
    pub fn stem(peer: &Peer) -> String {
        format!("{}-{}", peer.role.as_str(), peer.id.replace('/', "-"))
    }

    /// Whether `stem` has a certificate and key here.
    pub fn holds(&self, stem: &str) -> bool {
        ["pem", "key"]
            .iter()
            .all(|ext| self.dir.join(format!("{stem}.{ext}")).exists())
    }

    /// A certificate and key for `peer` (replacing any earlier one: a
    /// renewal), and the `[tls]` that uses them.
    pub fn issue(&self, peer: &Peer) -> anyhow::Result<TlsConfig> {
        let uri = SanType::URI(peer.uri().try_into()?);
        self.sign(&Self::stem(peer), &peer.to_string(), vec![uri])
    }

    /// A certificate for a process that is no cellmesh role — an etcd
    /// member — named `stem`: it carries [`SERVER_NAME`] (what cellmesh
    /// clients verify) and `names` (its host names or IP addresses, which
    /// its peers verify), and no `cellmesh:` identity, so it may call no
    /// cellmesh service.
    pub fn issue_server(&self, stem: &str, names: &[String]) -> anyhow::Result<TlsConfig> {
        let sans = names
            .iter()
            .map(|n| match n.parse::<std::net::IpAddr>() {
                Ok(ip) => Ok(SanType::IpAddress(ip)),
                Err(_) => Ok(SanType::DnsName(n.as_str().try_into()?)),
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        self.sign(stem, stem, sans)
    }

    /// Signs a new key's certificate for [`SERVER_NAME`] and `sans`, both
    /// server and client, into `<stem>.pem` and `<stem>.key`.
    fn sign(&self, stem: &str, common_name: &str, sans: Vec<SanType>) -> anyhow::Result<TlsConfig> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec![SERVER_NAME.to_string()])?;
        params.subject_alt_names.extend(sans);
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &self.ca, &self.ca_key)?;
        let cert_file = self.dir.join(format!("{stem}.pem"));
        let key_file = self.dir.join(format!("{stem}.key"));
        // The key first: until the certificate follows, readers keep the
        // pair they have (a key without its certificate does not load).
        replace(&key_file, key.serialize_pem().as_bytes())?;
        replace(&cert_file, cert.pem().as_bytes())?;
        let path = |p: &Path| p.display().to_string();
        Ok(TlsConfig {
            ca_file: path(&self.dir.join(CA_CERT)),
            cert_file: path(&cert_file),
            key_file: path(&key_file),
            crl_file: path(&self.dir.join(CRL)),
        })
    }

    /// Adds the certificate in `cert_file` to the revocation list; its
    /// serial number (hex).
    pub fn revoke(&self, cert_file: &Path) -> anyhow::Result<String> {
        let pem = std::fs::read(cert_file)
            .with_context(|| format!("cannot read {}", cert_file.display()))?;
        let (_, pem) = x509_parser::pem::parse_x509_pem(&pem)
            .map_err(|e| anyhow::anyhow!("{} is not PEM: {e}", cert_file.display()))?;
        let cert = pem
            .parse_x509()
            .map_err(|e| anyhow::anyhow!("{} is not a certificate: {e}", cert_file.display()))?;
        let serial = cert.tbs_certificate.raw_serial().to_vec();
        let (mut revoked, number) = self.revoked()?;
        if !revoked.contains(&serial) {
            revoked.push(serial.clone());
        }
        self.write_crl(revoked, number + 1)?;
        Ok(serial.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// The serials the current list names, and its number.
    fn revoked(&self) -> anyhow::Result<(Vec<Vec<u8>>, u64)> {
        let path = self.dir.join(CRL);
        let pem =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let (_, pem) = x509_parser::pem::parse_x509_pem(&pem)
            .map_err(|e| anyhow::anyhow!("{} is not PEM: {e}", path.display()))?;
        let (_, crl) = x509_parser::parse_x509_crl(&pem.contents)
            .map_err(|e| anyhow::anyhow!("{} is not a revocation list: {e}", path.display()))?;
        let serials = crl
            .iter_revoked_certificates()
            .map(|r| r.raw_serial().to_vec())
            .collect();
        let number = crl
            .crl_number()
            .and_then(|n| u64::try_from(n).ok())
            .unwrap_or(1);
        Ok((serials, number))
    }

    fn write_crl(&self, serials: Vec<Vec<u8>>, number: u64) -> anyhow::Result<()> {
        let now = SystemTime::now();
        let revoked_certs = serials
            .into_iter()
            .map(|serial| RevokedCertParams {
                serial_number: SerialNumber::from_slice(&serial),
                revocation_time: now.into(),
                reason_code: Some(RevocationReason::KeyCompromise),
                invalidity_date: None,
            })
            .collect();
        let params = CertificateRevocationListParams {
            this_update: now.into(),
            next_update: (now + CRL_LIFETIME).into(),
            crl_number: SerialNumber::from(number),
            issuing_distribution_point: None,
            revoked_certs,
            key_identifier_method: KeyIdMethod::Sha256,
        };
        let crl = params.signed_by(&self.ca, &self.ca_key)?;
        replace(&self.dir.join(CRL), crl.pem()?.as_bytes())
    }
}

/// `cellmesh pki`: certificates of a deployment whose CA is in `--dir`
/// (`<data dir>/tls` of `cellmesh dev --tls`, or one `pki init` made for
/// a Terraform deployment).
#[derive(clap::Args, Debug)]
pub struct PkiArgs {
    /// The folder holding ca.pem, ca.key and crl.pem.
    #[arg(long)]
    pub dir: PathBuf,
    #[command(subcommand)]
    pub command: PkiCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum PkiCommand {
    /// Creates the deployment's CA in `--dir` (refused if one is there).
    Init,
    /// Issues every certificate the Terraform variables call for
    /// (`terraform.tfvars.json`): routers, cells, edges, control plane and
    /// `operator/admin`. Keeps those already issued unless `--renew`.
    IssueAll {
        /// The example env's variables as JSON (`cellmesh plan --tfvars`
        /// writes them).
        #[arg(long)]
        tfvars: PathBuf,
        /// Issue every certificate anew (a rotation).
        #[arg(long)]
        renew: bool,
    },
    /// Issues (or renews in place) the certificate of `<role>/<id>`; a
    /// running process picks the new one up within seconds.
    Issue {
        /// router, cell, edge, control-plane or operator.
        #[arg(long)]
        role: String,
        /// e.g. `1`, `eu-west/c1`, `eu-west`, `admin`.
        #[arg(long)]
        id: String,
    },
    /// Revokes a certificate: every server refuses it from its next
    /// handshake.
    Revoke {
        /// The certificate's PEM file.
        #[arg(long)]
        cert: PathBuf,
    },
}

pub fn run(args: PkiArgs) -> anyhow::Result<()> {
    let open = || Pki::open(&args.dir);
    match args.command {
        PkiCommand::Init => {
            Pki::init(&args.dir)?;
            println!(
                "a new CA in {}: ca.pem, ca.key (keep it offline), crl.pem",
                args.dir.display()
            );
        }
        PkiCommand::IssueAll { tfvars, renew } => {
            let (issued, kept) = super::issue_all::issue_all(&open()?, &tfvars, renew)?;
            println!(
                "{issued} issued, {kept} kept in {} (Terraform's tls_dir)",
                args.dir.display()
            );
        }
        PkiCommand::Issue { role, id } => {
            let Some(peer) = Peer::parse(&format!("cellmesh:{role}/{id}")) else {
                bail!(
                    "unknown role {role:?} or empty id (roles: router, cell, edge, control-plane, operator)"
                );
            };
            let config = open()?.issue(&peer)?;
            println!("issued {peer}: {} {}", config.cert_file, config.key_file);
        }
        PkiCommand::Revoke { cert } => {
            let serial = open()?.revoke(&cert)?;
            println!("revoked serial {serial}: {}", args.dir.join(CRL).display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellmesh_proto::tls::Role;

    #[test]
    fn issued_certificates_name_their_holder() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::create(dir.path()).unwrap();
        let peer = Peer::new(Role::Cell, "eu-west/c1");
        let config = pki.issue(&peer).unwrap();
        let loaded = config.load().unwrap();
        assert_eq!(loaded.me, peer);
        assert!(config.key_file.ends_with("cell-eu-west-c1.key"));
    }

    /// A channel's dialler checks the server's certificate against the
    /// revocation list too: a revoked certificate no longer serves
    /// (tonic's own TLS client takes no lists).
    #[tokio::test]
    async fn a_dialler_refuses_a_server_presenting_a_revoked_certificate() {
        use cellmesh_proto::tls::dial::Dialer;
        use tower::Service;
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::create(dir.path()).unwrap();
        let cell = pki.issue(&Peer::new(Role::Cell, "eu-west/c1")).unwrap();
        let operator = pki.issue(&Peer::new(Role::Operator, "admin")).unwrap();
        // The server presents the cell's certificate throughout.
        let acceptor = tokio_rustls::TlsAcceptor::from(cell.load().unwrap().server_config());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri: tonic::transport::Uri = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    if let Ok(stream) = acceptor.accept(tcp).await {
                        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                        drop(stream);
                    }
                });
            }
        });
        let dialler = || Dialer::with(operator.load().unwrap().client_config());
        let served = dialler().call(uri.clone()).await;
        assert!(served.is_ok(), "{:?}", served.err());
        pki.revoke(Path::new(&cell.cert_file)).unwrap();
        let Err(refused) = dialler().call(uri).await else {
            panic!("a revoked server certificate was accepted");
        };
        assert!(
            refused.to_string().to_lowercase().contains("revoked"),
            "{refused}"
        );
    }

    /// A process handed another node's bundle is refused at its config
    /// check, naming whose certificate it holds.
    #[test]
    fn a_config_with_another_nodes_certificate_is_refused() {
        use cellmesh_proto::config::{ConfigError, check_tls};
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::create(dir.path()).unwrap();
        let cell = pki.issue(&Peer::new(Role::Cell, "eu-west-1/c1")).unwrap();
        assert!(check_tls(&cell, Role::Cell, Some("eu-west-1/c1")).is_ok());
        for (role, id) in [(Role::Cell, Some("eu-west-1/c2")), (Role::Edge, None)] {
            let Err(ConfigError::Invalid { field, message }) = check_tls(&cell, role, id) else {
                panic!("{role:?} {id:?} accepted a cell's certificate");
            };
            assert_eq!(field, "tls.cert_file");
            assert!(message.contains("cellmesh:cell/eu-west-1/c1"), "{message}");
        }
        assert!(Pki::init(dir.path()).is_err(), "a second CA over the first");
    }

    #[test]
    fn a_reopened_ca_revokes_and_the_list_keeps_earlier_serials() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::create(dir.path()).unwrap();
        let edge = pki.issue(&Peer::new(Role::Edge, "eu-west")).unwrap();
        let cell = pki.issue(&Peer::new(Role::Cell, "eu-west/c1")).unwrap();
        assert!(pki.revoked().unwrap().0.is_empty());
        let reopened = Pki::open(dir.path()).unwrap();
        reopened.revoke(Path::new(&edge.cert_file)).unwrap();
        reopened.revoke(Path::new(&cell.cert_file)).unwrap();
        reopened.revoke(Path::new(&cell.cert_file)).unwrap();
        let (serials, number) = reopened.revoked().unwrap();
        assert_eq!(serials.len(), 2);
        assert_eq!(number, 4);
        // The list is one a server loads (signed by the CA it trusts).
        cell.load().unwrap();
    }
}
