//! memif 2.0 control messages: 128 bytes each on a `SOCK_SEQPACKET` socket, little-endian,
//! a 16-bit type at offset 0 and the body from offset 2. [`Msg::decode`] takes any bytes (a
//! peer's message is untrusted) and returns a message or an error naming what is wrong; it
//! never panics (fuzzed: `fuzz/fuzz_targets/memif_msg.rs`).

/// Every control message is this long.
pub const MSG_LEN: usize = 128;
/// Protocol version 2.0: major in the high byte.
pub const VERSION: u16 = 0x0200;
/// The cookie at the start of every ring.
pub const RING_COOKIE: u32 = 0x03E3_1F20;
/// Names (interface, application) are NUL-terminated in 32 bytes.
pub const NAME_LEN: usize = 32;
/// The shared secret, NUL-terminated in 24 bytes (at most 23 characters).
pub const SECRET_LEN: usize = 24;
/// A disconnect reason, NUL-terminated in 96 bytes.
pub const REASON_LEN: usize = 96;
/// The largest ring a peer may ask for: 2^14 slots.
pub const MAX_LOG2_RING: u8 = 14;

/// `ADD_RING` flag: a client-to-server ring (libmemif's S2M); clear for server-to-client.
pub const RING_FLAG_C2S: u16 = 1;

/// Interface modes (`INIT.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    Ethernet = 0,
    Ip = 1,
    PuntInject = 2,
}

impl Mode {
    pub fn from_u8(v: u8) -> Option<Mode> {
        match v {
            0 => Some(Mode::Ethernet),
            1 => Some(Mode::Ip),
            2 => Some(Mode::PuntInject),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Ethernet => "ethernet",
            Mode::Ip => "ip",
            Mode::PuntInject => "punt-inject",
        }
    }
}

/// Sent by the server when a client connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub name: String,
    pub min_version: u16,
    pub max_version: u16,
    /// The highest region index the server accepts (a count minus one).
    pub max_region: u16,
    /// The highest server-to-client ring index (a count minus one).
    pub max_s2c_ring: u16,
    /// The highest client-to-server ring index (a count minus one).
    pub max_c2s_ring: u16,
    pub max_log2_ring_size: u8,
}

/// The client's first message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Init {
    pub version: u16,
    pub id: u32,
    /// The raw mode byte (checked by the server, which names an unknown one).
    pub mode: u8,
    /// The secret's bytes up to the first NUL.
    pub secret: Vec<u8>,
    pub name: String,
}

/// A shared region; its memfd travels with the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddRegion {
    pub index: u16,
    pub size: u64,
}

/// A ring inside a region; its eventfd travels with the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddRing {
    pub flags: u16,
    pub index: u16,
    pub region: u16,
    /// Byte offset of the ring header in the region.
    pub offset: u32,
    pub log2_size: u8,
    pub private_hdr_size: u16,
}

impl AddRing {
    pub fn c2s(&self) -> bool {
        self.flags & RING_FLAG_C2S != 0
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    Ack,
    Hello(Hello),
    Init(Init),
    AddRegion(AddRegion),
    AddRing(AddRing),
    Connect { if_name: String },
    Connected { if_name: String },
    Disconnect { code: u32, reason: String },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("message of {0} bytes, not {MSG_LEN}")]
    Size(usize),
    #[error("unknown message type {0}")]
    Type(u16),
}

pub const T_NONE: u16 = 0;
pub const T_ACK: u16 = 1;
pub const T_HELLO: u16 = 2;
pub const T_INIT: u16 = 3;
pub const T_ADD_REGION: u16 = 4;
pub const T_ADD_RING: u16 = 5;
pub const T_CONNECT: u16 = 6;
pub const T_CONNECTED: u16 = 7;
pub const T_DISCONNECT: u16 = 8;

fn u16_at(b: &[u8; MSG_LEN], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}

fn u32_at(b: &[u8; MSG_LEN], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8; MSG_LEN], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

/// The bytes of a NUL-terminated field up to its first NUL (all of it without one).
fn cbytes(b: &[u8]) -> &[u8] {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    &b[..end]
}

/// A name field as text; bytes that are not UTF-8 are replaced (names are for logs).
fn cstr(b: &[u8]) -> String {
    String::from_utf8_lossy(cbytes(b)).into_owned()
}

/// Writes `s` NUL-terminated into `dst`, cut to `dst.len() - 1` bytes.
fn put_cstr(dst: &mut [u8], s: &[u8]) {
    let n = s.len().min(dst.len() - 1);
    dst[..n].copy_from_slice(&s[..n]);
    dst[n..].fill(0);
}

