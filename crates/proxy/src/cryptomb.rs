//! The `cryptomb` private-key provider: each worker thread gathers the signatures its
//! handshakes ask for in a queue of up to 8 per kind of key (RSA of one size, ECDSA P-256), and
//! runs the queue as one 8-lane operation when it is full, or when `poll_delay` has passed
//! since its first operation.
//!
//! Two backends run the lanes:
//! * `crypto_mb`: Intel's multi-buffer library (`libcrypto_mb.a` from the `ipp-crypto-static`
//!   Python package), one AVX-512 IFMA call for all 8 lanes (`mbx_rsa_private_crt_mb8`,
//!   `mbx_nistp256_ecdsa_sign_mb8`). Linked only when the build found the library, used only
//!   when the library says the CPU can run it.
//! * `portable`: BoringSSL, lane by lane. The same queue, padding, verification and statistics,
//!   so the provider's logic is tested on every machine.
//!
//! The padding (PKCS#1 v1.5 or PSS) is done here, the lanes only compute the raw RSA private
//! operation; every result is checked with the public key before BoringSSL gets it: a faulty
//! RSA-CRT signature would give the key away, and one that does not verify fails its handshake
//! (counted as a failed check) rather than going to the client.

use crate::batch::Batch;
use crate::stats::TlsStats;
use boring::bn::{BigNum, BigNumContext};
use boring::ec::EcKey;
use boring::ecdsa::EcdsaSig;
use boring::hash::{hash, MessageDigest};
use boring::nid::Nid;
use boring::pkey::{PKey, Private};
use boring::rsa::{Padding, Rsa};
use boring::ssl::{SslRef, SslSignatureAlgorithm};
use foreign_types::ForeignTypeRef;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio_boring::{AsyncPrivateKeyMethod, AsyncPrivateKeyMethodError, BoxPrivateKeyMethodFuture};

/// Lanes of one multi-buffer operation.
pub use crate::batch::LANES;

/// Why an operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyOpError {
    #[error("the signature did not verify with the public key")]
    Check,
    #[error("{0}")]
    Sign(String),
    #[error("the provider stopped")]
    Stopped,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyKind {
    /// RSA of this many bits, two primes.
    Rsa(u32),
    EcdsaP256,
}

enum KeyForm {
    Rsa {
        rsa: Rsa<Private>,
        crt: RsaCrt,
        /// The key in IPP's form (the inline provider's ippcp backend).
        #[cfg(ippcp)]
        ipp: Option<crate::ippcp::Key>,
    },
    Ec {
        ec: EcKey<Private>,
        d: [u64; 4],
        order: BigNum,
    },
}

/// The CRT components as crypto_mb takes them: little-endian 64-bit words, half the modulus
/// each.
struct RsaCrt {
    p: Vec<u64>,
    q: Vec<u64>,
    dp: Vec<u64>,
    dq: Vec<u64>,
    iq: Vec<u64>,
    /// The modulus in the same form (`bits/64` words), for the public check.
    n: Vec<u64>,
    /// The library's public operation takes only this exponent; other keys are checked by
    /// BoringSSL.
    e_65537: bool,
}

/// `n` as `words` little-endian 64-bit words (`None` if it does not fit).
fn le_words(n: &boring::bn::BigNumRef, words: usize) -> Option<Vec<u64>> {
    let be = n.to_vec();
    if be.len() > words * 8 {
        return None;
    }
    let mut le = vec![0u8; words * 8];
    for (i, b) in be.iter().rev().enumerate() {
        le[i] = *b;
    }
    Some(le.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect())
}

/// A key the provider can hold, with its parts precomputed.
pub struct PreparedKey {
    kind: KeyKind,
    form: KeyForm,
}

impl PreparedKey {
    /// RSA keys of 1024 to 4096 bits with two primes, and EC P-256 keys; others are refused
    /// with the reason.
    pub fn new(pkey: PKey<Private>) -> Result<PreparedKey, String> {
        if let Ok(rsa) = pkey.rsa() {
            let bits = rsa.n().num_bits() as u32;
            if ![1024, 2048, 3072, 4096].contains(&bits) {
                return Err(format!("an RSA key of {bits} bits (cryptomb takes 1024, 2048, 3072 or 4096)"));
            }
            let half = bits as usize / 128;
            let part = |b: Option<&boring::bn::BigNumRef>| b.and_then(|b| le_words(b, half));
            let e_65537 = rsa.e().to_vec() == [1, 0, 1];
            let crt = match (part(rsa.p()), part(rsa.q()), part(rsa.dmp1()), part(rsa.dmq1()), part(rsa.iqmp()), le_words(rsa.n(), bits as usize / 64)) {
                (Some(p), Some(q), Some(dp), Some(dq), Some(iq), Some(n)) => RsaCrt { p, q, dp, dq, iq, n, e_65537 },
                _ => return Err("an RSA key without two primes of half its size (CRT form)".into()),
            };
            #[cfg(ippcp)]
            let ipp = {
                let be = |b: Option<&boring::bn::BigNumRef>| b.map(|b| b.to_vec()).unwrap_or_default();
                crate::ippcp::Key::new(bits as usize, &be(rsa.p()), &be(rsa.q()), &be(rsa.dmp1()), &be(rsa.dmq1()), &be(rsa.iqmp()))
            };
            return Ok(PreparedKey {
                kind: KeyKind::Rsa(bits),
                form: KeyForm::Rsa {
                    rsa,
                    crt,
                    #[cfg(ippcp)]
                    ipp,
                },
            });
        }
        if let Ok(ec) = pkey.ec_key() {
            if ec.group().curve_name() != Some(Nid::X9_62_PRIME256V1) {
                return Err("an EC key on a curve other than P-256".into());
            }
            let d = le_words(ec.private_key(), 4).ok_or("an EC private key out of range")?;
            let mut order = BigNum::new().map_err(|e| e.to_string())?;
            let mut ctx = BigNumContext::new().map_err(|e| e.to_string())?;
            ec.group().order(&mut order, &mut ctx).map_err(|e| e.to_string())?;
            let d = [d[0], d[1], d[2], d[3]];
            return Ok(PreparedKey { kind: KeyKind::EcdsaP256, form: KeyForm::Ec { ec, d, order } });
        }
        Err("a key that is neither RSA nor EC".into())
    }

