//! The wire format of session synchronisation between HA nodes (vectorlb-daemon's `sync`
//! streams it over UDP; the tools' forger writes it): a 40-byte header (`VLBS`, version, kind,
//! sender epoch, sequence, record count), 98-byte session records (the last 16: the SYN
//! proxy's sequence translation), and an HMAC-SHA256 over everything before it, under the HA
//! group's key. A message whose HMAC fails or that is cut short or malformed is refused whole.
//!
//! A record's first byte is the family of its client, VIP and local address (4 or 6); its
//! sixth holds flags: [`HAS_LOCAL`], and [`BACKEND_OTHER_FAMILY`] for a tunnel to a backend of
//! the other family (IPv4-in-IPv6 and the reverse).

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use vectorlb_lb::session::SeqAdj;
use vectorlb_lb::sync::SyncRecord;

pub const MAGIC: &[u8; 4] = b"VLBS";
pub const VERSION: u8 = 2;
pub const HEADER: usize = 40;
pub const RECORD: usize = 98;
pub const MAC: usize = 32;
pub const MAX_RECORDS: usize = 16;

pub const KIND_RECORDS: u8 = 1;
pub const KIND_ACK: u8 = 2;
pub const KIND_BULK_REQUEST: u8 = 3;
pub const KIND_BULK_DONE: u8 = 4;

/// Record flag: a full-NAT local address and port follow.
pub const HAS_LOCAL: u8 = 1;
/// Record flag: the backend's address is of the other family than the client's.
pub const BACKEND_OTHER_FAMILY: u8 = 2;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub kind: u8,
    pub epoch: u64,
    pub seq: u64,
    /// ACK: the sequence acknowledged.
    pub ack: u64,
    /// (worker on the sender, record)
    pub records: Vec<(u8, SyncRecord)>,
}

fn put_ip(out: &mut Vec<u8>, a: IpAddr) {
    match a {
        IpAddr::V4(x) => {
            out.extend_from_slice(&x.octets());
            out.extend_from_slice(&[0; 12]);
        }
        IpAddr::V6(x) => out.extend_from_slice(&x.octets()),
    }
}

fn get_ip(b: &[u8], v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&b[..16]).unwrap()))
    } else {
        IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
    }
}

pub fn encode(m: &Message, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + m.records.len() * RECORD + MAC);
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.push(m.kind);
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&m.epoch.to_be_bytes());
    out.extend_from_slice(&m.seq.to_be_bytes());
    out.extend_from_slice(&(m.records.len() as u16).to_be_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&m.ack.to_be_bytes());
    out.extend_from_slice(&[0; 4]);
    for (w, r) in &m.records {
        let local = r.local;
        out.push(if r.client.is_ipv6() { 6 } else { 4 });
        out.push(r.proto);
        out.push(r.state);
        out.push(r.flags);
        out.push(*w);
        let other = r.backend.is_ipv6() != r.client.is_ipv6();
        out.push(if local.is_some() { HAS_LOCAL } else { 0 } | if other { BACKEND_OTHER_FAMILY } else { 0 });
        out.extend_from_slice(&r.cport.to_be_bytes());
        out.extend_from_slice(&r.vport.to_be_bytes());
        out.extend_from_slice(&r.bport.to_be_bytes());
        out.extend_from_slice(&local.map(|l| l.1).unwrap_or(0).to_be_bytes());
        out.extend_from_slice(&r.expire_in.to_be_bytes());
        put_ip(&mut out, r.client);
        put_ip(&mut out, r.vip);
        put_ip(&mut out, r.backend);
        put_ip(&mut out, local.map(|l| l.0).unwrap_or(r.client));
        let a = &r.adj;
        out.extend_from_slice(&a.seq.to_be_bytes());
        out.extend_from_slice(&a.ts.to_be_bytes());
        out.extend_from_slice(&a.client_ts.to_be_bytes());
        out.extend_from_slice(&a.client_win.to_be_bytes());
        out.push(a.wscale);
        out.push(a.opts);
    }
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(&out);
    out.extend_from_slice(&mac.finalize().into_bytes());
    out
}

/// Why a message was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Truncated,
    BadMac,
    Malformed,
    Replayed,
}

