//! Zero-copy packet views, builders and checksums.
//!
//! Each header has a typed view over a byte buffer (`Ipv4Packet<T: AsRef<[u8]>>` and so on) with
//! `new_unchecked` for the hot path and `new_checked` that validates lengths first, one accessor
//! per field, and setters where `T: AsMut<[u8]>`. Malformed input is an [`Error`], never a panic:
//! every `new_checked` and [`parse_frame`] is fuzzed (see `fuzz/`).
//!
//! [`builder::Builder`] constructs whole frames with correct checksums for tests, fixtures and
//! benchmarks; the data plane itself only uses the views.

pub mod arp;
pub mod builder;
pub mod checksum;
pub mod ethernet;
pub mod icmp;
pub mod ipv4;
pub mod ipv6;
pub mod parse;
pub mod tcp;
pub mod udp;
pub mod vnet;

pub use parse::{parse_frame, Family, Frag, FrameInfo};

/// Why a buffer could not be read as the header asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The buffer ends before the header (or a length field) says it should.
    #[error("packet truncated")]
    Truncated,
    /// A field holds a value the header does not allow (version, header length, option length).
    #[error("malformed header")]
    Malformed,
}

pub type Result<T> = std::result::Result<T, Error>;

/// IP protocol numbers used by the data plane.
pub mod proto {
    pub const HOPOPT: u8 = 0;
    pub const ICMP: u8 = 1;
    pub const IPIP: u8 = 4;
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
    pub const IPV6: u8 = 41;
    pub const IPV6_ROUTE: u8 = 43;
    pub const IPV6_FRAG: u8 = 44;
    pub const ESP: u8 = 50;
    pub const AH: u8 = 51;
    pub const ICMPV6: u8 = 58;
    pub const IPV6_NONXT: u8 = 59;
    pub const IPV6_OPTS: u8 = 60;
}

#[inline(always)]
pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

#[inline(always)]
pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline(always)]
pub(crate) fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}