    pub fn kind(&self) -> KeyKind {
        self.kind
    }
}

/// What the lanes compute: the raw RSA private operation on padded inputs, or ECDSA on
/// digests. A lane that fails is `None` (its operation is then done alone, and counted).
pub trait Lanes: Send + Sync {
    fn name(&self) -> &'static str;
    /// `inputs[i]`: big-endian, the modulus's size. Out: the same size.
    fn rsa(&self, keys: &[&PreparedKey], inputs: &[&[u8]]) -> Vec<Option<Vec<u8>>>;
    /// `digests[i]`: the message's SHA-256. Out: (r, s).
    fn ecdsa(&self, keys: &[&PreparedKey], digests: &[&[u8]]) -> Vec<Option<EcdsaSig>>;
    /// The RSA public operation on signatures, for the check, where the backend has a
    /// faster one than BoringSSL's: `sigs[i]` big-endian, the modulus's size; out: the same
    /// size, `None` for a lane it could not compute (BoringSSL then checks that lane). `None`
    /// as a whole: not offered.
    fn rsa_public(&self, _keys: &[&PreparedKey], _sigs: &[&[u8]]) -> Option<Vec<Option<Vec<u8>>>> {
        None
    }
}

/// `n` failed lanes.
fn nones<T>(n: usize) -> Vec<Option<T>> {
    (0..n).map(|_| None).collect()
}

/// BoringSSL, one lane at a time.
pub struct Portable;

fn rsa_one(k: &PreparedKey, input: &[u8]) -> Option<Vec<u8>> {
    let KeyForm::Rsa { rsa, .. } = &k.form else { return None };
    let mut out = vec![0u8; rsa.size() as usize];
    let n = rsa.private_encrypt(input, &mut out, Padding::NONE).ok()?;
    out.truncate(n);
    Some(out)
}

fn ecdsa_one(k: &PreparedKey, digest: &[u8]) -> Option<EcdsaSig> {
    let KeyForm::Ec { ec, .. } = &k.form else { return None };
    EcdsaSig::sign(digest, ec).ok()
}

impl Lanes for Portable {
    fn name(&self) -> &'static str {
        "portable"
    }
    fn rsa(&self, keys: &[&PreparedKey], inputs: &[&[u8]]) -> Vec<Option<Vec<u8>>> {
        keys.iter().zip(inputs).map(|(k, i)| rsa_one(k, i)).collect()
    }
    fn ecdsa(&self, keys: &[&PreparedKey], digests: &[&[u8]]) -> Vec<Option<EcdsaSig>> {
        keys.iter().zip(digests).map(|(k, d)| ecdsa_one(k, d)).collect()
    }
}

/// IPP Cryptography's single-buffer RSA, one lane at a time (ECDSA through BoringSSL): the
/// `inline` provider's `ippcp` backend.
#[cfg(ippcp)]
pub struct IppcpLanes;

#[cfg(ippcp)]
impl Lanes for IppcpLanes {
    fn name(&self) -> &'static str {
        "ippcp"
    }
    fn rsa(&self, keys: &[&PreparedKey], inputs: &[&[u8]]) -> Vec<Option<Vec<u8>>> {
        keys.iter()
            .zip(inputs)
            .map(|(k, i)| match &k.form {
                KeyForm::Rsa { ipp: Some(key), .. } => key.private(i),
                _ => None,
            })
            .collect()
    }
    fn ecdsa(&self, keys: &[&PreparedKey], digests: &[&[u8]]) -> Vec<Option<EcdsaSig>> {
        Portable.ecdsa(keys, digests)
    }
}

/// Whether this build has IPP Cryptography (the inline provider's ippcp backend).
pub fn ippcp_available() -> Result<(), String> {
    if cfg!(ippcp) {
        Ok(())
    } else {
        Err("this build has no IPP Cryptography (libippcp.a from the ipp-crypto-static package was not found when it was built; scripts/setup.sh installs it)".into())
    }
}

/// Whether this build and this CPU can run the crypto_mb backend; the reason if not.
/// `VECTORLB_CRYPTO_MB=off` in the environment makes it unavailable (to see the fallback and
/// the refusal on a machine that has it).
pub fn crypto_mb_available() -> Result<(), String> {
    if std::env::var("VECTORLB_CRYPTO_MB").is_ok_and(|v| v == "off") {
        return Err("crypto_mb is turned off (VECTORLB_CRYPTO_MB=off)".into());
    }
    #[cfg(crypto_mb)]
    {
        // SAFETY: both functions only read CPUID and take no pointers.
        let ok = unsafe { mb::mbx_is_crypto_mb_applicable(mb::mbx_get_cpu_features()) } != 0;
        if ok {
            Ok(())
        } else {
            Err("this CPU lacks what crypto_mb needs (AVX-512 F/DQ/BW, IFMA and VBMI2)".into())
        }
    }
    #[cfg(not(crypto_mb))]
    {
        Err("this build has no crypto_mb (libcrypto_mb.a from the ipp-crypto-static package was not found when it was built; scripts/setup.sh installs it)".into())
    }
}

#[cfg(crypto_mb)]
mod mb {
    //! The few entry points of Intel's crypto_mb used here (crypto_mb/rsa.h, ec_nistp256.h,
    //! cpu_features.h). Key parts are little-endian 64-bit words; the RSA input and output, the
    //! ECDSA digest and the signature's r and s are big-endian byte strings, as in TLS (the
    //! tests check every lane against BoringSSL).
    #[repr(C)]
    pub struct RsaMethod {
        _opaque: [u8; 0],
    }
    extern "C" {
        pub fn mbx_get_cpu_features() -> u64;
        pub fn mbx_is_crypto_mb_applicable(features: u64) -> i32;
        #[allow(non_snake_case)]
        pub fn mbx_RSA_private_crt_Method(bits: i32) -> *const RsaMethod;
        #[allow(non_snake_case)]
        pub fn mbx_RSA_Method_BufSize(m: *const RsaMethod) -> i32;
        #[allow(non_snake_case)]
        pub fn mbx_RSA_pub65537_Method(bits: i32) -> *const RsaMethod;
        pub fn mbx_rsa_public_mb8(from: *const *const u8, to: *const *mut u8, n: *const *const u64, bits: i32, m: *const RsaMethod, buf: *mut u8) -> u32;
        pub fn mbx_rsa_private_crt_mb8(
            from: *const *const u8,
            to: *const *mut u8,
            p: *const *const u64,
            q: *const *const u64,
            dp: *const *const u64,
            dq: *const *const u64,
            iq: *const *const u64,
            bits: i32,
            m: *const RsaMethod,
            buf: *mut u8,
        ) -> u32;
        pub fn mbx_nistp256_ecdsa_sign_mb8(r: *const *mut u8, s: *const *mut u8, msg: *const *const u8, eph: *const *const u64, reg: *const *const u64, buf: *mut u8) -> u32;
    }
    // The library's `_ssl_` entry points (not used here) need OpenSSL's `BN_bn2lebinpad`;
    // BoringSSL provides it under that name, so they link as they are.

