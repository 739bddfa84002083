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
//!
//! **Shared secrets ahead.** The shared secret is a variable-base scalar multiplication (35 µs
//! in BoringSSL here, 6.6 µs a lane in `mbx_x25519_mb8`), computed by BoringSSL's `X25519` the
//! moment it reads the client's key. The binary is also linked with `-Wl,--wrap=X25519`, and a
//! listener under the provider reads the client's records through
//! [`crate::kexstream::KexStream`], which finds the client's X25519 key in plaintext before
//! BoringSSL sees it (TLS 1.2: the ClientKeyExchange; TLS 1.3: the ClientHello's key share),
//! holds that record back, and queues the secret on this thread's queue of up to eight, run as
//! one call when full or when `poll_delay` has passed since its first. The handshake's [`Slot`]
//! (installed around each poll of the handshake by [`in_handshake`]) carries the private key
//! (TLS 1.2: the pair handed out for its ServerKeyExchange; TLS 1.3: a pair drawn ahead, handed
//! out when BoringSSL asks for its key share) and then the secret. [`__wrap_X25519`] returns
//! that secret only for exactly the private key and peer key it was computed for; any other
//! call (another group chosen, a lane that failed, a record split oddly) computes as BoringSSL
//! does. So a mistaken guess costs a lane of work, never a wrong secret.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::oneshot;

/// Pairs made per batch (crypto_mb's lanes).
const LANES: usize = 8;

static ENABLED: AtomicBool = AtomicBool::new(false);
/// Key pairs handed out from batches, and made singly (disabled, no library, or a failed lane).
static BATCHED: AtomicU64 = AtomicU64::new(0);
static SINGLE: AtomicU64 = AtomicU64::new(0);
/// Shared secrets BoringSSL took from a batch, computed itself, and batches run.
static SECRETS_BATCHED: AtomicU64 = AtomicU64::new(0);
static SECRETS_SINGLE: AtomicU64 = AtomicU64::new(0);
static SECRET_RUNS: AtomicU64 = AtomicU64::new(0);

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
    /// Set by the `X25519` wrapper, as `SEEN`.
    static SEEN_SECRET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Set while [`wrapped`] asks (that pair is not counted).
    static PROBING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The handshake being polled on this thread ([`in_handshake`]).
    static CURRENT: RefCell<Option<Arc<Slot>>> = const { RefCell::new(None) };
    /// This thread's queue of shared secrets (the timer of a batch may run on another thread of
    /// a multi-threaded runtime; it holds the queue, not the thread).
    static SECRETS: Arc<Mutex<crate::batch::Batch<SecretOp>>> = Arc::default();
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

/// Shared secrets so far: (taken from batches, computed by BoringSSL, batches run).
pub fn secret_counts() -> (u64, u64, u64) {
    (SECRETS_BATCHED.load(Ordering::Relaxed), SECRETS_SINGLE.load(Ordering::Relaxed), SECRET_RUNS.load(Ordering::Relaxed))
}

/// Whether BoringSSL's key pairs and shared secrets come through [`__wrap_X25519_keypair`] and
/// [`__wrap_X25519`] in this binary.
pub fn wrapped() -> bool {
    let (mut public, mut private, mut secret) = ([0u8; 32], [0u8; 32], [0u8; 32]);
    SEEN.with(|s| s.set(false));
    SEEN_SECRET.with(|s| s.set(false));
    PROBING.with(|p| p.set(true));
    // SAFETY: writable 32-byte buffers and 32-byte inputs, as the functions require.
    unsafe {
        boring_sys::X25519_keypair(public.as_mut_ptr(), private.as_mut_ptr());
        boring_sys::X25519(secret.as_mut_ptr(), private.as_ptr(), public.as_ptr());
    }
    PROBING.with(|p| p.set(false));
    wipe(&mut private);
    wipe(&mut secret);
    SEEN.with(|s| s.get()) && SEEN_SECRET.with(|s| s.get())
}

