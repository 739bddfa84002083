//! The files the daemon and the proxy keep (configuration, state, hand-off), written and read
//! without trusting what else is in their directory:
//!
//! * [`write_atomic`]: whole or not at all, with the mode (and owner) of the file it replaces,
//!   or a private mode for a new one; the temporary file is created exclusively and never
//!   through a link;
//! * [`read_private`]: only a regular file of this user that nobody else may write, opened
//!   without following a link and without blocking (a FIFO in its place cannot hang the
//!   reader), checked on the open descriptor (no window between a check and the open), and
//!   bounded in size;
//! * [`check_private_dir`]: a directory of this user (or root) that nobody else may write, not
//!   a link.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

fn refused(path: &Path, why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, format!("{}: {why}", path.display()))
}

/// A temporary file's name beside `path`, unique in this process.
fn temporary(path: &Path) -> io::Result<PathBuf> {
    static N: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("{}: no file name", path.display())))?;
    let n = N.fetch_add(1, Ordering::Relaxed);
    Ok(path.with_file_name(format!(".{}.{}.{n}.tmp", name.to_string_lossy(), std::process::id())))
}

/// The mode a file written by [`write_atomic`] gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The mode of the file it replaces, or this one for a new file.
    Keep(u32),
    /// This one, whatever the file it replaces had (a file that holds private keys).
    Always(u32),
}

/// Writes `data` to `path` as a whole or not at all: a new file beside it (created
/// exclusively, `O_NOFOLLOW`, mode 0600 while it is written), synced, given its [`Mode`] and
/// the owner of the regular file it replaces, then renamed over `path`. A `path` that exists
/// and is not a regular file (a directory, a device, a link) is refused.
pub fn write_atomic(path: &Path, data: &[u8], mode: Mode) -> io::Result<()> {
    stage(path, data, mode)?.commit()
}

/// A file written beside the one it is to replace, not yet renamed over it ([`stage`]);
/// removed when dropped uncommitted.
pub struct Staged {
    tmp: PathBuf,
    path: PathBuf,
    done: bool,
}

impl Staged {
    /// Renames it over the file it replaces.
    pub fn commit(mut self) -> io::Result<()> {
        self.done = true;
        std::fs::rename(&self.tmp, &self.path).inspect_err(|_| {
            let _ = std::fs::remove_file(&self.tmp);
        })
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// The first half of [`write_atomic`]: everything but the rename, so that a caller can act
/// between knowing the file can be written and replacing it.
pub fn stage(path: &Path, data: &[u8], mode: Mode) -> io::Result<Staged> {
    let old = match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_file() => Some(m),
        Ok(_) => return Err(refused(path, "not a regular file; not replaced")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    let mode = match (mode, &old) {
        (Mode::Keep(_), Some(m)) => m.mode() & 0o7777,
        (Mode::Keep(m) | Mode::Always(m), _) => m,
    };
    let tmp = temporary(path)?;
    let open = || OpenOptions::new().write(true).create_new(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).mode(0o600).open(&tmp);
    let mut f = match open() {
        // A leftover of an earlier process with this pid: unlink never follows a link.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(&tmp)?;
            open()?
        }
        r => r?,
    };
    let staged = Staged { tmp, path: path.to_path_buf(), done: false };
    f.write_all(data)?;
    if let Some(m) = &old {
        if m.uid() != euid() || m.gid() != f.metadata()?.gid() {
            std::os::unix::fs::fchown(&f, Some(m.uid()), Some(m.gid()))?;
        }
    }
    f.set_permissions(std::fs::Permissions::from_mode(mode))?;
    f.sync_all()?;
    Ok(staged)
}

/// Opens `path` for reading if it is a regular file of this user that nobody else may write:
/// without following a link (`O_NOFOLLOW`), without blocking (`O_NONBLOCK`: a FIFO put in its
/// place returns at once and is then refused), checked on the open descriptor.
pub fn open_private(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC).open(path).map_err(|e| {
        if e.raw_os_error() == Some(libc::ELOOP) {
            refused(path, "a symbolic link; not followed")
        } else {
            e
        }
    })?;
    let m = f.metadata()?;
    if !m.file_type().is_file() {
        return Err(refused(path, "not a regular file"));
    }
    if m.uid() != euid() || m.mode() & 0o022 != 0 {
        return Err(refused(path, "not this user's, or others may write it"));
    }
    Ok(f)
}

/// The bytes of `path`, opened as [`open_private`] opens it, if it holds at most `max`.
pub fn read_private(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let f = open_private(path)?;
    let len = f.metadata()?.len();
    if len > max {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("{}: {len} bytes, more than {max}", path.display())));
    }
    let mut b = Vec::with_capacity(len as usize);
    f.take(max + 1).read_to_end(&mut b)?;
    if b.len() as u64 > max {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("{}: grew past {max} bytes while read", path.display())));
    }
    Ok(b)
}

