//! The session-sync wire format (vectorlb-sync). Two ways in: the input as a datagram from the
//! network (it is refused somewhere: cut short, a bad header, a failing tag; nothing panics
//! and nothing is parsed before the tag holds), and the input as a message's clear text
//! (header and records) sealed under the group's secret, which reaches the record parser:
//! whatever it decodes to encodes and decodes back to the same message, and a wrong secret
//! never opens it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use vectorlb_sync::{decode, encode, seal, Refused, Sealer, Secret, HEADER, MAX_MESSAGE};

struct Keys {
    secret: Secret,
    other: Secret,
    sealer: Sealer,
}

fn keys() -> &'static Keys {
    static K: OnceLock<Keys> = OnceLock::new();
    K.get_or_init(|| {
        let secret = Secret::new(b"fuzz sync secret 0123456789");
        let sealer = Sealer::with_salt(&secret, [7; 16]);
        Keys { secret, other: Secret::new(b"another secret 0123456789"), sealer }
    })
}

fuzz_target!(|data: &[u8]| {
    let k = keys();
    // As received: anything but a message sealed under the secret is refused.
    if let Ok(m) = decode(data, &k.secret) {
        panic!("random bytes opened as {m:?}");
    }
    // As clear text, sealed: a header and whole records (the sealer's salt in its place).
    if data.len() >= HEADER && data.len() <= MAX_MESSAGE {
        let mut plain = data.to_vec();
        plain[48..64].copy_from_slice(&[7; 16]);
        let wire = seal(plain, &k.sealer);
        assert!(matches!(decode(&wire, &k.other), Err(Refused::BadMac | Refused::Malformed)));
        match decode(&wire, &k.secret) {
            Ok(m) => {
                let again = encode(&m, &k.sealer);
                assert_eq!(decode(&again, &k.secret).as_ref(), Ok(&m));
            }
            Err(Refused::Malformed) => {}
            Err(e) => panic!("a sealed message refused as {e:?}"),
        }
    }
});
