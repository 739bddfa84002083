//! What the pipeline decides for each packet, and the per-core counters.
//!
//! Drop reasons and counters are declared once, here ([`drop_reasons!`], [`counter_set!`]);
//! the pipeline, the API, the metrics and the documentation all read those lists.

/// Declares a set of per-core `u64` counters once: the struct, each counter's name and help
/// text, summing across cores, and iteration for the API, the metrics and the documentation.
///
/// ```
/// vectorlb_lb::counter_set! {
///     /// Example counters.
///     pub struct Example {
///         /// Packets seen.
///         seen,
///     }
/// }
/// let mut a = Example { seen: 1 };
/// a.add(&Example { seen: 2 });
/// assert_eq!(a.iter().next(), Some(("seen", "Packets seen.", 3)));
/// ```
#[macro_export]
macro_rules! counter_set {
    ($(#[$m:meta])* pub struct $name:ident { $( $(#[doc = $doc:literal])+ $field:ident ),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct $name { $( $(#[doc = $doc])+ pub $field: u64, )* }

        impl $name {
            /// Every counter's name, in declaration order.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($field)),*];
            /// Every counter's help text, in declaration order.
            pub const HELP: &'static [&'static str] = &[$(concat!($($doc),+)),*];

            /// Adds another core's counters into these.
            pub fn add(&mut self, o: &Self) {
                $( self.$field += o.$field; )*
            }

            /// (name, help, value) of every counter, in declaration order.
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, &'static str, u64)> {
                let values = [$(self.$field),*];
                Self::NAMES.iter().zip(Self::HELP).zip(values).map(|((n, h), v)| (*n, h.trim(), v))
            }
        }
    };
}

/// Declares the drop reasons once: the enum, names, help text and the list of all of them.
macro_rules! drop_reasons {
    ($( $(#[doc = $doc:literal])+ $variant:ident = $name:literal, )*) => {
        /// Why a packet was dropped. Every drop has one, and each has a counter.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum DropReason { $( $(#[doc = $doc])+ $variant, )* }

        impl DropReason {
            pub const COUNT: usize = [$($name),*].len();
            /// Every reason, in discriminant order.
            pub const ALL: [DropReason; Self::COUNT] = [$(DropReason::$variant),*];

            /// The reason's name in the API, the metrics and the documentation.
            pub fn name(self) -> &'static str {
                match self { $(DropReason::$variant => $name,)* }
            }

            /// One sentence on what the reason means.
            pub fn help(self) -> &'static str {
                match self { $(DropReason::$variant => concat!($($doc),+).trim(),)* }
            }
        }
    };
}

