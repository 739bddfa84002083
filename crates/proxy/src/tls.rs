//! TLS termination through BoringSSL: certificates chosen by SNI, ALPN (`h2`, `http/1.1`),
//! TLS 1.2 and 1.3, resumption on or off, and where the private-key operation of each full
//! handshake runs (the provider): inline in the worker, or on a pool of crypto threads through
//! BoringSSL's asynchronous private-key method, so the worker serves other connections while
//! the signature is computed.

use crate::config::{CryptoMbBackend, CryptoMbFallback, InlineBackend, Provider, Tls};
use crate::stats::TlsStats;
use boring::hash::MessageDigest;
use boring::nid::Nid;
use boring::pkey::{PKey, Private};
use boring::rsa::Padding;
use boring::sign::{RsaPssSaltlen, Signer};
use boring::ssl::{AlpnError, NameType, SslAcceptor, SslAcceptorBuilder, SslContext, SslMethod, SslOptions, SslSessionCacheMode, SslSignatureAlgorithm, SslVersion};
use boring::x509::X509;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Mutex};
use tokio_boring::{AsyncPrivateKeyMethod, AsyncPrivateKeyMethodError, BoxPrivateKeyMethodFuture};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{field}: {path}: {msg}")]
    File { field: String, path: String, msg: String },
    #[error("{field}: {msg}")]
    Setup { field: String, msg: String },
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
        Ok(crate::cryptomb::completion(rx, self.stats.clone()))
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

fn read(field: &str, pem: &crate::config::Pem) -> Result<Vec<u8>, TlsError> {
    match pem {
        crate::config::Pem::File(path) => std::fs::read(path).map_err(|e| TlsError::File { field: field.into(), path: path.display().to_string(), msg: e.to_string() }),
        crate::config::Pem::Inline(text) => Ok(text.as_bytes().to_vec()),
    }
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

/// Where the private-key operations of one listener run, resolved at start.
enum Runner {
    Inline,
    Pool(mpsc::Sender<Job>),
    CryptoMb(Arc<crate::cryptomb::Engine>),
}

/// The TLS 1.2 cipher suites, in the server's order of preference.
pub const TLS12_CIPHERS: &str =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";

/// One context per certificate, configured alike.
fn context(field: &str, tls: &Tls, i: usize, runner: &Runner, stats: &Arc<TlsStats>) -> Result<(SslAcceptorBuilder, Vec<String>), TlsError> {
    let c = &tls.certificates[i];
    let fc = format!("{field}.certificates[{i}]");
    let chain = X509::stack_from_pem(&read(&format!("{fc}.cert"), &c.cert)?).map_err(|e| TlsError::File {
        field: format!("{fc}.cert"),
        path: c.cert.source(),
        msg: format!("not a PEM certificate: {e}"),
    })?;
    let leaf = chain.first().cloned().ok_or_else(|| TlsError::File { field: format!("{fc}.cert"), path: c.cert.source(), msg: "no certificate in the file".into() })?;
    let key = PKey::private_key_from_pem(&read(&format!("{fc}.key"), &c.key)?).map_err(|e| TlsError::File {
        field: format!("{fc}.key"),
        path: c.key.source(),
        msg: format!("not a PEM private key: {e}"),
    })?;
    let pubkey = leaf.public_key().map_err(setup(&fc))?;
    if !pubkey.public_eq(&key) {
        return Err(TlsError::Setup { field: fc, msg: "the key does not belong to the certificate".into() });
    }
    let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls()).map_err(setup(field))?;
    let version = |v: &str| if v == "1.3" { SslVersion::TLS1_3 } else { SslVersion::TLS1_2 };
    b.set_min_proto_version(Some(version(&tls.min_version))).map_err(setup(field))?;
    b.set_max_proto_version(Some(version(&tls.max_version))).map_err(setup(field))?;
    // TLS 1.2: the server's order decides (AEAD with forward secrecy only; AES-GCM first, which
    // every x86 server of this decade runs in hardware). TLS 1.3's suites are all AEAD and
    // BoringSSL orders them itself.
    b.set_cipher_list(TLS12_CIPHERS).map_err(setup(field))?;
    b.set_options(SslOptions::CIPHER_SERVER_PREFERENCE);
    b.set_certificate(&leaf).map_err(setup(&fc))?;
    for extra in chain.into_iter().skip(1) {
        b.add_extra_chain_cert(extra).map_err(setup(&fc))?;
    }
    install_key(&mut b, runner, stats, key, &fc)?;
    if !tls.resumption {
        b.set_session_cache_mode(SslSessionCacheMode::OFF);
        b.set_options(SslOptions::NO_TICKET);
    }
    b.set_alpn_select_callback(|_, client| boring::ssl::select_next_proto(b"\x02h2\x08http/1.1", client).ok_or(AlpnError::NOACK));
    Ok((b, names(&leaf)))
}

