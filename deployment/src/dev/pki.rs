//! `cellmesh dev --tls`: a certificate authority made for this run and one
//! certificate per process, in `<data dir>/tls` (keys mode 0600). Each
//! certificate names its holder (`cellmesh:<role>/<id>`) and the DNS name
//! every client verifies; `operator.pem` is for the operator's tools
//! (`cellmesh ctl`, and `cellmesh dev` itself). A real deployment issues
//! these from its own CA and points `[tls]` at the files.

use std::path::{Path, PathBuf};

use anyhow::Context;
use cellmesh_proto::tls::{Peer, SERVER_NAME, TlsConfig};
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};

pub struct Pki {
    dir: PathBuf,
    ca: Certificate,
    ca_key: KeyPair,
}

impl Pki {
    /// A new CA in `dir` (any older one there is replaced).
    pub fn create(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let ca_key = KeyPair::generate()?;
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
        let ca = params.self_signed(&ca_key)?;
        super::write_private(&dir.join("ca.pem"), ca.pem().as_bytes())?;
        Ok(Self {
            dir: dir.to_path_buf(),
            ca,
            ca_key,
        })
    }

    /// A certificate and key for `peer`, and the `[tls]` that uses them.
    pub fn issue(&self, peer: &Peer) -> anyhow::Result<TlsConfig> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec![SERVER_NAME.to_string()])?;
        params
            .subject_alt_names
            .push(SanType::URI(peer.uri().try_into()?));
        params
            .distinguished_name
            .push(DnType::CommonName, peer.to_string());
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &self.ca, &self.ca_key)?;
        let name = format!("{}-{}", peer.role.as_str(), peer.id.replace('/', "-"));
        let cert_file = self.dir.join(format!("{name}.pem"));
        let key_file = self.dir.join(format!("{name}.key"));
        super::write_private(&cert_file, cert.pem().as_bytes())?;
        super::write_private(&key_file, key.serialize_pem().as_bytes())?;
        let path = |p: &Path| p.display().to_string();
        Ok(TlsConfig {
            ca_file: path(&self.dir.join("ca.pem")),
            cert_file: path(&cert_file),
            key_file: path(&key_file),
        })
    }
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
}
