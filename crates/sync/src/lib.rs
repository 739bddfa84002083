//! The wire format of session synchronisation between HA nodes (vectorlb-daemon's `sync`
//! streams it over UDP; the session hand-off file and the tools' forger write it too).
//!
//! A message is a 64-byte header in the clear and up to 16 session records of 98 bytes (the
//! last 16: the SYN proxy's sequence translation), encrypted and authenticated with
//! AES-256-GCM: a listener on the sync network learns which nodes talk and how much, not
//! which sessions exist. The header is the AEAD's associated data (authenticated, not
//! hidden):
//!
//! ```text
//!  0..4   "VLBS"          4  version (3)    5  kind      6..8  record count
//!  8..16  sender epoch (its start, µs)      16..24 sequence (per sender epoch, from 1)
//! 24..32  ack: the sequence acknowledged (ACK), the records a bulk transfer sent (BULK_DONE),
//!         or what a record message is (0 a change, 1 bulk, 2 refresh)
//! 32..40  request: the bulk request a bulk record or BULK_DONE answers (BULK_REQUEST: its own)
//! 40..48  the sender's clock (ms since 1970)  48..64 the sender's salt
//! ```
//!
//! Keys: the group's secret (`ha.sync_key`) is reduced once with HKDF-SHA256; each sender
//! draws a random 16-byte salt when it starts ([`Sealer::new`]) and seals under the key
//! expanded from the secret with that salt, with the message's sequence number as the nonce.
//! A sender never uses a sequence twice under one salt, so no nonce repeats under a key, at any
//! rate or uptime (random 96-bit nonces under one group key would, after ~2^32 messages, come
//! closer to a repeat than GCM allows). The receiver expands the key from the header's salt
//! (one HMAC) for each message.
//!
//! A message cut short, with a bad header or length, whose tag fails, or whose records do not
//! parse is refused whole ([`Refused`]); nothing of it is used. Replay and freshness (the
//! sequence window per sender, the clock) are the receiver's: [`decode`] only says what the
//! message is.
//!
//! A record's first byte is the family of its client, VIP and local address (4 or 6); its
//! sixth holds flags: [`HAS_LOCAL`], and [`BACKEND_OTHER_FAMILY`] for a tunnel to a backend of
//! the other family (IPv4-in-IPv6 and the reverse).

pub mod handoff;

use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM};
use ring::hkdf::{Prk, Salt, HKDF_SHA256};
use ring::rand::{SecureRandom, SystemRandom};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use vectorlb_lb::session::SeqAdj;
use vectorlb_lb::sync::SyncRecord;

pub const MAGIC: &[u8; 4] = b"VLBS";
pub const VERSION: u8 = 3;
pub const HEADER: usize = 64;
pub const RECORD: usize = 98;
/// The authentication tag after the records.
pub const TAG: usize = 16;
pub const MAX_RECORDS: usize = 16;
/// The longest message: a full one.
pub const MAX_MESSAGE: usize = HEADER + MAX_RECORDS * RECORD + TAG;
const SALT: usize = 16;

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
    /// Unique per sender epoch: the AEAD's nonce.
    pub seq: u64,
    /// ACK: the sequence acknowledged; BULK_DONE: the records sent; RECORDS: 0 a change, 1
    /// bulk, 2 refresh.
    pub ack: u64,
    /// The bulk request a bulk record message or BULK_DONE answers; a BULK_REQUEST's own.
    pub request: u64,
    /// The sender's clock when it sealed the message, ms since 1970 (the receiver's freshness
    /// check).
    pub time_ms: u64,
    /// (worker on the sender, record)
    pub records: Vec<(u8, SyncRecord)>,
}

/// The group's secret, reduced once (HKDF extract); what a receiver needs.
pub struct Secret(Prk);

impl Secret {
    pub fn new(secret: &[u8]) -> Secret {
        Secret(Salt::new(HKDF_SHA256, b"vectorlb session sync v3").extract(secret))
    }

    fn key(&self, salt: &[u8]) -> LessSafeKey {
        let info = [salt];
        let okm = self.0.expand(&info, &AES_256_GCM).expect("HKDF-SHA256 yields a 32-byte key");
        LessSafeKey::new(UnboundKey::from(okm))
    }
}

/// One sender's sealing key: the secret expanded with a salt of its own.
pub struct Sealer {
    salt: [u8; SALT],
    key: LessSafeKey,
}

