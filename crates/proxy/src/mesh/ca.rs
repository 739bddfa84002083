//! The mesh's certificate authority and workload certificates (X.509-SVIDs).
//!
//! * [`Authority`]: an ECDSA P-256 signing key and its self-signed certificate, generated or
//!   loaded from PEM (an operator's own key); it signs a workload's certificate signing request
//!   for an identity the caller was *authorized* to ask for ([`Placement`]), never for a name
//!   taken from the request itself.
//! * [`Svid`]: a workload's key, its certificate chain and validity, renewed at half its life.
//! * [`Bundle`]: the trust anchors, several of them while the authority's key rotates.
//!
//! Workload certificates follow the X.509-SVID rules: one URI SAN (critical, the subject is
//! empty), `cA=false`, key usage digitalSignature and keyEncipherment (critical), extended key
//! usage serverAuth and clientAuth, valid from two minutes back (clock skew).

use super::identity::SpiffeId;
use boring::asn1::{Asn1Time, Asn1TimeRef};
use boring::bn::{BigNum, MsbOption};
use boring::ec::{EcGroup, EcKey};
use boring::hash::MessageDigest;
use boring::nid::Nid;
use boring::pkey::{HasPublic, PKey, PKeyRef, Private};
use boring::stack::Stack;
use boring::x509::extension::{AuthorityKeyIdentifier, BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectAlternativeName, SubjectKeyIdentifier};
use boring::x509::store::{X509Store, X509StoreBuilder};
use boring::x509::{X509NameBuilder, X509Ref, X509Req, X509ReqBuilder, X509StoreContext, X509};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How far back a certificate's validity starts (peers' clocks differ).
pub const CLOCK_SKEW: Duration = Duration::from_secs(120);
/// The shortest and longest workload certificate lifetimes the authority signs.
pub const MIN_TTL: Duration = Duration::from_secs(60);
pub const MAX_TTL: Duration = Duration::from_secs(90 * 24 * 3600);

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("{0}")]
    Crypto(String),
    #[error("{0}")]
    Bad(String),
    #[error("node {node} has no pod running as {account} in namespace {namespace}: it may not hold that identity")]
    NotOnNode { node: String, namespace: String, account: String },
}

impl From<boring::error::ErrorStack> for CaError {
    fn from(e: boring::error::ErrorStack) -> CaError {
        CaError::Crypto(e.to_string())
    }
}

fn bad(msg: impl Into<String>) -> CaError {
    CaError::Bad(msg.into())
}

/// A new ECDSA P-256 private key (workload keys are made where they are used).
pub fn new_key() -> Result<PKey<Private>, CaError> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1)?;
    Ok(PKey::from_ec_key(EcKey::generate(&group)?)?)
}

fn asn1_time(t: SystemTime) -> Result<Asn1Time, CaError> {
    let secs = t.duration_since(UNIX_EPOCH).map_err(|_| bad("a time before 1970"))?.as_secs();
    Ok(Asn1Time::from_unix(secs as libc::time_t)?)
}

/// An ASN.1 time as a system time.
pub fn system_time(t: &Asn1TimeRef) -> Result<SystemTime, CaError> {
    let d = Asn1Time::from_unix(0)?.diff(t)?;
    let secs = d.days as i64 * 86_400 + d.secs as i64;
    u64::try_from(secs).map(|s| UNIX_EPOCH + Duration::from_secs(s)).map_err(|_| bad("a certificate time before 1970"))
}

fn serial() -> Result<boring::asn1::Asn1Integer, CaError> {
    let mut n = BigNum::new()?;
    n.rand(127, MsbOption::MAYBE_ZERO, false)?;
    Ok(n.to_asn1_integer()?)
}

/// The identity a workload certificate is for: its only URI SAN, a SPIFFE ID.
pub fn svid_id(leaf: &X509Ref) -> Result<SpiffeId, CaError> {
    let sans = leaf.subject_alt_names().ok_or_else(|| bad("the certificate has no subjectAltName"))?;
    let uris: Vec<&str> = sans.iter().filter_map(|g| g.uri()).collect();
    match uris[..] {
        [uri] => uri.parse().map_err(|e| bad(format!("the certificate's URI SAN: {e}"))),
        [] => Err(bad("the certificate has no URI SAN (a SPIFFE ID)")),
        _ => Err(bad(format!("the certificate has {} URI SANs; an SVID has exactly one", uris.len()))),
    }
}