    /// The status of lane `i` (4 bits each; 0 is success).
    pub fn lane_ok(status: u32, i: usize) -> bool {
        (status >> (4 * i)) & 0xf == 0
    }
}

/// Intel's crypto_mb: all lanes in one AVX-512 IFMA call.
#[cfg(crypto_mb)]
pub struct CryptoMbLanes;

#[cfg(crypto_mb)]
impl Lanes for CryptoMbLanes {
    fn name(&self) -> &'static str {
        "crypto_mb"
    }

    fn rsa(&self, keys: &[&PreparedKey], inputs: &[&[u8]]) -> Vec<Option<Vec<u8>>> {
        let n = keys.len().min(inputs.len()).min(LANES);
        let Some(KeyKind::Rsa(bits)) = keys.first().map(|k| k.kind()) else { return nones(keys.len()) };
        let bytes = bits as usize / 8;
        // Every lane of one call must have the same size; the queue is per size.
        if keys[..n].iter().any(|k| k.kind() != KeyKind::Rsa(bits)) || inputs[..n].iter().any(|i| i.len() != bytes) {
            return nones(keys.len());
        }
        let from_be: Vec<Vec<u8>> = inputs[..n].iter().map(|i| i.to_vec()).collect();
        let mut to_be: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; bytes]).collect();
        let mut from = [std::ptr::null::<u8>(); LANES];
        let mut to = [std::ptr::null_mut::<u8>(); LANES];
        let (mut p, mut q, mut dp, mut dq, mut iq) =
            ([std::ptr::null::<u64>(); LANES], [std::ptr::null(); LANES], [std::ptr::null(); LANES], [std::ptr::null(); LANES], [std::ptr::null(); LANES]);
        for i in 0..n {
            let KeyForm::Rsa { crt, .. } = &keys[i].form else { return nones(keys.len()) };
            from[i] = from_be[i].as_ptr();
            to[i] = to_be[i].as_mut_ptr();
            (p[i], q[i], dp[i], dq[i], iq[i]) = (crt.p.as_ptr(), crt.q.as_ptr(), crt.dp.as_ptr(), crt.dq.as_ptr(), crt.iq.as_ptr());
        }
        // SAFETY: the method is a static table of the library; it is checked for null.
        let m = unsafe { mb::mbx_RSA_private_crt_Method(bits as i32) };
        if m.is_null() {
            return nones(keys.len());
        }
        // SAFETY: `m` is a valid method (above).
        let size = unsafe { mb::mbx_RSA_Method_BufSize(m) }.max(0) as usize;
        let mut scratch = vec![0u8; size];
        // SAFETY: lanes 0..n point at buffers of the sizes the library reads and writes for
        // `bits` (input and output `bits/8` bytes, CRT parts `bits/128` words each, all checked
        // above and in PreparedKey::new); lanes n..8 are null, which the library skips; the
        // scratch buffer has the size the method asks for. Nothing is retained after the call.
        let status =
            unsafe { mb::mbx_rsa_private_crt_mb8(from.as_ptr(), to.as_ptr(), p.as_ptr(), q.as_ptr(), dp.as_ptr(), dq.as_ptr(), iq.as_ptr(), bits as i32, m, scratch.as_mut_ptr()) };
        let mut out: Vec<Option<Vec<u8>>> = (0..n).map(|i| mb::lane_ok(status, i).then(|| to_be[i].clone())).collect();
        out.resize_with(keys.len(), || None);
        out
    }

    fn rsa_public(&self, keys: &[&PreparedKey], sigs: &[&[u8]]) -> Option<Vec<Option<Vec<u8>>>> {
        let n = keys.len().min(sigs.len()).min(LANES);
        let Some(KeyKind::Rsa(bits)) = keys.first().map(|k| k.kind()) else { return None };
        let bytes = bits as usize / 8;
        let mut from = [std::ptr::null::<u8>(); LANES];
        let mut to = [std::ptr::null_mut::<u8>(); LANES];
        let mut modulus = [std::ptr::null::<u64>(); LANES];
        let mut to_be: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; bytes]).collect();
        for i in 0..n {
            // Lanes this call cannot take stay null (skipped by the library, `None` below).
            let KeyForm::Rsa { crt, .. } = &keys[i].form else { continue };
            if keys[i].kind() != KeyKind::Rsa(bits) || !crt.e_65537 || sigs[i].len() != bytes || crt.n.len() * 64 != bits as usize {
                continue;
            }
            from[i] = sigs[i].as_ptr();
            to[i] = to_be[i].as_mut_ptr();
            modulus[i] = crt.n.as_ptr();
        }
        // SAFETY: the method is a static table of the library; it is checked for null.
        let m = unsafe { mb::mbx_RSA_pub65537_Method(bits as i32) };
        if m.is_null() {
            return None;
        }
        // SAFETY: `m` is a valid method (above).
        let size = unsafe { mb::mbx_RSA_Method_BufSize(m) }.max(0) as usize;
        let mut scratch = vec![0u8; size];
        // SAFETY: every non-null lane points at a signature and an output of `bits/8` bytes and
        // a modulus of `bits/64` words (checked above); null lanes are skipped by the library;
        // the scratch buffer has the size the method asks for. Nothing is retained.
        let status = unsafe { mb::mbx_rsa_public_mb8(from.as_ptr(), to.as_ptr(), modulus.as_ptr(), bits as i32, m, scratch.as_mut_ptr()) };
        let mut out: Vec<Option<Vec<u8>>> = to_be.into_iter().enumerate().map(|(i, v)| (!from[i].is_null() && mb::lane_ok(status, i)).then_some(v)).collect();
        out.resize_with(keys.len(), || None);
        Some(out)
    }

    fn ecdsa(&self, keys: &[&PreparedKey], digests: &[&[u8]]) -> Vec<Option<EcdsaSig>> {
        let n = keys.len().min(digests.len()).min(LANES);
        let mut msg_be: Vec<[u8; 32]> = Vec::with_capacity(n);
        let mut eph: Vec<[u64; 4]> = Vec::with_capacity(n);
        let (mut r, mut s) = (vec![[0u8; 32]; n], vec![[0u8; 32]; n]);
        let (mut pm, mut pe, mut pd) = ([std::ptr::null::<u8>(); LANES], [std::ptr::null::<u64>(); LANES], [std::ptr::null::<u64>(); LANES]);
        let (mut pr, mut ps) = ([std::ptr::null_mut::<u8>(); LANES], [std::ptr::null_mut::<u8>(); LANES]);
        for i in 0..n {
            let KeyForm::Ec { order, .. } = &keys[i].form else { return nones(keys.len()) };
            if digests[i].len() != 32 {
                return nones(keys.len());
            }
            // A fresh secret nonce per signature, uniform in [1, order).
            let k = loop {
                let Ok(mut k) = BigNum::new() else { return nones(keys.len()) };
                if order.rand_range(&mut k).is_err() {
                    return nones(keys.len());
                }
                if k.num_bits() > 0 {
                    break k;
                }
            };
            let Some(w) = le_words(&k, 4) else { return nones(keys.len()) };
            eph.push([w[0], w[1], w[2], w[3]]);
            let mut m = [0u8; 32];
            m.copy_from_slice(digests[i]);
            msg_be.push(m);
        }
        for i in 0..n {
            let KeyForm::Ec { d, .. } = &keys[i].form else { return nones(keys.len()) };
            pm[i] = msg_be[i].as_ptr();
            pe[i] = eph[i].as_ptr();
            pd[i] = d.as_ptr();
            pr[i] = r[i].as_mut_ptr();
            ps[i] = s[i].as_mut_ptr();
        }
        // SAFETY: lanes 0..n point at 32-byte digests and outputs and 4-word scalars, which is
        // what P-256 reads and writes; lanes n..8 are null, which the library skips; the call
        // keeps no pointer. No scratch buffer is needed by this entry point (null).
        let status = unsafe { mb::mbx_nistp256_ecdsa_sign_mb8(pr.as_ptr(), ps.as_ptr(), pm.as_ptr(), pe.as_ptr(), pd.as_ptr(), std::ptr::null_mut()) };
        // Nonces do not outlive the call.
        eph.iter_mut().for_each(|e| *e = [0; 4]);
        let mut out: Vec<Option<EcdsaSig>> = (0..n)
            .map(|i| {
                if !mb::lane_ok(status, i) {
                    return None;
                }
                let be = |x: &[u8; 32]| BigNum::from_slice(x).ok();
                EcdsaSig::from_private_components(be(&r[i])?, be(&s[i])?).ok()
            })
            .collect();
        out.resize_with(keys.len(), || None);
        out
    }
}

