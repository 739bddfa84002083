//! Shared memory regions: memfd files mapped by both sides.
//!
//! The client creates every region (memfd, sealed against shrinking, on huge pages when asked)
//! and passes its descriptor to the server, which maps it. A region the peer sent is checked
//! before it is mapped: its file must be at least as large as announced and sealed against
//! shrinking, because a peer that truncated a mapped file after the fact would make every
//! later access beyond the new end fault (SIGBUS) in the data plane.
//!
//! Nothing here forms a Rust reference into a region: the peer writes the memory at any time,
//! so it is read and written only through raw pointers, and [`Region::span`] is the one place
//! an address inside a region is computed, after checking the bounds.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

/// The largest region either side maps (the address space and the memory are the data
/// plane's; a peer cannot ask for more).
pub const MAX_REGION: u64 = 1 << 32;

#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    #[error("region size {0} is outside 1..={MAX_REGION}")]
    Size(u64),
    #[error("the region's file is {actual} bytes, smaller than the {announced} announced")]
    Short { announced: u64, actual: u64 },
    #[error("the region's file is not sealed against shrinking (F_SEAL_SHRINK); a peer could truncate it under the mapping")]
    NotSealed,
    #[error("{what}: {source}")]
    Os { what: &'static str, source: io::Error },
}

fn os(what: &'static str) -> impl FnOnce(io::Error) -> RegionError {
    move |source| RegionError::Os { what, source }
}

/// One mapped region.
///
/// Invariant: `base` is the start of a live shared mapping of `len` bytes, owned by this
/// value; it lies inside a reservation `resv .. resv + resv_len` (the mapping with an
/// inaccessible guard on each side, for a peer's region) that Drop unmaps; `len` never
/// changes.
pub struct Region {
    base: NonNull<u8>,
    len: usize,
    resv: *mut u8,
    resv_len: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is process-wide memory, not tied to a thread; every access goes through
// raw pointers whose synchronisation the ring protocol provides.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` gives only addresses and the length.
unsafe impl Sync for Region {}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the reservation is ours (invariant), unmapped once.
        unsafe { libc::munmap(self.resv.cast(), self.resv_len) };
    }
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Region({} bytes, fd {})", self.len, self.fd.as_raw_fd())
    }
}

fn map(fd: &OwnedFd, len: usize) -> Result<NonNull<u8>, RegionError> {
    // SAFETY: a fresh shared mapping of a file we hold; the kernel checks the arguments.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
    if p == libc::MAP_FAILED {
        return Err(os("mmap")(io::Error::last_os_error()));
    }
    Ok(NonNull::new(p.cast()).expect("mmap returned NULL"))
}

/// Maps `len` bytes of `fd` between two inaccessible guards of `page` bytes (the file's page
/// size: huge pages need aligned addresses), so that an access just outside the region
/// faults instead of reading or writing whatever memory lies next to it. Returns the mapping
/// and the reservation.
fn map_guarded(fd: &OwnedFd, len: usize, page: usize) -> Result<(NonNull<u8>, *mut u8, usize), RegionError> {
    let body = len.next_multiple_of(page);
    let resv_len = body + 3 * page;
    // SAFETY: reserving address space only (no access, no memory).
    let r = unsafe { libc::mmap(std::ptr::null_mut(), resv_len, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0) };
    if r == libc::MAP_FAILED {
        return Err(os("mmap (reserve)")(io::Error::last_os_error()));
    }
    let r = r as *mut u8;
    // The first page-aligned address after one guard page.
    let start = ((r as usize + page).next_multiple_of(page)) as *mut u8;
    // SAFETY: start..start+body lies inside the reservation we own (start - r <= 2 * page
    // and body + 3 * page = resv_len); MAP_FIXED replaces only that part of it.
    let p = unsafe { libc::mmap(start.cast(), body, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_FIXED, fd.as_raw_fd(), 0) };
    if p == libc::MAP_FAILED {
        let e = io::Error::last_os_error();
        // SAFETY: our reservation.
        unsafe { libc::munmap(r.cast(), resv_len) };
        return Err(os("mmap")(e));
    }
    Ok((NonNull::new(p.cast()).expect("mmap returned NULL"), r, resv_len))
}

