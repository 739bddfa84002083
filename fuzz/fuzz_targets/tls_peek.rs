//! `vectorlb_proxy::kexstream::inspect` on arbitrary record bodies: the client's handshake
//! records the proxy reads ahead of BoringSSL (to find an X25519 key) come from anyone.
//!
//! It must never panic or read outside its input; what it returns must be in the input: a
//! ClientKeyExchange key is the message's last 32 bytes, a key share 32 bytes found in it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vectorlb_proxy::kexstream::{inspect, Ahead};

fuzz_target!(|data: &[u8]| {
    match inspect(data) {
        None => {}
        Some(Ahead::ClientKeyExchange(k)) => {
            assert_eq!(data.len(), 4 + 33);
            assert_eq!(data[0], 16);
            assert_eq!(&data[5..], &k);
        }
        Some(Ahead::KeyShare(k)) => {
            assert_eq!(data[0], 1);
            assert!(data.windows(32).any(|w| w == k));
        }
    }
});
