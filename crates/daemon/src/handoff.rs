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
pub use vectorlb_sync::handoff::{parse, Loaded, MAX_AGE};

pub const FILE: &str = "sessions.handoff";
/// The longest the stop spends writing (a huge table is cut short, not waited for).
const WRITE_LIMIT: Duration = Duration::from_secs(3);
/// The largest file read (16 M sessions' worth is far above any table).
const MAX_FILE: u64 = 2 << 30;

pub fn path(run_dir: &str) -> PathBuf {
    Path::new(run_dir).join(FILE)
}

/// Milliseconds since 1970 (0 if the clock is before it).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Writes every worker's sessions; how many.
pub fn save(workers: &Workers, run_dir: &str) -> io::Result<usize> {
    std::fs::create_dir_all(run_dir)?;
    vectorlb_http::files::check_private_dir(Path::new(run_dir))?;
    let file = path(run_dir);
    let mut out = vectorlb_sync::handoff::Writer::new(now_ms()).map_err(|_| io::Error::other("no random bytes for the file's key salt"))?;
    let t = Instant::now();
    'all: for w in 0..workers.len() {
        for v6 in [false, true] {
            let mut cursor = Some(0);
            while let Some(c) = cursor {
                if t.elapsed() > WRITE_LIMIT {
                    tracing::warn!("session handoff: cut short after {WRITE_LIMIT:?} ({} sessions written)", out.records);
                    break 'all;
                }
                let Ok((records, next)) = workers.export(w, v6, Export::All, c, 4096) else { break };
                out.push(w as u8, &records);
                cursor = next;
            }
        }
    }
    let n = out.records;
    vectorlb_http::files::write_atomic(&file, &out.finish(), vectorlb_http::files::Mode::Always(0o600))?;
    Ok(n)
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

    fn file(at: u64) -> Vec<u8> {
        let r = SyncRecord {
            proto: 6,
            vip: "10.96.0.10".parse().unwrap(),
            vport: 80,
            client: "10.244.1.5".parse().unwrap(),
            cport: 1,
            backend: "10.244.2.7".parse().unwrap(),
            bport: 8080,
            local: None,
            state: 3,
            flags: 0,
            expire_in: 30_000,
            adj: SeqAdj::default(),
        };
        let mut w = vectorlb_sync::handoff::Writer::new(at).unwrap();
        w.push(0, &[r]);
        w.finish()
    }

    #[test]
    fn the_file_is_taken_once_and_only_when_it_is_safe() {
        let dir = std::env::temp_dir().join(format!("vectorlb-handoff-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let d = dir.to_str().unwrap();
        assert_eq!(take(d), Ok(None));
        std::fs::write(path(d), file(now_ms())).unwrap();
        std::fs::set_permissions(path(d), std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        assert_eq!(take(d).unwrap().unwrap().records.len(), 1);
        assert_eq!(take(d), Ok(None), "removed after reading");
        std::fs::write(path(d), file(now_ms())).unwrap();
        std::fs::set_permissions(path(d), std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
        assert!(take(d).unwrap_err().contains("others may write"));
        assert!(!path(d).exists(), "a refused file is removed too");
        // A link to a good file (swapped in after any check by path) is not followed.
        let good = dir.join("elsewhere");
        std::fs::write(&good, file(now_ms())).unwrap();
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
        std::fs::write(path(d), file(now_ms())).unwrap();
        std::fs::set_permissions(path(d), std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        assert!(take(d).unwrap_err().contains("others may write"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
