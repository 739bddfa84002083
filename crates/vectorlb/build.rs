//! Links BoringSSL's X25519 functions through the proxy's `keyshare` module
//! (`vectorlb_proxy::keyshare`: the `cryptomb` provider makes the key exchange's ephemeral
//! key pairs, and their shared secrets, eight at a time with crypto_mb). Without the flags
//! BoringSSL computes them itself.
fn main() {
    for kind in ["bins", "tests", "examples"] {
        for f in ["X25519_keypair", "X25519"] {
            println!("cargo:rustc-link-arg-{kind}=-Wl,--wrap={f}");
            // The wrapper's object is linked even where nothing else of it is used (BoringSSL's
            // archive, which refers to it, comes after the proxy's on the linker's command line).
            println!("cargo:rustc-link-arg-{kind}=-Wl,--undefined=__wrap_{f}");
        }
    }
}