/// The mesh's certificate authority.
pub struct Authority {
    key: PKey<Private>,
    cert: X509,
    trust_domain: String,
}

impl Authority {
    /// A new key and a self-signed certificate valid for `validity` from now.
    pub fn generate(trust_domain: &str, validity: Duration) -> Result<Authority, CaError> {
        SpiffeId::new(trust_domain, "a", "a").map_err(|e| bad(e.to_string()))?;
        let key = new_key()?;
        let mut name = X509NameBuilder::new()?;
        name.append_entry_by_text("O", trust_domain)?;
        name.append_entry_by_text("CN", "vectorlb mesh CA")?;
        let name = name.build();
        let now = SystemTime::now();
        let mut b = X509::builder()?;
        b.set_version(2)?;
        let sn = serial()?;
        b.set_serial_number(&sn)?;
        b.set_subject_name(&name)?;
        b.set_issuer_name(&name)?;
        b.set_pubkey(&key)?;
        let nb = asn1_time(now - CLOCK_SKEW)?;
        b.set_not_before(&nb)?;
        let na = asn1_time(now + validity)?;
        b.set_not_after(&na)?;
        let e1 = BasicConstraints::new().critical().ca().build()?;
        b.append_extension(&e1)?;
        let e2 = KeyUsage::new().critical().key_cert_sign().crl_sign().build()?;
        b.append_extension(&e2)?;
        let ski = SubjectKeyIdentifier::new().build(&b.x509v3_context(None, None))?;
        b.append_extension(&ski)?;
        let san = SubjectAlternativeName::new().uri(&format!("spiffe://{trust_domain}")).build(&b.x509v3_context(None, None))?;
        b.append_extension(&san)?;
        b.sign(&key, MessageDigest::sha256())?;
        Ok(Authority { key, cert: b.build(), trust_domain: trust_domain.into() })
    }

    /// An operator's authority: its certificate and key in PEM. The pair must sign a workload
    /// certificate that verifies against the certificate (so it is a CA and the key is its).
    pub fn load(trust_domain: &str, cert_pem: &[u8], key_pem: &[u8]) -> Result<Authority, CaError> {
        SpiffeId::new(trust_domain, "a", "a").map_err(|e| bad(e.to_string()))?;
        let cert = X509::from_pem(cert_pem).map_err(|e| bad(format!("the CA certificate is not PEM: {e}")))?;
        let key = PKey::private_key_from_pem(key_pem).map_err(|e| bad(format!("the CA key is not a PEM private key: {e}")))?;
        if !cert.public_key()?.public_eq(&key) {
            return Err(bad("the CA key does not belong to the CA certificate"));
        }
        let ca = Authority { key, cert, trust_domain: trust_domain.into() };
        let probe = SpiffeId::new(trust_domain, "probe", "probe").expect("valid");
        let probe_key = new_key()?;
        let cannot = |e: CaError| bad(format!("the CA certificate cannot sign workload certificates: {e}"));
        let leaf = ca.issue(&probe, &probe_key, MIN_TTL, SystemTime::now()).map_err(cannot)?;
        Bundle::new(trust_domain, vec![ca.cert.clone()])?.verify(&leaf, &[]).map_err(cannot)?;
        Ok(ca)
    }

    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    pub fn certificate(&self) -> &X509 {
        &self.cert
    }

    pub fn cert_pem(&self) -> Result<String, CaError> {
        Ok(String::from_utf8_lossy(&self.cert.to_pem()?).into_owned())
    }

    pub fn key_pem(&self) -> Result<String, CaError> {
        Ok(String::from_utf8_lossy(&self.key.private_key_to_pem_pkcs8()?).into_owned())
    }

