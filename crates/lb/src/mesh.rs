//! Steering for the mesh (docs/mesh.md): TCP between meshed pods goes to the node's mesh
//! proxy instead of to its destination, unchanged (the proxy's namespace delivers every address
//! locally, so the accepted socket's own address is the original destination). No rule in the
//! node's iptables or nftables: the data plane decides.
//!
//! A packet is steered when it is TCP, not a fragment past the first, not from the proxy itself
//! (its frames carry the proxy's interface MAC as source), and either
//! * from a meshed pod to a meshed pod (a client's connection, or a server's replies to a
//!   connection the proxy delivered), or
//! * to a meshed pod's tunnel port (another node's proxy opening a tunnel to it).
//!
//! Everything else (UDP, pods outside the mesh, the proxy's own packets) is routed as before.

use std::collections::HashSet;
use std::net::IpAddr;
use vectorlb_packet::{proto, Family, Frag, FrameInfo};

/// Meshed pods at most (every node's), as the API accepts them.
pub const MAX_MEMBERS: usize = 1 << 20;

/// What the mesh steers, as the daemon publishes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MeshSpec {
    /// The proxy's own addresses on the pods port (where steered packets are sent).
    pub proxy: Vec<IpAddr>,
    /// The proxy interface's MAC (its frames are not steered again).
    pub proxy_mac: [u8; 6],
    /// Every meshed pod's address, on this node and the others.
    pub members: Vec<IpAddr>,
    /// The port tunnels arrive on (15008).
    pub tunnel_port: u16,
}

/// A published mesh (shared by every worker).
#[derive(Debug, Default)]
pub struct Mesh {
    proxy4: Option<u128>,
    proxy6: Option<u128>,
    proxy_mac: [u8; 6],
    members: HashSet<u128>,
    tunnel_port: u16,
    pub generation: u64,
}

fn key(a: IpAddr) -> (u128, bool) {
    match a {
        IpAddr::V4(a) => (crate::addr::key4(a.octets()), true),
        IpAddr::V6(a) => (crate::addr::key6(a.octets()), false),
    }
}

impl Mesh {
    pub fn build(spec: &MeshSpec, generation: u64) -> Result<Mesh, String> {
        if spec.members.len() > MAX_MEMBERS {
            return Err(format!("{} meshed pods: at most {MAX_MEMBERS}", spec.members.len()));
        }
        if spec.tunnel_port == 0 {
            return Err("the tunnel port is 1 to 65535".into());
        }
        let (mut proxy4, mut proxy6) = (None, None);
        for &a in &spec.proxy {
            let (k, v4) = key(a);
            let slot = if v4 { &mut proxy4 } else { &mut proxy6 };
            if slot.replace(k).is_some() {
                return Err(format!("two proxy addresses of {a}'s family"));
            }
        }
        if proxy4.is_none() && proxy6.is_none() {
            return Err("the proxy has no address".into());
        }
        let members: HashSet<u128> = spec.members.iter().map(|&a| key(a).0).collect();
        Ok(Mesh { proxy4, proxy6, proxy_mac: spec.proxy_mac, members, tunnel_port: spec.tunnel_port, generation })
    }

    /// Steering nothing.
    pub fn off(generation: u64) -> Mesh {
        Mesh { generation, ..Default::default() }
    }

    pub fn members(&self) -> usize {
        self.members.len()
    }

    /// The proxy's address to route `d` to instead of its destination, or None: not steered.
    /// `d` is an Ethernet frame and `info` its parse.
    pub fn steer(&self, d: &[u8], info: &FrameInfo) -> Option<u128> {
        if self.members.is_empty() || info.proto != proto::TCP || info.frag == Frag::Later || d.get(6..12)? == self.proxy_mac {
            return None;
        }
        let l3 = info.l3;
        let (src, dst, proxy) = match info.family? {
            Family::V4 => (crate::addr::key4(d.get(l3 + 12..l3 + 16)?.try_into().ok()?), crate::addr::key4(d.get(l3 + 16..l3 + 20)?.try_into().ok()?), self.proxy4?),
            Family::V6 => (crate::addr::key6(d.get(l3 + 8..l3 + 24)?.try_into().ok()?), crate::addr::key6(d.get(l3 + 24..l3 + 40)?.try_into().ok()?), self.proxy6?),
        };
        if !self.members.contains(&dst) {
            return None;
        }
        let dport = u16::from_be_bytes(d.get(info.l4 + 2..info.l4 + 4)?.try_into().ok()?);
        (self.members.contains(&src) || dport == self.tunnel_port).then_some(proxy)
    }
}