/// Makes key pairs in batches from now on, if this binary is linked for it and crypto_mb can
/// run here; the reason if not.
pub fn enable() -> Result<(), String> {
    let r = crate::cryptomb::crypto_mb_available().and_then(|()| {
        if wrapped() {
            Ok(())
        } else {
            // A binary built without the link flags: loud, since it costs a quarter of the
            // handshakes per core (docs/proxy.md).
            Err("this binary was not linked with -Wl,--wrap=X25519_keypair,--wrap=X25519 (its build.rs must emit them, as crates/vectorlb/build.rs does)".into())
        }
    });
    match &r {
        Ok(()) => ENABLED.store(true, Ordering::Relaxed),
        Err(why) => {
            let _ = NOT_ENABLED.set(why.clone());
        }
    }
    r
}

/// Why batches were asked for and are off (none: they are on, or nobody asked).
pub fn not_enabled_reason() -> Option<&'static str> {
    NOT_ENABLED.get().map(String::as_str)
}

static NOT_ENABLED: std::sync::OnceLock<String> = std::sync::OnceLock::new();

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
        // Copied out, then wiped where it lies (in the pool's own buffer) before it leaves.
        let (pu, pr) = p.pairs.last_mut().expect("a batch has eight pairs");
        *public = *pu;
        *private = *pr;
        wipe(pu);
        wipe(pr);
        p.pairs.pop();
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
        let slot = current();
        match slot.as_ref().and_then(|s| s.take_reserved()) {
            // Drawn ahead for this handshake, its secret with the client's share on the way.
            Some((pu, pr)) => {
                public = pu;
                private = pr;
            }
            None => {
                next_pair(&mut public, &mut private);
                // The client's key comes later (TLS 1.2): the stream needs this private key.
                if let Some(slot) = slot.filter(|_| enabled()) {
                    slot.lock().private = Some(private);
                }
            }
        }
    }
    // SAFETY: the caller's buffers are 32 writable bytes each (above).
    unsafe {
        std::ptr::copy_nonoverlapping(public.as_ptr(), out_public, 32);
        std::ptr::copy_nonoverlapping(private.as_ptr(), out_private, 32);
    }
    wipe(&mut private);
}

extern "C" {
    /// BoringSSL's own `X25519` (the linker's name for it under `--wrap=X25519`).
    fn __real_X25519(out: *mut u8, private: *const u8, peer: *const u8) -> libc::c_int;
}

/// BoringSSL's `X25519`, for a binary linked with `-Wl,--wrap=X25519`: the secret computed
/// ahead for this handshake when it was computed for exactly these keys, else BoringSSL's.
///
/// # Safety
/// `out` is a writable 32-byte buffer, `private` and `peer` readable 32-byte buffers (the
/// contract of the function it replaces).
#[no_mangle]
pub unsafe extern "C" fn __wrap_X25519(out: *mut u8, private: *const u8, peer: *const u8) -> libc::c_int {
    SEEN_SECRET.with(|s| s.set(true));
    if let Some(slot) = current() {
        let mut k = [0u8; 32];
        let mut p = [0u8; 32];
        // SAFETY: both inputs are 32 readable bytes (above).
        unsafe {
            std::ptr::copy_nonoverlapping(private, k.as_mut_ptr(), 32);
            std::ptr::copy_nonoverlapping(peer, p.as_mut_ptr(), 32);
        }
        let found = slot.take_secret(&k, &p);
        wipe(&mut k);
        if let Some(mut secret) = found {
            // SAFETY: `out` is 32 writable bytes (above).
            unsafe { std::ptr::copy_nonoverlapping(secret.as_ptr(), out, 32) };
            // As BoringSSL: an all-zero secret (a small-order peer key) is refused.
            let nonzero = secret.iter().fold(0u8, |a, b| a | b) != 0;
            wipe(&mut secret);
            SECRETS_BATCHED.fetch_add(1, Ordering::Relaxed);
            return nonzero as libc::c_int;
        }
    }
    if !PROBING.with(|p| p.get()) {
        SECRETS_SINGLE.fetch_add(1, Ordering::Relaxed);
    }
    // SAFETY: the caller's buffers, passed on under the same contract.
    unsafe { __real_X25519(out, private, peer) }
}