    /// A workload certificate for `id` and `key`, valid `ttl` from `now` (never past the
    /// authority's own end).
    pub fn issue<K: HasPublic>(&self, id: &SpiffeId, key: &PKeyRef<K>, ttl: Duration, now: SystemTime) -> Result<X509, CaError> {
        if id.trust_domain() != self.trust_domain {
            return Err(bad(format!("{id} is not in this authority's trust domain {}", self.trust_domain)));
        }
        if !(MIN_TTL..=MAX_TTL).contains(&ttl) {
            return Err(bad(format!("a certificate lifetime of {ttl:?} is outside {MIN_TTL:?} to {MAX_TTL:?}")));
        }
        let ca_end = system_time(self.cert.not_after())?;
        let end = (now + ttl).min(ca_end);
        if end <= now {
            return Err(bad("the CA certificate has expired"));
        }
        let mut b = X509::builder()?;
        b.set_version(2)?;
        let sn = serial()?;
        b.set_serial_number(&sn)?;
        b.set_subject_name(&X509NameBuilder::new()?.build())?;
        b.set_issuer_name(self.cert.subject_name())?;
        b.set_pubkey(key)?;
        let nb = asn1_time(now - CLOCK_SKEW)?;
        b.set_not_before(&nb)?;
        let na = asn1_time(end)?;
        b.set_not_after(&na)?;
        let e3 = BasicConstraints::new().critical().build()?;
        b.append_extension(&e3)?;
        let e4 = KeyUsage::new().critical().digital_signature().key_encipherment().build()?;
        b.append_extension(&e4)?;
        let e5 = ExtendedKeyUsage::new().server_auth().client_auth().build()?;
        b.append_extension(&e5)?;
        let aki = AuthorityKeyIdentifier::new().keyid(true).build(&b.x509v3_context(Some(&self.cert), None))?;
        b.append_extension(&aki)?;
        let san = SubjectAlternativeName::new().critical().uri(&id.to_string()).build(&b.x509v3_context(Some(&self.cert), None))?;
        b.append_extension(&san)?;
        b.sign(&self.key, MessageDigest::sha256())?;
        Ok(b.build())
    }

    /// Signs a certificate signing request (PEM) for `id`: the request proves its key, and
    /// only its key is taken (whatever names it carries, the certificate is for `id`).
    pub fn sign_request(&self, id: &SpiffeId, csr_pem: &[u8], ttl: Duration, now: SystemTime) -> Result<X509, CaError> {
        let req = X509Req::from_pem(csr_pem).map_err(|e| bad(format!("not a PEM certificate signing request: {e}")))?;
        let key = req.public_key().map_err(|e| bad(format!("the request's key: {e}")))?;
        if !req.verify(&key).unwrap_or(false) {
            return Err(bad("the request's signature does not verify with its own key"));
        }
        strong_enough(&key)?;
        self.issue(id, &key, ttl, now)
    }
}

/// Whether a requester's key is one a workload certificate may carry: ECDSA on P-256 or P-384
/// (what workloads make; the tunnels' handshakes sign with them), or RSA of at least 2,048 bits.
/// A weak key would make the identity forgeable.
fn strong_enough<K: HasPublic>(key: &PKeyRef<K>) -> Result<(), CaError> {
    use boring::nid::Nid;
    use boring::pkey::Id;
    match key.id() {
        Id::EC => {
            let curve = key.ec_key()?.group().curve_name();
            if matches!(curve, Some(Nid::X9_62_PRIME256V1) | Some(Nid::SECP384R1)) {
                Ok(())
            } else {
                Err(bad("the request's EC key is not on P-256 or P-384"))
            }
        }
        Id::RSA if key.bits() >= 2048 => Ok(()),
        Id::RSA => Err(bad(format!("the request's RSA key has {} bits, fewer than 2,048", key.bits()))),
        _ => Err(bad("the request's key is neither ECDSA (P-256, P-384) nor RSA")),
    }
}

/// Writes `text` to `path` readable by its owner only (keys), replacing it whole.
pub fn write_private(path: &std::path::Path, text: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
    f.write_all(text)?;
    f.sync_all()?;
    std::fs::rename(tmp, path)
}

impl Authority {
    /// Writes the authority to `dir` (`ca.pem`; `ca.key`, mode 0600).
    pub fn save(&self, dir: &std::path::Path) -> Result<(), CaError> {
        std::fs::create_dir_all(dir).map_err(|e| bad(format!("{}: {e}", dir.display())))?;
        let io = |e: std::io::Error| bad(format!("{}: {e}", dir.display()));
        write_private(&dir.join("ca.key"), self.key_pem()?.as_bytes()).map_err(io)?;
        std::fs::write(dir.join("ca.pem"), self.cert_pem()?).map_err(io)
    }

    /// The authority `save` wrote to `dir`.
    pub fn open(trust_domain: &str, dir: &std::path::Path) -> Result<Authority, CaError> {
        let read = |f: &str| std::fs::read(dir.join(f)).map_err(|e| bad(format!("{}/{f}: {e}", dir.display())));
        Authority::load(trust_domain, &read("ca.pem")?, &read("ca.key")?)
    }

