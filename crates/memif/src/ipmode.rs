//! IP-mode memif for a data plane that works on Ethernet frames: an IP-mode peer sends and
//! receives bare IPv4 / IPv6 packets. The receive side gives each packet an Ethernet header
//! (to the port's MAC, from a fixed MAC standing for the peer, with the type from the IP
//! version) in the buffer's headroom, so nothing is copied again; the transmit side takes the
//! header off and drops, counted, whatever is not IP (the peer could not read it). The peer's
//! MAC is what the data plane resolves every next hop on the port to (it cannot ask: there is
//! no ARP on an IP link).

use crate::conn::{Link, QueueStats};
use std::sync::Arc;
use vectorlb_io::{Packet, RxQueue, TxQueue};

const ETH_LEN: usize = 14;

/// The MAC that stands for an IP-mode peer: locally administered, and never the port's own.
pub fn peer_mac(port_mac: [u8; 6]) -> [u8; 6] {
    let m = [0x02, 0x6d, 0x65, 0x6d, 0x69, 0x66];
    if m == port_mac {
        [0x02, 0x6d, 0x65, 0x6d, 0x69, 0x67]
    } else {
        m
    }
}

/// The Ethernet type for an IP packet starting with `first` (its version nibble).
fn ethertype(first: u8) -> Option<[u8; 2]> {
    match first >> 4 {
        4 => Some([0x08, 0x00]),
        6 => Some([0x86, 0xdd]),
        _ => None,
    }
}

/// Receives bare IP packets from `inner` as Ethernet frames.
pub struct IpRx<R> {
    inner: R,
    header: [u8; ETH_LEN],
    link: Arc<Link>,
    queue: u16,
}

impl<R> IpRx<R> {
    pub fn new(inner: R, port_mac: [u8; 6], link: Arc<Link>, queue: u16) -> Self {
        let mut header = [0u8; ETH_LEN];
        header[..6].copy_from_slice(&port_mac);
        header[6..12].copy_from_slice(&peer_mac(port_mac));
        IpRx { inner, header, link, queue }
    }
}

impl<P: Packet, R: RxQueue<P>> RxQueue<P> for IpRx<R> {
    fn recv(&mut self, out: &mut Vec<P>, max: usize) -> usize {
        let start = out.len();
        self.inner.recv(out, max);
        // Kept packets moved up in order; the rest freed by the truncate.
        let mut w = start;
        for r in start..out.len() {
            let p = &mut out[r];
            let t = p.data().first().and_then(|&b| ethertype(b));
            // No headroom cannot happen with the queues' buffers; counted with the rest.
            if let Some(t) = t.filter(|_| p.prepend(ETH_LEN)) {
                let d = p.data_mut();
                d[..12].copy_from_slice(&self.header[..12]);
                d[12..14].copy_from_slice(&t);
                out.swap(w, r);
                w += 1;
            }
        }
        let dropped = (out.len() - w) as u64;
        out.truncate(w);
        if dropped > 0 {
            QueueStats::add(&self.link.queues[self.queue as usize].not_ip, dropped);
        }
        out.len() - start
    }
}

/// Sends Ethernet frames to `inner` as bare IP packets.
pub struct IpTx<T> {
    inner: T,
    link: Arc<Link>,
    queue: u16,
}

impl<T> IpTx<T> {
    pub fn new(inner: T, link: Arc<Link>, queue: u16) -> Self {
        IpTx { inner, link, queue }
    }
}

impl<P: Packet, T: TxQueue<P>> TxQueue<P> for IpTx<T> {
    fn send(&mut self, pkts: &mut Vec<P>) -> usize {
        let before = pkts.len();
        // Order kept; what the peer cannot take is freed (dropping a packet frees it).
        pkts.retain_mut(|p| {
            let d = p.data();
            let ip = d.len() > ETH_LEN && ethertype(d[ETH_LEN]).is_some_and(|t| t == [d[12], d[13]]);
            if ip {
                p.adj(ETH_LEN);
            }
            ip
        });
        let dropped = before - pkts.len();
        if dropped > 0 {
            QueueStats::add(&self.link.queues[self.queue as usize].not_ip, dropped as u64);
        }
        // Those dropped are gone from `pkts` but were not sent.
        self.inner.send(pkts)
    }