/// One handshake's key exchange, shared by its stream and the wrappers (see the module's
/// documentation); everything in it is wiped when it goes.
#[derive(Default)]
pub struct Slot(Mutex<SlotState>);

#[derive(Default)]
struct SlotState {
    /// The private key of the pair handed out to this handshake (TLS 1.2's ECDHE key).
    private: Option<[u8; 32]>,
    /// A pair drawn ahead (TLS 1.3), handed out at BoringSSL's next `X25519_keypair`.
    reserved: Option<([u8; 32], [u8; 32])>,
    /// A secret computed ahead: (private key, peer key, secret).
    secret: Option<([u8; 32], [u8; 32], [u8; 32])>,
}

impl Drop for SlotState {
    fn drop(&mut self) {
        if let Some(k) = self.private.as_mut() {
            wipe(k);
        }
        if let Some((a, b)) = self.reserved.as_mut() {
            wipe(a);
            wipe(b);
        }
        if let Some((a, b, c)) = self.secret.as_mut() {
            wipe(a);
            wipe(b);
            wipe(c);
        }
    }
}

impl Slot {
    fn lock(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take_reserved(&self) -> Option<([u8; 32], [u8; 32])> {
        let mut g = self.lock();
        let pair = g.reserved;
        if let Some((a, b)) = g.reserved.as_mut() {
            wipe(a);
            wipe(b);
        }
        g.reserved = None;
        pair
    }

    fn take_private(&self) -> Option<[u8; 32]> {
        let mut g = self.lock();
        let k = g.private;
        if let Some(a) = g.private.as_mut() {
            wipe(a);
        }
        g.private = None;
        k
    }

    /// The secret, if it was computed for exactly `private` and `peer` (then gone from here).
    fn take_secret(&self, private: &[u8; 32], peer: &[u8; 32]) -> Option<[u8; 32]> {
        let mut g = self.lock();
        match g.secret.as_mut() {
            // The peer key is public; the private key is compared in constant time.
            Some((k, p, s)) if p == peer && same(k, private) => {
                let secret = *s;
                wipe(k);
                wipe(p);
                wipe(s);
                g.secret = None;
                Some(secret)
            }
            _ => None,
        }
    }
}

/// `a == b` in time independent of where they differ.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    std::hint::black_box(a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y))) == 0
}

fn current() -> Option<Arc<Slot>> {
    CURRENT.try_with(|c| c.borrow().clone()).ok().flatten()
}

/// Polls `handshake` with `slot` as this thread's current handshake, so that the wrappers
/// find it.
/// (`None`: polled as it is.)
pub fn in_handshake<F: Future>(slot: Option<Arc<Slot>>, handshake: F) -> InHandshake<F> {
    InHandshake { slot, inner: Box::pin(handshake) }
}

pub struct InHandshake<F> {
    slot: Option<Arc<Slot>>,
    inner: Pin<Box<F>>,
}

impl<F: Future> Future for InHandshake<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        struct Restore(Option<Arc<Slot>>);
        impl Drop for Restore {
            fn drop(&mut self) {
                let prev = self.0.take();
                let _ = CURRENT.try_with(|c| *c.borrow_mut() = prev);
            }
        }
        let Some(slot) = self.slot.clone() else { return self.inner.as_mut().poll(cx) };
        let prev = CURRENT.with(|c| c.borrow_mut().replace(slot));
        let _restore = Restore(prev);
        self.inner.as_mut().poll(cx)
    }
}

/// Queues the shared secret of `peer` (a client's X25519 key) with this handshake's private
/// key: with `reserve` (TLS 1.3) a pair drawn now for the key share BoringSSL will ask for,
/// else (TLS 1.2) the pair already handed out. `None` if there is no private key (batches off,
/// or no pair was handed out to this handshake). The receiver answers once the secret is in the
/// slot (or its lane failed: BoringSSL then computes it).
pub fn compute_ahead(slot: &Arc<Slot>, peer: [u8; 32], reserve: bool, delay: Duration) -> Option<oneshot::Receiver<()>> {
    if !enabled() {
        return None;
    }
    let private = if reserve {
        let (mut public, mut private) = ([0u8; 32], [0u8; 32]);
        next_pair(&mut public, &mut private);
        let mut g = slot.lock();
        if let Some((a, b)) = g.reserved.as_mut() {
            wipe(a);
            wipe(b);
        }
        g.reserved = Some((public, private));
        private
    } else {
        slot.take_private()?
    };
    let (reply, rx) = oneshot::channel();
    let op = SecretOp { slot: slot.clone(), private, peer, reply: Some(reply) };
    let q = SECRETS.with(|q| q.clone());
    crate::batch::Batch::submit(&q, op, delay, run_secrets);
    Some(rx)
}

