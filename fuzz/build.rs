//! The proxy's X25519 wrappers (`vectorlb_proxy::keyshare`) call BoringSSL's own function under
//! the name the linker's `--wrap` gives it: every binary that links the proxy is linked so.
fn main() {
    for f in ["X25519_keypair", "X25519"] {
        println!("cargo:rustc-link-arg=-Wl,--wrap={f}");
        println!("cargo:rustc-link-arg=-Wl,--undefined=__wrap_{f}");
    }
}