drop_reasons! {
    /// A header is cut short, or a length field points past the end of the frame.
    Truncated = "truncated",
    /// A header field holds a value the protocol does not allow.
    Malformed = "malformed",
    /// The IPv4 header checksum is wrong.
    BadChecksum = "bad_checksum",
    /// A fragment addressed to the LB that belongs to none of its flows (an ICMP echo in
    /// fragments, a protocol the VIP does not serve); the LB does not reassemble.
    Fragment = "fragment",
    /// A later fragment to the LB whose datagram's first fragment this core has not seen
    /// (lost, reordered, or older than the fragment table's 2 s).
    FragmentNoFirst = "fragment_no_first",
    /// TTL or hop limit would reach zero (an ICMP time-exceeded is sent when the rate allows).
    TtlExceeded = "ttl_exceeded",
    /// A TCP segment to a VIP or local address whose flags no TCP sends (SYN+FIN, SYN+RST,
    /// FIN without ACK, none at all, and the rest of the combinations conntrack calls invalid);
    /// it creates no session and is not forwarded.
    InvalidTcpFlags = "invalid_tcp_flags",
    /// A TCP segment other than a SYN with no session (a reset, or any segment to a service
    /// without continuation), or a reply with no session.
    NoSession = "no_session",
    /// The service has no backend that takes new sessions (all weights 0): a UDP datagram
    /// (a TCP SYN is answered with a reset, counted in `tcp_resets_sent`).
    NoBackend = "no_backend",
    /// The session table is full; established sessions keep forwarding.
    TableFull = "session_table_full",
    /// Every full-NAT or SNAT local port of this core is in use.
    NoLocalPort = "no_local_port",
    /// A new TCP connection while half-open sessions hold the core's whole half-open budget
    /// (`global.half_open_share`) and none could be evicted.
    HalfOpenLimit = "half_open_limit",
    /// A segment that would continue a flow while continued sessions hold the
    /// core's whole continuation budget and none could be evicted.
    ContinuationLimit = "continuation_limit",
    /// The session's backend was removed from the configuration.
    BackendRemoved = "backend_removed",
    /// No route to the destination.
    NoRoute = "no_route",
    /// The next hop's MAC address is unknown.
    NoNeighbor = "no_neighbor",
    /// Larger than the egress MTU (a too-big or fragmentation-needed error is sent when allowed).
    MtuExceeded = "mtu_exceeded",
    /// An ICMP error the LB would have sent was suppressed by the rate limit.
    IcmpRateLimited = "icmp_rate_limited",
    /// An ICMP error about a flow the LB has no session for.
    IcmpNoSession = "icmp_no_session",
    /// An IP protocol the VIP does not serve.
    UnsupportedProtocol = "unsupported_protocol",
    /// A reply to a local port that no worker owns (more port partitions than workers).
    Misdirected = "misdirected",
    /// The buffer has no headroom or tailroom for the headers to add.
    NoRoom = "no_room",
    /// An ACK without a session to a SYN-proxied service whose acknowledgement number is not
    /// a SYN cookie this LB issued in the last two minutes (a forged or stale ACK).
    BadSyncookie = "bad_syncookie",
    /// A segment of a SYN-proxied connection while the backend has not answered the proxy's
    /// SYN yet, other than the first data segment (the client retransmits it).
    SynproxyPending = "synproxy_pending",
    /// The first data segment of a SYN-proxied connection while the backend has not answered:
    /// not lost, its copy goes to the backend with the ACK that completes the handshake (only
    /// the buffer is freed; `synproxy_held` counts them too).
    SynproxyHeld = "synproxy_held",
    /// A new flow a network policy does not allow (counted per endpoint and per policy too).
    PolicyDenied = "policy_denied",
    /// A new flow a network policy allows, while the table of allowed flows is full of live
    /// ones.
    PolicyFlowsFull = "policy_flows_full",
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
    /// Belongs to another worker (a reply to a local port that worker owns): hand the
    /// untouched packet to it.
    Handoff(u16),
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
    /// Sessions scheduled to the backend on this core.
    pub new_sessions: u64,
}

counter_set! {
    /// What one core's pipeline did, apart from drops.
    pub struct Events {
        /// Packets received by the pipeline.
        rx,
        /// Packets it sent.
        tx,
        /// Packets of existing flows forwarded in one pass (the fast path; part of `tx`).
        fast_path,
        /// Packets it handed to the host (ARP, ND, traffic not for the LB).
        to_kernel,
        /// Packets it handed to the worker that owns their session.
        handoff,
        /// Sessions created.
        sessions_created,
        /// ICMP echo replies sent for VIPs.
        icmp_echo_replies,
        /// ICMP errors generated (time exceeded, too big).
        icmp_errors_sent,
        /// ICMP errors about a session, translated and forwarded.
        icmp_errors_translated,
        /// TOA options inserted into handshake-completing ACKs.
        toa_inserted,
        /// TOA options not inserted (no room below the MTU, or no option space).
        toa_skipped,
        /// TCP resets sent: for connections whose backend was taken out, and for new
        /// connections to a service with no backend that takes them.
        tcp_resets_sent,
        /// SYNs answered with a SYN cookie by the SYN proxy (no session was created).
        syncookies_sent,
        /// ACKs that returned a valid SYN cookie: the proxy opened a backend connection.
        syncookies_valid,
        /// SYN-proxied connections spliced: the backend answered and the two halves joined.
        synproxy_spliced,
        /// Client data segments held while their backend handshake was pending.
        synproxy_held,
        /// Held segments delivered with the ACK that completed the backend's handshake.
        synproxy_held_sent,
        /// Half-open sessions ended to make room for a new connection (the budget was spent).
        half_open_evicted,
        /// Sessions opened by continuation: a TCP segment other than a SYN that matched no
        /// session, sent to its flow's consistent-hash backend (a flow another node served).
        continued,
        /// Continued sessions ended to make room (the continuation budget was
        /// spent: a flood of segments without sessions, or many flows moving at once).
        continued_evicted,
        /// Closed sessions (TIME_WAIT, CLOSE) ended to make room for a new connection in a
        /// full table, oldest first.
        closed_evicted,
        /// Later fragments forwarded as their datagram's first fragment was.
        fragments_forwarded,
        /// First fragments forwarded while the fragment table was full, or into a tunnel of
        /// the other family (their later fragments are then dropped).
        fragments_untracked,
        /// New flows of `quic` services sent to the backend whose server id their connection
        /// id carries.
        quic_by_server_id,
        /// New flows of `quic` services whose server id no eligible backend has: by the hash.
        quic_unknown_server_id,
        /// New flows of `quic` services without a usable server id (Initial and 0-RTT
        /// packets, version-0 or short ids, non-QUIC datagrams): by the hash.
        quic_by_hash,
        /// New flows of client-affinity services sent to the backend their client had.
        affinity_kept,
        /// New flows of client-affinity services whose client could not be remembered: the
        /// service's table was full of live entries.
        affinity_full,
    }
}

