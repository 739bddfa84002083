//! A ring in shared memory: a 128-byte header (cookie, flags and `head` in the first cache
//! line, `tail` in the second) and 2^k 16-byte descriptors.
//!
//! `head` and `tail` are free-running 16-bit counters; a slot is `counter & (size - 1)`. The
//! client writes only `head` and the server only `tail`, on both kinds of ring: on a
//! client-to-server ring the client produces packets (head) and the server consumes them
//! (tail); on a server-to-client ring the client produces empty buffers (head) and the server
//! fills them (tail). Each side reads the other's index with acquire ordering and publishes its
//! own with release ordering, after its descriptor and buffer writes.
//!
//! Everything in a ring may be changed by the peer at any moment. [`Ring`] reads a descriptor
//! once into a local [`Desc`] (which is then checked against the regions before any copy) and
//! never forms a reference into the ring.

use crate::proto::RING_COOKIE;
use crate::region::Region;
use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};

pub const HEADER_LEN: usize = 128;
pub const DESC_LEN: usize = 16;
const OFF_COOKIE: usize = 0;
const OFF_FLAGS: usize = 4;
const OFF_HEAD: usize = 6;
const OFF_TAIL: usize = 64;

/// Ring flag: the ring's receiver polls; its sender need not signal the eventfd.
pub const RING_FLAG_MASK_INT: u16 = 1;
/// Descriptor flag: the packet continues in the next slot.
pub const DESC_FLAG_NEXT: u16 = 1;

/// The bytes a ring of 2^`log2` slots takes.
pub const fn ring_len(log2: u8) -> usize {
    HEADER_LEN + DESC_LEN * (1usize << log2)
}

/// A descriptor, as read from (or to be written to) a ring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Desc {
    pub flags: u16,
    pub region: u16,
    pub length: u32,
    pub offset: u32,
    pub metadata: u32,
}

/// A view of one ring inside a mapped region.
///
/// Invariant: `base` points at `ring_len(log2)` bytes inside a live mapping that the owner of
/// this view keeps alive (the connection holds the region), and `base` is 8-byte aligned, so
/// the header's atomics are aligned.
#[derive(Debug, Clone, Copy)]
pub struct Ring {
    base: *mut u8,
    mask: u16,
    log2: u8,
}

// SAFETY: a Ring is an address into shared memory, valid as long as its region (see the
// invariant); which thread uses it is up to the queue that owns it.
unsafe impl Send for Ring {}
// SAFETY: every access through `&Ring` is an atomic or volatile access to shared memory that
// another process writes concurrently anyway; sharing the view between threads adds nothing
// a peer could not already do.
unsafe impl Sync for Ring {}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    #[error("ring size 2^{0} is outside 2^1..=2^{max}", max = crate::proto::MAX_LOG2_RING)]
    Size(u8),
    #[error("ring at offset {offset} ({len} bytes) does not fit its region of {region} bytes")]
    Bounds { offset: u64, len: u64, region: u64 },
    #[error("ring at offset {0} is not 8-byte aligned")]
    Align(u64),
    #[error("ring cookie {0:#x}, not {RING_COOKIE:#x}")]
    Cookie(u32),
}

impl Ring {
    /// The ring of 2^`log2` slots at `offset` in `region`, checked to lie inside it.
    pub fn new(region: &Region, offset: u64, log2: u8) -> Result<Ring, RingError> {
        if !(1..=crate::proto::MAX_LOG2_RING).contains(&log2) {
            return Err(RingError::Size(log2));
        }
        let len = ring_len(log2) as u64;
        let base = region.span(offset, len).ok_or(RingError::Bounds { offset, len, region: region.len() as u64 })?;
        if !(base as usize).is_multiple_of(8) {
            return Err(RingError::Align(offset));
        }
        Ok(Ring { base, mask: (1u16 << log2).wrapping_sub(1), log2 })
    }

    pub fn size(&self) -> u16 {
        self.mask.wrapping_add(1)
    }

    pub fn log2(&self) -> u8 {
        self.log2
    }

    fn a16(&self, off: usize) -> &AtomicU16 {
        // SAFETY: off is a 2-aligned offset inside the header (invariant: base 8-aligned, the
        // header inside the mapping). AtomicU16 has u16's layout; the peer's concurrent
        // writes are what atomics are for.
        unsafe { &*(self.base.add(off) as *const AtomicU16) }
    }

    pub fn cookie(&self) -> u32 {
        // SAFETY: as a16, 4-aligned.
        unsafe { &*(self.base.add(OFF_COOKIE) as *const AtomicU32) }.load(Ordering::Relaxed)
    }

    /// Checks the cookie the client wrote.
    pub fn check_cookie(&self) -> Result<(), RingError> {
        match self.cookie() {
            RING_COOKIE => Ok(()),
            c => Err(RingError::Cookie(c)),
        }
    }

    /// The client's setup of a fresh ring: cookie, flags, indexes.
    pub fn init(&self) {
        // SAFETY: as cookie().
        unsafe { &*(self.base.add(OFF_COOKIE) as *const AtomicU32) }.store(RING_COOKIE, Ordering::Relaxed);
        self.set_flags(0);
        self.a16(OFF_HEAD).store(0, Ordering::Relaxed);
        self.a16(OFF_TAIL).store(0, Ordering::Release);
    }