impl Sealer {
    /// A new random salt (a sender's start). Fails only if the system has no randomness.
    pub fn new(secret: &Secret) -> Result<Sealer, ring::error::Unspecified> {
        let mut salt = [0u8; SALT];
        SystemRandom::new().fill(&mut salt)?;
        Ok(Sealer::with_salt(secret, salt))
    }

    /// A given salt: tests and the fuzzer only (a salt used twice with the same sequences
    /// repeats nonces).
    pub fn with_salt(secret: &Secret, salt: [u8; SALT]) -> Sealer {
        Sealer { salt, key: secret.key(&salt) }
    }
}

fn nonce(seq: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&seq.to_be_bytes());
    Nonce::assume_unique_for_key(n)
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
        IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&b[..16]).expect("16 bytes")))
    } else {
        IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
    }
}

/// The header and the records in the clear (what [`seal`] encrypts).
pub fn plain(m: &Message, salt: &[u8; 16]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + m.records.len() * RECORD + TAG);
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.push(m.kind);
    out.extend_from_slice(&(m.records.len() as u16).to_be_bytes());
    for v in [m.epoch, m.seq, m.ack, m.request, m.time_ms] {
        out.extend_from_slice(&v.to_be_bytes());
    }
    out.extend_from_slice(salt);
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
    out
}

/// Encrypts what follows the header in place and appends the tag, with the header (its
/// sequence the nonce) as associated data. `b` must hold at least a header; the sealer's
/// caller never seals two messages with one sequence.
pub fn seal(mut b: Vec<u8>, sealer: &Sealer) -> Vec<u8> {
    assert!(b.len() >= HEADER, "a sync message has a header");
    let seq = u64::from_be_bytes(b[16..24].try_into().expect("8 bytes"));
    let (head, body) = b.split_at_mut(HEADER);
    let tag: Tag = sealer.key.seal_in_place_separate_tag(nonce(seq), Aad::from(&*head), body).expect("a message far below GCM's length limit");
    b.extend_from_slice(tag.as_ref());
    b
}

/// A whole message, sealed. Its sequence must be new for this sealer.
pub fn encode(m: &Message, sealer: &Sealer) -> Vec<u8> {
    seal(plain(m, &sealer.salt), sealer)
}

/// Why a message was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Shorter than a header and a tag.
    Truncated,
    /// The authentication tag failed: another key, or altered on the way.
    BadMac,
    /// Not this version's header, a length that is not its record count's, an unknown record
    /// family or flag.
    Malformed,
    /// Authentic, but already seen (the receiver's window).
    Replayed,
    /// Authentic, but sealed too long ago by the sender's clock (the receiver's check).
    Outdated,
}