/// What TLS asked for, prepared for the lanes: the padded RSA input or the ECDSA digest.
fn prepare(key: &PreparedKey, alg: SslSignatureAlgorithm, input: &[u8]) -> Result<Vec<u8>, String> {
    let (md, pss) = match alg {
        SslSignatureAlgorithm::RSA_PKCS1_SHA256 | SslSignatureAlgorithm::ECDSA_SECP256R1_SHA256 => (MessageDigest::sha256(), false),
        SslSignatureAlgorithm::RSA_PKCS1_SHA384 => (MessageDigest::sha384(), false),
        SslSignatureAlgorithm::RSA_PKCS1_SHA512 => (MessageDigest::sha512(), false),
        SslSignatureAlgorithm::RSA_PSS_RSAE_SHA256 => (MessageDigest::sha256(), true),
        SslSignatureAlgorithm::RSA_PSS_RSAE_SHA384 => (MessageDigest::sha384(), true),
        SslSignatureAlgorithm::RSA_PSS_RSAE_SHA512 => (MessageDigest::sha512(), true),
        a => return Err(format!("signature algorithm {a:?} is not offered")),
    };
    let digest = hash(md, input).map_err(|e| e.to_string())?;
    match &key.form {
        KeyForm::Ec { .. } => {
            if alg != SslSignatureAlgorithm::ECDSA_SECP256R1_SHA256 {
                return Err(format!("{alg:?} with a P-256 key"));
            }
            Ok(digest.to_vec())
        }
        KeyForm::Rsa { rsa, .. } => {
            if alg == SslSignatureAlgorithm::ECDSA_SECP256R1_SHA256 {
                return Err(format!("{alg:?} with an RSA key"));
            }
            let k = rsa.size() as usize;
            let mut em = vec![0u8; k];
            if pss {
                // SAFETY: `em` has RSA_size(rsa) bytes, which is what the function writes;
                // `digest` is a digest of `md`, which is what it reads; the RSA and the
                // digest methods are live for the call. Salt length -1: the digest's length, as
                // TLS requires.
                let ok = unsafe { boring_sys::RSA_padding_add_PKCS1_PSS_mgf1(rsa.as_ptr(), em.as_mut_ptr(), digest.as_ptr(), md.as_ptr(), md.as_ptr(), -1) };
                if ok != 1 {
                    return Err("PSS padding failed".into());
                }
            } else {
                let mut prefixed: *mut u8 = std::ptr::null_mut();
                let mut len = 0usize;
                let mut alloced: std::os::raw::c_int = 0;
                // SAFETY: the out-parameters point at locals; `digest` is readable for its
                // length. On success `prefixed` points at `len` bytes, released below with
                // OPENSSL_free when the function says it allocated them.
                let ok = unsafe { boring_sys::RSA_add_pkcs1_prefix(&mut prefixed, &mut len, &mut alloced, md.type_().as_raw(), digest.as_ptr(), digest.len()) };
                if ok != 1 || prefixed.is_null() {
                    return Err("PKCS#1 DigestInfo failed".into());
                }
                // SAFETY: as above: `len` readable bytes at `prefixed`.
                let t = unsafe { std::slice::from_raw_parts(prefixed, len) }.to_vec();
                if alloced != 0 {
                    // SAFETY: allocated by BoringSSL for us, released once.
                    unsafe { boring_sys::OPENSSL_free(prefixed.cast()) };
                }
                // EMSA-PKCS1-v1_5: 00 01 FF..FF 00 T, at least 8 bytes of FF.
                if t.len() + 11 > k {
                    return Err("the key is too small for this digest".into());
                }
                em[1] = 1;
                let ps_end = k - t.len() - 1;
                em[2..ps_end].fill(0xff);
                em[ps_end + 1..].copy_from_slice(&t);
            }
            Ok(em)
        }
    }
}

