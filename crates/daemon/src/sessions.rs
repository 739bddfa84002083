//! Paged session listings, read by the owning worker on request of the API.

use std::net::IpAddr;
use vectorlb_api::model::{Proto, Session as SessionInfo};
use vectorlb_lb::session::{flag, state, Session};
use vectorlb_lb::sync::SyncAddr;
use vectorlb_lb::Worker;
use vectorlb_packet::proto;

#[derive(Debug, Clone, Default)]
pub struct Page {
    pub sessions: Vec<SessionInfo>,
    /// Where the next page starts (None: this was the last).
    pub next: Option<usize>,
}

fn sock(a: IpAddr, port: u16) -> String {
    std::net::SocketAddr::new(a, port).to_string()
}

fn collect<A: SyncAddr>(w: &Worker, start: usize, limit: usize, now: u32) -> Page
where
    Session<A>: vectorlb_lb::mem::Zeroable,
{
    let snap = w.snapshot();
    let mut out = Vec::new();
    let next = w.flows.table.for_each::<A>(start, |_, s| {
        if out.len() >= limit {
            return false;
        }
        let snat = s.flags & flag::SNAT != 0;
        let (p, vip) = if snat {
            (if s.state == state::UDP { proto::UDP } else { proto::TCP }, "snat".to_string())
        } else {
            match snap.service(s.svc) {
                Some(sv) => (sv.spec.proto, sock(sv.spec.vip, sv.spec.port)),
                None => (0, "(removed)".into()),
            }
        };
        let backend = match snap.backend(s.backend) {
            Some(b) => sock(b.addr, b.port),
            None if snat => String::new(),
            None => "(removed)".into(),
        };
        let local = snap.laddr_addr(s.laddr).map(|a| sock(a, s.lport));
        out.push(SessionInfo {
            proto: if p == proto::UDP { Proto::Udp } else { Proto::Tcp },
            client: sock(s.client.ip(), s.cport),
            vip,
            backend,
            local,
            state: state::name(s.state).to_string(),
            expires_ms: s.expire.wrapping_sub(now) as i32 as i64,
            snat,
        });
        true
    });
    // for_each stops (returning the resume index) only when the page is full.
    Page { sessions: out, next }
}

pub fn page(w: &Worker, start: usize, limit: usize, v6: bool, now: u32) -> Page {
    let limit = limit.clamp(1, 10_000);
    if v6 {
        collect::<[u8; 16]>(w, start, limit, now)
    } else {
        collect::<[u8; 4]>(w, start, limit, now)
    }
}