    /// Issues certificates for `ids` with fresh keys into `dir` as a node proxy reads them
    /// (`<namespace>.<account>.pem` and `.key`, and `bundle.pem` with `bundle`'s anchors);
    /// each file is replaced whole, the key before its certificate.
    pub fn issue_to_dir(&self, ids: &[SpiffeId], bundle: &Bundle, ttl: Duration, dir: &std::path::Path) -> Result<(), CaError> {
        std::fs::create_dir_all(dir).map_err(|e| bad(format!("{}: {e}", dir.display())))?;
        let io = |e: std::io::Error| bad(format!("{}: {e}", dir.display()));
        write_private(&dir.join("bundle.pem"), bundle.to_pem()?.as_bytes()).map_err(io)?;
        for id in ids {
            let key = new_key()?;
            let cert = self.issue(id, &key, ttl, SystemTime::now())?;
            let base = format!("{}.{}", id.namespace(), id.account());
            write_private(&dir.join(format!("{base}.key")), &key.private_key_to_pem_pkcs8()?).map_err(io)?;
            write_private(&dir.join(format!("{base}.pem")), &cert.to_pem()?).map_err(io)?;
        }
        Ok(())
    }
}

/// A certificate signing request (PEM) for `id` with `key`.
pub fn request(id: &SpiffeId, key: &PKey<Private>) -> Result<String, CaError> {
    let mut b = X509ReqBuilder::new()?;
    b.set_pubkey(key)?;
    let mut exts = Stack::new()?;
    exts.push(SubjectAlternativeName::new().uri(&id.to_string()).build(&b.x509v3_context(None))?)?;
    b.add_extensions(&exts)?;
    b.sign(key, MessageDigest::sha256())?;
    Ok(String::from_utf8_lossy(&b.build().to_pem()?).into_owned())
}

/// A workload's key and certificate chain (leaf first).
#[derive(Clone)]
pub struct Svid {
    pub id: SpiffeId,
    pub key: PKey<Private>,
    pub chain: Vec<X509>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl Svid {
    /// Checks the key belongs to the leaf and reads the identity and validity from it.
    pub fn new(key: PKey<Private>, chain: Vec<X509>) -> Result<Svid, CaError> {
        let leaf = chain.first().ok_or_else(|| bad("an empty certificate chain"))?;
        if !leaf.public_key()?.public_eq(&key) {
            return Err(bad("the key does not belong to the certificate"));
        }
        Ok(Svid { id: svid_id(leaf)?, not_before: system_time(leaf.not_before())?, not_after: system_time(leaf.not_after())?, key, chain })
    }

    /// When to renew: half-way through the certificate's life.
    pub fn refresh_at(&self) -> SystemTime {
        let life = self.not_after.duration_since(self.not_before).unwrap_or_default();
        self.not_before + life / 2
    }

    pub fn serial(&self) -> String {
        self.chain[0].serial_number().to_bn().and_then(|b| b.to_hex_str().map(|s| s.to_string())).unwrap_or_default()
    }
}

/// The trust anchors of one trust domain: the authority's certificate, or two of them while
/// its key is replaced (old and new verify alike until the old one's certificates expire).
#[derive(Clone)]
pub struct Bundle {
    trust_domain: String,
    roots: Vec<X509>,
}

impl Bundle {
    pub fn new(trust_domain: &str, roots: Vec<X509>) -> Result<Bundle, CaError> {
        if roots.is_empty() {
            return Err(bad("a trust bundle with no certificate"));
        }
        Ok(Bundle { trust_domain: trust_domain.into(), roots })
    }

    /// The bundle in PEM, as it is distributed (the `root-cert.pem` of a ConfigMap).
    pub fn from_pem(trust_domain: &str, pem: &[u8]) -> Result<Bundle, CaError> {
        Bundle::new(trust_domain, X509::stack_from_pem(pem).map_err(|e| bad(format!("the trust bundle is not PEM: {e}")))?)
    }

    pub fn to_pem(&self) -> Result<String, CaError> {
        let mut out = String::new();
        for c in &self.roots {
            out.push_str(&String::from_utf8_lossy(&c.to_pem()?));
        }
        Ok(out)
    }

    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    pub fn roots(&self) -> &[X509] {
        &self.roots
    }