pub fn decode(b: &[u8], key: &[u8]) -> Result<Message, Refused> {
    if b.len() < HEADER + MAC {
        return Err(Refused::Truncated);
    }
    let (body, tag) = b.split_at(b.len() - MAC);
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(body);
    mac.verify_slice(tag).map_err(|_| Refused::BadMac)?;
    if &body[..4] != MAGIC || body[4] != VERSION {
        return Err(Refused::Malformed);
    }
    let be64 = |o: usize| u64::from_be_bytes(body[o..o + 8].try_into().unwrap());
    let be16 = |o: usize| u16::from_be_bytes([body[o], body[o + 1]]);
    let count = be16(24) as usize;
    if body.len() != HEADER + count * RECORD || count > MAX_RECORDS {
        return Err(Refused::Malformed);
    }
    let mut records = Vec::with_capacity(count);
    for i in 0..count {
        let r = &body[HEADER + i * RECORD..HEADER + (i + 1) * RECORD];
        let v6 = match r[0] {
            4 => false,
            6 => true,
            _ => return Err(Refused::Malformed),
        };
        if r[5] & !(HAS_LOCAL | BACKEND_OTHER_FAMILY) != 0 {
            return Err(Refused::Malformed);
        }
        let p16 = |o: usize| u16::from_be_bytes([r[o], r[o + 1]]);
        let rec = SyncRecord {
            proto: r[1],
            state: r[2],
            flags: r[3],
            cport: p16(6),
            vport: p16(8),
            bport: p16(10),
            expire_in: u32::from_be_bytes(r[14..18].try_into().unwrap()),
            client: get_ip(&r[18..], v6),
            vip: get_ip(&r[34..], v6),
            backend: get_ip(&r[50..], v6 != (r[5] & BACKEND_OTHER_FAMILY != 0)),
            local: (r[5] & HAS_LOCAL != 0).then(|| (get_ip(&r[66..], v6), p16(12))),
            adj: SeqAdj {
                seq: u32::from_be_bytes(r[82..86].try_into().unwrap()),
                ts: u32::from_be_bytes(r[86..90].try_into().unwrap()),
                client_ts: u32::from_be_bytes(r[90..94].try_into().unwrap()),
                client_win: p16(94),
                wscale: r[96],
                opts: r[97],
            },
        };
        records.push((r[4], rec));
    }
    Ok(Message { kind: body[5], epoch: be64(8), seq: be64(16), ack: be64(28), records })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(i: u16) -> (u8, SyncRecord) {
        (
            (i % 3) as u8,
            SyncRecord {
                proto: 6,
                vip: "10.0.0.100".parse().unwrap(),
                vport: 80,
                client: "10.0.0.2".parse().unwrap(),
                cport: 40000 + i,
                backend: "10.1.0.11".parse().unwrap(),
                bport: 8080,
                local: i.is_multiple_of(2).then(|| ("10.1.0.200".parse().unwrap(), 1024 + i)),
                state: 3,
                flags: 0x08,
                expire_in: 900_000,
                adj: Default::default(),
            },
        )
    }

    #[test]
    fn messages_round_trip_and_refuse_tampering() {
        let key = b"0123456789abcdef-key";
        let mut m = Message { kind: KIND_RECORDS, epoch: 77, seq: 5, ack: 0, records: (0..16).map(rec).collect() };
        let v6 = SyncRecord {
            client: "2001:db8::2".parse().unwrap(),
            vip: "2001:db8::100".parse().unwrap(),
            backend: "2001:db8:1::11".parse().unwrap(),
            local: Some(("2001:db8:1::200".parse().unwrap(), 7)),
            ..m.records[0].1
        };
        m.records[3] = (1, v6);
        // Tunnels to a backend of the other family: IPv4-in-IPv6 and the reverse.
        m.records[5].1.backend = "2001:db8:1::12".parse().unwrap();
        m.records[7].1 = SyncRecord { backend: "10.1.0.13".parse().unwrap(), local: None, ..v6 };
        // A SYN-proxied session carries its translation.
        let adj = SeqAdj { seq: 0xdead_beef, ts: 0x0102_0304, client_ts: 7, client_win: 502, wscale: 0x57, opts: 0x07 };
        m.records[4].1 = SyncRecord { flags: 0x48, adj, ..m.records[4].1 };
        let b = encode(&m, key);
        assert_eq!(b.len(), HEADER + 16 * RECORD + MAC);
        assert_eq!(decode(&b, key), Ok(m.clone()));
        // A wrong key, any flipped bit, a cut: refused.
        assert_eq!(decode(&b, b"another-key-0123456"), Err(Refused::BadMac));
        for i in [0, 5, 30, HEADER + 7, b.len() - 1] {
            let mut t = b.clone();
            t[i] ^= 1;
            assert_eq!(decode(&t, key), Err(Refused::BadMac), "bit flipped at {i}");
        }
        assert_eq!(decode(&b[..b.len() - 1], key), Err(Refused::BadMac));
        assert_eq!(decode(&b[..20], key), Err(Refused::Truncated));
        // Signed but inconsistent (count says 17 records): malformed.
        let mut body = b[..b.len() - MAC].to_vec();
        body[24..26].copy_from_slice(&17u16.to_be_bytes());
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap();
        mac.update(&body);
        body.extend_from_slice(&mac.finalize().into_bytes());
        assert_eq!(decode(&body, key), Err(Refused::Malformed));
        // Signed but with an unknown record flag: malformed.
        let mut body = b[..b.len() - MAC].to_vec();
        body[HEADER + 5] |= 0x80;
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap();
        mac.update(&body);
        body.extend_from_slice(&mac.finalize().into_bytes());
        assert_eq!(decode(&body, key), Err(Refused::Malformed));
    }
}
