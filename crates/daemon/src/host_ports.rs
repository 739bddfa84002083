//! Pods' host ports (a container's `hostPort`: the CNI `portMappings` capability, which
//! vectorlb-cni passes on as the pod's `host_ports`).
//!
//! A host port on the node's addresses (`[ports.pods] node_port_addresses`) is a NAT service of
//! the data plane (the node's address and port to the pod's address and port, the client's
//! address kept), published beside the configuration's services but never written to its
//! file; the host's kernel hands that port of that address to the data plane by a routing rule
//! of the NodePorts' table ([`crate::steer`]), made when the pod is attached (or taken back at
//! a start) and removed when it is detached.
//!
//! A host port on a loopback address (`hostIP: 127.0.0.1`) is relayed instead: the daemon
//! listens there on the host and connects each client to the pod. Routing loopback traffic
//! out of an interface would need `route_localnet`, which lets other machines on the link
//! reach the host's loopback services (CVE-2020-8558); a relay on the loopback reaches
//! nothing the host's own processes could not. TCP only: a UDP host port on a loopback address
//! is refused.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use vectorlb_api::model::HostPort;

/// Connections one relay carries at once; more wait in the listen queue.
pub const RELAY_MAX_CONNECTIONS: usize = 256;

/// Where one host port goes in the data plane: (node address, protocol number, host port, pod
/// address, pod port).
pub type Binding = (IpAddr, u8, u16, IpAddr, u16);

fn proto_num(p: &str) -> u8 {
    if p == "udp" {
        vectorlb_packet::proto::UDP
    } else {
        vectorlb_packet::proto::TCP
    }
}

/// A protocol number's name as `ip rule` takes it.
pub fn proto_name(p: u8) -> &'static str {
    if p == vectorlb_packet::proto::UDP {
        "udp"
    } else {
        "tcp"
    }
}

/// The node addresses a host port is on (none for a loopback one): its `host_ip`, or every
/// node address of a family the pod has an address of.
fn addresses(h: &HostPort, pod_ips: &[IpAddr], node: &[IpAddr]) -> Vec<IpAddr> {
    match h.host_ip {
        Some(a) if a.is_loopback() => Vec::new(),
        Some(a) if !a.is_unspecified() => vec![a],
        unspec => node.iter().filter(|n| pod_ips.iter().any(|p| p.is_ipv4() == n.is_ipv4())).filter(|n| unspec.is_none_or(|u| u.is_ipv4() == n.is_ipv4())).copied().collect(),
    }
}

/// Checks a pod's host ports against the node: each on a node address (or loopback, TCP) of a
/// family the pod has, no two alike.
pub fn check(ports: &[HostPort], pod_ips: &[IpAddr], node: &[IpAddr]) -> Result<(), String> {
    if ports.is_empty() {
        return Ok(());
    }
    if node.is_empty() {
        return Err("host_ports: this pods port serves no host ports (pods.node_port_addresses is empty)".into());
    }
    for (i, h) in ports.iter().enumerate() {
        let pod = |v4: bool| pod_ips.iter().find(|p| p.is_ipv4() == v4).copied();
        match h.host_ip {
            Some(a) if a.is_loopback() => {
                if h.proto != "tcp" {
                    return Err(format!("host_ports[{i}]: a {} host port on {a}: only TCP is relayed on a loopback address", h.proto));
                }
                if pod(a.is_ipv4()).is_none() {
                    return Err(format!("host_ports[{i}].host_ip {a}: the pod has no address of its family"));
                }
            }
            Some(a) if !a.is_unspecified() && !node.contains(&a) => {
                let n: Vec<String> = node.iter().map(IpAddr::to_string).collect();
                return Err(format!("host_ports[{i}].host_ip {a}: not one of this node's addresses ({})", n.join(", ")));
            }
            _ => {}
        }
        if h.host_ip.is_none_or(|a| !a.is_loopback()) && bindings(std::slice::from_ref(h), pod_ips, node).is_empty() {
            return Err(format!("host_ports[{i}]: the pod has no address of the node addresses' families"));
        }
        if ports[..i].iter().any(|o| overlaps(o, pod_ips, h, pod_ips, node)) {
            return Err(format!("host_ports[{i}]: {}/{} is listed twice", h.host_port, h.proto));
        }
    }
    Ok(())
}