    /// A certificate store holding the anchors.
    pub fn store(&self) -> Result<X509Store, CaError> {
        let mut b = X509StoreBuilder::new()?;
        for c in &self.roots {
            b.add_cert(c.clone())?;
        }
        Ok(b.build())
    }

    /// Verifies `leaf` (with `intermediates`) up to an anchor and reads its identity, which
    /// must be in this trust domain.
    pub fn verify(&self, leaf: &X509Ref, intermediates: &[X509]) -> Result<SpiffeId, CaError> {
        let store = self.store()?;
        let mut chain = Stack::new()?;
        for c in intermediates {
            chain.push(c.clone())?;
        }
        let mut ctx = X509StoreContext::new()?;
        let ok = ctx.init(&store, leaf, &chain, |c| {
            let ok = c.verify_cert()?;
            Ok(if ok { Ok(()) } else { Err(c.verify_result().err().map_or("rejected", |e| e.error_string()).to_string()) })
        })?;
        ok.map_err(|e| bad(format!("the certificate does not verify: {e}")))?;
        let id = svid_id(leaf)?;
        if id.trust_domain() != self.trust_domain {
            return Err(bad(format!("{id} is not in the trust domain {}", self.trust_domain)));
        }
        Ok(id)
    }
}

/// Which service accounts have pods on which node: what a node may hold certificates for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    nodes: BTreeMap<String, BTreeSet<(String, String)>>,
}

impl Placement {
    pub fn insert(&mut self, node: &str, namespace: &str, account: &str) {
        self.nodes.entry(node.into()).or_default().insert((namespace.into(), account.into()));
    }

    /// Whether `node` runs a pod as `id`'s account: else the node may not have its certificate
    /// (a compromised node cannot speak for workloads it does not run).
    pub fn authorize(&self, node: &str, id: &SpiffeId) -> Result<(), CaError> {
        let key = (id.namespace().to_string(), id.account().to_string());
        if self.nodes.get(node).is_some_and(|s| s.contains(&key)) {
            Ok(())
        } else {
            Err(CaError::NotOnNode { node: node.into(), namespace: key.0, account: key.1 })
        }
    }