    fn poll(&mut self) -> bool {
        self.inner.poll()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::Link;
    use vectorlb_io::mem::{channel, MemPacket, Pool};
    use vectorlb_io::PacketBuf;

    fn ip4(len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        v[0] = 0x45;
        v
    }

    #[test]
    fn received_ip_packets_get_an_ethernet_header_and_the_rest_are_dropped() {
        let link = Link::new(1);
        let pool = Pool::default();
        let mut ip6 = vec![0u8; 48];
        ip6[0] = 0x60;
        let (mut feed, inner) = channel::<MemPacket>(16, 0);
        let mut burst: Vec<MemPacket> = [ip4(40), vec![0x00; 30], ip6.clone(), vec![], ip4(20)].iter().map(|f| pool.packet(0, f).unwrap()).collect();
        feed.send(&mut burst);
        let mut rx = IpRx::new(inner, [2, 0, 0, 0, 0, 1], link.clone(), 0);
        let mut out: Vec<MemPacket> = Vec::new();
        assert_eq!(rx.recv(&mut out, 64), 3);
        let d: Vec<&[u8]> = out.iter().map(|p| p.data()).collect();
        assert_eq!(d[0].len(), 54);
        assert_eq!(&d[0][..14], &[2, 0, 0, 0, 0, 1, 0x02, 0x6d, 0x65, 0x6d, 0x69, 0x66, 0x08, 0x00]);
        assert_eq!(&d[0][14..], &ip4(40)[..]);
        assert_eq!(&d[1][12..14], &[0x86, 0xdd]);
        assert_eq!(&d[1][14..], &ip6[..]);
        assert_eq!(d[2].len(), 34, "order kept");
        assert_eq!(link.queues[0].snapshot().not_ip, 2);
        drop(out);
        assert_eq!(pool.stats().in_use(), 0, "dropped packets are freed");
    }

    #[test]
    fn sent_frames_lose_their_ethernet_header_and_non_ip_is_dropped() {
        let link = Link::new(1);
        let pool = Pool::default();
        let frame = |t: [u8; 2], first: u8, len: usize| {
            let mut f = vec![0u8; len];
            f[12..14].copy_from_slice(&t);
            if len > 14 {
                f[14] = first;
            }
            pool.packet(0, &f).unwrap()
        };
        let (inner, mut sent) = channel::<MemPacket>(16, 0);
        let mut tx = IpTx::new(inner, link.clone(), 0);
        let mut pkts = vec![
            frame([0x08, 0x00], 0x45, 60),
            frame([0x08, 0x06], 0x00, 42), // ARP
            frame([0x86, 0xdd], 0x60, 74),
            frame([0x08, 0x00], 0x60, 60), // type and version disagree
            frame([0x08, 0x00], 0x45, 14), // no packet at all
        ];
        assert_eq!(tx.send(&mut pkts), 2);
        assert!(pkts.is_empty());
        let got = sent.drain();
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].data().len(), got[0].data()[0]), (46, 0x45));
        assert_eq!((got[1].data().len(), got[1].data()[0]), (60, 0x60));
        assert_eq!(link.queues[0].snapshot().not_ip, 3);
        drop(got);
        assert_eq!(pool.stats().in_use(), 0);
    }

    #[test]
    fn the_peer_mac_is_never_the_ports() {
        assert_ne!(peer_mac([0x02, 0x6d, 0x65, 0x6d, 0x69, 0x66]), [0x02, 0x6d, 0x65, 0x6d, 0x69, 0x66]);
        assert_eq!(peer_mac([2, 0, 0, 0, 0, 1])[0] & 0x03, 0x02, "locally administered, unicast");
    }
}