/// Checks one result with the public key; the signature as TLS sends it if it verifies.
/// `public`: the RSA public operation on the signature, where the backend computed it in
/// its batch (otherwise BoringSSL computes it here).
fn check(key: &PreparedKey, prepared: &[u8], r: RsaOrEc, public: Option<Vec<u8>>) -> Result<Vec<u8>, KeyOpError> {
    match (&key.form, r) {
        (KeyForm::Rsa { .. }, RsaOrEc::Rsa(sig)) if public.is_some() => {
            // The raw public operation gives the padded input back, the modulus's size.
            if public.as_deref() == Some(prepared) {
                Ok(sig)
            } else {
                Err(KeyOpError::Check)
            }
        }
        (KeyForm::Rsa { rsa, .. }, RsaOrEc::Rsa(sig)) => {
            let mut back = vec![0u8; rsa.size() as usize];
            match rsa.public_decrypt(&sig, &mut back, Padding::NONE) {
                Ok(n) if n == prepared.len() && back[..n] == *prepared => Ok(sig),
                _ => Err(KeyOpError::Check),
            }
        }
        (KeyForm::Ec { ec, .. }, RsaOrEc::Ec(sig)) => match sig.verify(prepared, ec) {
            Ok(true) => sig.to_der().map_err(|e| KeyOpError::Sign(e.to_string())),
            _ => Err(KeyOpError::Check),
        },
        _ => Err(KeyOpError::Check),
    }
}

enum RsaOrEc {
    Rsa(Vec<u8>),
    Ec(EcdsaSig),
}

/// One signature waiting in a queue.
struct Op {
    key: Arc<PreparedKey>,
    prepared: Vec<u8>,
    reply: oneshot::Sender<Result<Vec<u8>, KeyOpError>>,
}

/// The queues of every worker thread, one per kind of key.
type Queues = HashMap<(ThreadId, KeyKind), Arc<Mutex<Batch<Op>>>>;

/// The provider of one listener: its backend, the queues of each worker thread, statistics.
pub struct Engine {
    lanes: Box<dyn Lanes>,
    /// No queue: each operation runs at once, in the worker that asked (the inline provider).
    immediate: bool,
    poll_delay: Duration,
    stats: Arc<TlsStats>,
    queues: Mutex<Queues>,
}

impl Engine {
    pub fn new(lanes: Box<dyn Lanes>, poll_delay: Duration, stats: Arc<TlsStats>) -> Arc<Engine> {
        Arc::new(Engine { lanes, immediate: false, poll_delay, stats, queues: Mutex::new(HashMap::new()) })
    }

    /// Runs each operation at once on `lanes`, in the worker (with the same padding and check).
    pub fn immediate(lanes: Box<dyn Lanes>, stats: Arc<TlsStats>) -> Arc<Engine> {
        Arc::new(Engine { lanes, immediate: true, poll_delay: Duration::ZERO, stats, queues: Mutex::new(HashMap::new()) })
    }

    /// Whether operations run at once in the worker (the inline provider's engine).
    pub fn is_immediate(&self) -> bool {
        self.immediate
    }

    pub fn backend(&self) -> &'static str {
        self.lanes.name()
    }

    /// Queues one signature on the calling thread's queue; the receiver gets the checked
    /// signature. Runs the queue when it is full; arms the `poll_delay` timer when it was empty.
    pub fn submit(self: &Arc<Self>, key: &Arc<PreparedKey>, alg: SslSignatureAlgorithm, input: &[u8]) -> oneshot::Receiver<Result<Vec<u8>, KeyOpError>> {
        let (reply, rx) = oneshot::channel();
        let prepared = match prepare(key, alg, input) {
            Ok(p) => p,
            Err(e) => {
                let _ = reply.send(Err(KeyOpError::Sign(e)));
                return rx;
            }
        };
        if self.immediate {
            self.run(key.kind(), vec![Op { key: key.clone(), prepared, reply }]);
            return rx;
        }
        let q = {
            let mut all = self.queues.lock().unwrap_or_else(|e| e.into_inner());
            all.entry((std::thread::current().id(), key.kind())).or_default().clone()
        };
        let (me, kind) = (self.clone(), key.kind());
        Batch::submit(&q, Op { key: key.clone(), prepared, reply }, self.poll_delay, move |batch| me.run(kind, batch));
        rx
    }

    /// Runs one batch through the lanes, checks every result and answers every operation.
    fn run(&self, kind: KeyKind, batch: Vec<Op>) {
        if batch.is_empty() {
            return;
        }
        let keys: Vec<&PreparedKey> = batch.iter().map(|o| &*o.key).collect();
        let inputs: Vec<&[u8]> = batch.iter().map(|o| o.prepared.as_slice()).collect();
        let results: Vec<Option<RsaOrEc>> = match kind {
            KeyKind::Rsa(_) => {
                if !self.immediate {
                    self.stats.rsa_queue_sizes.observe(batch.len() as f64);
                }
                self.lanes.rsa(&keys, &inputs).into_iter().map(|r| r.map(RsaOrEc::Rsa)).collect()
            }
            KeyKind::EcdsaP256 => {
                if !self.immediate {
                    self.stats.ecdsa_queue_sizes.observe(batch.len() as f64);
                }
                self.lanes.ecdsa(&keys, &inputs).into_iter().map(|r| r.map(RsaOrEc::Ec)).collect()
            }
        };
        // A lane the backend could not compute is computed alone (counted as a fallback).
        let mut results = results.into_iter();
        let results: Vec<Option<RsaOrEc>> = batch
            .iter()
            .map(|op| match results.next().flatten() {
                Some(r) => Some(r),
                None => {
                    self.stats.key_op_fallbacks.fetch_add(1, Ordering::Relaxed);
                    match kind {
                        KeyKind::Rsa(_) => rsa_one(&op.key, &op.prepared).map(RsaOrEc::Rsa),
                        KeyKind::EcdsaP256 => ecdsa_one(&op.key, &op.prepared).map(RsaOrEc::Ec),
                    }
                }
            })
            .collect();
        // The RSA checks in one batch too, where the backend offers it.
        let mut publics = match kind {
            KeyKind::Rsa(_) => {
                let sigs: Vec<&[u8]> = results.iter().map(|r| if let Some(RsaOrEc::Rsa(s)) = r { s.as_slice() } else { &[][..] }).collect();
                self.lanes.rsa_public(&keys, &sigs)
            }
            KeyKind::EcdsaP256 => None,
        }
        .unwrap_or_default()
        .into_iter();
        for (op, r) in batch.into_iter().zip(results) {
            let public = publics.next().flatten();
            let answer = match r {
                None => Err(KeyOpError::Sign("the private-key operation failed".into())),
                Some(r) => {
                    let c = check(&op.key, &op.prepared, r, public);
                    if c == Err(KeyOpError::Check) {
                        self.stats.failed_checks.fetch_add(1, Ordering::Relaxed);
                        tracing::error!(backend = self.lanes.name(), "a signature failed its check with the public key; the handshake is failed");
                    }
                    c
                }
            };
            let _ = op.reply.send(answer);
        }
    }
}