    pub fn accounts(&self, node: &str) -> impl Iterator<Item = &(String, String)> {
        self.nodes.get(node).into_iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> SpiffeId {
        s.parse().unwrap()
    }

    /// A request (PEM) signed by a key made by OpenSSL's command line with these options.
    fn openssl_request(newkey: &[&str]) -> String {
        let o = std::process::Command::new("openssl").args(["req", "-new", "-nodes", "-subj", "/CN=x", "-keyout", "/dev/null"]).args(newkey).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    }

    #[test]
    fn weak_or_unusual_request_keys_are_refused() {
        let ca = Authority::generate("cluster.local", Duration::from_secs(86_400)).unwrap();
        let (who, now, ttl) = (id("spiffe://cluster.local/ns/shop/sa/web"), SystemTime::now(), Duration::from_secs(3600));
        for (opts, ok) in [
            (&["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"][..], true),
            (&["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-384"][..], true),
            (&["-newkey", "rsa:2048"][..], true),
            (&["-newkey", "rsa:1024"][..], false),
            (&["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:secp256k1"][..], false),
            (&["-newkey", "ed25519"][..], false),
        ] {
            let r = ca.sign_request(&who, openssl_request(opts).as_bytes(), ttl, now);
            assert_eq!(r.is_ok(), ok, "{opts:?}: {:?}", r.err());
        }
    }

    #[test]
    fn workload_certificates_are_svids_that_verify_against_the_bundle() {
        let ca = Authority::generate("cluster.local", Duration::from_secs(86_400)).unwrap();
        let key = new_key().unwrap();
        let csr = request(&id("spiffe://cluster.local/ns/evil/sa/admin"), &key).unwrap();
        let now = SystemTime::now();
        // The request asks for another name: the certificate is for the authorized identity.
        let cert = ca.sign_request(&id("spiffe://cluster.local/ns/shop/sa/cart"), csr.as_bytes(), Duration::from_secs(3600), now).unwrap();
        let svid = Svid::new(key, vec![cert.clone()]).unwrap();
        assert_eq!(svid.id, id("spiffe://cluster.local/ns/shop/sa/cart"));
        let life = svid.not_after.duration_since(svid.not_before).unwrap();
        assert_eq!(life, Duration::from_secs(3600) + CLOCK_SKEW);
        assert_eq!(svid.refresh_at(), svid.not_before + life / 2);
        // As another implementation reads it (OpenSSL's command line).
        let mut child = std::process::Command::new("openssl")
            .args(["x509", "-noout", "-text"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("openssl");
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), &cert.to_pem().unwrap()).unwrap();
        let text = String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap();
        for want in [
            "X509v3 Subject Alternative Name: critical",
            "X509v3 Key Usage: critical",
            "CA:FALSE",
            "Digital Signature, Key Encipherment",
            "TLS Web Server Authentication, TLS Web Client Authentication",
            "URI:spiffe://cluster.local/ns/shop/sa/cart",
        ] {
            assert!(text.contains(want), "{want} in\n{text}");
        }
        assert!(cert.subject_name().entries().next().is_none(), "empty subject");
        let bundle = Bundle::from_pem("cluster.local", ca.cert_pem().unwrap().as_bytes()).unwrap();
        assert_eq!(bundle.verify(&cert, &[]).unwrap(), svid.id);
        // Another authority's certificate, another trust domain, bad sizes and requests.
        let other = Authority::generate("cluster.local", Duration::from_secs(86_400)).unwrap();
        let forged = other.issue(&svid.id, &new_key().unwrap(), Duration::from_secs(3600), now).unwrap();
        assert!(bundle.verify(&forged, &[]).unwrap_err().to_string().contains("does not verify"));
        assert!(Bundle::new("other.td", vec![ca.certificate().clone()]).unwrap().verify(&cert, &[]).unwrap_err().to_string().contains("trust domain"));
        assert!(ca.issue(&id("spiffe://other.td/ns/a/sa/b"), &new_key().unwrap(), Duration::from_secs(3600), now).is_err());
        assert!(ca.issue(&svid.id, &new_key().unwrap(), Duration::from_secs(1), now).unwrap_err().to_string().contains("outside"));
        assert!(ca.issue(&svid.id, &new_key().unwrap(), Duration::from_secs(365 * 86_400), now).is_err());
        assert!(ca.sign_request(&svid.id, b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n", Duration::from_secs(3600), now).is_err());
        assert!(Bundle::from_pem("cluster.local", b"").is_err());
    }

    #[test]
    fn an_operators_authority_loads_only_when_it_can_sign() {
        let ca = Authority::generate("corp.example", Duration::from_secs(86_400)).unwrap();
        let loaded = Authority::load("corp.example", ca.cert_pem().unwrap().as_bytes(), ca.key_pem().unwrap().as_bytes()).unwrap();
        assert_eq!(loaded.cert_pem().unwrap(), ca.cert_pem().unwrap());
        let other = Authority::generate("corp.example", Duration::from_secs(86_400)).unwrap();
        let e = Authority::load("corp.example", ca.cert_pem().unwrap().as_bytes(), other.key_pem().unwrap().as_bytes()).err().unwrap();
        assert!(e.to_string().contains("does not belong"), "{e}");
        // A workload certificate is not a CA: what it signs does not verify.
        let key = new_key().unwrap();
        let leaf = ca.issue(&id("spiffe://corp.example/ns/a/sa/b"), &key, Duration::from_secs(3600), SystemTime::now()).unwrap();
        let e = Authority::load("corp.example", &leaf.to_pem().unwrap(), &key.private_key_to_pem_pkcs8().unwrap()).err().unwrap();
        assert!(e.to_string().contains("cannot sign"), "{e}");
        assert!(Authority::load("corp.example", b"junk", b"junk").is_err());
        assert!(Authority::generate("Bad Domain", Duration::from_secs(60)).is_err());
    }

    #[test]
    fn a_node_holds_identities_only_of_the_pods_it_runs() {
        let mut p = Placement::default();
        p.insert("node-a", "shop", "cart");
        p.insert("node-b", "shop", "pay");
        assert!(p.authorize("node-a", &id("spiffe://cluster.local/ns/shop/sa/cart")).is_ok());
        let e = p.authorize("node-a", &id("spiffe://cluster.local/ns/shop/sa/pay")).unwrap_err();
        assert!(matches!(e, CaError::NotOnNode { .. }), "{e}");
        assert!(p.authorize("node-c", &id("spiffe://cluster.local/ns/shop/sa/cart")).is_err());
        assert_eq!(p.accounts("node-b").collect::<Vec<_>>(), vec![&("shop".to_string(), "pay".to_string())]);
    }
}
