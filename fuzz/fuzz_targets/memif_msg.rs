//! memif control messages: `Msg::decode` on arbitrary bytes (and encode/decode agreeing), then
//! the server's handshake state machine fed the input as a sequence of 128-byte messages over
//! a real control socket. ADD_REGION messages carry a sealed memfd and ADD_RING messages an
//! eventfd, so the fuzzer reaches the setup and CONNECT stages; whatever it sends, the server
//! must answer or refuse, never panic or hang.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;
use std::time::Duration;
use vectorlb_memif::proto::{Msg, MSG_LEN, T_ADD_REGION, T_ADD_RING};
use vectorlb_memif::region::Region;
use vectorlb_memif::sock::{self, Recv, SocketAddr};
use vectorlb_memif::{InterfaceConfig, Server};

struct World {
    server: std::sync::Mutex<Server>,
    addr: SocketAddr,
    region: Region,
    eventfd: OwnedFd,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let addr = SocketAddr::parse(&format!("@vectorlb-fuzz-memif-{}", std::process::id())).unwrap();
        let ifaces =
            vec![InterfaceConfig { id: 0, queues: 2, max_log2_ring: 10, ..Default::default() }, InterfaceConfig { id: 1, secret: Some(b"secret".to_vec()), ..Default::default() }];
        let (server, _links) = Server::bind(&addr, 0o600, ifaces).unwrap();
        let region = Region::create("fuzz", 1 << 20, false).unwrap();
        for off in [0u64, 32768, 65536, 98304] {
            vectorlb_memif::ring::Ring::new(&region, off, 10).unwrap().init();
        }
        // SAFETY: a fresh eventfd.
        let eventfd = unsafe { OwnedFd::from_raw_fd(libc::eventfd(0, libc::EFD_NONBLOCK)) };
        World { server: std::sync::Mutex::new(server), addr, region, eventfd }
    })
}

fuzz_target!(|data: &[u8]| {
    for chunk in data.chunks(MSG_LEN) {
        if let Ok(m) = Msg::decode(chunk) {
            // Names that are not UTF-8 decode lossily (and may then be cut), so the first round
            // trip may change them; after it, encode and decode agree exactly.
            let once = Msg::decode(&m.encode()).expect("our own encoding decodes");
            assert_eq!(Msg::decode(&once.encode()), Ok(once.clone()), "encode and decode agree");
            assert_eq!(once.type_id(), m.type_id());
        }
    }
    let w = world();
    let mut server = w.server.lock().unwrap();
    let Ok(fd) = sock::connect(&w.addr) else { return };
    server.poll(Duration::ZERO);
    for chunk in data.chunks(MSG_LEN).take(16) {
        let mut b = [0u8; MSG_LEN];
        b[..chunk.len()].copy_from_slice(chunk);
        let t = u16::from_le_bytes([b[0], b[1]]);
        let attach = match t {
            T_ADD_REGION => Some(w.region.fd()),
            T_ADD_RING => Some(w.eventfd.as_raw_fd()),
            _ => None,
        };
        // A short chunk goes as a short datagram (the server must refuse its size).
        let r = if chunk.len() == MSG_LEN {
            sock::send(&fd, &b, attach)
        } else {
            // SAFETY: a datagram of chunk.len() bytes on a valid socket.
            let n = unsafe { libc::send(fd.as_raw_fd(), chunk.as_ptr().cast(), chunk.len(), libc::MSG_NOSIGNAL) };
            if n < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(())
            }
        };
        if r.is_err() {
            break;
        }
        server.poll(Duration::ZERO);
        loop {
            match sock::recv(&fd) {
                Ok(Recv::Msg { buf, .. }) => {
                    Msg::decode(&buf).expect("the server sends valid messages");
                }
                _ => break,
            }
        }
    }
    drop(fd);
    server.poll(Duration::ZERO);
});
