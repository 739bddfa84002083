//! memif by annotation on the pods port (docs/pod-network.md#memif-by-annotation), Calico VPP's
//! model: a pod whose annotation names ports also gets a memif, served by the daemon on an
//! abstract socket *inside the pod's network namespace* (`@vectorlb/memif-IFNAME`, so only the
//! pod's processes reach it). Frames to the pod for TCP or UDP destination ports in its ranges
//! go to the memif; everything else to its interface. Both carry the pod's addresses; what the
//! pod sends on the memif passes the same source check as its interface.
//!
//! - The memif is in IP mode (bare IPv4 / IPv6 packets, as on the tun interface), one queue
//!   pair: the pods port's reader receives from it, and any worker transmits under a lock.
//! - The listener is bound by a thread that entered the pod's namespace; one control thread
//!   of the pods port runs every pod's handshakes.
//! - While no application is connected, frames for the memif's ports are dropped and counted
//!   (`tx_dropped`): those ports belong to the memif.
//! - Fragments after the first and IPv6 packets with extension headers have no ports here:
//!   they go to the interface.

use crate::lock;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use vectorlb_dpdk::{Mbuf, Mempool};
use vectorlb_memif::{InterfaceConfig, IpTx, Link, Mode, Server, ServerRx, ServerTx, SharedCopier, SocketAddr};

/// The most port ranges one pod may ask for.
pub const MAX_RANGES: usize = 16;

/// The largest frame the pods' memifs move.
const MAX_FRAME: usize = 2048;

/// Destination ports of one protocol that go to the pod's memif.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortRange {
    /// `tcp` or `udp`.
    pub proto: Proto,
    pub first: u16,
    pub last: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    fn number(self) -> u8 {
        match self {
            Proto::Tcp => 6,
            Proto::Udp => 17,
        }
    }
}

/// Checks a pod's ranges: at most [`MAX_RANGES`], each 1 ≤ first ≤ last.
pub fn check(ranges: &[PortRange]) -> Result<(), String> {
    if ranges.len() > MAX_RANGES {
        return Err(format!("memif_ports: {} ranges; at most {MAX_RANGES}", ranges.len()));
    }
    for (i, r) in ranges.iter().enumerate() {
        if r.first == 0 || r.first > r.last {
            return Err(format!("memif_ports[{i}]: {}-{} is not a port range (1 <= first <= last <= 65535)", r.first, r.last));
        }
    }
    Ok(())
}

/// The memif socket of interface `ifname`, in the pod's namespace.
pub fn socket_name(ifname: &str) -> String {
    format!("@vectorlb/memif-{ifname}")
}

/// Whether the IP packet `ip` goes to the memif: TCP or UDP to a destination port in `ranges`
/// (first fragments only; IPv6 without extension headers).
pub fn steered(ranges: &[PortRange], ip: &[u8]) -> bool {
    let (proto, l4) = match ip.first().map(|b| b >> 4) {
        Some(4) if ip.len() >= 20 => {
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            // A fragment after the first has no ports.
            if u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff != 0 || ihl < 20 {
                return false;
            }
            (ip[9], ihl)
        }
        Some(6) if ip.len() >= 40 => (ip[6], 40),
        _ => return false,
    };
    let Some(port) = ip.get(l4 + 2..l4 + 4).map(|b| u16::from_be_bytes([b[0], b[1]])) else { return false };
    ranges.iter().any(|r| r.proto.number() == proto && (r.first..=r.last).contains(&port))
}

/// What the pods port's memifs share: the buffers they receive into, and a copier.
pub struct MemifIo {
    pub pool: Arc<Mempool>,
    pub copier: SharedCopier,
}

/// A pod's memif.
pub struct PodMemif {
    pub ranges: Vec<PortRange>,
    pub socket: String,
    pub link: Arc<Link>,
    server: Mutex<Server>,
    /// Only the pods port's reader takes it.
    pub(crate) rx: Mutex<ServerRx<Mbuf, Arc<Mempool>>>,
    /// Any worker, one at a time.
    pub(crate) tx: Mutex<IpTx<ServerTx<Mbuf>>>,
}