/// Puts `key` behind `runner`: signed inline, on the crypto pool, or in crypto_mb's batches.
fn install_key(b: &mut boring::ssl::SslContextBuilder, runner: &Runner, stats: &Arc<TlsStats>, key: PKey<Private>, fc: &str) -> Result<(), TlsError> {
    match runner {
        Runner::Pool(jobs) => {
            b.set_async_private_key_method(PoolMethod { key: Arc::new(key), jobs: Mutex::new(jobs.clone()), stats: stats.clone() });
        }
        Runner::CryptoMb(engine) => match crate::cryptomb::PreparedKey::new(key.clone()) {
            Ok(prepared) => b.set_async_private_key_method(crate::cryptomb::CryptoMbMethod { engine: engine.clone(), key: Arc::new(prepared) }),
            // The inline provider's IPP backend signs RSA only: any other key is BoringSSL's.
            Err(msg) if engine.is_immediate() => {
                tracing::info!("{fc}.key: {} cannot hold {msg}; BoringSSL signs for this certificate", engine.backend());
                b.set_private_key(&key).map_err(setup(fc))?
            }
            Err(msg) => return Err(TlsError::Setup { field: format!("{fc}.key"), msg: format!("the cryptomb provider cannot hold {msg}") }),
        },
        Runner::Inline => b.set_private_key(&key).map_err(setup(fc))?,
    }
    Ok(())
}

/// A private-key provider on its own, for contexts built elsewhere (the mesh's workload
/// certificates, which change as they rotate): one engine whose batches every key shares.
pub struct KeySigner {
    runner: Runner,
    stats: Arc<TlsStats>,
    field: String,
}

impl KeySigner {
    pub fn new(field: &str, provider: &Provider) -> Result<KeySigner, TlsError> {
        crate::sslmem::link();
        let tls = Tls { certificates: Vec::new(), provider: *provider, resumption: false, min_version: "1.3".into(), max_version: "1.3".into() };
        let (runner, stats) = runner(field, &tls)?;
        Ok(KeySigner { runner, stats, field: field.into() })
    }

    /// Signs for `key` in `b`'s handshakes (server or client) through the provider.
    pub fn install(&self, b: &mut boring::ssl::SslContextBuilder, key: PKey<Private>) -> Result<(), TlsError> {
        install_key(b, &self.runner, &self.stats, key, &self.field)
    }

    pub fn stats(&self) -> &Arc<TlsStats> {
        &self.stats
    }
}

/// Whether the CPU has AVX-512 IFMA (the 52-bit multiply-add the fast RSA code needs).
fn ifma() -> bool {
    std::is_x86_feature_detected!("avx512ifma") && std::is_x86_feature_detected!("avx512f")
}

