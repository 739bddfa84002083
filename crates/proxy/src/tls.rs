//! TLS termination through BoringSSL: certificates chosen by SNI, ALPN (`h2`, `http/1.1`),
//! TLS 1.2 and 1.3, resumption on or off, and where the private-key operation of each full
//! handshake runs (the provider): inline in the worker, or on a pool of crypto threads through
//! BoringSSL's asynchronous private-key method, so the worker serves other connections while
//! the signature is computed.

use crate::config::{Provider, Tls};
use boring::hash::MessageDigest;
use boring::nid::Nid;
use boring::pkey::{PKey, Private};
use boring::rsa::Padding;
use boring::sign::{RsaPssSaltlen, Signer};
use boring::ssl::{AlpnError, NameType, SslAcceptor, SslAcceptorBuilder, SslContext, SslMethod, SslOptions, SslSessionCacheMode, SslSignatureAlgorithm, SslVersion};
use boring::x509::X509;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use tokio_boring::{AsyncPrivateKeyMethod, AsyncPrivateKeyMethodError, BoxPrivateKeyMethodFuture};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{field}: {path}: {msg}")]
    File { field: String, path: String, msg: String },
    #[error("{field}: {msg}")]
    Setup { field: String, msg: String },
}

/// Handshake statistics of a listener.
#[derive(Debug, Default)]
pub struct TlsStats {
    pub handshakes: AtomicU64,
    pub handshake_failures: AtomicU64,
    /// Private-key operations run by the provider (pool only; inline ones run inside BoringSSL).
    pub offloaded: AtomicU64,
    pub offload_failures: AtomicU64,
}

struct Job {
    key: Arc<PKey<Private>>,
    alg: SslSignatureAlgorithm,
    input: Vec<u8>,
    reply: tokio::sync::oneshot::Sender<Result<Vec<u8>, String>>,
}

/// Signs `input` as TLS asks for `alg`.
fn sign(key: &PKey<Private>, alg: SslSignatureAlgorithm, input: &[u8]) -> Result<Vec<u8>, String> {
    let (md, pss) = match alg {
        SslSignatureAlgorithm::RSA_PKCS1_SHA256 | SslSignatureAlgorithm::ECDSA_SECP256R1_SHA256 => (MessageDigest::sha256(), false),
        SslSignatureAlgorithm::RSA_PKCS1_SHA384 | SslSignatureAlgorithm::ECDSA_SECP384R1_SHA384 => (MessageDigest::sha384(), false),
        SslSignatureAlgorithm::RSA_PKCS1_SHA512 | SslSignatureAlgorithm::ECDSA_SECP521R1_SHA512 => (MessageDigest::sha512(), false),
        SslSignatureAlgorithm::RSA_PSS_RSAE_SHA256 => (MessageDigest::sha256(), true),
        SslSignatureAlgorithm::RSA_PSS_RSAE_SHA384 => (MessageDigest::sha384(), true),
        SslSignatureAlgorithm::RSA_PSS_RSAE_SHA512 => (MessageDigest::sha512(), true),
        a => return Err(format!("signature algorithm {a:?} is not offered")),
    };
    let mut s = Signer::new(md, key).map_err(|e| e.to_string())?;
    if key.rsa().is_ok() {
        s.set_rsa_padding(if pss { Padding::PKCS1_PSS } else { Padding::PKCS1 }).map_err(|e| e.to_string())?;
        if pss {
            s.set_rsa_pss_saltlen(RsaPssSaltlen::DIGEST_LENGTH).map_err(|e| e.to_string())?;
        }
    }
    s.sign_oneshot_to_vec(input).map_err(|e| e.to_string())
}

/// The `pool` provider: operations queue to crypto threads; the handshake's future completes
/// when its signature is ready.
struct PoolMethod {
    key: Arc<PKey<Private>>,
    jobs: Mutex<mpsc::Sender<Job>>,
    stats: Arc<TlsStats>,
}