/// A shared secret waiting in a queue.
struct SecretOp {
    slot: Arc<Slot>,
    private: [u8; 32],
    peer: [u8; 32],
    reply: Option<oneshot::Sender<()>>,
}

impl Drop for SecretOp {
    fn drop(&mut self) {
        wipe(&mut self.private);
        if let Some(r) = self.reply.take() {
            let _ = r.send(());
        }
    }
}

/// Runs up to eight secrets in one call and puts each in its handshake's slot (a failed lane's
/// is left to BoringSSL). Dropping each op answers its stream.
fn run_secrets(batch: Vec<SecretOp>) {
    if batch.is_empty() {
        return;
    }
    SECRET_RUNS.fetch_add(1, Ordering::Relaxed);
    let mut inputs: Vec<([u8; 32], [u8; 32])> = batch.iter().map(|o| (o.private, o.peer)).collect();
    let mut secrets = secrets(&inputs);
    for (op, s) in batch.iter().zip(secrets.iter()) {
        if let Some(s) = s {
            let mut g = op.slot.lock();
            if let Some((a, b, c)) = g.secret.as_mut() {
                wipe(a);
                wipe(b);
                wipe(c);
            }
            g.secret = Some((op.private, op.peer, *s));
        }
    }
    // The copies made for the call, wiped in their buffers before these are freed.
    for (k, _) in inputs.iter_mut() {
        wipe(k);
    }
    for s in secrets.iter_mut().flatten() {
        wipe(s);
    }
}

/// X25519 of up to eight (private key, peer key) pairs in one crypto_mb call; `None` for a lane
/// the library failed.
#[cfg(crypto_mb)]
fn secrets(inputs: &[([u8; 32], [u8; 32])]) -> Vec<Option<[u8; 32]>> {
    extern "C" {
        fn mbx_x25519_mb8(shared: *const *mut u8, private: *const *const u8, public: *const *const u8) -> u32;
    }
    assert!(!inputs.is_empty() && inputs.len() <= LANES);
    let mut out = [[0u8; 32]; LANES];
    let mut o = [std::ptr::null_mut::<u8>(); LANES];
    let mut k = [std::ptr::null::<u8>(); LANES];
    let mut p = [std::ptr::null::<u8>(); LANES];
    for (i, slot) in out.iter_mut().enumerate() {
        // Unused lanes repeat the first input (into their own outputs).
        let (key, peer) = &inputs[if i < inputs.len() { i } else { 0 }];
        o[i] = slot.as_mut_ptr();
        k[i] = key.as_ptr();
        p[i] = peer.as_ptr();
    }
    // SAFETY: eight writable 32-byte outputs and eight pairs of 32-byte inputs, all live for the
    // call; the library reads and writes only those (crypto_mb/x25519.h).
    let status = unsafe { mbx_x25519_mb8(o.as_ptr(), k.as_ptr(), p.as_ptr()) };
    let result = (0..inputs.len()).map(|i| if (status >> (4 * i)) & 0xf == 0 { Some(out[i]) } else { None }).collect();
    for s in out.iter_mut() {
        wipe(s);
    }
    result
}