/// The future BoringSSL polls for an offloaded signature: done when `rx` answers, copying the
/// signature into BoringSSL's buffer (sized for the key's largest signature).
pub(crate) fn completion<E: Send + 'static>(rx: tokio::sync::oneshot::Receiver<Result<Vec<u8>, E>>, stats: Arc<TlsStats>) -> BoxPrivateKeyMethodFuture {
    Box::pin(async move {
        let sig = match rx.await {
            Ok(Ok(sig)) => sig,
            _ => {
                stats.offload_failures.fetch_add(1, Ordering::Relaxed);
                return Err(AsyncPrivateKeyMethodError);
            }
        };
        Ok(Box::new(move |_: &mut boring::ssl::SslRef, out: &mut [u8]| {
            let d = out.get_mut(..sig.len()).ok_or(AsyncPrivateKeyMethodError)?;
            d.copy_from_slice(&sig);
            Ok(sig.len())
        }) as Box<dyn FnOnce(&mut boring::ssl::SslRef, &mut [u8]) -> Result<usize, AsyncPrivateKeyMethodError>>)
    })
}

/// The asynchronous private-key method of one certificate, feeding the listener's engine.
pub struct CryptoMbMethod {
    pub engine: Arc<Engine>,
    pub key: Arc<PreparedKey>,
}

impl AsyncPrivateKeyMethod for CryptoMbMethod {
    fn sign(&self, _ssl: &mut SslRef, input: &[u8], alg: SslSignatureAlgorithm, _output: &mut [u8]) -> Result<BoxPrivateKeyMethodFuture, AsyncPrivateKeyMethodError> {
        let rx = self.engine.submit(&self.key, alg, input);
        self.engine.stats.offloaded.fetch_add(1, Ordering::Relaxed);
        Ok(completion(rx, self.engine.stats.clone()))
    }