/// Whether two host ports take the same port of a same address.
pub fn overlaps(a: &HostPort, a_ips: &[IpAddr], b: &HostPort, b_ips: &[IpAddr], node: &[IpAddr]) -> bool {
    if a.proto != b.proto || a.host_port != b.host_port {
        return false;
    }
    let (la, lb) = (a.host_ip.filter(IpAddr::is_loopback), b.host_ip.filter(IpAddr::is_loopback));
    if la.is_some() || lb.is_some() {
        return la.is_some() && la == lb;
    }
    let bs = addresses(b, b_ips, node);
    addresses(a, a_ips, node).iter().any(|x| bs.contains(x))
}

/// The data plane's part of a pod's host ports.
pub fn bindings(ports: &[HostPort], pod_ips: &[IpAddr], node: &[IpAddr]) -> Vec<Binding> {
    let mut out = Vec::new();
    for h in ports {
        for a in addresses(h, pod_ips, node) {
            if let Some(p) = pod_ips.iter().find(|p| p.is_ipv4() == a.is_ipv4()) {
                out.push((a, proto_num(&h.proto), h.host_port, *p, h.container_port));
            }
        }
    }
    out
}

/// The relayed (loopback) part: (listen, pod) addresses.
pub fn relayed(ports: &[HostPort], pod_ips: &[IpAddr]) -> Vec<(SocketAddr, SocketAddr)> {
    ports
        .iter()
        .filter_map(|h| {
            let l = h.host_ip.filter(IpAddr::is_loopback)?;
            let p = pod_ips.iter().find(|p| p.is_ipv4() == l.is_ipv4())?;
            Some((SocketAddr::new(l, h.host_port), SocketAddr::new(*p, h.container_port)))
        })
        .collect()
}

/// A TCP relay from a loopback address to a pod; stops when dropped (its open connections
/// end with their peers).
pub struct Relay {
    stop: Arc<AtomicBool>,
    pub listen: SocketAddr,
}

