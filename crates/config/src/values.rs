//! Values every section uses: addresses, prefixes, durations, timeouts.

use crate::error::{bail, Error};
use crate::file::RawTimeouts;
use std::net::IpAddr;
use vectorlb_lb::Timeouts;

pub(crate) fn ip(field: &str, s: &str) -> Result<IpAddr, Error> {
    s.parse().map_err(|_| Error::invalid(format!("{field}: '{s}' is not an IP address")))
}

/// "10.0.0.0/24" or "2001:db8::/64"; a bare address is a host prefix.
pub fn prefix(field: &str, s: &str) -> Result<(IpAddr, u8), Error> {
    let (a, l) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let addr = ip(field, a)?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let len = match l {
        None => max,
        Some(l) => match l.parse::<u8>() {
            Ok(n) if n <= max => n,
            _ => bail!("{field}: '{s}' has an invalid prefix length (0..={max})"),
        },
    };
    Ok((addr, len))
}

/// `a` with every bit past `len` cleared: the network it is in.
pub fn masked(a: IpAddr, len: u8) -> IpAddr {
    match a {
        IpAddr::V4(v) => {
            let m = if len == 0 { 0 } else { u32::MAX << (32 - u32::from(len.min(32))) };
            IpAddr::V4((u32::from(v) & m).into())
        }
        IpAddr::V6(v) => {
            let m = if len == 0 { 0 } else { u128::MAX << (128 - u32::from(len.min(128))) };
            IpAddr::V6((u128::from(v) & m).into())
        }
    }
}

pub(crate) fn ms(field: &str, v: Option<f64>, default: u32) -> Result<u32, Error> {
    match v {
        None => Ok(default),
        Some(x) if x.is_finite() && (0.0..=1_000_000.0).contains(&x) => Ok((x * 1000.0).round() as u32),
        Some(x) => bail!("{field}: {x} is not a number of seconds in 0..=1000000"),
    }
}

pub(crate) fn timeouts(field: &str, r: &RawTimeouts, base: &Timeouts) -> Result<Timeouts, Error> {
    let t = Timeouts {
        syn: ms(&format!("{field}.syn"), r.syn, base.syn)?,
        established: ms(&format!("{field}.established"), r.established, base.established)?,
        fin: ms(&format!("{field}.fin"), r.fin, base.fin)?,
        time_wait: ms(&format!("{field}.time_wait"), r.time_wait, base.time_wait)?,
        close: ms(&format!("{field}.close"), r.close, base.close)?,
        udp: ms(&format!("{field}.udp"), r.udp, base.udp)?,
    };
    for (n, v) in [("syn", t.syn), ("established", t.established), ("fin", t.fin), ("udp", t.udp)] {
        if v == 0 {
            bail!("{field}.{n}: must be above 0 (only time_wait and close may be 0)");
        }
    }
    Ok(t)
}
