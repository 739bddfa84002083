//! The session hand-off file's bytes (vectorlb-daemon's `handoff` writes and reads the file
//! across a planned restart): `VLBHOFF2`, the time it was written (ms since 1970, 8 bytes),
//! then messages of the sync wire format (up to 16 records each, with their workers), each
//! after its length (4 bytes). The messages are sealed under a fixed secret: the file's
//! protection is its owner and mode (the daemon checks both); the tag finds a damaged file.

use crate::{decode, encode, Message, Sealer, Secret, KIND_RECORDS, MAX_MESSAGE, MAX_RECORDS};
use std::time::Duration;
use vectorlb_lb::sync::SyncRecord;

pub const MAGIC: &[u8; 8] = b"VLBHOFF2";
const KEY: &[u8] = b"vectorlb session handoff";
/// A file older than this is not used: its clients have given up or sent their next segments.
pub const MAX_AGE: Duration = Duration::from_secs(60);

/// Builds a file's bytes.
pub struct Writer {
    out: Vec<u8>,
    sealer: Sealer,
    seq: u64,
    written_ms: u64,
    /// Records added.
    pub records: usize,
}

impl Writer {
    /// A file written at `now_ms`. Fails only if the system has no randomness (the key salt).
    pub fn new(now_ms: u64) -> Result<Writer, ring::error::Unspecified> {
        let sealer = Sealer::new(&Secret::new(KEY))?;
        let mut out = Vec::with_capacity(1 << 16);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&now_ms.to_be_bytes());
        Ok(Writer { out, sealer, seq: 0, written_ms: now_ms, records: 0 })
    }

    /// Adds worker `w`'s records (any number: messages of up to 16).
    pub fn push(&mut self, w: u8, records: &[SyncRecord]) {
        for chunk in records.chunks(MAX_RECORDS) {
            self.seq += 1;
            let m = Message { kind: KIND_RECORDS, epoch: 0, seq: self.seq, ack: 0, request: 0, time_ms: self.written_ms, records: chunk.iter().map(|r| (w, *r)).collect() };
            let b = encode(&m, &self.sealer);
            self.out.extend_from_slice(&(b.len() as u32).to_be_bytes());
            self.out.extend_from_slice(&b);
            self.records += chunk.len();
        }
    }

    pub fn finish(self) -> Vec<u8> {
        self.out
    }
}

/// What [`parse`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Loaded {
    /// By worker (as written).
    pub records: Vec<(u8, SyncRecord)>,
    /// Whose time ran out while the daemon was down.
    pub expired: usize,
    /// Milliseconds between writing and reading.
    pub age_ms: u64,
}

/// Parses a file's bytes, read at `now_ms` (milliseconds since 1970). A file that is not one,
/// too old, from the future, cut short, or with any message that fails is refused whole.
pub fn parse(b: &[u8], now_ms: u64) -> Result<Loaded, String> {
    if b.len() < 16 || &b[..8] != MAGIC {
        return Err("not a session handoff file (of this version)".into());
    }
    let written = u64::from_be_bytes(b[8..16].try_into().expect("8 bytes"));
    let age_ms = now_ms.checked_sub(written).ok_or("written in the future (the clock moved back)")?;
    if age_ms > MAX_AGE.as_millis() as u64 {
        return Err(format!("written {} s ago: too old", age_ms / 1000));
    }
    let secret = Secret::new(KEY);
    let mut out = Loaded { age_ms, ..Default::default() };
    let mut rest = &b[16..];
    while !rest.is_empty() {
        let len = rest.get(..4).map(|l| u32::from_be_bytes(l.try_into().expect("4 bytes")) as usize).ok_or("cut short")?;
        if len > MAX_MESSAGE {
            return Err(format!("a message of {len} bytes (at most {MAX_MESSAGE})"));
        }
        let m = rest.get(4..4 + len).ok_or("cut short")?;
        let msg = decode(m, &secret).map_err(|e| format!("a damaged message ({e:?})"))?;
        for (w, mut r) in msg.records {
            match r.expire_in.checked_sub(age_ms.min(u32::MAX as u64) as u32) {
                Some(left) if left > 0 => {
                    r.expire_in = left;
                    out.records.push((w, r));
                }
                _ => out.expired += 1,
            }
        }
        rest = &rest[4 + len..];
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vectorlb_lb::session::SeqAdj;

    fn rec(port: u16, expire_in: u32) -> SyncRecord {
        SyncRecord {
            proto: 6,
            vip: "10.96.0.10".parse().unwrap(),
            vport: 80,
            client: "10.244.1.5".parse().unwrap(),
            cport: port,
            backend: "10.244.2.7".parse().unwrap(),
            bport: 8080,
            local: None,
            state: 3,
            flags: 0,
            expire_in,
            adj: SeqAdj::default(),
        }
    }

    pub(crate) fn file(at: u64, msgs: &[Vec<(u8, SyncRecord)>]) -> Vec<u8> {
        let mut w = Writer::new(at).unwrap();
        for m in msgs {
            // One message per entry (the records of one worker each, as the daemon writes).
            for (k, r) in m {
                w.push(*k, std::slice::from_ref(r));
            }
        }
        w.finish()
    }

    #[test]
    fn records_come_back_with_the_time_they_have_left() {
        let f = file(1_000_000, &[vec![(0, rec(1, 30_000)), (1, rec(2, 500))], vec![(0, rec(3, 10_000))]]);
        let l = parse(&f, 1_001_000).unwrap();
        assert_eq!(l.age_ms, 1000);
        assert_eq!(l.expired, 1, "the one with 500 ms left expired during the second");
        assert_eq!(l.records.iter().map(|(w, r)| (*w, r.cport, r.expire_in)).collect::<Vec<_>>(), [(0, 1, 29_000), (0, 3, 9_000)]);
    }

    #[test]
    fn a_bad_file_is_refused_whole() {
        let good = file(1_000_000, &[vec![(0, rec(1, 30_000))]]);
        assert!(parse(&good, 1_000_000 + MAX_AGE.as_millis() as u64 + 1).unwrap_err().contains("too old"));
        assert!(parse(&good, 999_000).unwrap_err().contains("future"));
        assert!(parse(&good[..good.len() - 3], 1_000_100).unwrap_err().contains("cut short"));
        let mut bad = good.clone();
        let last = bad.len() - 40;
        bad[last] ^= 1;
        assert!(parse(&bad, 1_000_100).unwrap_err().contains("damaged"));
        let mut huge = good[..16].to_vec();
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse(&huge, 1_000_100).unwrap_err().contains("at most"));
        assert!(parse(b"VLBHOFF1\0\0\0\0\0\0\0\0", 0).unwrap_err().contains("not a session handoff file"), "the previous version's file");
        assert!(parse(b"something else entirely", 0).is_err());
        assert_eq!(parse(&file(5, &[]), 5).unwrap(), Loaded::default());
    }
}
