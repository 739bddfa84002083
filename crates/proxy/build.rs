//! Links Intel's crypto_mb (libcrypto_mb.a, from the `ipp-crypto-static` Python package) when it
//! is installed, and sets `cfg(crypto_mb)` (and IPP Cryptography, libippcp.a: `cfg(ippcp)`); without it the build goes on and the `cryptomb`
//! provider's crypto_mb backend says it is unavailable.
//!
//! Looked for in `$VECTORLB_CRYPTO_MB_DIR/lib`, then `/opt/vectorlb/crypto_mb/lib` (where
//! scripts/setup.sh installs the packages).

fn main() {
    // BoringSSL's X25519 functions through crate::keyshare in every binary of this crate
    // (its unit tests too: the wrapper calls `__real_X25519`, which only the wrap defines); the
    // `vectorlb` binary's build script does the same for it.
    for f in ["X25519_keypair", "X25519"] {
        println!("cargo:rustc-link-arg=-Wl,--wrap={f}");
        // The wrapper's object is linked even where nothing else of it is used (BoringSSL's
        // archive, which refers to it, comes after the proxy's on the linker's command line).
        println!("cargo:rustc-link-arg=-Wl,--undefined=__wrap_{f}");
    }
    println!("cargo::rustc-check-cfg=cfg(crypto_mb)");
    println!("cargo::rustc-check-cfg=cfg(ippcp)");
    println!("cargo:rerun-if-env-changed=VECTORLB_CRYPTO_MB_DIR");
    let mut dirs = Vec::new();
    if let Ok(d) = std::env::var("VECTORLB_CRYPTO_MB_DIR") {
        if d.is_empty() || d == "none" {
            // Asked to build without it (tests of the fallback).
            return;
        }
        dirs.push(std::path::PathBuf::from(d).join("lib"));
    }
    dirs.push("/opt/vectorlb/crypto_mb/lib".into());
    let target = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    for d in dirs {
        let lib = d.join("libcrypto_mb.a");
        println!("cargo:rerun-if-changed={}", lib.display());
        if target == "x86_64" && lib.is_file() {
            println!("cargo:rustc-link-search=native={}", d.display());
            println!("cargo:rustc-link-lib=static=crypto_mb");
            println!("cargo:rustc-cfg=crypto_mb");
            // IPP Cryptography (the same package): single-buffer RSA for the inline provider.
            let ipp = d.join("libippcp.a");
            println!("cargo:rerun-if-changed={}", ipp.display());
            if ipp.is_file() {
                println!("cargo:rustc-link-lib=static=ippcp");
                println!("cargo:rustc-cfg=ippcp");
            }
            return;
        }
    }
    println!("cargo:warning=libcrypto_mb.a not found (scripts/setup.sh installs it): the cryptomb provider runs only its portable backend");
}
