//! Hashing helpers: a fast hasher for the small configuration maps read per packet, and the
//! flow hashes schedulers consume.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

pub use vectorlb_sched::mix64;

/// A multiply-rotate hasher (the Fx hash of rustc) for small maps keyed by trusted
/// configuration (VIPs, local addresses): far cheaper than SipHash per packet. Maps keyed by
/// packet contents under an attacker's control use the keyed session-table hash instead.
#[derive(Default, Clone, Copy)]
pub struct FxHasher(u64);

const K: u64 = 0x517c_c1b7_2722_0a95;

impl FxHasher {
    #[inline(always)]
    fn add(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(K);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            self.add(u64::from_le_bytes(b));
        }
    }
    #[inline(always)]
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64);
    }
    #[inline(always)]
    fn write_u16(&mut self, i: u16) {
        self.add(i as u64);
    }
    #[inline(always)]
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }
    #[inline(always)]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline(always)]
    fn write_u128(&mut self, i: u128) {
        self.add(i as u64);
        self.add((i >> 64) as u64);
    }
    #[inline(always)]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline(always)]
    fn finish(&self) -> u64 {
        self.0
    }
}

pub type FxBuild = BuildHasherDefault<FxHasher>;
pub type FxHashMap<K, V> = HashMap<K, V, FxBuild>;
pub type FxHashSet<K> = HashSet<K, FxBuild>;

/// The folded multiply of the keyed table hashes (the session table's, the policy's flows):
/// the 128-bit product's halves xored.
#[inline(always)]
pub fn fold_mul(a: u64, b: u64) -> u64 {
    let r = (a as u128) * (b as u128);
    (r as u64) ^ ((r >> 64) as u64)
}

/// A hasher for keys that carry their own keyed hash (they write it, and only it, with
/// `write_u64`): the map does not hash a second time.
#[derive(Default, Clone, Copy)]
pub struct PreHashed(u64);

impl Hasher for PreHashed {
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is meant; anything else still spreads (never used by the keys here).
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ *b as u64).wrapping_mul(K);
        }
    }
    #[inline(always)]
    fn write_u64(&mut self, i: u64) {
        self.0 = i;
    }
    #[inline(always)]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// Flow hash over a 5-tuple (for Maglev), keyed by the cluster key (`global.cluster_key`; 0
/// without one): every node of a cluster agrees on it, and without the key nobody can aim
/// flows at a backend. Never keyed by anything of the node's or the run's.
#[inline(always)]
pub fn flow_hash(key: u64, src: u128, dst: u128, sport: u16, dport: u16, proto: u8) -> u64 {
    let a = mix64(key ^ src as u64 ^ (src >> 64) as u64 ^ ((sport as u64) << 48));
    let b = mix64(dst as u64 ^ (dst >> 64) as u64 ^ ((dport as u64) << 32) ^ proto as u64);
    mix64(a ^ b.rotate_left(17))
}

/// Hash of a client address alone (for source hashing), keyed as [`flow_hash`].
#[inline(always)]
pub fn addr_hash(key: u64, a: u128) -> u64 {
    mix64(key ^ a as u64 ^ mix64((a >> 64) as u64))
}

/// The cluster key from its text in the configuration: FNV-1a over the bytes, then mixed.
/// Part of the wire contract between nodes: every version must compute the same value.
pub fn cluster_key(text: &str) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in text.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix64(h) | 1
}

/// A number from the kernel's random source (a hash key an attacker cannot aim flows with, a
/// local-port start a restart does not repeat).
pub fn random_seed() -> u64 {
    let mut b = [0u8; 8];
    // getrandom(2) cannot fail for 8 bytes once the pool is initialised; a failure leaves the
    // time-based fallback below.
    if std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b)).is_ok() {
        return u64::from_ne_bytes(b);
    }
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
    mix64(t ^ std::process::id() as u64)
}
