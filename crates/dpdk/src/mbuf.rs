//! Packet buffers: DPDK mbufs as the I/O seam's [`Packet`].
//!
//! The hot path reads and writes the few mbuf fields it needs directly; `csrc/shim.c` asserts
//! their offsets at build time, so a DPDK release that moves them fails the build.

use crate::ffi;
use std::ptr::NonNull;
use vectorlb_io::{Offload, Packet, PacketBuf, PacketMeta};

const OFF_DATA_OFF: usize = 16;
const OFF_NB_SEGS: usize = 20;
const OFF_PORT: usize = 22;
const OFF_PKT_LEN: usize = 36;
const OFF_DATA_LEN: usize = 40;
/// `hash.rss`, the receive hash.
const OFF_HASH: usize = 44;
/// Our receive queue (u16) and class (u8), in `hash.fdir.hi`, which we do not use.
const OFF_QUEUE: usize = 48;
const OFF_CLASS: usize = 50;
const OFF_BUF_LEN: usize = 54;
/// `tx_offload`, which holds a frame's [`Offload`] (segment size in the low 16 bits, the
/// partial checksum in bit 16): DPDK reads it only for offloads requested in `ol_flags`, which
/// vectorlb never sets. Cleared when an mbuf is allocated (DPDK's reset) and on every receive.
const OFF_TX_OFFLOAD: usize = 72;

/// An owned mbuf. Dropping it frees it (the whole chain) back to its pool.
///
/// Invariant: the pointer is a valid `rte_mbuf` that this value exclusively owns, with
/// `data_off + data_len <= buf_len` (DPDK's own invariant, kept by every method here).
#[repr(transparent)]
pub struct Mbuf(NonNull<u8>);

// SAFETY: an mbuf may move between threads with its ownership (DPDK does this across lcores);
// nothing in it is tied to the thread that allocated it.
unsafe impl Send for Mbuf {}

impl Drop for Mbuf {
    fn drop(&mut self) {
        // SAFETY: we own the mbuf (invariant) and never use it again.
        unsafe { ffi::vl_mbuf_free(self.0.as_ptr().cast()) }
    }
}

impl Mbuf {
    /// # Safety
    /// `p` is a valid mbuf owned by the caller, which gives up its ownership.
    pub unsafe fn from_raw(p: NonNull<u8>) -> Mbuf {
        Mbuf(p)
    }

    #[inline(always)]
    fn field<T: Copy>(&self, off: usize) -> T {
        // SAFETY: offsets inside struct rte_mbuf (asserted in the shim); valid per invariant.
        unsafe { std::ptr::read_unaligned(self.0.as_ptr().add(off) as *const T) }
    }

    #[inline(always)]
    fn set<T: Copy>(&mut self, off: usize, v: T) {
        // SAFETY: as `field`; we own the mbuf.
        unsafe { std::ptr::write_unaligned(self.0.as_ptr().add(off) as *mut T, v) }
    }

    #[inline(always)]
    fn base(&self) -> *mut u8 {
        self.field::<*mut u8>(0)
    }

    /// The port the frame was received on (DPDK's port id).
    #[inline(always)]
    pub fn port(&self) -> u16 {
        self.field(OFF_PORT)
    }

    #[inline(always)]
    pub fn len(&self) -> usize {
        self.field::<u16>(OFF_DATA_LEN) as usize
    }

    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn headroom(&self) -> usize {
        self.field::<u16>(OFF_DATA_OFF) as usize
    }

    fn room(&self) -> usize {
        self.field::<u16>(OFF_BUF_LEN) as usize
    }

    #[inline(always)]
    fn set_lens(&mut self, len: usize) {
        self.set(OFF_DATA_LEN, len as u16);
        self.set(OFF_PKT_LEN, len as u32);
    }

    /// Records the receive queue (and clears the class) after a receive.
    #[inline(always)]
    pub(crate) fn stamp_queue(&mut self, queue: u16) {
        self.set(OFF_QUEUE, queue as u32);
        // A driver that refills its ring without DPDK's reset may hand back an mbuf with an
        // earlier frame's offload.
        self.set(OFF_TX_OFFLOAD, 0u64);
    }

    /// Replaces the contents with `frame` from the default headroom. False if it does not fit.
    pub fn load(&mut self, frame: &[u8]) -> bool {
        let head = self.headroom().min(vectorlb_io::DEFAULT_HEADROOM);
        if head + frame.len() > self.room() {
            return false;
        }
        self.set(OFF_DATA_OFF, head as u16);
        self.set_lens(frame.len());
        self.data_mut().copy_from_slice(frame);
        true
    }
}

impl PacketBuf for Mbuf {
    #[inline(always)]
    fn data(&self) -> &[u8] {
        // SAFETY: [base + data_off, + data_len) lies inside the buffer (invariant).
        unsafe { std::slice::from_raw_parts(self.base().add(self.headroom()), self.len()) }
    }

    #[inline(always)]
    fn data_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `data`, and we own the mbuf exclusively.
        unsafe { std::slice::from_raw_parts_mut(self.base().add(self.headroom()), self.len()) }
    }

    #[inline]
    fn prepend(&mut self, n: usize) -> bool {
        let head = self.headroom();
        if n > head || self.len() + n > u16::MAX as usize {
            return false;
        }
        self.set(OFF_DATA_OFF, (head - n) as u16);
        let len = self.len() + n;
        self.set_lens(len);
        true
    }

    #[inline]
    fn adj(&mut self, n: usize) {
        let n = n.min(self.len());
        self.set(OFF_DATA_OFF, (self.headroom() + n) as u16);
        let len = self.len() - n;
        self.set_lens(len);
    }

    #[inline]
    fn set_len(&mut self, len: usize) -> bool {
        if self.headroom() + len > self.room() {
            return false;
        }
        self.set_lens(len);
        true
    }

    #[inline(always)]
    fn prefetch(&self) {
        vectorlb_io::prefetch(self.base().wrapping_add(self.headroom()));
    }

    #[inline(always)]
    fn offload(&self) -> Offload {
        let v: u64 = self.field(OFF_TX_OFFLOAD);
        Offload { gso_size: v as u16, partial: v & 1 << 16 != 0 }
    }

    #[inline(always)]
    fn set_offload(&mut self, o: Offload) {
        self.set(OFF_TX_OFFLOAD, o.gso_size as u64 | (o.partial as u64) << 16);
    }
}

impl Packet for Mbuf {
    #[inline(always)]
    fn meta(&self) -> PacketMeta {
        PacketMeta { port: self.port(), queue: self.field(OFF_QUEUE), hash: self.field(OFF_HASH), class: self.field(OFF_CLASS) }
    }

    fn set_meta(&mut self, m: PacketMeta) {
        self.set(OFF_PORT, m.port);
        self.set(OFF_QUEUE, m.queue);
        self.set(OFF_HASH, m.hash);
        self.set(OFF_CLASS, m.class);
    }

    #[inline(always)]
    fn segments(&self) -> u16 {
        self.field(OFF_NB_SEGS)
    }

    #[inline]
    fn free_all(pkts: &mut Vec<Mbuf>) {
        if pkts.is_empty() {
            return;
        }
        // SAFETY: Mbuf is a transparent non-null mbuf pointer and we own every one; after the
        // bulk free the vector forgets them (set_len(0) runs no destructor).
        unsafe {
            ffi::vl_mbuf_free_bulk(pkts.as_mut_ptr() as *mut *mut ffi::RteMbuf, pkts.len() as u32);
            pkts.set_len(0);
        }
    }
}