/// One core's counters. Only that core writes them; readers sum cores (see [`Counters::add`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    pub events: Events,
    pub drops: [u64; DropReason::COUNT],
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

    /// (name, count) of every drop reason.
    pub fn drop_counts(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        DropReason::ALL.iter().map(|r| (r.name(), self.dropped(*r)))
    }

    /// Adds another core's counters into these.
    pub fn add(&mut self, o: &Counters) {
        self.events.add(&o.events);
        for (a, b) in self.drops.iter_mut().zip(o.drops.iter()) {
            *a += b;
        }
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
            a.new_sessions += b.new_sessions;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cores_are_summed_on_read() {
        let mut a = Counters { events: Events { rx: 3, tx: 2, ..Default::default() }, ..Default::default() };
        a.drop(DropReason::NoSession);
        a.services = vec![ServiceCounters { packets: 1, bytes: 10, new_sessions: 1 }];
        let mut b = Counters { events: Events { rx: 5, to_kernel: 1, ..Default::default() }, ..Default::default() };
        b.drop(DropReason::NoSession);
        b.drop(DropReason::TableFull);
        b.services = vec![ServiceCounters { packets: 2, bytes: 20, new_sessions: 0 }; 2];
        b.backends = vec![BackendCounters { packets: 4, bytes: 40, new_sessions: 2 }];
        let mut total = Counters::default();
        total.add(&a);
        total.add(&b);
        assert_eq!((total.events.rx, total.events.tx, total.events.to_kernel), (8, 2, 1));
        assert_eq!(total.dropped(DropReason::NoSession), 2);
        assert_eq!(total.total_drops(), 3);
        assert_eq!(total.services[0], ServiceCounters { packets: 3, bytes: 30, new_sessions: 1 });
        assert_eq!(total.services.len(), 2);
        assert_eq!((total.backends[0].bytes, total.backends[0].new_sessions), (40, 2));
        assert_eq!(total.drop_counts().find(|(n, _)| *n == "no_session"), Some(("no_session", 2)));
    }

    #[test]
    fn lists_are_whole_and_ordered() {
        assert_eq!(DropReason::ALL.len(), DropReason::COUNT);
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i, "ALL is in discriminant order");
            assert!(r.help().ends_with('.') && !r.help().starts_with(' '), "{}: help is one trimmed sentence", r.name());
        }
        assert_eq!(Events::NAMES.len(), Events::HELP.len());
        let e = Events { handoff: 7, ..Default::default() };
        assert_eq!(e.iter().find(|(n, _, _)| *n == "handoff").map(|x| x.2), Some(7));
        assert!(e.iter().all(|(_, h, _)| h.ends_with('.')));
    }
}
