//! QUIC connection-id routing for UDP services with `quic = true` (docs/scale-out.md), in the
//! scheme Katran uses: a backend writes its server id into the destination connection ids it
//! hands out, so a packet that carries one reaches that backend whatever its 5-tuple (a client
//! that changed address, a flow that moved to another node of the cluster).
//!
//! The destination connection id (at least 8 bytes) carries its layout version in the top two
//! bits of its first byte:
//! - version 1: a 16-bit server id, the low 6 bits of byte 0, byte 1, the top 2 bits of byte 2;
//! - version 2: a 24-bit server id in bytes 1..4;
//! - version 3: a 32-bit server id in bytes 1..5;
//! - version 0: no server id.
//!
//! Short-header packets (first bit 0) carry the id right after the first byte. Long-header
//! packets (first bit 1: version, then the id's length and the id) carry it too, except
//! Initial and 0-RTT packets, whose id the client chose: those go by the hash, as every packet
//! without a usable id does. Server id 0 is no server id.

/// How a QUIC packet is to be routed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// By the server id its connection id carries.
    ServerId(u32),
    /// By the flow's hash: an Initial or 0-RTT packet, an id of version 0, shorter than 8
    /// bytes, or with server id 0, or a datagram too short to hold one.
    Hash,
}

/// The shortest destination connection id that may carry a server id.
pub const MIN_CID_LEN: usize = 8;

/// Where `payload` (a UDP datagram's payload) is to go.
pub fn route(payload: &[u8]) -> Route {
    let Some(&first) = payload.first() else { return Route::Hash };
    let cid = if first & 0x80 != 0 {
        // Long header: type in bits 4-5; Initial (0) and 0-RTT (1) carry the client's id.
        if matches!((first >> 4) & 0x3, 0 | 1) {
            return Route::Hash;
        }
        let Some(&len) = payload.get(5) else { return Route::Hash };
        let len = len as usize;
        if len < MIN_CID_LEN {
            return Route::Hash;
        }
        match payload.get(6..6 + len) {
            Some(c) => c,
            None => return Route::Hash,
        }
    } else {
        match payload.get(1..1 + MIN_CID_LEN) {
            Some(c) => c,
            None => return Route::Hash,
        }
    };
    let id = match cid[0] >> 6 {
        1 => ((cid[0] as u32 & 0x3f) << 10) | ((cid[1] as u32) << 2) | (cid[2] as u32 >> 6),
        2 => u32::from_be_bytes([0, cid[1], cid[2], cid[3]]),
        3 => u32::from_be_bytes([cid[1], cid[2], cid[3], cid[4]]),
        _ => 0,
    };
    if id == 0 {
        Route::Hash
    } else {
        Route::ServerId(id)
    }
}

/// The largest server id of a connection-id version (what a backend's `quic_id` may be).
pub fn max_server_id(version: u8) -> u32 {
    match version {
        1 => 0xffff,
        2 => 0xff_ffff,
        _ => u32::MAX,
    }
}

/// A destination connection id of `version` carrying `id` (8 bytes; the rest zero): what a
/// backend would hand out, for tests and tools.
pub fn connection_id(version: u8, id: u32) -> [u8; 8] {
    let mut c = [0u8; 8];
    match version {
        1 => {
            c[0] = 0x40 | ((id >> 10) as u8 & 0x3f);
            c[1] = (id >> 2) as u8;
            c[2] = ((id & 0x3) as u8) << 6;
        }
        2 => {
            c[0] = 0x80;
            c[1..4].copy_from_slice(&id.to_be_bytes()[1..]);
        }
        _ => {
            c[0] = 0xc0;
            c[1..5].copy_from_slice(&id.to_be_bytes());
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn short(cid: &[u8]) -> Vec<u8> {
        let mut p = vec![0x40];
        p.extend_from_slice(cid);
        p.extend_from_slice(&[0xaa; 20]);
        p
    }

    fn long(kind: u8, cid: &[u8]) -> Vec<u8> {
        let mut p = vec![0xc0 | (kind << 4), 0, 0, 0, 1, cid.len() as u8];
        p.extend_from_slice(cid);
        p.extend_from_slice(&[8, 1, 2, 3, 4, 5, 6, 7, 8]);
        p
    }

    #[test]
    fn every_version_round_trips() {
        for (v, id) in [(1, 1), (1, 0xffff), (1, 0x1234), (2, 0xab_cdef), (3, 0xdead_beef), (3, 7)] {
            let c = connection_id(v, id);
            assert_eq!(route(&short(&c)), Route::ServerId(id), "v{v} {id:#x}");
            // Handshake (2) and Retry (3) long headers carry the server's id too.
            assert_eq!(route(&long(2, &c)), Route::ServerId(id));
            assert_eq!(route(&long(3, &c)), Route::ServerId(id));
            // Initial (0) and 0-RTT (1): the client's id, by the hash.
            assert_eq!(route(&long(0, &c)), Route::Hash);
            assert_eq!(route(&long(1, &c)), Route::Hash);
            assert!(id <= max_server_id(v));
        }
    }

    #[test]
    fn what_has_no_usable_id_goes_by_the_hash() {
        assert_eq!(route(&[]), Route::Hash);
        assert_eq!(route(&short(&[0x00; 8])), Route::Hash, "version 0");
        assert_eq!(route(&short(&connection_id(2, 0))), Route::Hash, "server id 0");
        assert_eq!(route(&[0x40, 0x80, 1, 2]), Route::Hash, "cut short");
        assert_eq!(route(&long(2, &[0x80, 1, 2, 3])), Route::Hash, "a 4-byte id");
        let mut cut = long(2, &connection_id(3, 9));
        cut.truncate(10);
        assert_eq!(route(&cut), Route::Hash);
        // Never a panic, whatever the bytes.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for n in 0..50_000usize {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let p: Vec<u8> = (0..n % 40).map(|i| (x >> (i % 8 * 8)) as u8).collect();
            let _ = route(&p);
        }
    }
}