/// Without crypto_mb nothing is computed ahead (BoringSSL computes every secret).
#[cfg(not(crypto_mb))]
fn secrets(inputs: &[([u8; 32], [u8; 32])]) -> Vec<Option<[u8; 32]>> {
    vec![None; inputs.len()]
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

    /// BoringSSL's X25519 (in this test binary, through the wrapper, with no slot: BoringSSL's).
    fn boring_x25519(private: &[u8; 32], peer: &[u8; 32]) -> ([u8; 32], i32) {
        let mut out = [0u8; 32];
        // SAFETY: 32-byte buffers.
        let r = unsafe { boring_sys::X25519(out.as_mut_ptr(), private.as_ptr(), peer.as_ptr()) };
        (out, r)
    }

    #[test]
    fn batched_secrets_match_boringssl_for_any_peer_key() {
        if crate::cryptomb::crypto_mb_available().is_err() {
            eprintln!("crypto_mb cannot run here: nothing computed ahead (tested: the fallback)");
            assert!(secrets(&[([1; 32], [2; 32])]).iter().all(|s| s.is_none()));
            return;
        }
        // Peer keys as clients send them, with the top bit set (RFC 7748 ignores it), at or
        // above the field's prime (non-canonical), and of small order (the secret is all zero,
        // which BoringSSL refuses).
        let mut peers: Vec<[u8; 32]> = Vec::new();
        for _ in 0..13 {
            let (mut public, mut private) = ([0u8; 32], [0u8; 32]);
            single(&mut public, &mut private);
            peers.push(public);
        }
        peers[1][31] |= 0x80;
        peers[2] = [0xff; 32];
        peers[3] = [0; 32];
        peers[4] = [0; 32];
        peers[4][0] = 1;
        peers[5] = [0xff; 32];
        peers[5][0] = 0xed;
        peers[5][31] = 0x7f; // p itself
        for chunk in peers.chunks(LANES) {
            let inputs: Vec<([u8; 32], [u8; 32])> = chunk
                .iter()
                .map(|peer| {
                    let mut k = [0u8; 32];
                    private_key(&mut k);
                    (k, *peer)
                })
                .collect();
            let got = secrets(&inputs);
            assert_eq!(got.len(), inputs.len());
            for ((k, peer), s) in inputs.iter().zip(got) {
                let (want, ok) = boring_x25519(k, peer);
                match s {
                    Some(s) => {
                        assert_eq!(s, want, "peer {peer:02x?}");
                        assert_eq!(ok == 1, s != [0; 32], "peer {peer:02x?}");
                    }
                    // A lane the library refuses is BoringSSL's to compute (and to refuse).
                    None => eprintln!("crypto_mb refused peer {peer:02x?} (BoringSSL: {ok})"),
                }
            }
        }
    }

    #[test]
    fn a_secret_in_the_slot_is_used_only_for_its_own_keys_and_only_once() {
        let slot = Arc::new(Slot::default());
        let (k, p, s) = ([3u8; 32], [4u8; 32], [5u8; 32]);
        slot.lock().secret = Some((k, p, s));
        let call = |k: &[u8; 32], p: &[u8; 32]| {
            let slot = slot.clone();
            let (k, p) = (*k, *p);
            let f = in_handshake(Some(slot), async move {
                let mut out = [0u8; 32];
                // SAFETY: 32-byte buffers.
                let r = unsafe { __wrap_X25519(out.as_mut_ptr(), k.as_ptr(), p.as_ptr()) };
                (out, r)
            });
            tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
        };
        // Another peer key, another private key: BoringSSL's answer, the secret stays.
        assert_eq!(call(&k, &[6; 32]), boring_x25519(&k, &[6; 32]));
        assert_eq!(call(&[7; 32], &p), boring_x25519(&[7; 32], &p));
        // Its own keys: the secret, then gone (a second call is BoringSSL's).
        assert_eq!(call(&k, &p), (s, 1));
        assert!(slot.lock().secret.is_none());
        assert_eq!(call(&k, &p), boring_x25519(&k, &p));
        // An all-zero secret is refused as BoringSSL refuses it.
        slot.lock().secret = Some((k, p, [0; 32]));
        assert_eq!(call(&k, &p).1, 0);
        // Outside a handshake nothing of the slot is used.
        slot.lock().secret = Some((k, p, s));
        let mut out = [0u8; 32];
        // SAFETY: 32-byte buffers.
        let r = unsafe { __wrap_X25519(out.as_mut_ptr(), k.as_ptr(), p.as_ptr()) };
        assert_eq!((out, r), boring_x25519(&k, &p));
    }
}