impl AsyncPrivateKeyMethod for PoolMethod {
    fn sign(&self, _ssl: &mut boring::ssl::SslRef, input: &[u8], alg: SslSignatureAlgorithm, _output: &mut [u8]) -> Result<BoxPrivateKeyMethodFuture, AsyncPrivateKeyMethodError> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        let job = Job { key: self.key.clone(), alg, input: input.to_vec(), reply };
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).send(job).map_err(|_| AsyncPrivateKeyMethodError)?;
        self.stats.offloaded.fetch_add(1, Ordering::Relaxed);
        let stats = self.stats.clone();
        Ok(Box::pin(async move {
            let sig = match rx.await {
                Ok(Ok(sig)) => sig,
                _ => {
                    stats.offload_failures.fetch_add(1, Ordering::Relaxed);
                    return Err(AsyncPrivateKeyMethodError);
                }
            };
            Ok(Box::new(move |_: &mut boring::ssl::SslRef, out: &mut [u8]| {
                // BoringSSL sized `out` for the key's largest signature.
                let d = out.get_mut(..sig.len()).ok_or(AsyncPrivateKeyMethodError)?;
                d.copy_from_slice(&sig);
                Ok(sig.len())
            }) as Box<dyn FnOnce(&mut boring::ssl::SslRef, &mut [u8]) -> Result<usize, AsyncPrivateKeyMethodError>>)
        }))
    }

    fn decrypt(&self, _ssl: &mut boring::ssl::SslRef, _input: &[u8], _output: &mut [u8]) -> Result<BoxPrivateKeyMethodFuture, AsyncPrivateKeyMethodError> {
        // RSA key exchange is not offered (only (EC)DHE suites), so nothing is decrypted.
        Err(AsyncPrivateKeyMethodError)
    }
}

/// Starts `n` crypto threads serving one queue.
fn pool(n: usize) -> mpsc::Sender<Job> {
    let (tx, rx) = mpsc::channel::<Job>();
    let rx = Arc::new(Mutex::new(rx));
    for i in 0..n {
        let rx = rx.clone();
        let _ = std::thread::Builder::new().name(format!("vlb-crypto-{i}")).spawn(move || loop {
            let job = match rx.lock().unwrap_or_else(|e| e.into_inner()).recv() {
                Ok(j) => j,
                Err(_) => return,
            };
            let _ = job.reply.send(sign(&job.key, job.alg, &job.input));
        });
    }
    tx
}

fn read(field: &str, path: &std::path::Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::File { field: field.into(), path: path.display().to_string(), msg: e.to_string() })
}

/// The DNS names a certificate is for (subjectAltName, else the common name), lower case.
fn names(cert: &X509) -> Vec<String> {
    let mut out: Vec<String> = cert.subject_alt_names().map(|s| s.iter().filter_map(|g| g.dnsname().map(str::to_ascii_lowercase)).collect()).unwrap_or_default();
    if out.is_empty() {
        out.extend(cert.subject_name().entries_by_nid(Nid::COMMONNAME).filter_map(|e| e.data().as_utf8().ok().map(|s| s.to_string().to_ascii_lowercase())));
    }
    out
}

fn name_matches(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => host.split_once('.').is_some_and(|(_, rest)| rest == suffix),
        None => pattern == host,
    }
}

fn setup(field: &str) -> impl Fn(boring::error::ErrorStack) -> TlsError + '_ {
    move |e| TlsError::Setup { field: field.into(), msg: e.to_string() }
}

