//! Sessions carried across a planned restart (docs/operations.md): when the daemon stops on
//! SIGTERM, just before its workers stop, every worker's sessions are written to
//! `runtime.run_dir/sessions.handoff`; the next start reads them back into the same workers
//! (once its services are published) and removes the file. Connections in flight then keep
//! their backends and their NAT translations, as a standby keeps them from session sync: a NAT
//! reply that reaches the new daemon first finds its session, instead of being dropped or
//! routed untranslated.
//!
//! The file is the session sync's wire format (messages of up to 16 records, each with its
//! worker), after a header with the time it was written. It is written atomically with mode
//! 0600 (a temporary file created exclusively, never through a link) in the daemon's own
//! directory, which must be a directory of the daemon's user or root that nobody else may
//! write; a file that is not the daemon user's regular file (opened without following a link,
//! checked on the open descriptor), that others may write, that is older than [`MAX_AGE`] or
//! that does not parse is not used (and removed).
//! Records whose time ran out while the daemon was down are skipped; records for services or
//! backends the new configuration does not have are refused by the workers as sync refuses
//! them. A daemon killed (SIGKILL) writes nothing: its flows are continued by the L4 core's
//! stateless continuation where the scheduler allows it.

use crate::workers::Workers;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use vectorlb_lb::sync::{Export, SyncRecord};
use vectorlb_sync::{decode, encode, Message, Sealer, Secret, KIND_RECORDS, MAX_RECORDS};

pub const FILE: &str = "sessions.handoff";
const MAGIC: &[u8; 8] = b"VLBHOFF2";
/// The sealing secret: the file's protection is its owner and mode; the tag finds a damaged
/// file.
const KEY: &[u8] = b"vectorlb session handoff";
/// A file older than this is not used: its clients have given up or sent their next segments.
pub const MAX_AGE: Duration = Duration::from_secs(60);
/// The longest the stop spends writing (a huge table is cut short, not waited for).
const WRITE_LIMIT: Duration = Duration::from_secs(3);
/// The largest file read (16 M sessions' worth is far above any table).
const MAX_FILE: u64 = 2 << 30;

pub fn path(run_dir: &str) -> PathBuf {
    Path::new(run_dir).join(FILE)
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Writes every worker's sessions; how many.
pub fn save(workers: &Workers, run_dir: &str) -> io::Result<usize> {
    std::fs::create_dir_all(run_dir)?;
    vectorlb_http::files::check_private_dir(Path::new(run_dir))?;
    let file = path(run_dir);
    let mut out = Vec::with_capacity(1 << 16);
    let (t, mut n, mut seq) = (Instant::now(), 0usize, 0u64);
    let sealer = Sealer::new(&Secret::new(KEY)).map_err(|_| io::Error::other("no random bytes for the file's key salt"))?;
    let written = now_ms();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&written.to_be_bytes());
    'all: for w in 0..workers.len() {
        for v6 in [false, true] {
            let mut cursor = Some(0);
            while let Some(c) = cursor {
                if t.elapsed() > WRITE_LIMIT {
                    tracing::warn!("session handoff: cut short after {WRITE_LIMIT:?} ({n} sessions written)");
                    break 'all;
                }
                let Ok((records, next)) = workers.export(w, v6, Export::All, c, 4096) else { break };
                for chunk in records.chunks(MAX_RECORDS) {
                    seq += 1;
                    let m = Message { kind: KIND_RECORDS, epoch: 0, seq, ack: 0, request: 0, time_ms: written, records: chunk.iter().map(|r| (w as u8, *r)).collect() };
                    let b = encode(&m, &sealer);
                    out.extend_from_slice(&(b.len() as u32).to_be_bytes());
                    out.extend_from_slice(&b);
                    n += chunk.len();
                }
                cursor = next;
            }
        }
    }
    vectorlb_http::files::write_atomic(&file, &out, vectorlb_http::files::Mode::Always(0o600))?;
    Ok(n)
}

/// What [`read`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Loaded {
    /// By worker (as written).
    pub records: Vec<(u8, SyncRecord)>,
    /// Whose time ran out while the daemon was down.
    pub expired: usize,
    /// Milliseconds between writing and reading.
    pub age_ms: u64,
}

