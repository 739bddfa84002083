//! What the pipeline knows of one packet between its stages ([`Meta`]: half a cache line per
//! packet of a batch), and what kind of packet it is. The features (`frag`, `icmp`,
//! `synproxy`) read it too, which is why it is not private to `pipeline.rs`.

use crate::rewrite::Hdr;
use crate::session::Ref;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Kind {
    #[default]
    Done,
    // The three kinds looked up by hash come first, together (one range test in stage 2).
    /// To a VIP service.
    Forward,
    /// From a NAT backend.
    NatReply,
    /// From an SNAT source to the outside.
    Snat,
    /// To a local address and port (full-NAT reply or SNAT return).
    PortReply,
    /// UDP from the outside to the inside of an `outbound_only` SNAT rule: marks the flow.
    SnatIn,
    /// ICMP / ICMPv6 (echo, errors): the slow path.
    Icmp,
    /// A first IP fragment (it has the ports): the slow path (`frag.rs`).
    Frag,
    /// A later IP fragment.
    FragLater,
}

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Meta {
    pub kind: Kind,
    pub v6: bool,
    pub proto: u8,
    pub tcp_flags: u8,
    /// Ethernet header and up to two VLAN tags: at most 22.
    pub l3: u8,
    pub l4: u16,
    pub end: u16,
    pub sport: u16,
    pub dport: u16,
    /// Service id, SNAT rule id, local address index, or NAT backend id, by kind.
    pub id: u32,
    pub hash: u64,
    /// Candidate record from stage 2 (raw reference, 0: none).
    pub cand: Option<Ref>,
    pub deep: bool,
    /// Sessions inserted (low 16 bits) when stage 2 looked: if more have been inserted since,
    /// a miss must look again (the flow may have been created by an earlier packet of the
    /// batch). Fewer than 2^16 are inserted between a packet's stages 2 and 3 (two groups).
    pub seen: u16,
}

// One per packet of a batch, rewritten for each: half a cache line.
const _: () = assert!(std::mem::size_of::<Meta>() == 32);

impl Meta {
    #[inline(always)]
    pub fn hdr(&self) -> Hdr {
        Hdr { l3: self.l3 as usize, l4: self.l4 as usize, end: self.end as usize, v6: self.v6, proto: self.proto }
    }
}
