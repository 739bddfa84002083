//! X25519 secrets computed ahead: a client's records read through `KexStream` with the batches
//! on (this test binary is linked with the X25519 wraps, as `vectorlb` is), and BoringSSL's
//! `X25519` then finding the secret, for TLS 1.2's ClientKeyExchange and TLS 1.3's key share.
//! The handshakes of real clients (curl, `openssl s_client`) are in `tests/tls.rs`.

use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use vectorlb_proxy::kexstream::KexStream;
use vectorlb_proxy::keyshare::{self, in_handshake, Slot};

/// The counters are the process's: one test at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn keypair() -> ([u8; 32], [u8; 32]) {
    let (mut public, mut private) = ([0u8; 32], [0u8; 32]);
    // SAFETY: two writable 32-byte buffers.
    unsafe { boring_sys::X25519_keypair(public.as_mut_ptr(), private.as_mut_ptr()) };
    (public, private)
}

fn x25519(private: &[u8; 32], peer: &[u8; 32]) -> [u8; 32] {
    let mut out = [0u8; 32];
    // SAFETY: 32-byte buffers.
    assert_eq!(unsafe { boring_sys::X25519(out.as_mut_ptr(), private.as_ptr(), peer.as_ptr()) }, 1);
    out
}

/// A TLS record of `content` type around `body`.
fn record(content: u8, body: &[u8]) -> Vec<u8> {
    let mut r = vec![content, 3, 3, (body.len() >> 8) as u8, body.len() as u8];
    r.extend_from_slice(body);
    r
}

fn client_key_exchange(key: &[u8]) -> Vec<u8> {
    let mut m = vec![16, 0, 0, key.len() as u8 + 1, key.len() as u8];
    m.extend_from_slice(key);
    record(22, &m)
}

/// A ClientHello offering TLS 1.3 with an X25519 key share.
fn client_hello(share: &[u8; 32]) -> Vec<u8> {
    let mut body = vec![3, 3];
    body.extend_from_slice(&[0x11; 32]);
    body.extend_from_slice(&[0, 0, 2, 0x13, 0x01, 1, 0]);
    let mut exts = vec![0, 43, 0, 3, 2, 3, 4]; // supported_versions: TLS 1.3
    exts.extend_from_slice(&[0, 51, 0, 38, 0, 36, 0, 0x1d, 0, 32]); // key_share: x25519
    exts.extend_from_slice(share);
    body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
    body.extend(exts);
    let mut m = vec![1, 0, (body.len() >> 8) as u8, body.len() as u8];
    m.extend(body);
    record(22, &m)
}

#[test]
fn secrets_computed_ahead_are_the_ones_boringssl_computes() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    assert!(keyshare::wrapped(), "this test binary is linked with the X25519 wraps");
    if let Err(why) = keyshare::enable() {
        eprintln!("nothing computed ahead here: {why}");
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let after_the_hello = [record(20, &[1]), record(23, &[0x55; 300])].concat();

    // TLS 1.2: the server's pair is handed out during the handshake, the client's key comes in
    // its ClientKeyExchange.
    let slot = Arc::new(Slot::default());
    let (server_public, server_private) = rt.block_on(in_handshake(Some(slot.clone()), async { keypair() }));
    let (client_public, client_private) = keypair();
    let data = [client_key_exchange(&client_public), after_the_hello.clone()].concat();
    let before = keyshare::secret_counts();
    let (got, secret) = rt.block_on(in_handshake(Some(slot.clone()), async {
        let mut s = KexStream::new(&data[..], slot.clone(), Duration::from_millis(1), true);
        let mut got = Vec::new();
        s.read_to_end(&mut got).await.unwrap();
        (got, x25519(&server_private, &client_public))
    }));
    let after = keyshare::secret_counts();
    assert_eq!(got, data, "every byte, in order");
    assert_eq!(secret, x25519(&client_private, &server_public), "the secret both sides agree on");
    assert_eq!((after.0 - before.0, after.1 - before.1, after.2 - before.2), (1, 0, 1), "one secret from one batch");

    // TLS 1.3: the pair is drawn when the ClientHello is read, and handed out when BoringSSL
    // asks for its key share.
    let slot = Arc::new(Slot::default());
    let (client_public, client_private) = keypair();
    let data = [client_hello(&client_public), after_the_hello.clone()].concat();
    let before = keyshare::secret_counts();
    let (got, server_public, secret) = rt.block_on(in_handshake(Some(slot.clone()), async {
        let mut s = KexStream::new(&data[..], slot.clone(), Duration::from_millis(1), true);
        let mut got = Vec::new();
        s.read_to_end(&mut got).await.unwrap();
        let (server_public, server_private) = keypair();
        (got, server_public, x25519(&server_private, &client_public))
    }));
    let after = keyshare::secret_counts();
    assert_eq!(got, data);
    assert_eq!(secret, x25519(&client_private, &server_public));
    assert_eq!((after.0 - before.0, after.1 - before.1), (1, 0));

    // A listener without TLS 1.3 leaves the hello's share alone; a P-256 key exchange is not
    // X25519: BoringSSL computes, nothing is held.
    let slot = Arc::new(Slot::default());
    let data = [client_hello(&client_public), client_key_exchange(&[4; 65]), after_the_hello].concat();
    let before = keyshare::secret_counts();
    let got = rt.block_on(in_handshake(Some(slot.clone()), async {
        let mut s = KexStream::new(&data[..], slot.clone(), Duration::from_secs(60), false);
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got)).await.expect("nothing held").unwrap();
        got
    }));
    assert_eq!(got, data);
    assert_eq!(keyshare::secret_counts().2, before.2, "no batch ran");
}

#[test]
fn eight_handshakes_share_one_batch() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if keyshare::enable().is_err() {
        return;
    }
    // Eight streams on one thread, each with its pair handed out, read together: one call.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let handshakes: Vec<_> = (0..8)
        .map(|_| {
            let slot = Arc::new(Slot::default());
            let (server_public, server_private) = rt.block_on(in_handshake(Some(slot.clone()), async { keypair() }));
            let (client_public, client_private) = keypair();
            (slot, server_public, server_private, client_public, client_private)
        })
        .collect();
    let before = keyshare::secret_counts();
    let results = rt.block_on(async {
        let tasks: Vec<_> = handshakes
            .iter()
            .map(|(slot, _, server_private, client_public, _)| {
                let (slot, server_private, client_public) = (slot.clone(), *server_private, *client_public);
                tokio::spawn(in_handshake(Some(slot.clone()), async move {
                    let data = client_key_exchange(&client_public);
                    // A poll_delay far longer than the test: only a full queue runs them.
                    let mut s = KexStream::new(&data[..], slot, Duration::from_secs(60), false);
                    let mut got = Vec::new();
                    s.read_to_end(&mut got).await.unwrap();
                    x25519(&server_private, &client_public)
                }))
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(tokio::time::timeout(Duration::from_secs(5), t).await.expect("a full queue runs at once").unwrap());
        }
        out
    });
    let after = keyshare::secret_counts();
    for ((_, server_public, _, _, client_private), secret) in handshakes.iter().zip(results) {
        assert_eq!(secret, x25519(client_private, server_public));
    }
    assert_eq!((after.0 - before.0, after.2 - before.2), (8, 1), "eight secrets, one call");
}