impl Mesh {
    /// As [`Mesh::steer`] for a connection the load balancer has translated to a backend
    /// (destination NAT, the client's address kept): from `client` to `backend` (address keys),
    /// the frame's source MAC `from`. A meshed pod's connection to a Service goes to the proxy
    /// after the backend is chosen, so the proxy sees the backend as its destination.
    pub fn steer_translated(&self, client: u128, backend: u128, v4: bool, from: Option<&[u8]>) -> Option<u128> {
        if self.members.is_empty() || from.is_none_or(|f| f == self.proxy_mac) {
            return None;
        }
        let proxy = if v4 { self.proxy4? } else { self.proxy6? };
        (self.members.contains(&client) && self.members.contains(&backend)).then_some(proxy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vectorlb_packet::builder::Builder;

    const PROXY_MAC: [u8; 6] = [2, 0x76, 0, 0, 0, 9];

    fn mesh() -> Mesh {
        let spec = MeshSpec {
            proxy: vec!["10.244.1.250".parse().unwrap(), "fd00:244:1::fa".parse().unwrap()],
            proxy_mac: PROXY_MAC,
            members: ["10.244.1.5", "10.244.1.6", "10.244.2.7", "fd00:244:1::5", "fd00:244:2::7"].iter().map(|s| s.parse().unwrap()).collect(),
            tunnel_port: 15008,
        };
        Mesh::build(&spec, 1).unwrap()
    }

    fn tcp(src: &str, dst: &str, dport: u16, from: [u8; 6]) -> Vec<u8> {
        let sock = |a: &str, p: u16| if a.contains(':') { format!("[{a}]:{p}") } else { format!("{a}:{p}") };
        Builder::tcp(&sock(src, 40000), &sock(dst, dport), 0x02).macs(from, [2, 0x76, 0xff, 0xff, 0xff, 0xfe]).build()
    }

    fn steer(m: &Mesh, f: &[u8]) -> Option<u128> {
        m.steer(f, &vectorlb_packet::parse_frame(f).unwrap())
    }

    #[test]
    fn meshed_tcp_goes_to_the_proxy_and_nothing_else_does() {
        let m = mesh();
        let pod = [2, 0x76, 0, 0, 0, 1];
        let p4 = crate::addr::key4([10, 244, 1, 250]);
        assert_eq!(steer(&m, &tcp("10.244.1.5", "10.244.2.7", 8080, pod)), Some(p4), "meshed to meshed, other node");
        assert_eq!(steer(&m, &tcp("10.244.1.5", "10.244.1.6", 80, pod)), Some(p4), "meshed to meshed, same node");
        assert!(steer(&m, &tcp("fd00:244:1::5", "fd00:244:2::7", 80, pod)).is_some(), "IPv6");
        assert_eq!(steer(&m, &tcp("10.244.1.5", "10.244.3.3", 80, pod)), None, "to a pod outside the mesh");
        assert_eq!(steer(&m, &tcp("10.244.3.3", "10.244.1.5", 80, pod)), None, "from a pod outside the mesh");
        assert_eq!(steer(&m, &tcp("10.244.2.250", "10.244.1.5", 15008, pod)), Some(p4), "another node's proxy opening a tunnel");
        assert_eq!(steer(&m, &tcp("10.244.1.5", "10.244.2.7", 8080, PROXY_MAC)), None, "the proxy's own packets");
        let udp = Builder::udp("10.244.1.5:1", "10.244.2.7:53").macs(pod, [2, 0x76, 0xff, 0xff, 0xff, 0xfe]).build();
        assert_eq!(steer(&m, &udp), None, "UDP");
        let empty = Mesh::build(&MeshSpec { proxy: vec!["10.244.1.250".parse().unwrap()], tunnel_port: 15008, ..Default::default() }, 1).unwrap();
        assert_eq!(steer(&empty, &tcp("10.244.1.5", "10.244.2.7", 8080, pod)), None);
    }

    #[test]
    fn bad_specs_are_refused() {
        let ok = MeshSpec { proxy: vec!["10.0.0.1".parse().unwrap()], tunnel_port: 15008, ..Default::default() };
        assert!(Mesh::build(&ok, 1).is_ok());
        assert!(Mesh::build(&MeshSpec { proxy: vec![], ..ok.clone() }, 1).unwrap_err().contains("no address"));
        assert!(Mesh::build(&MeshSpec { proxy: vec!["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()], ..ok.clone() }, 1).unwrap_err().contains("two proxy"));
        assert!(Mesh::build(&MeshSpec { tunnel_port: 0, ..ok }, 1).is_err());
    }
}
