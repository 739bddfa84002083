//! RSA-2048 private-key operations per second on one thread: BoringSSL one at a time (the
//! portable lanes, as `inline` signs), IPP Cryptography one at a time (`inline_backend =
//! "ippcp"`) and crypto_mb eight at a time, where they run; one JSON line each. Then X25519
//! key pairs per second as the key exchange gets them (`X25519_keypair`, routed through
//! `vectorlb_proxy::keyshare`): BoringSSL's one at a time, and eight at a time with crypto_mb.
//! `cargo run --release -p vectorlb-proxy --example sign_speed [SECONDS]`
use boring::pkey::PKey;
use boring::rsa::Rsa;
use std::time::{Duration, Instant};
use vectorlb_proxy::cryptomb::{Lanes, Portable, PreparedKey};

fn run(name: &str, lanes: &dyn Lanes, key: &PreparedKey, secs: f64) {
    let inputs: Vec<Vec<u8>> = (0..8u8)
        .map(|i| {
            let mut v = vec![i + 1; 256];
            v[0] = 0;
            v
        })
        .collect();
    let refs: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    let keys: Vec<&PreparedKey> = (0..8).map(|_| key).collect();
    let t = Instant::now();
    let mut ops = 0u64;
    while t.elapsed() < Duration::from_secs_f64(secs) {
        let out = lanes.rsa(&keys, &refs);
        assert!(out.iter().all(|o| o.is_some()));
        ops += 8;
    }
    let rate = ops as f64 / t.elapsed().as_secs_f64();
    println!("{{\"bench\":\"rsa2048_private_ops\",\"backend\":\"{name}\",\"ops_per_s\":{rate:.0}}}");
}

fn keypairs(name: &str, secs: f64) {
    let (mut public, mut private) = ([0u8; 32], [0u8; 32]);
    let t = Instant::now();
    let mut n = 0u64;
    while t.elapsed() < Duration::from_secs_f64(secs) {
        for _ in 0..64 {
            // SAFETY: two 32-byte buffers.
            unsafe { boring_sys::X25519_keypair(public.as_mut_ptr(), private.as_mut_ptr()) };
        }
        n += 64;
    }
    let rate = n as f64 / t.elapsed().as_secs_f64();
    println!("{{\"bench\":\"x25519_keypairs\",\"backend\":\"{name}\",\"per_s\":{rate:.0},\"us_each\":{:.2}}}", 1e6 / rate);
}

fn main() {
    let secs: f64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let key = PreparedKey::new(PKey::from_rsa(Rsa::generate(2048).unwrap()).unwrap()).unwrap();
    run("boringssl", &Portable, &key, secs);
    #[cfg(ippcp)]
    run("ippcp", &vectorlb_proxy::cryptomb::IppcpLanes, &key, secs);
    match vectorlb_proxy::cryptomb::crypto_mb_available() {
        #[cfg(crypto_mb)]
        Ok(()) => run("crypto_mb", &vectorlb_proxy::cryptomb::CryptoMbLanes, &key, secs),
        #[cfg(not(crypto_mb))]
        Ok(()) => {}
        Err(why) => println!("{{\"bench\":\"rsa2048_private_ops\",\"backend\":\"crypto_mb\",\"unavailable\":{why:?}}}"),
    }
    keypairs("boringssl", secs);
    match vectorlb_proxy::keyshare::enable() {
        Ok(()) => keypairs("crypto_mb", secs),
        Err(why) => println!("{{\"bench\":\"x25519_keypairs\",\"backend\":\"crypto_mb\",\"unavailable\":{why:?}}}"),
    }
}