/// Checks and opens a message. The cheap checks (length, header, count) come before the
/// key is expanded and the tag checked; nothing is parsed before the tag holds.
pub fn decode(b: &[u8], secret: &Secret) -> Result<Message, Refused> {
    if b.len() < HEADER + TAG {
        return Err(Refused::Truncated);
    }
    if &b[..4] != MAGIC || b[4] != VERSION {
        return Err(Refused::Malformed);
    }
    let be64 = |o: usize| u64::from_be_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    let count = u16::from_be_bytes([b[6], b[7]]) as usize;
    if count > MAX_RECORDS || b.len() != HEADER + count * RECORD + TAG {
        return Err(Refused::Malformed);
    }
    let (head, rest) = b.split_at(HEADER);
    let key = secret.key(&head[48..64]);
    let mut body = rest.to_vec();
    let records_plain = key.open_in_place(nonce(be64(16)), Aad::from(head), &mut body).map_err(|_| Refused::BadMac)?;
    let mut records = Vec::with_capacity(count);
    for r in records_plain.chunks_exact(RECORD) {
        let v6 = match r[0] {
            4 => false,
            6 => true,
            _ => return Err(Refused::Malformed),
        };
        if r[5] & !(HAS_LOCAL | BACKEND_OTHER_FAMILY) != 0 {
            return Err(Refused::Malformed);
        }
        let p16 = |o: usize| u16::from_be_bytes([r[o], r[o + 1]]);
        let p32 = |o: usize| u32::from_be_bytes(r[o..o + 4].try_into().expect("4 bytes"));
        let rec = SyncRecord {
            proto: r[1],
            state: r[2],
            flags: r[3],
            cport: p16(6),
            vport: p16(8),
            bport: p16(10),
            expire_in: p32(14),
            client: get_ip(&r[18..], v6),
            vip: get_ip(&r[34..], v6),
            backend: get_ip(&r[50..], v6 != (r[5] & BACKEND_OTHER_FAMILY != 0)),
            local: (r[5] & HAS_LOCAL != 0).then(|| (get_ip(&r[66..], v6), p16(12))),
            adj: SeqAdj { seq: p32(82), ts: p32(86), client_ts: p32(90), client_win: p16(94), wscale: r[96], opts: r[97] },
        };
        records.push((r[4], rec));
    }
    Ok(Message { kind: b[5], epoch: be64(8), seq: be64(16), ack: be64(24), request: be64(32), time_ms: be64(40), records })
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

    fn message() -> Message {
        let mut m = Message { kind: KIND_RECORDS, epoch: 77, seq: 5, ack: 1, request: 0xfeed, time_ms: 1_700_000_000_000, records: (0..16).map(rec).collect() };
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
        m
    }

    #[test]
    fn messages_round_trip_and_refuse_tampering() {
        let secret = Secret::new(b"0123456789abcdef-key");
        let sealer = Sealer::new(&secret).unwrap();
        let m = message();
        let b = encode(&m, &sealer);
        assert_eq!(b.len(), MAX_MESSAGE);
        assert_eq!(decode(&b, &secret), Ok(m.clone()));
        // Another sender (its own salt) decodes under the same secret.
        let other = Sealer::new(&secret).unwrap();
        assert_ne!(other.salt, sealer.salt);
        assert_eq!(decode(&encode(&m, &other), &secret), Ok(m.clone()));
        // A wrong key, any flipped bit of the authenticated header or of the sealed records,
        // a cut: refused, nothing parsed.
        assert_eq!(decode(&b, &Secret::new(b"another-key-0123456")), Err(Refused::BadMac));
        for i in [8, 16, 24, 32, 40, 48, 63, HEADER, HEADER + 7, b.len() - 1] {
            let mut t = b.clone();
            t[i] ^= 1;
            assert_eq!(decode(&t, &secret), Err(Refused::BadMac), "bit flipped at {i}");
        }
        for i in [0, 4, 6, 7] {
            let mut t = b.clone();
            t[i] ^= 1;
            assert_eq!(decode(&t, &secret), Err(Refused::Malformed), "header byte {i}");
        }
        assert_eq!(decode(&b[..b.len() - 1], &secret), Err(Refused::Malformed));
        assert_eq!(decode(&b[..HEADER + TAG - 1], &secret), Err(Refused::Truncated));
        // Sealed, but with an unknown record family or flag: malformed.
        for (at, v) in [(0, 5u8), (5, 0x80)] {
            let mut p = plain(&m, &sealer.salt);
            p[HEADER + at] = v;
            assert_eq!(decode(&seal(p, &sealer), &secret), Err(Refused::Malformed));
        }
        // An empty message (an ACK, a BULK_REQUEST) is sealed too.
        let ack = Message { kind: KIND_ACK, epoch: 77, seq: 6, ack: 5, request: 0, time_ms: 1, records: Vec::new() };
        let b = encode(&ack, &sealer);
        assert_eq!(b.len(), HEADER + TAG);
        assert_eq!(decode(&b, &secret), Ok(ack));
    }

    #[test]
    fn a_listener_learns_no_addresses() {
        let secret = Secret::new(b"0123456789abcdef-key");
        let m = message();
        let b = encode(&m, &Sealer::new(&secret).unwrap());
        let p = plain(&m, &[0; 16]);
        // No address of any record appears in what goes on the wire (in the clear it does).
        for (_, r) in &m.records {
            for a in [r.client, r.vip, r.backend] {
                let n = match a {
                    IpAddr::V4(x) => x.octets().to_vec(),
                    IpAddr::V6(x) => x.octets().to_vec(),
                };
                let found = |hay: &[u8]| hay.windows(n.len()).any(|w| w == &n[..]);
                assert!(found(&p[HEADER..]), "the clear text has {a}");
                assert!(!found(&b[HEADER..]), "{a} is visible on the wire");
            }
        }
    }
}