impl Region {
    /// Creates a region of `size` bytes (the client's side): a memfd, on huge pages when
    /// `hugepages` and the system has them (else normal pages), sealed against shrinking.
    pub fn create(name: &str, size: u64, hugepages: bool) -> Result<Region, RegionError> {
        if size == 0 || size > MAX_REGION {
            return Err(RegionError::Size(size));
        }
        let cname = std::ffi::CString::new(name.replace('\0', "")).expect("no NUL");
        let mut fd = -1;
        if hugepages {
            // SAFETY: a valid C string; memfd_create only creates a file.
            fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_ALLOW_SEALING | libc::MFD_HUGETLB | libc::MFD_CLOEXEC) };
        }
        let mut size_used = size;
        if fd < 0 {
            // SAFETY: as above.
            fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_ALLOW_SEALING | libc::MFD_CLOEXEC) };
            if fd < 0 {
                return Err(os("memfd_create")(io::Error::last_os_error()));
            }
        } else {
            size_used = size.next_multiple_of(2 << 20);
        }
        // SAFETY: memfd_create returned a fresh descriptor we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: a valid descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size_used as libc::off_t) } != 0 {
            let e = io::Error::last_os_error();
            if hugepages && size_used != size {
                // No free huge pages: normal pages then.
                return Region::create(name, size, false);
            }
            return Err(os("ftruncate")(e));
        }
        // SAFETY: a valid descriptor; adding seals only restricts later changes.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) } != 0 {
            return Err(os("F_ADD_SEALS")(io::Error::last_os_error()));
        }
        let base = match map(&fd, size_used as usize) {
            Ok(b) => b,
            Err(_) if hugepages && size_used != size => return Region::create(name, size, false),
            Err(e) => return Err(e),
        };
        Ok(Region { base, len: size_used as usize, resv: base.as_ptr(), resv_len: size_used as usize, fd })
    }

    /// Maps a region the peer sent (the server's side), after checking its file: at least
    /// `size` bytes, and sealed against shrinking unless `trust_unsealed`.
    pub fn from_peer(fd: OwnedFd, size: u64, trust_unsealed: bool) -> Result<Region, RegionError> {
        if size == 0 || size > MAX_REGION {
            return Err(RegionError::Size(size));
        }
        // SAFETY: fstat writes into the zeroed struct we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid descriptor and a valid out pointer.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(os("fstat")(io::Error::last_os_error()));
        }
        if (st.st_size as u64) < size || st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(RegionError::Short { announced: size, actual: st.st_size.max(0) as u64 });
        }
        // SAFETY: a valid descriptor; F_GET_SEALS only reads.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if !trust_unsealed && (seals < 0 || seals & libc::F_SEAL_SHRINK == 0) {
            return Err(RegionError::NotSealed);
        }
        // The file's page size: 4 KiB, or the huge page size on hugetlbfs.
        let page = (st.st_blksize as usize).clamp(4096, 1 << 30).next_power_of_two();
        let (base, resv, resv_len) = map_guarded(&fd, size as usize, page)?;
        Ok(Region { base, len: size as usize, resv, resv_len, fd })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    pub fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// The address of `len` bytes at `offset`, if they lie inside the region.
    #[inline(always)]
    pub fn span(&self, offset: u64, len: u64) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        if end > self.len as u64 {
            return None;
        }
        // SAFETY: offset + len <= self.len, so the result is inside (or one past) the mapping.
        Some(unsafe { self.base.as_ptr().add(offset as usize) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_region_is_checked_before_it_is_mapped() {
        let r = Region::create("t", 8192, false).unwrap();
        assert!(r.span(0, 8192).is_some());
        assert!(r.span(1, 8192).is_none());
        assert!(r.span(u64::MAX, 2).is_none());
        // SAFETY: dup of a valid descriptor.
        let dup = |fd: RawFd| unsafe { OwnedFd::from_raw_fd(libc::dup(fd)) };
        let m = Region::from_peer(dup(r.fd()), 8192, false).unwrap();
        // SAFETY: both map the same file; 4 bytes inside it.
        unsafe {
            r.base().write(42);
            assert_eq!(m.base().read_volatile(), 42);
        }
        assert!(matches!(Region::from_peer(dup(r.fd()), 8193, false), Err(RegionError::Short { .. })));
        assert!(matches!(Region::from_peer(dup(r.fd()), 0, false), Err(RegionError::Size(0))));
        // A memfd the peer did not seal: refused.
        // SAFETY: creating a file descriptor.
        let raw = unsafe { libc::memfd_create(c"unsealed".as_ptr(), 0) };
        // SAFETY: fresh descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: valid descriptor.
        assert_eq!(unsafe { libc::ftruncate(raw, 8192) }, 0);
        assert!(matches!(Region::from_peer(fd, 8192, false), Err(RegionError::NotSealed)));
        // Just past a peer's region is a guard: a read there faults (in a child process).
        let m = Region::from_peer(dup(r.fd()), 6000, false).unwrap();
        for (off, faults) in [(m.len() - 1, false), (8192, true), (8192 + 4095, true)] {
            // SAFETY: the child only reads one byte and exits; the parent waits for it.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: deliberately touching the guard (or the region's last byte).
                unsafe {
                    std::ptr::read_volatile(m.base().add(off));
                    libc::_exit(0);
                }
            }
            let mut status = 0;
            // SAFETY: waiting for our child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            assert_eq!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSEGV, faults, "offset {off}");
        }
        // The seal holds: the creator cannot shrink it either.
        // SAFETY: valid descriptor.
        assert_ne!(unsafe { libc::ftruncate(r.fd(), 4096) }, 0);
    }
}
