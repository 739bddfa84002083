//! What the pipeline decides for each packet, and the per-core counters.

/// Why a packet was dropped. Every drop has one, and each has a counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DropReason {
    /// A header is cut short, or a length field points past the end of the frame.
    Truncated,
    /// A header field holds a value the protocol does not allow.
    Malformed,
    /// IPv4 header checksum is wrong.
    BadChecksum,
    /// A fragment addressed to a VIP or local address (the LB does not reassemble).
    Fragment,
    /// TTL / hop limit would reach zero (an ICMP time-exceeded is sent when the rate allows).
    TtlExceeded,
    /// A TCP segment other than SYN with no session (or a reply with no session).
    NoSession,
    /// The service has no backend that takes new sessions (all weights 0).
    NoBackend,
    /// The session table is full; established sessions keep forwarding.
    TableFull,
    /// Every full-NAT/SNAT local port of this core is in use.
    NoLocalPort,
    /// The session's backend was removed from the configuration.
    BackendRemoved,
    /// No route to the destination.
    NoRoute,
    /// The next hop's MAC address is unknown.
    NoNeighbor,
    /// Larger than the egress MTU (a too-big / fragmentation-needed error is sent when allowed).
    MtuExceeded,
    /// An ICMP error the LB would have sent was suppressed by the rate limit.
    IcmpRateLimited,
    /// An ICMP error about a flow the LB has no session for.
    IcmpNoSession,
    /// An IP protocol the VIP does not serve.
    UnsupportedProtocol,
    /// A reply to a local port that another core owns (flow steering is misconfigured).
    Misdirected,
    /// The buffer has no headroom or tailroom for the headers to add.
    NoRoom,
}

impl DropReason {
    pub const COUNT: usize = 18;
    pub const ALL: [DropReason; Self::COUNT] = [
        DropReason::Truncated,
        DropReason::Malformed,
        DropReason::BadChecksum,
        DropReason::Fragment,
        DropReason::TtlExceeded,
        DropReason::NoSession,
        DropReason::NoBackend,
        DropReason::TableFull,
        DropReason::NoLocalPort,
        DropReason::BackendRemoved,
        DropReason::NoRoute,
        DropReason::NoNeighbor,
        DropReason::MtuExceeded,
        DropReason::IcmpRateLimited,
        DropReason::IcmpNoSession,
        DropReason::UnsupportedProtocol,
        DropReason::Misdirected,
        DropReason::NoRoom,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DropReason::Truncated => "truncated",
            DropReason::Malformed => "malformed",
            DropReason::BadChecksum => "bad_checksum",
            DropReason::Fragment => "fragment",
            DropReason::TtlExceeded => "ttl_exceeded",
            DropReason::NoSession => "no_session",
            DropReason::NoBackend => "no_backend",
            DropReason::TableFull => "session_table_full",
            DropReason::NoLocalPort => "no_local_port",
            DropReason::BackendRemoved => "backend_removed",
            DropReason::NoRoute => "no_route",
            DropReason::NoNeighbor => "no_neighbor",
            DropReason::MtuExceeded => "mtu_exceeded",
            DropReason::IcmpRateLimited => "icmp_rate_limited",
            DropReason::IcmpNoSession => "icmp_no_session",
            DropReason::UnsupportedProtocol => "unsupported_protocol",
            DropReason::Misdirected => "misdirected",
            DropReason::NoRoom => "no_room",
        }
    }
}

impl From<vectorlb_packet::Error> for DropReason {
    fn from(e: vectorlb_packet::Error) -> Self {
        match e {
            vectorlb_packet::Error::Truncated => DropReason::Truncated,
            vectorlb_packet::Error::Malformed => DropReason::Malformed,
        }
    }
}

/// The pipeline's decision for one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Send the (rewritten) buffer on this port.
    Tx(u16),
    Drop(DropReason),
    /// Not for the load balancer: hand it to the host's stack unchanged (ARP, ND, SSH, ...).
    Kernel,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServiceCounters {
    pub packets: u64,
    pub bytes: u64,
    pub new_sessions: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackendCounters {
    pub packets: u64,
    pub bytes: u64,
}

/// One core's counters. Only that core writes them; readers sum cores (see [`Counters::add`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    pub rx: u64,
    pub tx: u64,
    pub kernel: u64,
    pub drops: [u64; DropReason::COUNT],
    pub sessions_created: u64,
    pub icmp_echo_replies: u64,
    pub icmp_errors_sent: u64,
    pub icmp_errors_translated: u64,
    pub toa_inserted: u64,
    pub toa_skipped: u64,
    /// Resets sent for connections whose backend was taken out.
    pub tcp_resets_sent: u64,
    /// Indexed by service id.
    pub services: Vec<ServiceCounters>,
    /// Indexed by backend slot.
    pub backends: Vec<BackendCounters>,
}

impl Counters {
    #[inline(always)]
    pub fn drop(&mut self, r: DropReason) {
        self.drops[r as usize] += 1;
    }

    pub fn dropped(&self, r: DropReason) -> u64 {
        self.drops[r as usize]
    }

    pub fn total_drops(&self) -> u64 {
        self.drops.iter().sum()
    }

    /// Adds another core's counters into these.
    pub fn add(&mut self, o: &Counters) {
        self.rx += o.rx;
        self.tx += o.tx;
        self.kernel += o.kernel;
        for (a, b) in self.drops.iter_mut().zip(o.drops.iter()) {
            *a += b;
        }
        self.sessions_created += o.sessions_created;
        self.icmp_echo_replies += o.icmp_echo_replies;
        self.icmp_errors_sent += o.icmp_errors_sent;
        self.icmp_errors_translated += o.icmp_errors_translated;
        self.toa_inserted += o.toa_inserted;
        self.toa_skipped += o.toa_skipped;
        self.tcp_resets_sent += o.tcp_resets_sent;
        if self.services.len() < o.services.len() {
            self.services.resize(o.services.len(), Default::default());
        }
        for (a, b) in self.services.iter_mut().zip(&o.services) {
            a.packets += b.packets;
            a.bytes += b.bytes;
            a.new_sessions += b.new_sessions;
        }
        if self.backends.len() < o.backends.len() {
            self.backends.resize(o.backends.len(), Default::default());
        }
        for (a, b) in self.backends.iter_mut().zip(&o.backends) {
            a.packets += b.packets;
            a.bytes += b.bytes;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cores_are_summed_on_read() {
        let mut a = Counters { rx: 3, tx: 2, ..Default::default() };
        a.drop(DropReason::NoSession);
        a.services = vec![ServiceCounters { packets: 1, bytes: 10, new_sessions: 1 }];
        let mut b = Counters { rx: 5, kernel: 1, ..Default::default() };
        b.drop(DropReason::NoSession);
        b.drop(DropReason::TableFull);
        b.services = vec![ServiceCounters { packets: 2, bytes: 20, new_sessions: 0 }; 2];
        b.backends = vec![BackendCounters { packets: 4, bytes: 40 }];
        let mut total = Counters::default();
        total.add(&a);
        total.add(&b);
        assert_eq!((total.rx, total.tx, total.kernel), (8, 2, 1));
        assert_eq!(total.dropped(DropReason::NoSession), 2);
        assert_eq!(total.total_drops(), 3);
        assert_eq!(total.services[0], ServiceCounters { packets: 3, bytes: 30, new_sessions: 1 });
        assert_eq!(total.services.len(), 2);
        assert_eq!(total.backends[0].bytes, 40);
        assert_eq!(DropReason::ALL.len(), DropReason::COUNT);
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i, "ALL is in discriminant order");
        }
    }
}