    fn decrypt(&self, _ssl: &mut SslRef, _input: &[u8], _output: &mut [u8]) -> Result<BoxPrivateKeyMethodFuture, AsyncPrivateKeyMethodError> {
        Err(AsyncPrivateKeyMethodError)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use boring::ec::EcGroup;

    fn rsa_key(bits: u32) -> Arc<PreparedKey> {
        Arc::new(PreparedKey::new(PKey::from_rsa(Rsa::generate(bits).unwrap()).unwrap()).unwrap())
    }
    fn ec_key() -> Arc<PreparedKey> {
        let g = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
        Arc::new(PreparedKey::new(PKey::from_ec_key(EcKey::generate(&g).unwrap()).unwrap()).unwrap())
    }

    /// Verifies `sig` over `msg` as a TLS client would.
    fn verifies(key: &PreparedKey, alg: SslSignatureAlgorithm, msg: &[u8], sig: &[u8]) -> bool {
        use boring::rsa::Padding;
        use boring::sign::{RsaPssSaltlen, Verifier};
        let (md, pss) = match alg {
            SslSignatureAlgorithm::RSA_PKCS1_SHA256 | SslSignatureAlgorithm::ECDSA_SECP256R1_SHA256 => (MessageDigest::sha256(), false),
            SslSignatureAlgorithm::RSA_PKCS1_SHA384 => (MessageDigest::sha384(), false),
            SslSignatureAlgorithm::RSA_PSS_RSAE_SHA256 => (MessageDigest::sha256(), true),
            SslSignatureAlgorithm::RSA_PSS_RSAE_SHA384 => (MessageDigest::sha384(), true),
            SslSignatureAlgorithm::RSA_PSS_RSAE_SHA512 => (MessageDigest::sha512(), true),
            _ => unreachable!(),
        };
        let pkey = match &key.form {
            KeyForm::Rsa { rsa, .. } => PKey::from_rsa(rsa.clone()).unwrap(),
            KeyForm::Ec { ec, .. } => PKey::from_ec_key(ec.clone()).unwrap(),
        };
        let mut v = Verifier::new(md, &pkey).unwrap();
        if pkey.rsa().is_ok() {
            v.set_rsa_padding(if pss { Padding::PKCS1_PSS } else { Padding::PKCS1 }).unwrap();
            if pss {
                v.set_rsa_pss_saltlen(RsaPssSaltlen::DIGEST_LENGTH).unwrap();
            }
        }
        v.verify_oneshot(sig, msg).unwrap_or(false)
    }

    /// Runs `n` signatures through an engine on `lanes` (the timer flushes a partial batch).
    async fn sign_n(lanes: Box<dyn Lanes>, key: &Arc<PreparedKey>, alg: SslSignatureAlgorithm, n: usize) -> (Vec<Result<Vec<u8>, KeyOpError>>, Arc<TlsStats>) {
        let stats = Arc::new(TlsStats::default());
        let e = Engine::new(lanes, Duration::from_millis(5), stats.clone());
        let rxs: Vec<_> = (0..n).map(|i| e.submit(key, alg, format!("transcript {i}").as_bytes())).collect();
        let mut out = Vec::new();
        for rx in rxs {
            out.push(rx.await.unwrap());
        }
        (out, stats)
    }

    async fn every_algorithm(lanes: fn() -> Box<dyn Lanes>) {
        let rsa = rsa_key(2048);
        let ec = ec_key();
        for (key, alg) in [
            (&rsa, SslSignatureAlgorithm::RSA_PSS_RSAE_SHA256),
            (&rsa, SslSignatureAlgorithm::RSA_PSS_RSAE_SHA384),
            (&rsa, SslSignatureAlgorithm::RSA_PSS_RSAE_SHA512),
            (&rsa, SslSignatureAlgorithm::RSA_PKCS1_SHA256),
            (&rsa, SslSignatureAlgorithm::RSA_PKCS1_SHA384),
            (&ec, SslSignatureAlgorithm::ECDSA_SECP256R1_SHA256),
        ] {
            // 11: one full batch of 8 run at once, then 3 flushed by the timer.
            let (sigs, stats) = sign_n(lanes(), key, alg, 11).await;
            for (i, s) in sigs.iter().enumerate() {
                let s = s.as_ref().unwrap_or_else(|e| panic!("{alg:?} lane {i}: {e}"));
                assert!(verifies(key, alg, format!("transcript {i}").as_bytes(), s), "{alg:?} lane {i}");
            }
            let h = if key.kind() == KeyKind::EcdsaP256 { &stats.ecdsa_queue_sizes } else { &stats.rsa_queue_sizes };
            assert_eq!(h.count(), 2, "{alg:?}: two batches");
            assert_eq!(h.sum(), 11.0, "{alg:?}: 8 + 3 operations");
            assert_eq!(stats.failed_checks.load(Ordering::Relaxed), 0);
            assert_eq!(stats.key_op_fallbacks.load(Ordering::Relaxed), 0);
        }
    }

    #[tokio::test]
    async fn portable_lanes_sign_every_algorithm_in_batches() {
        every_algorithm(|| Box::new(Portable)).await;
    }

    #[tokio::test]
    async fn crypto_mb_lanes_sign_every_algorithm_in_batches() {
        match crypto_mb_available() {
            #[cfg(crypto_mb)]
            Ok(()) => every_algorithm(|| Box::new(CryptoMbLanes)).await,
            #[cfg(not(crypto_mb))]
            Ok(()) => unreachable!(),
            Err(why) => eprintln!("crypto_mb lanes not tested here: {why}"),
        }
    }

    #[cfg(crypto_mb)]
    #[test]
    fn crypto_mb_agrees_with_boringssl_for_every_rsa_size_and_partial_batches() {
        if let Err(why) = crypto_mb_available() {
            eprintln!("crypto_mb lanes not tested here: {why}");
            return;
        }
        for bits in [1024, 2048, 3072, 4096] {
            let keys: Vec<Arc<PreparedKey>> = (0..3).map(|_| rsa_key(bits)).collect();
            for n in [1, 5, 8] {
                let ks: Vec<&PreparedKey> = (0..n).map(|i| &*keys[i % 3]).collect();
                let ins: Vec<Vec<u8>> = (0..n).map(|i| prepare(ks[i], SslSignatureAlgorithm::RSA_PSS_RSAE_SHA256, &[i as u8; 40]).unwrap()).collect();
                let refs: Vec<&[u8]> = ins.iter().map(|v| v.as_slice()).collect();
                let mb = CryptoMbLanes.rsa(&ks, &refs);
                let pt = Portable.rsa(&ks, &refs);
                assert_eq!(mb, pt, "{bits} bits, {n} lanes: RSA is deterministic, both must agree");
            }
        }
    }

    #[cfg(ippcp)]
    #[test]
    fn ippcp_agrees_with_boringssl_for_every_rsa_size() {
        for bits in [1024, 2048, 3072, 4096] {
            let k = rsa_key(bits);
            let ins: Vec<Vec<u8>> = (0..3).map(|i| prepare(&k, SslSignatureAlgorithm::RSA_PKCS1_SHA256, &[i as u8; 33]).unwrap()).collect();
            let refs: Vec<&[u8]> = ins.iter().map(|v| v.as_slice()).collect();
            let ks = [&*k, &*k, &*k];
            assert_eq!(IppcpLanes.rsa(&ks, &refs), Portable.rsa(&ks, &refs), "{bits} bits");
        }
    }

    #[cfg(ippcp)]
    #[tokio::test]
    async fn the_immediate_engine_signs_at_once_without_queue_statistics() {
        let key = rsa_key(2048);
        let stats = Arc::new(TlsStats::default());
        let e = Engine::immediate(Box::new(IppcpLanes), stats.clone());
        let rx = e.submit(&key, SslSignatureAlgorithm::RSA_PSS_RSAE_SHA256, b"transcript");
        let sig = rx.await.unwrap().unwrap();
        assert!(verifies(&key, SslSignatureAlgorithm::RSA_PSS_RSAE_SHA256, b"transcript", &sig));
        assert_eq!(stats.rsa_queue_sizes.count(), 0);
    }

    /// Lanes that compute the right signature and then flip one bit of it, as a fault would.
    struct Corrupting;
    impl Lanes for Corrupting {
        fn name(&self) -> &'static str {
            "corrupting"
        }
        fn rsa(&self, keys: &[&PreparedKey], inputs: &[&[u8]]) -> Vec<Option<Vec<u8>>> {
            Portable
                .rsa(keys, inputs)
                .into_iter()
                .map(|s| {
                    s.map(|mut s| {
                        s[10] ^= 0x04;
                        s
                    })
                })
                .collect()
        }
        fn ecdsa(&self, keys: &[&PreparedKey], digests: &[&[u8]]) -> Vec<Option<EcdsaSig>> {
            Portable
                .ecdsa(keys, digests)
                .into_iter()
                .map(|s| {
                    let s = s?;
                    let mut r = s.r().to_owned().ok()?;
                    r.add_word(1).ok()?;
                    EcdsaSig::from_private_components(r, s.s().to_owned().ok()?).ok()
                })
                .collect()
        }
    }

