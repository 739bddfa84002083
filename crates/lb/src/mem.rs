//! Large fixed-capacity arrays in anonymous memory.
//!
//! The session table and its index are sized for the configured maximum up front, but the
//! kernel only backs the pages that are touched, so resident memory grows with the number of
//! live sessions. Transparent huge pages are requested (`MADV_HUGEPAGE`) to keep TLB misses off
//! the per-packet path.

use std::io;
use std::marker::PhantomData;

/// Types whose all-zero bit pattern is a valid value.
///
/// # Safety
/// Implement only for plain-old-data types (integers, arrays and `repr(C)` structs of them).
pub unsafe trait Zeroable: Copy {}

// SAFETY: every bit pattern, zero included, is a valid unsigned integer.
unsafe impl Zeroable for u8 {}
// SAFETY: as above.
unsafe impl Zeroable for u16 {}
// SAFETY: as above.
unsafe impl Zeroable for u32 {}
// SAFETY: as above.
unsafe impl Zeroable for u64 {}

pub struct MmapArray<T: Zeroable> {
    ptr: *mut T,
    len: usize,
    bytes: usize,
    _own: PhantomData<T>,
}

// SAFETY: the array owns its mapping exclusively; T is plain data.
unsafe impl<T: Zeroable + Send> Send for MmapArray<T> {}

impl<T: Zeroable> MmapArray<T> {
    /// Maps `len` zeroed elements. Nothing is resident until written or read.
    pub fn new(len: usize) -> io::Result<Self> {
        let len = len.max(1);
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "array too large"))?;
        // SAFETY: an anonymous private mapping with no address hint; the result is checked.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), bytes, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: advisory only, on the mapping just created; failure is harmless.
        unsafe {
            libc::madvise(p, bytes, libc::MADV_HUGEPAGE);
        }
        Ok(MmapArray { ptr: p as *mut T, len, bytes, _own: PhantomData })
    }

    #[inline(always)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Makes every page resident now, so that the first packets do not pay the page faults (a
    /// transparent huge page fault zeroes 2 MB and may compact memory: milliseconds in all).
    pub fn prefault(&mut self) {
        let base = self.ptr as *mut u8;
        let mut off = 0;
        while off < self.bytes {
            // SAFETY: off < bytes, inside the mapping, and &mut self excludes other access;
            // writing back the byte just read leaves the contents unchanged.
            unsafe { std::ptr::write_volatile(base.add(off), std::ptr::read_volatile(base.add(off))) };
            off += 4096;
        }
    }

    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline(always)]
    pub fn as_slice(&self) -> &[T] {
        // SAFETY: ptr maps len zero-initialised Ts (valid by Zeroable) for the life of self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    #[inline(always)]
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as above, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Hints the CPU to fetch element `i` into cache. Any index may be given: a prefetch never
    /// faults, and one outside the array only wastes the hint (so none is checked).
    #[inline(always)]
    pub fn prefetch(&self, i: usize) {
        vectorlb_io::prefetch(self.ptr.wrapping_add(i) as *const u8);
    }
}

impl<T: Zeroable> Drop for MmapArray<T> {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the region mapped in new().
        unsafe {
            libc::munmap(self.ptr as *mut libc::c_void, self.bytes);
        }
    }
}

/// Resident set size of this process in bytes (from /proc/self/statm).
pub fn resident_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    Some(pages * page)
}
