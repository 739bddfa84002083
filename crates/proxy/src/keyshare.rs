//! Ephemeral X25519 key pairs for the TLS key exchange, made eight at a time with crypto_mb.
//!
//! Every full handshake makes a fresh X25519 key pair (the server's key share in TLS 1.3, its
//! ECDHE key in TLS 1.2): BoringSSL's fixed-base scalar multiplication, 23 µs on this project's
//! AMD EPYC machines, about 7 % of a handshake's CPU under the `cryptomb` provider. The shared
//! secret needs the client's key and is computed where BoringSSL computes it, but the key pair
//! does not depend on the peer, so it can be made ahead: crypto_mb's
//! `mbx_x25519_public_key_mb8` makes eight in one AVX-512 IFMA call (4.1 µs a pair, measured
//! side by side with BoringSSL's).
//!
//! BoringSSL has no hook for its key shares, so the binary is linked with
//! `-Wl,--wrap=X25519_keypair` (build scripts of `vectorlb` and of this crate's tests and
//! examples): BoringSSL's calls to `X25519_keypair` reach [`__wrap_X25519_keypair`] instead.
//! Until [`enable`] is called (the `cryptomb` provider on crypto_mb does at start) the wrapper
//! does what BoringSSL's function does: random private key, masked as BoringSSL masks it,
//! `X25519_public_from_private`. Enabled, each thread keeps up to eight pairs made in one call
//! and hands out each once; a pair handed out is wiped from the pool, and so is the rest of the
//! pool when its thread ends. Forward secrecy is as before: a pair is used for one handshake
//! and then exists only in BoringSSL's handshake state, which erases it.
//!
//! A lane the library reports as failed is made singly instead. A wrong public value cannot
//! reveal anything (the pair is ephemeral); it would fail its handshake. The tests compare every
//! batched public value with BoringSSL's from the same private key.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Pairs made per batch (crypto_mb's lanes).
const LANES: usize = 8;

static ENABLED: AtomicBool = AtomicBool::new(false);
/// Key pairs handed out from batches, and made singly (disabled, no library, or a failed lane).
static BATCHED: AtomicU64 = AtomicU64::new(0);
static SINGLE: AtomicU64 = AtomicU64::new(0);

/// A pool of pairs; wiped when dropped (its thread ends).
struct Pool {
    pairs: Vec<([u8; 32], [u8; 32])>,
}

impl Drop for Pool {
    fn drop(&mut self) {
        for (public, private) in self.pairs.iter_mut() {
            wipe(public);
            wipe(private);
        }
    }
}

thread_local! {
    static POOL: RefCell<Pool> = const { RefCell::new(Pool { pairs: Vec::new() }) };
    /// Set by the wrapper: whether this binary routes BoringSSL's calls through it.
    static SEEN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Set while [`wrapped`] asks (that pair is not counted).
    static PROBING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn wipe(b: &mut [u8; 32]) {
    for x in b.iter_mut() {
        // SAFETY: a valid, aligned pointer to a byte of `b`; volatile so the wipe stays.
        unsafe { std::ptr::write_volatile(x, 0) };
    }
}

/// Key pairs made so far: (from batches, singly).
pub fn counts() -> (u64, u64) {
    (BATCHED.load(Ordering::Relaxed), SINGLE.load(Ordering::Relaxed))
}

/// Whether BoringSSL's key pairs come through [`__wrap_X25519_keypair`] in this binary.
pub fn wrapped() -> bool {
    let (mut public, mut private) = ([0u8; 32], [0u8; 32]);
    SEEN.with(|s| s.set(false));
    PROBING.with(|p| p.set(true));
    // SAFETY: two writable 32-byte buffers, as the function requires.
    unsafe { boring_sys::X25519_keypair(public.as_mut_ptr(), private.as_mut_ptr()) };
    PROBING.with(|p| p.set(false));
    wipe(&mut private);
    SEEN.with(|s| s.get())
}

/// Makes key pairs in batches from now on, if this binary is linked for it and crypto_mb can
/// run here; the reason if not.
pub fn enable() -> Result<(), String> {
    crate::cryptomb::crypto_mb_available()?;
    if !wrapped() {
        return Err("this binary was not linked with -Wl,--wrap=X25519_keypair".into());
    }
    ENABLED.store(true, Ordering::Relaxed);
    Ok(())
}

/// Whether batches are on.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// A random private key masked as BoringSSL's `X25519_keypair` masks it (the bits RFC 7748's
/// decoding clears are set, so that an implementation that does not clear them fails at once).
fn private_key(out: &mut [u8; 32]) {
    // SAFETY: a writable 32-byte buffer; BoringSSL's RAND_bytes does not fail (it aborts).
    unsafe { boring_sys::RAND_bytes(out.as_mut_ptr(), 32) };
    out[0] |= !248;
    out[31] &= !64;
    out[31] |= !127;
}

/// One pair, as BoringSSL makes it (not counted).
fn single(public: &mut [u8; 32], private: &mut [u8; 32]) {
    private_key(private);
    // SAFETY: a 32-byte output and a 32-byte private key.
    unsafe { boring_sys::X25519_public_from_private(public.as_mut_ptr(), private.as_ptr()) };
}

/// Eight pairs from one crypto_mb call (a failed lane made singly).
#[cfg(crypto_mb)]
fn batch() -> Vec<([u8; 32], [u8; 32])> {
    extern "C" {
        fn mbx_x25519_public_key_mb8(public: *const *mut u8, private: *const *const u8) -> u32;
    }
    let mut pairs = vec![([0u8; 32], [0u8; 32]); LANES];
    for (_, private) in pairs.iter_mut() {
        private_key(private);
    }
    let mut public = [std::ptr::null_mut::<u8>(); LANES];
    let mut private = [std::ptr::null::<u8>(); LANES];
    for (i, (pu, pr)) in pairs.iter_mut().enumerate() {
        public[i] = pu.as_mut_ptr();
        private[i] = pr.as_ptr();
    }
    // SAFETY: eight writable 32-byte outputs and eight 32-byte private keys, all live for the
    // call; the library reads and writes only those (crypto_mb/x25519.h).
    let status = unsafe { mbx_x25519_public_key_mb8(public.as_ptr(), private.as_ptr()) };
    for (i, (pu, pr)) in pairs.iter_mut().enumerate() {
        if (status >> (4 * i)) & 0xf != 0 {
            single(pu, pr);
            tracing::warn!("crypto_mb failed an X25519 lane (status {status:#x}); made singly");
        }
    }
    pairs
}

#[cfg(not(crypto_mb))]
fn batch() -> Vec<([u8; 32], [u8; 32])> {
    let mut pairs = vec![([0u8; 32], [0u8; 32]); LANES];
    for (pu, pr) in pairs.iter_mut() {
        single(pu, pr);
    }
    pairs
}

/// One pair: from this thread's pool (refilled eight at a time) when batches are on.
fn next_pair(public: &mut [u8; 32], private: &mut [u8; 32]) {
    if !enabled() {
        single(public, private);
        SINGLE.fetch_add(1, Ordering::Relaxed);
        return;
    }
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        if p.pairs.is_empty() {
            p.pairs = batch();
        }
        let (mut pu, mut pr) = p.pairs.pop().expect("a batch has eight pairs");
        *public = pu;
        *private = pr;
        wipe(&mut pu);
        wipe(&mut pr);
    });
    BATCHED.fetch_add(1, Ordering::Relaxed);
}