    #[tokio::test]
    async fn a_corrupted_signature_is_rejected_by_the_check_and_never_returned() {
        for (key, alg) in [(rsa_key(2048), SslSignatureAlgorithm::RSA_PSS_RSAE_SHA256), (ec_key(), SslSignatureAlgorithm::ECDSA_SECP256R1_SHA256)] {
            let (sigs, stats) = sign_n(Box::new(Corrupting), &key, alg, 3).await;
            assert!(sigs.iter().all(|s| *s == Err(KeyOpError::Check)), "{alg:?}: {sigs:?}");
            assert_eq!(stats.failed_checks.load(Ordering::Relaxed), 3);
        }
    }

    /// crypto_mb's lanes, with one bit of every RSA signature flipped: the check, done by the
    /// library's own batched public operation, must catch each.
    #[cfg(crypto_mb)]
    struct CorruptingCryptoMb;
    #[cfg(crypto_mb)]
    impl Lanes for CorruptingCryptoMb {
        fn name(&self) -> &'static str {
            "corrupting-crypto_mb"
        }
        fn rsa(&self, keys: &[&PreparedKey], inputs: &[&[u8]]) -> Vec<Option<Vec<u8>>> {
            CryptoMbLanes
                .rsa(keys, inputs)
                .into_iter()
                .map(|s| {
                    s.map(|mut s| {
                        s[100] ^= 0x20;
                        s
                    })
                })
                .collect()
        }
        fn ecdsa(&self, keys: &[&PreparedKey], digests: &[&[u8]]) -> Vec<Option<EcdsaSig>> {
            CryptoMbLanes.ecdsa(keys, digests)
        }
        fn rsa_public(&self, keys: &[&PreparedKey], sigs: &[&[u8]]) -> Option<Vec<Option<Vec<u8>>>> {
            CryptoMbLanes.rsa_public(keys, sigs)
        }
    }

    #[cfg(crypto_mb)]
    #[tokio::test]
    async fn crypto_mb_batched_check_rejects_corrupted_signatures_and_passes_good_ones() {
        if crypto_mb_available().is_err() {
            eprintln!("skipped: {}", crypto_mb_available().unwrap_err());
            return;
        }
        let key = rsa_key(2048);
        let (sigs, stats) = sign_n(Box::new(CorruptingCryptoMb), &key, SslSignatureAlgorithm::RSA_PKCS1_SHA256, 8).await;
        assert!(sigs.iter().all(|s| *s == Err(KeyOpError::Check)), "{sigs:?}");
        assert_eq!(stats.failed_checks.load(Ordering::Relaxed), 8);
        // The public operation itself gives back exactly what was signed, lane by lane.
        let inputs: Vec<Vec<u8>> = (0..5).map(|i| prepare(&key, SslSignatureAlgorithm::RSA_PSS_RSAE_SHA256, format!("m{i}").as_bytes()).unwrap()).collect();
        let keys: Vec<&PreparedKey> = (0..5).map(|_| &*key).collect();
        let ins: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
        let sigs: Vec<Vec<u8>> = CryptoMbLanes.rsa(&keys, &ins).into_iter().map(Option::unwrap).collect();
        let sig_refs: Vec<&[u8]> = sigs.iter().map(|v| v.as_slice()).collect();
        let back = CryptoMbLanes.rsa_public(&keys, &sig_refs).unwrap();
        for (b, i) in back.iter().zip(&inputs) {
            assert_eq!(b.as_deref(), Some(i.as_slice()));
        }
    }

    /// Lanes whose multi-buffer call fails for every lane: each is computed alone.
    struct Failing;
    impl Lanes for Failing {
        fn name(&self) -> &'static str {
            "failing"
        }
        fn rsa(&self, keys: &[&PreparedKey], _: &[&[u8]]) -> Vec<Option<Vec<u8>>> {
            nones(keys.len())
        }
        fn ecdsa(&self, keys: &[&PreparedKey], _: &[&[u8]]) -> Vec<Option<EcdsaSig>> {
            nones(keys.len())
        }
    }

    #[tokio::test]
    async fn lanes_the_backend_fails_are_signed_alone_and_counted() {
        let key = rsa_key(2048);
        let (sigs, stats) = sign_n(Box::new(Failing), &key, SslSignatureAlgorithm::RSA_PKCS1_SHA256, 2).await;
        for (i, s) in sigs.iter().enumerate() {
            assert!(verifies(&key, SslSignatureAlgorithm::RSA_PKCS1_SHA256, format!("transcript {i}").as_bytes(), s.as_ref().unwrap()));
        }
        assert_eq!(stats.key_op_fallbacks.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn an_algorithm_that_does_not_fit_the_key_is_an_error_not_a_signature() {
        let (sigs, _) = sign_n(Box::new(Portable), &ec_key(), SslSignatureAlgorithm::RSA_PSS_RSAE_SHA256, 1).await;
        assert!(matches!(sigs[0], Err(KeyOpError::Sign(_))));
        let (sigs, _) = sign_n(Box::new(Portable), &rsa_key(2048), SslSignatureAlgorithm::ED25519, 1).await;
        assert!(matches!(sigs[0], Err(KeyOpError::Sign(_))));
    }

    #[test]
    fn keys_cryptomb_cannot_hold_are_refused_with_the_reason() {
        let r = PreparedKey::new(PKey::from_rsa(Rsa::generate(1536).unwrap()).unwrap());
        assert!(r.err().unwrap().contains("1536 bits"));
        let g = EcGroup::from_curve_name(Nid::SECP384R1).unwrap();
        let r = PreparedKey::new(PKey::from_ec_key(EcKey::generate(&g).unwrap()).unwrap());
        assert!(r.err().unwrap().contains("P-256"));
    }
}