/// One context per certificate, configured alike.
fn context(field: &str, tls: &Tls, i: usize, pool: &Option<mpsc::Sender<Job>>, stats: &Arc<TlsStats>) -> Result<(SslAcceptorBuilder, Vec<String>), TlsError> {
    let c = &tls.certificates[i];
    let fc = format!("{field}.certificates[{i}]");
    let chain = X509::stack_from_pem(&read(&format!("{fc}.cert"), &c.cert)?)
        .map_err(|e| TlsError::File { field: format!("{fc}.cert"), path: c.cert.display().to_string(), msg: format!("not a PEM certificate: {e}") })?;
    let leaf = chain.first().cloned().ok_or_else(|| TlsError::File { field: format!("{fc}.cert"), path: c.cert.display().to_string(), msg: "no certificate in the file".into() })?;
    let key = PKey::private_key_from_pem(&read(&format!("{fc}.key"), &c.key)?)
        .map_err(|e| TlsError::File { field: format!("{fc}.key"), path: c.key.display().to_string(), msg: format!("not a PEM private key: {e}") })?;
    let pubkey = leaf.public_key().map_err(setup(&fc))?;
    if !pubkey.public_eq(&key) {
        return Err(TlsError::Setup { field: fc, msg: "the key does not belong to the certificate".into() });
    }
    let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls()).map_err(setup(field))?;
    b.set_min_proto_version(Some(if tls.min_version == "1.3" { SslVersion::TLS1_3 } else { SslVersion::TLS1_2 })).map_err(setup(field))?;
    b.set_certificate(&leaf).map_err(setup(&fc))?;
    for extra in chain.into_iter().skip(1) {
        b.add_extra_chain_cert(extra).map_err(setup(&fc))?;
    }
    match (tls.provider, pool) {
        (Provider::Pool { .. }, Some(jobs)) => {
            b.set_async_private_key_method(PoolMethod { key: Arc::new(key), jobs: Mutex::new(jobs.clone()), stats: stats.clone() });
        }
        _ => b.set_private_key(&key).map_err(setup(&fc))?,
    }
    if !tls.resumption {
        b.set_session_cache_mode(SslSessionCacheMode::OFF);
        b.set_options(SslOptions::NO_TICKET);
    }
    b.set_alpn_select_callback(|_, client| boring::ssl::select_next_proto(b"\x02h2\x08http/1.1", client).ok_or(AlpnError::NOACK));
    Ok((b, names(&leaf)))
}

/// A listener's acceptor: the first certificate's context, switching to another's by SNI.
pub fn acceptor(field: &str, tls: &Tls, stats: Arc<TlsStats>) -> Result<SslAcceptor, TlsError> {
    let jobs = match tls.provider {
        Provider::Pool { threads } => Some(pool(threads)),
        Provider::Inline => None,
    };
    let mut others: Vec<(Vec<String>, SslContext)> = Vec::new();
    for i in 1..tls.certificates.len() {
        let (b, names) = context(field, tls, i, &jobs, &stats)?;
        others.push((names, b.build().into_context()));
    }
    let (mut first, _) = context(field, tls, 0, &jobs, &stats)?;
    if !others.is_empty() {
        first.set_servername_callback(move |ssl, _alert| {
            if let Some(host) = ssl.servername(NameType::HOST_NAME).map(str::to_ascii_lowercase) {
                if let Some((_, ctx)) = others.iter().find(|(names, _)| names.iter().any(|n| name_matches(n, &host))) {
                    let _ = ssl.set_ssl_context(ctx);
                }
            }
            Ok(())
        });
    }
    Ok(first.build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_names_cover_one_label() {
        assert!(name_matches("*.example.com", "www.example.com"));
        assert!(!name_matches("*.example.com", "a.b.example.com"));
        assert!(!name_matches("*.example.com", "example.com"));
        assert!(name_matches("example.com", "example.com"));
    }

    #[test]
    fn signatures_verify_for_every_offered_algorithm_and_others_are_refused() {
        let rsa = PKey::from_rsa(boring::rsa::Rsa::generate(2048).unwrap()).unwrap();
        let ec = PKey::from_ec_key(boring::ec::EcKey::generate(&boring::ec::EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap()).unwrap()).unwrap();
        let msg = b"handshake transcript";
        for (key, alg, md, pss) in [
            (&rsa, SslSignatureAlgorithm::RSA_PKCS1_SHA256, MessageDigest::sha256(), false),
            (&rsa, SslSignatureAlgorithm::RSA_PSS_RSAE_SHA256, MessageDigest::sha256(), true),
            (&rsa, SslSignatureAlgorithm::RSA_PSS_RSAE_SHA384, MessageDigest::sha384(), true),
            (&ec, SslSignatureAlgorithm::ECDSA_SECP256R1_SHA256, MessageDigest::sha256(), false),
        ] {
            let sig = sign(key, alg, msg).unwrap();
            let mut v = boring::sign::Verifier::new(md, key).unwrap();
            if key.rsa().is_ok() {
                v.set_rsa_padding(if pss { Padding::PKCS1_PSS } else { Padding::PKCS1 }).unwrap();
                if pss {
                    v.set_rsa_pss_saltlen(RsaPssSaltlen::DIGEST_LENGTH).unwrap();
                }
            }
            assert!(v.verify_oneshot(&sig, msg).unwrap(), "{alg:?}");
        }
        assert!(sign(&rsa, SslSignatureAlgorithm::ED25519, msg).is_err());
    }
}