/// As [`put_cstr`] for text, cut at a character boundary (and at a NUL, which ends it).
fn put_str(dst: &mut [u8], s: &str) {
    let s = s.split('\0').next().unwrap_or("");
    let mut n = s.len().min(dst.len() - 1);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    put_cstr(dst, &s.as_bytes()[..n]);
}

impl Msg {
    /// The type number on the wire.
    pub fn type_id(&self) -> u16 {
        match self {
            Msg::Ack => T_ACK,
            Msg::Hello(_) => T_HELLO,
            Msg::Init(_) => T_INIT,
            Msg::AddRegion(_) => T_ADD_REGION,
            Msg::AddRing(_) => T_ADD_RING,
            Msg::Connect { .. } => T_CONNECT,
            Msg::Connected { .. } => T_CONNECTED,
            Msg::Disconnect { .. } => T_DISCONNECT,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Msg::Ack => "ACK",
            Msg::Hello(_) => "HELLO",
            Msg::Init(_) => "INIT",
            Msg::AddRegion(_) => "ADD_REGION",
            Msg::AddRing(_) => "ADD_RING",
            Msg::Connect { .. } => "CONNECT",
            Msg::Connected { .. } => "CONNECTED",
            Msg::Disconnect { .. } => "DISCONNECT",
        }
    }

    pub fn encode(&self) -> [u8; MSG_LEN] {
        let mut b = [0u8; MSG_LEN];
        b[0..2].copy_from_slice(&self.type_id().to_le_bytes());
        match self {
            Msg::Ack => {}
            Msg::Hello(h) => {
                put_str(&mut b[2..2 + NAME_LEN], &h.name);
                b[34..36].copy_from_slice(&h.min_version.to_le_bytes());
                b[36..38].copy_from_slice(&h.max_version.to_le_bytes());
                b[38..40].copy_from_slice(&h.max_region.to_le_bytes());
                b[40..42].copy_from_slice(&h.max_s2c_ring.to_le_bytes());
                b[42..44].copy_from_slice(&h.max_c2s_ring.to_le_bytes());
                b[44] = h.max_log2_ring_size;
            }
            Msg::Init(i) => {
                b[2..4].copy_from_slice(&i.version.to_le_bytes());
                b[4..8].copy_from_slice(&i.id.to_le_bytes());
                b[8] = i.mode;
                put_cstr(&mut b[9..9 + SECRET_LEN], &i.secret);
                put_str(&mut b[33..33 + NAME_LEN], &i.name);
            }
            Msg::AddRegion(r) => {
                b[2..4].copy_from_slice(&r.index.to_le_bytes());
                b[4..12].copy_from_slice(&r.size.to_le_bytes());
            }
            Msg::AddRing(r) => {
                b[2..4].copy_from_slice(&r.flags.to_le_bytes());
                b[4..6].copy_from_slice(&r.index.to_le_bytes());
                b[6..8].copy_from_slice(&r.region.to_le_bytes());
                b[8..12].copy_from_slice(&r.offset.to_le_bytes());
                b[12] = r.log2_size;
                b[13..15].copy_from_slice(&r.private_hdr_size.to_le_bytes());
            }
            Msg::Connect { if_name } | Msg::Connected { if_name } => put_str(&mut b[2..2 + NAME_LEN], if_name),
            Msg::Disconnect { code, reason } => {
                b[2..6].copy_from_slice(&code.to_le_bytes());
                put_str(&mut b[6..6 + REASON_LEN], reason);
            }
        }
        b
    }