/// Whether `dir` is a directory (not a link) of this user or root that nobody else may write;
/// the reason when it is not.
pub fn check_private_dir(dir: &Path) -> io::Result<()> {
    let m = std::fs::symlink_metadata(dir)?;
    if !m.file_type().is_dir() {
        return Err(refused(dir, "not a directory (a link is not followed)"));
    }
    if (m.uid() != euid() && m.uid() != 0) || m.mode() & 0o022 != 0 {
        return Err(refused(dir, "a directory others may write, or another user's"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vectorlb-files-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn a_write_keeps_the_mode_of_what_it_replaces_and_is_private_when_new() {
        let d = dir("write");
        let p = d.join("a.toml");
        write_atomic(&p, b"one", Mode::Keep(0o600)).unwrap();
        assert_eq!((std::fs::read(&p).unwrap(), mode(&p)), (b"one".to_vec(), 0o600));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        write_atomic(&p, b"two", Mode::Keep(0o600)).unwrap();
        assert_eq!((std::fs::read(&p).unwrap(), mode(&p)), (b"two".to_vec(), 0o640));
        write_atomic(&p, b"two", Mode::Always(0o600)).unwrap();
        assert_eq!(mode(&p), 0o600);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        // Nothing is left beside it, and what is not a regular file is not replaced.
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
        std::os::unix::fs::symlink(&p, d.join("link")).unwrap();
        assert!(write_atomic(&d.join("link"), b"x", Mode::Keep(0o600)).unwrap_err().to_string().contains("not a regular file"));
        assert!(write_atomic(&d, b"x", Mode::Keep(0o600)).is_err());
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        // Staged and dropped: nothing changes, nothing is left.
        drop(stage(&p, b"three", Mode::Keep(0o600)).unwrap());
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 2, "a.toml and the link");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn only_a_private_regular_file_is_read_and_never_through_a_link_or_a_fifo() {
        let d = dir("read");
        let p = d.join("state");
        write_atomic(&p, b"ok", Mode::Keep(0o600)).unwrap();
        assert_eq!(read_private(&p, 10).unwrap(), b"ok");
        assert!(read_private(&p, 1).unwrap_err().to_string().contains("more than 1"));
        std::os::unix::fs::symlink(&p, d.join("link")).unwrap();
        assert!(read_private(&d.join("link"), 10).unwrap_err().to_string().contains("symbolic link"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o622)).unwrap();
        assert!(read_private(&p, 10).unwrap_err().to_string().contains("others may write"));
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let t = std::time::Instant::now();
        assert!(read_private(&fifo, 10).unwrap_err().to_string().contains("not a regular file"));
        assert!(t.elapsed() < std::time::Duration::from_secs(1), "a FIFO blocked the open");
        assert!(read_private(&d.join("none"), 10).unwrap_err().kind() == io::ErrorKind::NotFound);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_directory_others_may_write_or_a_link_is_not_private() {
        let d = dir("dirs");
        check_private_dir(&d).unwrap();
        let open = d.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(check_private_dir(&open).is_err());
        std::os::unix::fs::symlink(&d, d.join("link")).unwrap();
        assert!(check_private_dir(&d.join("link")).unwrap_err().to_string().contains("not a directory"));
        let _ = std::fs::remove_dir_all(&d);
    }
}