    pub fn flags(&self) -> u16 {
        self.a16(OFF_FLAGS).load(Ordering::Relaxed)
    }

    pub fn set_flags(&self, f: u16) {
        self.a16(OFF_FLAGS).store(f, Ordering::Relaxed)
    }

    /// The head index, read with acquire ordering (the descriptors it covers are visible).
    #[inline(always)]
    pub fn head(&self) -> u16 {
        self.a16(OFF_HEAD).load(Ordering::Acquire)
    }

    #[inline(always)]
    pub fn tail(&self) -> u16 {
        self.a16(OFF_TAIL).load(Ordering::Acquire)
    }

    /// Publishes `head` after the writes it covers.
    #[inline(always)]
    pub fn set_head(&self, v: u16) {
        self.a16(OFF_HEAD).store(v, Ordering::Release)
    }

    #[inline(always)]
    pub fn set_tail(&self, v: u16) {
        self.a16(OFF_TAIL).store(v, Ordering::Release)
    }

    #[inline(always)]
    fn desc_ptr(&self, slot: u16) -> *mut u8 {
        // SAFETY: slot & mask < size, so the descriptor lies inside the ring (invariant).
        unsafe { self.base.add(HEADER_LEN + DESC_LEN * (slot & self.mask) as usize) }
    }

    /// Fetches descriptor `slot`'s cache line for writing (the server fills the buffers the
    /// client posted and writes their lengths back).
    #[inline(always)]
    pub fn prefetch_desc_for_write(&self, slot: u16) {
        vectorlb_io::prefetch_write(self.desc_ptr(slot));
    }

    /// Reads descriptor `slot` (any counter value; masked) once, into local memory.
    #[inline(always)]
    pub fn desc(&self, slot: u16) -> Desc {
        let p = self.desc_ptr(slot) as *const u64;
        // SAFETY: 16 bytes inside the ring, 8-byte aligned (the ring is, and descriptors start
        // at 128 + 16 i); volatile, because the peer may write them at any moment (the copy is
        // then whatever it wrote, and is checked before use).
        let (a, b) = unsafe { (u64::from_le(std::ptr::read_volatile(p)), u64::from_le(std::ptr::read_volatile(p.add(1)))) };
        Desc { flags: a as u16, region: (a >> 16) as u16, length: (a >> 32) as u32, offset: b as u32, metadata: (b >> 32) as u32 }
    }

    #[inline(always)]
    pub fn set_desc(&self, slot: u16, d: Desc) {
        let p = self.desc_ptr(slot) as *mut u64;
        let a = d.flags as u64 | (d.region as u64) << 16 | (d.length as u64) << 32;
        let b = d.offset as u64 | (d.metadata as u64) << 32;
        // SAFETY: as desc().
        unsafe {
            std::ptr::write_volatile(p, a.to_le());
            std::ptr::write_volatile(p.add(1), b.to_le());
        }
    }

    /// Writes only the length and flags of descriptor `slot` (a server filling a buffer the
    /// client posted leaves its region and offset as they are).
    #[inline(always)]
    pub fn set_len_flags(&self, slot: u16, length: u32, flags: u16) {
        let p = self.desc_ptr(slot);
        // SAFETY: inside the descriptor; flags at 0 (2-aligned), length at 4 (4-aligned).
        unsafe {
            std::ptr::write_volatile(p as *mut u16, flags.to_le());
            std::ptr::write_volatile(p.add(4) as *mut u32, length.to_le());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_and_bounds() {
        let r = Region::create("ring", 4096 * 8, false).unwrap();
        assert!(matches!(Ring::new(&r, 0, 0), Err(RingError::Size(0))));
        assert!(matches!(Ring::new(&r, 0, 15), Err(RingError::Size(15))));
        assert!(matches!(Ring::new(&r, 4, 2), Err(RingError::Align(4))));
        assert!(matches!(Ring::new(&r, 32768 - 128, 2), Err(RingError::Bounds { .. })));
        let ring = Ring::new(&r, 0, 10).unwrap();
        assert!(matches!(ring.check_cookie(), Err(RingError::Cookie(0))));
        ring.init();
        ring.check_cookie().unwrap();
        ring.set_head(5);
        ring.set_tail(3);
        ring.set_flags(RING_FLAG_MASK_INT);
        let d = Desc { flags: DESC_FLAG_NEXT, region: 1, length: 1500, offset: 0x10000, metadata: 9 };
        ring.set_desc(1024 + 2, d);
        assert_eq!(ring.desc(2), d, "slots wrap");
        ring.set_len_flags(2, 64, 0);
        assert_eq!(ring.desc(2), Desc { flags: 0, length: 64, ..d });
        // SAFETY: reading bytes of the mapping to check the layout.
        let bytes = unsafe { std::slice::from_raw_parts(r.base(), 256) };
        assert_eq!(&bytes[0..4], &crate::proto::RING_COOKIE.to_le_bytes());
        assert_eq!(&bytes[4..8], &[1, 0, 5, 0]);
        assert_eq!(&bytes[64..66], &[3, 0]);
        assert_eq!(&bytes[128 + 32..128 + 36], &[0, 0, 1, 0], "desc 2 at 128 + 32: flags, region");
    }
}
