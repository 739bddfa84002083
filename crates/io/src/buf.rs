//! The packet buffer the pipeline works on: a frame with headroom in front (for tunnel and
//! ICMP headers) and tailroom behind (for the TOA option). DPDK mbufs implement [`PacketBuf`]
//! (`vectorlb-dpdk`); replay, tests and benchmarks use [`HeapBuf`].

/// Room kept in front of a frame, as in DPDK's default mbuf headroom.
pub const DEFAULT_HEADROOM: usize = 128;
/// Default data room (a standard frame plus slack).
pub const DEFAULT_ROOM: usize = 2048;

pub trait PacketBuf {
    fn data(&self) -> &[u8];
    fn data_mut(&mut self) -> &mut [u8];
    /// Grows the frame by `n` bytes at the front. False (and no change) without headroom.
    fn prepend(&mut self, n: usize) -> bool;
    /// Removes `n` bytes from the front.
    fn adj(&mut self, n: usize);
    /// Sets the frame length: shrinks, or grows into tailroom. False (and no change) if the
    /// tailroom is too small.
    fn set_len(&mut self, len: usize) -> bool;
    /// Hints that the frame's first cache line will be read soon.
    #[inline(always)]
    fn prefetch(&self) {}
    /// What the frame's IP packet leaves to its receiver ([`Offload`]): nothing unless a
    /// port that reads super-packets (the pods port) said so.
    #[inline(always)]
    fn offload(&self) -> Offload {
        Offload::NONE
    }
    /// Records what the frame leaves to its receiver; buffers that cannot carry it ignore it
    /// (their ports never read super-packets).
    #[inline(always)]
    fn set_offload(&mut self, _o: Offload) {}
}

/// What a frame read from an interface with offloads (a pod's tun with a virtio-net header)
/// leaves to whoever receives it: its TCP or UDP checksum (`partial`: the field is to be
/// completed, or recomputed, before it leaves for a port without offloads), and, when
/// `gso_size` is not 0, its segmentation into packets of at most that many payload bytes (a
/// super-packet, longer than the MTU).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Offload {
    pub gso_size: u16,
    pub partial: bool,
}

impl Offload {
    pub const NONE: Offload = Offload { gso_size: 0, partial: false };
}

/// A heap-allocated buffer.
#[derive(Clone)]
pub struct HeapBuf {
    mem: Box<[u8]>,
    headroom: usize,
    start: usize,
    len: usize,
    offload: Offload,
}

impl HeapBuf {
    pub fn new(headroom: usize, room: usize) -> Self {
        HeapBuf { mem: vec![0u8; headroom + room].into_boxed_slice(), headroom, start: headroom, len: 0, offload: Offload::NONE }
    }

    /// A buffer holding `frame`, with the default headroom and at least the default room.
    pub fn from_frame(frame: &[u8]) -> Self {
        let mut b = HeapBuf::new(DEFAULT_HEADROOM, DEFAULT_ROOM.max(frame.len() + 64));
        b.load(frame);
        b
    }

    /// Replaces the contents with `frame`, restoring the headroom. Panics if the frame does not
    /// fit (a caller's sizing bug, not packet input).
    #[inline(always)]
    pub fn load(&mut self, frame: &[u8]) {
        let head = self.headroom;
        assert!(head + frame.len() <= self.mem.len(), "frame larger than the buffer");
        self.mem[head..head + frame.len()].copy_from_slice(frame);
        self.start = head;
        self.len = frame.len();
    }
}

impl PacketBuf for HeapBuf {
    #[inline(always)]
    fn data(&self) -> &[u8] {
        // SAFETY: `start + len <= mem.len()` always holds: `load` asserts it, `prepend` and
        // `adj` move bytes between the front room and the frame, `set_len` checks it.
        unsafe { self.mem.get_unchecked(self.start..self.start + self.len) }
    }

    #[inline(always)]
    fn data_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `data`.
        unsafe { self.mem.get_unchecked_mut(self.start..self.start + self.len) }
    }

    #[inline(always)]
    fn prepend(&mut self, n: usize) -> bool {
        if n > self.start {
            return false;
        }
        self.start -= n;
        self.len += n;
        true
    }

    #[inline(always)]
    fn adj(&mut self, n: usize) {
        let n = n.min(self.len);
        self.start += n;
        self.len -= n;
    }

    #[inline(always)]
    fn set_len(&mut self, len: usize) -> bool {
        if self.start + len > self.mem.len() {
            return false;
        }
        self.len = len;
        true
    }

    #[inline(always)]
    fn prefetch(&self) {
        crate::prefetch(self.mem.as_ptr().wrapping_add(self.start));
    }

    fn offload(&self) -> Offload {
        self.offload
    }

    fn set_offload(&mut self, o: Offload) {
        self.offload = o;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_bounded() {
        let mut b = HeapBuf::new(4, 8);
        b.load(&[1, 2, 3]);
        assert!(b.prepend(4));
        assert!(!b.prepend(1));
        assert_eq!(b.data().len(), 7);
        b.adj(4);
        assert_eq!(b.data(), &[1, 2, 3]);
        assert!(b.set_len(8));
        assert!(!b.set_len(9));
    }
}
