//! Links BoringSSL's X25519 key-pair function through the proxy's `keyshare` module
//! (`vectorlb_proxy::keyshare`: the `cryptomb` provider makes the key exchange's ephemeral
//! key pairs eight at a time with crypto_mb). Without the flag BoringSSL makes them itself.
fn main() {
    for kind in ["bins", "tests", "examples"] {
        println!("cargo:rustc-link-arg-{kind}=-Wl,--wrap=X25519_keypair");
        // The wrapper's object is linked even where nothing else of it is used (BoringSSL's
        // archive, which refers to it, comes after the proxy's on the linker's command line).
        println!("cargo:rustc-link-arg-{kind}=-Wl,--undefined=__wrap_X25519_keypair");
    }
}
