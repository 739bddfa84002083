//! The batched X25519 key pairs as BoringSSL gets them: through `X25519_keypair`, which this
//! test binary (like `vectorlb`) is linked to route through `vectorlb_proxy::keyshare`.

/// The public value BoringSSL computes for a private key.
fn public_of(private: &[u8; 32]) -> [u8; 32] {
    let mut public = [0u8; 32];
    // SAFETY: two 32-byte buffers.
    unsafe { boring_sys::X25519_public_from_private(public.as_mut_ptr(), private.as_ptr()) };
    public
}

#[test]
fn pairs_from_the_pool_are_correct_and_handed_out_once() {
    use vectorlb_proxy::keyshare;
    assert!(keyshare::wrapped(), "this test binary is linked with -Wl,--wrap=X25519_keypair");
    // Before it is enabled the wrapper makes pairs as BoringSSL does.
    let (mut public, mut private) = ([0u8; 32], [0u8; 32]);
    // SAFETY: two 32-byte buffers.
    unsafe { boring_sys::X25519_keypair(public.as_mut_ptr(), private.as_mut_ptr()) };
    assert_eq!(public, public_of(&private));
    assert_eq!(keyshare::counts(), (0, 1));
    if let Err(why) = vectorlb_proxy::cryptomb::crypto_mb_available() {
        eprintln!("batches not tested here: {why}");
        assert!(keyshare::enable().is_err());
        return;
    }
    keyshare::enable().expect("crypto_mb runs here and the binary is linked with the wrap");
    let mut seen = std::collections::HashSet::new();
    // Three batches and a part of a fourth, on two threads (each keeps its own pool).
    let worker = std::thread::spawn(|| {
        (0..12)
            .map(|_| {
                let (mut public, mut private) = ([0u8; 32], [0u8; 32]);
                // SAFETY: two 32-byte buffers.
                unsafe { boring_sys::X25519_keypair(public.as_mut_ptr(), private.as_mut_ptr()) };
                assert_eq!(public, public_of(&private));
                private
            })
            .collect::<Vec<_>>()
    });
    for _ in 0..27 {
        let (mut public, mut private) = ([0u8; 32], [0u8; 32]);
        // SAFETY: two 32-byte buffers.
        unsafe { boring_sys::X25519_keypair(public.as_mut_ptr(), private.as_mut_ptr()) };
        assert_eq!(public, public_of(&private), "a batched public value differs from BoringSSL's");
        assert!(seen.insert(private), "a private key was handed out twice");
    }
    for private in worker.join().unwrap() {
        assert!(seen.insert(private), "a private key was handed out twice (across threads)");
    }
    assert_eq!(keyshare::counts(), (39, 1));
}