/// The provider a listener runs, and its statistics: the configured one, or `inline` when
/// `cryptomb` asks for crypto_mb where it cannot run and the configuration allows the fallback.
fn runner(field: &str, tls: &Tls) -> Result<(Runner, Arc<TlsStats>), TlsError> {
    Ok(match tls.provider {
        Provider::Inline { backend: InlineBackend::Boringssl } => (Runner::Inline, Arc::new(TlsStats::new("inline", None))),
        // IPP's RSA where it has AVX-512 IFMA code to run (about twice BoringSSL's speed on
        // such CPUs, docs/proxy.md), BoringSSL elsewhere; no warning either way.
        Provider::Inline { backend: InlineBackend::Auto } => {
            if crate::cryptomb::ippcp_available().is_ok() && ifma() {
                return runner(field, &Tls { provider: Provider::Inline { backend: InlineBackend::Ippcp }, ..tls.clone() });
            }
            (Runner::Inline, Arc::new(TlsStats::new("inline", None)))
        }
        Provider::Inline { backend: InlineBackend::Ippcp } => match crate::cryptomb::ippcp_available() {
            #[cfg(ippcp)]
            Ok(()) => {
                let stats = Arc::new(TlsStats::new("inline/ippcp", None));
                (Runner::CryptoMb(crate::cryptomb::Engine::immediate(Box::new(crate::cryptomb::IppcpLanes), stats.clone())), stats)
            }
            #[cfg(not(ippcp))]
            Ok(()) => unreachable!("ippcp is never available without the library"),
            Err(why) => {
                tracing::warn!("{field}: inline_backend = \"ippcp\" cannot run: {why}; signing with BoringSSL");
                (Runner::Inline, Arc::new(TlsStats::new("inline", Some(why))))
            }
        },
        Provider::Pool { threads } => (Runner::Pool(pool(threads)), Arc::new(TlsStats::new("pool", None))),
        Provider::CryptoMb { poll_delay, backend, fallback } => {
            let lanes: Box<dyn crate::cryptomb::Lanes> = match backend {
                CryptoMbBackend::Portable => Box::new(crate::cryptomb::Portable),
                CryptoMbBackend::CryptoMb => match crate::cryptomb::crypto_mb_available() {
                    #[cfg(crypto_mb)]
                    Ok(()) => {
                        // The key exchange's ephemeral key pairs, eight at a time too.
                        match crate::keyshare::enable() {
                            Ok(()) => tracing::info!("{field}: X25519 key pairs made eight at a time with crypto_mb"),
                            Err(why) => tracing::warn!("{field}: X25519 key pairs and secrets made one at a time: {why}"),
                        }
                        Box::new(crate::cryptomb::CryptoMbLanes)
                    }
                    #[cfg(not(crypto_mb))]
                    Ok(()) => unreachable!("crypto_mb is never available without the library"),
                    Err(why) => match fallback {
                        CryptoMbFallback::Refuse => {
                            return Err(TlsError::Setup {
                                field: format!("{field}.provider"),
                                msg: format!("cryptomb cannot run: {why} (cryptomb_fallback = \"refuse\"; \"inline\" would sign in the workers instead)"),
                            })
                        }
                        CryptoMbFallback::Inline => {
                            tracing::warn!("{field}: the cryptomb provider cannot run: {why}; signing inline (cryptomb_fallback = \"inline\")");
                            return Ok((Runner::Inline, Arc::new(TlsStats::new("inline", Some(why)))));
                        }
                    },
                },
            };
            let name = format!("cryptomb/{}", lanes.name());
            tracing::info!("{field}: private keys on the {name} provider, poll_delay {poll_delay:?}");
            let stats = Arc::new(TlsStats::new(&name, None));
            (Runner::CryptoMb(crate::cryptomb::Engine::new(lanes, poll_delay, stats.clone())), stats)
        }
    })
}

