//! TLS for NBD connections (the protocol's `NBD_OPT_STARTTLS`), with rustls.
//!
//! Owns: loading the server's certificate chain and key (and, optionally, the certificate
//! authority that client certificates must chain to) from PEM files, and the rustls settings.
//! The handshake itself (when STARTTLS is allowed or required, and the reset of negotiated state
//! after it) lives in `negotiate` and `connection`. Must never: fall back to plaintext when TLS is
//! required, or start serving with a key that does not match its certificate.
//!
//! Pre-shared keys are not offered: rustls implements TLS 1.3 resumption PSKs only, not the
//! external PSKs that GnuTLS clients (qemu, libnbd) use for NBD.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Whether a server offers TLS, and whether it insists on it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TlsMode {
    /// `NBD_OPT_STARTTLS` is answered `NBD_REP_ERR_UNSUP`.
    #[default]
    Off,
    /// Clients may upgrade with `NBD_OPT_STARTTLS` or stay in plaintext.
    Optional,
    /// Every option but `NBD_OPT_STARTTLS` and `NBD_OPT_ABORT` is refused with
    /// `NBD_REP_ERR_TLS_REQD` until the connection is encrypted (the protocol's "forced TLS").
    Required,
}

/// Where the server's TLS material lives (PEM files).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server certificate, followed by any intermediates.
    pub certificate: PathBuf,
    /// The private key of the certificate (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// If set, clients must present a certificate issued by one of these authorities.
    pub client_ca: Option<PathBuf>,
}

/// Ready-to-use TLS settings of a server.
#[derive(Clone)]
pub struct TlsSettings {
    pub mode: TlsMode,
    pub(crate) acceptor: tokio_rustls::TlsAcceptor,
    pub(crate) client_certificates: bool,
}

impl std::fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSettings")
            .field("mode", &self.mode)
            .field("client_certificates", &self.client_certificates)
            .finish()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_certificates(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|error| format!("cannot read {what} {}: {error}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| format!("{what} {}: {error}", path.display()))?;
    if certificates.is_empty() {
        return Err(format!(
            "{what} {}: no PEM certificate in it",
            path.display()
        ));
    }
    Ok(certificates)
}

impl TlsSettings {
    /// Loads the files and checks that they make a usable server configuration (the key matches
    /// the certificate, the client authority parses). `mode` must not be `Off`.
    pub fn load(files: &TlsFiles, mode: TlsMode) -> Result<TlsSettings, String> {
        if mode == TlsMode::Off {
            return Err("TLS settings loaded with TLS off".into());
        }
        let chain = read_certificates(&files.certificate, "TLS certificate")?;
        let key = PrivateKeyDer::from_pem_file(&files.key)
            .map_err(|error| format!("TLS key {}: {error}", files.key.display()))?;
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|error| format!("TLS: {error}"))?;
        let builder = match &files.client_ca {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let mut roots = rustls::RootCertStore::empty();
                for certificate in read_certificates(path, "client certificate authority")? {
                    roots.add(certificate).map_err(|error| {
                        format!("client certificate authority {}: {error}", path.display())
                    })?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                        .build()
                        .map_err(|error| {
                            format!("client certificate authority {}: {error}", path.display())
                        })?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder.with_single_cert(chain, key).map_err(|error| {
            format!(
                "TLS certificate {} and key {} do not make a server identity: {error}",
                files.certificate.display(),
                files.key.display()
            )
        })?;
        Ok(TlsSettings {
            mode,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            client_certificates: files.client_ca.is_some(),
        })
    }
}