    /// Decodes one message. Field values are not judged here (the state machines do, with the
    /// peer told why); only the size and the type.
    pub fn decode(bytes: &[u8]) -> Result<Msg, DecodeError> {
        let b: &[u8; MSG_LEN] = bytes.try_into().map_err(|_| DecodeError::Size(bytes.len()))?;
        Ok(match u16_at(b, 0) {
            T_ACK => Msg::Ack,
            T_HELLO => Msg::Hello(Hello {
                name: cstr(&b[2..2 + NAME_LEN]),
                min_version: u16_at(b, 34),
                max_version: u16_at(b, 36),
                max_region: u16_at(b, 38),
                max_s2c_ring: u16_at(b, 40),
                max_c2s_ring: u16_at(b, 42),
                max_log2_ring_size: b[44],
            }),
            T_INIT => Msg::Init(Init { version: u16_at(b, 2), id: u32_at(b, 4), mode: b[8], secret: cbytes(&b[9..9 + SECRET_LEN]).to_vec(), name: cstr(&b[33..33 + NAME_LEN]) }),
            T_ADD_REGION => Msg::AddRegion(AddRegion { index: u16_at(b, 2), size: u64_at(b, 4) }),
            T_ADD_RING => {
                Msg::AddRing(AddRing { flags: u16_at(b, 2), index: u16_at(b, 4), region: u16_at(b, 6), offset: u32_at(b, 8), log2_size: b[12], private_hdr_size: u16_at(b, 13) })
            }
            T_CONNECT => Msg::Connect { if_name: cstr(&b[2..2 + NAME_LEN]) },
            T_CONNECTED => Msg::Connected { if_name: cstr(&b[2..2 + NAME_LEN]) },
            T_DISCONNECT => Msg::Disconnect { code: u32_at(b, 2), reason: cstr(&b[6..6 + REASON_LEN]) },
            t => return Err(DecodeError::Type(t)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_at_their_offsets() {
        let msgs = [
            Msg::Ack,
            Msg::Hello(Hello {
                name: "DPDK 22.11.11".into(),
                min_version: VERSION,
                max_version: VERSION,
                max_region: 255,
                max_s2c_ring: 255,
                max_c2s_ring: 255,
                max_log2_ring_size: 14,
            }),
            Msg::Init(Init { version: VERSION, id: 7, mode: 0, secret: b"s3cret".to_vec(), name: "vectorlb".into() }),
            Msg::AddRegion(AddRegion { index: 0, size: 8_454_656 }),
            Msg::AddRing(AddRing { flags: RING_FLAG_C2S, index: 1, region: 0, offset: 16512, log2_size: 10, private_hdr_size: 0 }),
            Msg::Connect { if_name: "net_memif0".into() },
            Msg::Connected { if_name: "memif0".into() },
            Msg::Disconnect { code: 0, reason: "ID not found".into() },
        ];
        for m in msgs {
            let b = m.encode();
            assert_eq!(Msg::decode(&b).unwrap(), m);
        }
        // Offsets as DPDK lays them out (checked against its header).
        let b = Msg::AddRing(AddRing { flags: 1, index: 2, region: 3, offset: 0x01020304, log2_size: 10, private_hdr_size: 0 }).encode();
        assert_eq!(&b[..15], &[5, 0, 1, 0, 2, 0, 3, 0, 4, 3, 2, 1, 10, 0, 0]);
        let b = Msg::Init(Init { version: VERSION, id: 0x0a0b0c0d, mode: 0, secret: vec![], name: "x".into() }).encode();
        assert_eq!(&b[..10], &[3, 0, 0, 2, 0x0d, 0x0c, 0x0b, 0x0a, 0, 0]);
        assert_eq!(b[33], b'x');
        let b = Msg::Hello(Hello { name: String::new(), min_version: 1, max_version: 2, max_region: 3, max_s2c_ring: 4, max_c2s_ring: 5, max_log2_ring_size: 6 }).encode();
        assert_eq!(&b[34..45], &[1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6]);
    }

    #[test]
    fn long_names_are_cut_and_terminated_and_bad_input_is_an_error() {
        let long = "n".repeat(100);
        let b = Msg::Connect { if_name: long.clone() }.encode();
        assert_eq!(b[2 + NAME_LEN - 1], 0);
        assert_eq!(Msg::decode(&b).unwrap(), Msg::Connect { if_name: "n".repeat(31) });
        let b = Msg::Init(Init { version: VERSION, id: 0, mode: 0, secret: vec![b's'; 40], name: long }).encode();
        let Msg::Init(i) = Msg::decode(&b).unwrap() else { panic!() };
        assert_eq!(i.secret.len(), 23);
        assert_eq!(Msg::decode(&[0u8; 127]), Err(DecodeError::Size(127)));
        assert_eq!(Msg::decode(&[0u8; 129]), Err(DecodeError::Size(129)));
        assert_eq!(Msg::decode(&[0u8; 128]), Err(DecodeError::Type(0)));
        let mut b = [0xffu8; 128];
        b[0] = 9;
        b[1] = 0;
        assert_eq!(Msg::decode(&b), Err(DecodeError::Type(9)));
        // Names without a NUL and with bytes that are not UTF-8 still decode.
        let mut b = [0xffu8; 128];
        b[0] = T_CONNECTED as u8;
        b[1] = 0;
        assert!(matches!(Msg::decode(&b), Ok(Msg::Connected { .. })));
    }
}