impl PodMemif {
    /// Binds the memif socket in the calling thread's network namespace (the pod's: called on
    /// the thread that entered it). Only the control side: [`PodMemif::new`] adds the queues.
    pub fn listen(ifname: &str) -> std::io::Result<(Server, Arc<Link>)> {
        let name = socket_name(ifname);
        let addr = SocketAddr::parse(&name).map_err(std::io::Error::other)?;
        let cfg = InterfaceConfig { id: 0, name: "vectorlb".into(), mode: Mode::Ip, queues: 1, ..Default::default() };
        let (server, mut links) = Server::bind(&addr, 0o600, vec![cfg]).map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok((server, links.remove(0)))
    }

    pub fn new(ranges: Vec<PortRange>, ifname: &str, port: u16, server: Server, link: Arc<Link>, io: &MemifIo) -> PodMemif {
        let rx = ServerRx::new(link.clone(), 0, port, io.pool.clone(), io.copier.clone(), MAX_FRAME);
        let tx = IpTx::new(ServerTx::new(link.clone(), 0, io.copier.clone()), link.clone(), 0);
        PodMemif { ranges, socket: socket_name(ifname), link, server: Mutex::new(server), rx: Mutex::new(rx), tx: Mutex::new(tx) }
    }

    /// Runs the handshakes and disconnects waiting on the socket (never blocks).
    pub fn poll(&self) {
        lock(&self.server).poll(Duration::ZERO);
    }

    /// Whether an application is connected.
    pub fn connected(&self) -> bool {
        self.link.is_up()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(proto: Proto, first: u16, last: u16) -> PortRange {
        PortRange { proto, first, last }
    }

    #[test]
    fn ranges_are_checked() {
        assert!(check(&[r(Proto::Tcp, 4444, 20000), r(Proto::Udp, 53, 53)]).is_ok());
        assert!(check(&[r(Proto::Tcp, 0, 10)]).unwrap_err().contains("memif_ports[0]"));
        assert!(check(&[r(Proto::Udp, 1, 1), r(Proto::Tcp, 20, 10)]).unwrap_err().contains("memif_ports[1]: 20-10"));
        assert!(check(&[r(Proto::Tcp, 1, 2); MAX_RANGES + 1]).is_err());
        let j: Result<PortRange, _> = serde_json::from_str(r#"{"proto":"sctp","first":1,"last":2}"#);
        assert!(j.is_err());
    }

    #[test]
    fn steering_reads_the_destination_port() {
        let ranges = [r(Proto::Tcp, 4444, 4450), r(Proto::Udp, 5000, 5000)];
        let mut v4 = [0u8; 40];
        v4[0] = 0x45;
        v4[9] = 6;
        v4[22..24].copy_from_slice(&4445u16.to_be_bytes());
        assert!(steered(&ranges, &v4));
        v4[9] = 17;
        assert!(!steered(&ranges, &v4), "udp 4445 is not a memif port");
        v4[22..24].copy_from_slice(&5000u16.to_be_bytes());
        assert!(steered(&ranges, &v4));
        // A later fragment: no ports.
        v4[6..8].copy_from_slice(&0x0010u16.to_be_bytes());
        assert!(!steered(&ranges, &v4));
        v4[6..8].copy_from_slice(&0x2000u16.to_be_bytes());
        assert!(steered(&ranges, &v4), "the first fragment (MF set, offset 0) has its ports");
        // Options move the ports.
        let mut opt = [0u8; 44];
        opt[0] = 0x46;
        opt[9] = 6;
        opt[26..28].copy_from_slice(&4444u16.to_be_bytes());
        assert!(steered(&ranges, &opt));
        let mut v6 = [0u8; 60];
        v6[0] = 0x60;
        v6[6] = 6;
        v6[42..44].copy_from_slice(&4450u16.to_be_bytes());
        assert!(steered(&ranges, &v6));
        v6[6] = 0; // hop-by-hop options: not looked into
        assert!(!steered(&ranges, &v6));
        // Short or not IP.
        assert!(!steered(&ranges, &v4[..21]));
        assert!(!steered(&ranges, &[]));
        assert!(!steered(&ranges, &[0x55; 40]));
    }
}
