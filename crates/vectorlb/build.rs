//! Links BoringSSL's X25519 key-pair function through the proxy's `keyshare` module
//! (`vectorlb_proxy::keyshare`: the `cryptomb` provider makes the key exchange's ephemeral
//! key pairs eight at a time with crypto_mb). Without the flag BoringSSL makes them itself.
fn main() {
    for kind in ["bins", "tests", "examples"] {
        println!("cargo:rustc-link-arg-{kind}=-Wl,--wrap=X25519_keypair");
    }
}