impl Relay {
    pub fn start(listen: SocketAddr, to: SocketAddr) -> io::Result<Relay> {
        let l = TcpListener::bind(listen)?;
        l.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        std::thread::Builder::new().name("vlb-hostport".into()).spawn(move || accept_loop(l, to, s))?;
        Ok(Relay { stop, listen })
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn accept_loop(l: TcpListener, to: SocketAddr, stop: Arc<AtomicBool>) {
    let open = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Relaxed) {
        if open.load(Ordering::Relaxed) >= RELAY_MAX_CONNECTIONS {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        match l.accept() {
            Ok((c, _)) => {
                open.fetch_add(1, Ordering::Relaxed);
                let open = open.clone();
                let spawned = std::thread::Builder::new().name("vlb-hostport-c".into()).spawn(move || {
                    relay_one(c, to);
                    open.fetch_sub(1, Ordering::Relaxed);
                });
                if spawned.is_err() {
                    tracing::warn!("host port relay to {to}: no thread for a connection; it is closed");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => {
                tracing::warn!("host port relay to {to}: accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Copies both ways until each side has closed; a pod that does not answer within 5 s closes
/// the client's connection.
fn relay_one(c: TcpStream, to: SocketAddr) {
    let _ = c.set_nonblocking(false);
    let Ok(p) = TcpStream::connect_timeout(&to, Duration::from_secs(5)) else {
        let _ = c.shutdown(Shutdown::Both);
        return;
    };
    let (Ok(c2), Ok(p2)) = (c.try_clone(), p.try_clone()) else { return };
    let up = std::thread::Builder::new().name("vlb-hostport-c".into()).spawn(move || copy(c2, p2));
    copy(p, c);
    if let Ok(h) = up {
        let _ = h.join();
    }
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hp(proto: &str, port: u16, ip: Option<&str>) -> HostPort {
        HostPort { proto: proto.into(), host_port: port, container_port: 8080, host_ip: ip.map(|a| a.parse().unwrap()) }
    }

    #[test]
    fn host_ports_are_checked_and_placed() {
        let node: Vec<IpAddr> = vec!["192.168.77.1".parse().unwrap(), "fd00:77::1".parse().unwrap()];
        let v4: Vec<IpAddr> = vec!["10.244.1.10".parse().unwrap()];
        let both: Vec<IpAddr> = vec!["10.244.1.11".parse().unwrap(), "fd00:244:1::11".parse().unwrap()];
        // No host_ip: every node address of the pod's families.
        assert_eq!(bindings(&[hp("tcp", 54323, None)], &v4, &node), [(node[0], 6, 54323, v4[0], 8080)]);
        assert_eq!(bindings(&[hp("udp", 53, Some("0.0.0.0"))], &both, &node).len(), 1, "the unspecified address of a family: that family's");
        assert_eq!(bindings(&[hp("udp", 53, None)], &both, &node).len(), 2);
        // The same port on loopback, on the node's address, and in UDP: three, no conflict.
        let three = [hp("tcp", 54323, Some("127.0.0.1")), hp("tcp", 54323, Some("192.168.77.1")), hp("udp", 54323, Some("192.168.77.1"))];
        assert_eq!(check(&three, &v4, &node), Ok(()));
        for i in 0..3 {
            for j in 0..3 {
                assert_eq!(overlaps(&three[i], &v4, &three[j], &v4, &node), i == j, "{i} {j}");
            }
        }
        assert!(overlaps(&hp("tcp", 80, None), &v4, &hp("tcp", 80, Some("192.168.77.1")), &v4, &node), "every address includes this one");
        assert_eq!(relayed(&three, &v4), [("127.0.0.1:54323".parse().unwrap(), "10.244.1.10:8080".parse().unwrap())]);
        assert_eq!(bindings(&three, &v4, &node).len(), 2, "the loopback one is relayed, not bound");
        // Refused: another address, UDP on loopback, a family the pod lacks, twice, none served.
        assert!(check(&[hp("tcp", 1, Some("192.168.77.9"))], &v4, &node).unwrap_err().contains("not one of this node's addresses"));
        assert!(check(&[hp("udp", 1, Some("127.0.0.1"))], &v4, &node).unwrap_err().contains("only TCP"));
        assert!(check(&[hp("tcp", 1, Some("fd00:77::1"))], &v4, &node).unwrap_err().contains("no address of the node addresses' families"));
        assert!(check(&[hp("tcp", 1, Some("::1"))], &v4, &node).unwrap_err().contains("no address of its family"));
        assert!(check(&[hp("tcp", 7, None), hp("tcp", 7, Some("192.168.77.1"))], &v4, &node).unwrap_err().contains("listed twice"));
        assert!(check(&[hp("tcp", 7, None)], &v4, &[]).unwrap_err().contains("node_port_addresses is empty"));
    }

    #[test]
    fn a_relay_carries_both_ways_and_stops_when_dropped() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let to = server.local_addr().unwrap();
        std::thread::spawn(move || {
            for c in server.incoming().take(2) {
                let mut c = c.unwrap();
                let mut b = [0u8; 5];
                c.read_exact(&mut b).unwrap();
                c.write_all(&[b"echo:".as_slice(), &b].concat()).unwrap();
            }
        });
        let free = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let r = Relay::start(free, to).unwrap();
        let mut c = TcpStream::connect(free).unwrap();
        c.write_all(b"hello").unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let mut got = String::new();
        c.read_to_string(&mut got).unwrap();
        assert_eq!(got, "echo:hello");
        assert!(Relay::start(free, to).is_err(), "the port is taken while the relay lives");
        drop(r);
        std::thread::sleep(Duration::from_millis(100));
        assert!(TcpStream::connect(free).is_err(), "gone once dropped");
    }
}