/// Whether a listener's handshakes compute their X25519 secrets ahead, eight at a time
/// ([`crate::kexstream`]): under the `cryptomb` provider on crypto_mb, with the key-exchange
/// batches on (they are turned on only where crypto_mb's lanes were chosen, see `runner`).
/// Then the longest a client's record is held (`poll_delay`) and whether TLS 1.3 is allowed.
pub fn key_exchange_ahead(tls: &Tls) -> Option<(std::time::Duration, bool)> {
    match tls.provider {
        Provider::CryptoMb { poll_delay, backend: CryptoMbBackend::CryptoMb, .. } if crate::keyshare::enabled() => Some((poll_delay, tls.max_version == "1.3")),
        _ => None,
    }
}

/// A listener's acceptor (the first certificate's context, switching to another's by SNI) and
/// its statistics.
pub fn acceptor(field: &str, tls: &Tls) -> Result<(SslAcceptor, Arc<TlsStats>), TlsError> {
    crate::sslmem::link();
    let (runner, stats) = runner(field, tls)?;
    let mut others: Vec<(Vec<String>, SslContext)> = Vec::new();
    for i in 1..tls.certificates.len() {
        let (b, names) = context(field, tls, i, &runner, &stats)?;
        others.push((names, b.build().into_context()));
    }
    let (mut first, _) = context(field, tls, 0, &runner, &stats)?;
    if !others.is_empty() {
        first.set_servername_callback(move |ssl, _alert| {
            // The name as routing compares it: `api.example.` is `api.example`.
            if let Some(host) = ssl.servername(NameType::HOST_NAME).and_then(crate::route::canonical_name) {
                if let Some((_, ctx)) = others.iter().find(|(names, _)| names.iter().any(|n| name_matches(n, &host))) {
                    let _ = ssl.set_ssl_context(ctx);
                }
            }
            Ok(())
        });
    }
    Ok((first.build(), stats))
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

    /// A key the multi-buffer code cannot hold: `cryptomb` refuses it naming the field; the
    /// inline provider's IPP backend leaves that certificate to BoringSSL.
    #[test]
    fn a_key_of_an_odd_size_is_refused_by_cryptomb_and_signed_by_boringssl_inline() {
        let dir = std::env::temp_dir().join(format!("vectorlb-tls-odd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = PKey::from_rsa(boring::rsa::Rsa::generate(1536).unwrap()).unwrap();
        let mut name = boring::x509::X509NameBuilder::new().unwrap();
        name.append_entry_by_text("CN", "odd.test").unwrap();
        let name = name.build();
        let mut c = boring::x509::X509Builder::new().unwrap();
        c.set_subject_name(&name).unwrap();
        c.set_issuer_name(&name).unwrap();
        c.set_pubkey(&key).unwrap();
        c.set_not_before(&boring::asn1::Asn1Time::days_from_now(0).unwrap()).unwrap();
        c.set_not_after(&boring::asn1::Asn1Time::days_from_now(2).unwrap()).unwrap();
        c.sign(&key, MessageDigest::sha256()).unwrap();
        std::fs::write(dir.join("odd.crt"), c.build().to_pem().unwrap()).unwrap();
        std::fs::write(dir.join("odd.key"), key.private_key_to_pem_pkcs8().unwrap()).unwrap();
        let tls = |provider| Tls {
            certificates: vec![crate::config::Certificate { cert: crate::config::Pem::File(dir.join("odd.crt")), key: crate::config::Pem::File(dir.join("odd.key")) }],
            provider,
            resumption: false,
            min_version: "1.2".into(),
            max_version: "1.3".into(),
        };
        let portable = Provider::CryptoMb { poll_delay: std::time::Duration::from_millis(1), backend: CryptoMbBackend::Portable, fallback: CryptoMbFallback::Refuse };
        let err = acceptor("listeners[0].tls", &tls(portable)).err().expect("refused").to_string();
        assert!(err.contains("listeners[0].tls.certificates[0].key") && err.contains("1536 bits"), "{err}");
        for backend in [InlineBackend::Auto, InlineBackend::Ippcp, InlineBackend::Boringssl] {
            assert!(acceptor("listeners[0].tls", &tls(Provider::Inline { backend })).is_ok(), "{backend:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
