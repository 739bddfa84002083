//! Addresses as map keys: IPv4 as IPv4-mapped IPv6, so one 128-bit key serves both families
//! (the services' tables, the routes, the policies' identities).

use std::net::IpAddr;

/// An IPv4 address as a key.
#[inline(always)]
pub fn key4(a: [u8; 4]) -> u128 {
    0xffff_0000_0000u128 | u32::from_be_bytes(a) as u128
}

#[inline(always)]
pub fn key6(a: [u8; 16]) -> u128 {
    u128::from_be_bytes(a)
}

pub fn key(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => key4(a.octets()),
        IpAddr::V6(a) => key6(a.octets()),
    }
}