/// Parses a handoff file's bytes, read at `now_ms` (milliseconds since the epoch).
pub fn parse(b: &[u8], now_ms: u64) -> Result<Loaded, String> {
    if b.len() < 16 || &b[..8] != MAGIC {
        return Err("not a session handoff file".into());
    }
    let written = u64::from_be_bytes(b[8..16].try_into().expect("8 bytes"));
    let age_ms = now_ms.checked_sub(written).ok_or("written in the future (the clock moved back)")?;
    if age_ms > MAX_AGE.as_millis() as u64 {
        return Err(format!("written {} s ago: too old", age_ms / 1000));
    }
    let mut out = Loaded { age_ms, ..Default::default() };
    let mut rest = &b[16..];
    let secret = Secret::new(KEY);
    while !rest.is_empty() {
        let len = rest.get(..4).map(|l| u32::from_be_bytes(l.try_into().expect("4 bytes")) as usize).ok_or("cut short")?;
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

/// Reads and removes the file; its records for the workers, or why it was not used.
pub fn take(run_dir: &str) -> Result<Option<Loaded>, String> {
    let file = path(run_dir);
    match std::fs::symlink_metadata(&file) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", file.display())),
        Ok(_) => {}
    }
    let r = vectorlb_http::files::check_private_dir(Path::new(run_dir))
        .and_then(|()| vectorlb_http::files::read_private(&file, MAX_FILE))
        .map_err(|e| format!("{e}; not used"))
        .and_then(|b| parse(&b, now_ms()).map_err(|e| format!("{}: {e}; not used", file.display())));
    let _ = std::fs::remove_file(&file);
    r.map(Some)
}

/// Takes the previous run's sessions back into the workers (worker `w`'s to `w`, modulo
/// their number now).
pub fn restore(workers: &Workers, run_dir: &str) {
    match take(run_dir) {
        Ok(None) => {}
        Ok(Some(l)) => {
            let n = l.records.len();
            let mut by: Vec<Vec<SyncRecord>> = vec![Vec::new(); workers.len().max(1)];
            for (w, r) in l.records {
                by[w as usize % workers.len().max(1)].push(r);
            }
            for (w, v) in by.into_iter().enumerate() {
                if !v.is_empty() {
                    workers.install(w, v);
                }
            }
            tracing::info!("session handoff: {n} sessions of the previous run taken back ({} expired meanwhile; written {} ms before)", l.expired, l.age_ms);
        }
        Err(e) => tracing::warn!("session handoff: {e}"),
    }
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
            backend: "10.244.1.6".parse().unwrap(),
            bport: 8080,
            local: None,
            state: 1,
            flags: 0,
            expire_in,
            adj: SeqAdj::default(),
        }
    }

    fn file(at: u64, msgs: &[Vec<(u8, SyncRecord)>]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&at.to_be_bytes());
        let sealer = Sealer::new(&Secret::new(KEY)).unwrap();
        for (i, m) in msgs.iter().enumerate() {
            let b = encode(&Message { kind: KIND_RECORDS, epoch: 0, seq: i as u64, ack: 0, request: 0, time_ms: at, records: m.clone() }, &sealer);
            out.extend_from_slice(&(b.len() as u32).to_be_bytes());
            out.extend_from_slice(&b);
        }
        out
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
        assert!(parse(b"VLBHOFF1", 0).is_err());
        assert!(parse(b"something else entirely", 0).is_err());
        assert_eq!(parse(&file(5, &[]), 5).unwrap(), Loaded::default());
    }

    #[test]
    fn the_file_is_taken_once_and_only_when_it_is_safe() {
        let dir = std::env::temp_dir().join(format!("vectorlb-handoff-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let d = dir.to_str().unwrap();
        assert_eq!(take(d), Ok(None));
        std::fs::write(path(d), file(now_ms(), &[vec![(0, rec(1, 30_000))]])).unwrap();
        std::fs::set_permissions(path(d), std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        assert_eq!(take(d).unwrap().unwrap().records.len(), 1);
        assert_eq!(take(d), Ok(None), "removed after reading");
        std::fs::write(path(d), file(now_ms(), &[vec![(0, rec(1, 30_000))]])).unwrap();
        std::fs::set_permissions(path(d), std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
        assert!(take(d).unwrap_err().contains("others may write"));
        assert!(!path(d).exists(), "a refused file is removed too");
        // A link to a good file (swapped in after any check by path) is not followed.
        let good = dir.join("elsewhere");
        std::fs::write(&good, file(now_ms(), &[vec![(0, rec(1, 30_000))]])).unwrap();
        std::fs::set_permissions(&good, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&good, path(d)).unwrap();
        assert!(take(d).unwrap_err().contains("symbolic link"));
        assert!(good.exists() && std::fs::symlink_metadata(path(d)).is_err(), "the link removed, its target kept");
        // A FIFO in its place does not hang the start.
        let c = std::ffi::CString::new(path(d).to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(take(d).unwrap_err().contains("not a regular file"));
        // A run_dir others may write is not trusted, for reading or writing.
        std::fs::write(path(d), file(now_ms(), &[vec![(0, rec(1, 30_000))]])).unwrap();
        std::fs::set_permissions(path(d), std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        assert!(take(d).unwrap_err().contains("others may write"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