/// BoringSSL's `X25519_keypair`, for a binary linked with `-Wl,--wrap=X25519_keypair`.
///
/// # Safety
/// `out_public` and `out_private` are writable 32-byte buffers (the contract of the function it
/// replaces).
#[no_mangle]
pub unsafe extern "C" fn __wrap_X25519_keypair(out_public: *mut u8, out_private: *mut u8) {
    SEEN.with(|s| s.set(true));
    let (mut public, mut private) = ([0u8; 32], [0u8; 32]);
    if PROBING.with(|p| p.get()) {
        single(&mut public, &mut private);
    } else {
        next_pair(&mut public, &mut private);
    }
    // SAFETY: the caller's buffers are 32 writable bytes each (above).
    unsafe {
        std::ptr::copy_nonoverlapping(public.as_ptr(), out_public, 32);
        std::ptr::copy_nonoverlapping(private.as_ptr(), out_private, 32);
    }
    wipe(&mut private);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn public_of(private: &[u8; 32]) -> [u8; 32] {
        let mut public = [0u8; 32];
        // SAFETY: 32-byte buffers.
        unsafe { boring_sys::X25519_public_from_private(public.as_mut_ptr(), private.as_ptr()) };
        public
    }

    #[test]
    fn batched_pairs_match_boringssl_and_are_all_different() {
        let pairs = batch();
        assert_eq!(pairs.len(), LANES);
        for (public, private) in &pairs {
            assert_eq!(*public, public_of(private), "a batched public value differs from BoringSSL's");
            // Masked as BoringSSL masks its own.
            assert_eq!(private[0] & 7, 7);
            assert_eq!(private[31] & 0xc0, 0x80);
        }
        let mut privates: Vec<_> = pairs.iter().map(|p| p.1).collect();
        privates.sort();
        privates.dedup();
        assert_eq!(privates.len(), LANES);
    }

    #[test]
    fn the_shared_secret_agrees_across_the_two_sides() {
        // A pair from the wrapper (whatever this test binary's linking) works in an exchange.
        let (mut a_pub, mut a_priv) = ([0u8; 32], [0u8; 32]);
        // SAFETY: 32-byte buffers.
        unsafe { __wrap_X25519_keypair(a_pub.as_mut_ptr(), a_priv.as_mut_ptr()) };
        let (mut b_pub, mut b_priv) = ([0u8; 32], [0u8; 32]);
        single(&mut b_pub, &mut b_priv);
        let (mut s1, mut s2) = ([0u8; 32], [0u8; 32]);
        // SAFETY: 32-byte buffers; X25519 returns 1 unless the result is all zeros.
        unsafe {
            assert_eq!(boring_sys::X25519(s1.as_mut_ptr(), a_priv.as_ptr(), b_pub.as_ptr()), 1);
            assert_eq!(boring_sys::X25519(s2.as_mut_ptr(), b_priv.as_ptr(), a_pub.as_ptr()), 1);
        }
        assert_eq!(s1, s2);
    }
}
