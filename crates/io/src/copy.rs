//! Copy engines: who moves a packet's bytes between two buffers.
//!
//! A shared-memory port (memif) copies every frame between the peer's shared buffers and the
//! data plane's own. The copies are submitted in batches to a [`CopyEngine`]: the CPU itself
//! ([`CpuEngine`], the copy done at once), or a DMA engine (DPDK dmadev, `vectorlb-dpdk`) that
//! does them asynchronously. Each batch gets a cookie; [`CopyEngine::completed`] says up to
//! which cookie every copy is done. [`Copier`] adds what a port wants around an engine: copies
//! below a size threshold go to the CPU (a small copy costs less than a DMA descriptor), and
//! when the engine cannot take a batch (its ring is full) the batch is copied by the CPU and
//! counted, never dropped.

/// Copies `n` bytes: frames of up to 64 bytes inline with overlapping fixed-size moves (a
/// call into the C library's memcpy costs as much as the copy itself at that size), up to
/// 8 KiB with an inline AVX2 loop where the CPU has it, the rest with `copy_nonoverlapping`.
///
/// # Safety
/// As `std::ptr::copy_nonoverlapping`: `src` readable and `dst` writable for `n` bytes, not
/// overlapping.
#[inline(always)]
pub unsafe fn copy_bytes(src: *const u8, dst: *mut u8, n: usize) {
    use std::ptr::{read_unaligned as rd, write_unaligned as wr};
    // SAFETY: (every branch) each move stays within [0, n) of both buffers, as the caller
    // promised they are; the two moves of a branch may overlap each other, which is fine (they
    // write the same bytes).
    unsafe {
        if n > 64 {
            #[cfg(target_arch = "x86_64")]
            if n <= 8192 && std::arch::is_x86_feature_detected!("avx2") {
                avx2_copy(src, dst, n);
                return;
            }
            std::ptr::copy_nonoverlapping(src, dst, n);
        } else if n >= 32 {
            let (a, b) = (rd(src as *const [u8; 32]), rd(src.add(n - 32) as *const [u8; 32]));
            wr(dst as *mut [u8; 32], a);
            wr(dst.add(n - 32) as *mut [u8; 32], b);
        } else if n >= 16 {
            let (a, b) = (rd(src as *const [u8; 16]), rd(src.add(n - 16) as *const [u8; 16]));
            wr(dst as *mut [u8; 16], a);
            wr(dst.add(n - 16) as *mut [u8; 16], b);
        } else if n >= 8 {
            let (a, b) = (rd(src as *const u64), rd(src.add(n - 8) as *const u64));
            wr(dst as *mut u64, a);
            wr(dst.add(n - 8) as *mut u64, b);
        } else {
            for i in 0..n {
                *dst.add(i) = *src.add(i);
            }
        }
    }
}

/// Copies `n` (33..) bytes with 32-byte moves, four at a time, the last move ending at `n`
/// (overlapping the one before it). Inline in the caller's loop, it beats a call into the C
/// library for frame-sized copies (measured at 1,500 B between two cores: 253 against 268
/// cycles per forwarded frame).
///
/// # Safety
/// As `copy_bytes`, with `n >= 32`, on a CPU with AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn avx2_copy(src: *const u8, dst: *mut u8, n: usize) {
    use std::arch::x86_64::*;
    // SAFETY: every load reads [i, i + 32) of src and every store writes the same range of dst
    // with i + 32 <= n (the tail: n - 32 >= 0); the caller promised both ranges are valid.
    unsafe {
        let mut i = 0;
        while i + 128 <= n {
            let a = _mm256_loadu_si256(src.add(i) as *const __m256i);
            let b = _mm256_loadu_si256(src.add(i + 32) as *const __m256i);
            let c = _mm256_loadu_si256(src.add(i + 64) as *const __m256i);
            let d = _mm256_loadu_si256(src.add(i + 96) as *const __m256i);
            _mm256_storeu_si256(dst.add(i) as *mut __m256i, a);
            _mm256_storeu_si256(dst.add(i + 32) as *mut __m256i, b);
            _mm256_storeu_si256(dst.add(i + 64) as *mut __m256i, c);
            _mm256_storeu_si256(dst.add(i + 96) as *mut __m256i, d);
            i += 128;
        }
        while i + 32 <= n {
            _mm256_storeu_si256(dst.add(i) as *mut __m256i, _mm256_loadu_si256(src.add(i) as *const __m256i));
            i += 32;
        }
        if i < n {
            let o = n - 32;
            _mm256_storeu_si256(dst.add(o) as *mut __m256i, _mm256_loadu_si256(src.add(o) as *const __m256i));
        }
    }
}

/// One copy: `len` bytes from `src` to `dst`.
#[derive(Debug, Clone, Copy)]
pub struct CopyOp {
    pub src: *const u8,
    pub dst: *mut u8,
    pub len: u32,
}

// SAFETY: a CopyOp is plain data (two addresses and a length); whoever submits it promises
// the memory stays valid (see CopyEngine::submit). Moving the description between threads
// does not touch the memory.
unsafe impl Send for CopyOp {}

/// Why an engine did not take a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubmitError {
    /// Its ring has no room for the whole batch now; nothing was enqueued.
    Full,
}

/// An engine that performs batches of copies, in order of submission.
pub trait CopyEngine: Send {
    /// A short name for counters and logs (`cpu`, `dma`).
    fn name(&self) -> &'static str;

    /// Enqueues every copy of `ops` as one batch and returns its cookie (cookies increase by
    /// one per batch). All or nothing: on error none of the copies was enqueued.
    ///
    /// # Safety
    /// Every `src` is readable and every `dst` writable for `len` bytes, the ranges of one op
    /// do not overlap, and all of them stay valid (and `dst` untouched by the caller) until
    /// [`CopyEngine::completed`] reports this batch's cookie.
    unsafe fn submit(&mut self, ops: &[CopyOp]) -> Result<u64, SubmitError>;

    /// The cookie of the newest batch whose copies (and every earlier batch's) are complete;
    /// `None` before the first completes.
    fn completed(&mut self) -> Option<u64>;

    /// Whether copies complete inside `submit` (the CPU): callers can skip the bookkeeping.
    fn synchronous(&self) -> bool {
        false
    }
}

/// The CPU as a copy engine: every copy done inside `submit`.
#[derive(Debug, Default)]
pub struct CpuEngine {
    next: u64,
}

impl CopyEngine for CpuEngine {
    fn name(&self) -> &'static str {
        "cpu"
    }

    unsafe fn submit(&mut self, ops: &[CopyOp]) -> Result<u64, SubmitError> {
        for op in ops {
            // SAFETY: the caller's contract (valid, non-overlapping ranges).
            unsafe { copy_bytes(op.src, op.dst, op.len as usize) };
        }
        let c = self.next;
        self.next += 1;
        Ok(c)
    }

    fn completed(&mut self) -> Option<u64> {
        self.next.checked_sub(1)
    }

    fn synchronous(&self) -> bool {
        true
    }
}

/// Counters of a [`Copier`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CopyStats {
    /// Copies the CPU did: all of them with the CPU engine, else those below the threshold.
    pub cpu: u64,
    /// Copies handed to the engine.
    pub engine: u64,
    /// Bytes handed to the engine.
    pub engine_bytes: u64,
    /// Copies done by the CPU because the engine's ring was full.
    pub cpu_fallback: u64,
    /// Bytes copied by the CPU (small and fallback).
    pub cpu_bytes: u64,
    /// Time stamp counter cycles spent copying (the CPU's copies, the engine's submit and
    /// completion calls) while timing is on ([`Copier::set_timing`]).
    pub cycles: u64,
}

/// The CPU's time stamp counter (a monotonic clock elsewhere), for cheap timing.
#[inline(always)]
pub fn cycles() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: rdtsc has no preconditions.
    unsafe {
        std::arch::x86_64::_rdtsc()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        use std::sync::OnceLock;
        static T0: OnceLock<std::time::Instant> = OnceLock::new();
        T0.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64
    }
}

/// An engine with a size threshold and a CPU fallback.
pub struct Copier {
    engine: Box<dyn CopyEngine>,
    /// The engine completes copies inside submit: every copy is done on the spot.
    sync: bool,
    threshold: u32,
    pending: Vec<CopyOp>,
    timing: bool,
    pub stats: CopyStats,
}

impl Copier {
    /// Copies of `threshold` bytes or more go to `engine`, smaller ones to the CPU. With the
    /// CPU engine the threshold does not matter.
    pub fn new(engine: Box<dyn CopyEngine>, threshold: u32) -> Copier {
        let sync = engine.synchronous();
        Copier { engine, sync, threshold, pending: Vec::with_capacity(256), timing: false, stats: CopyStats::default() }
    }

    pub fn cpu() -> Copier {
        Copier::new(Box::new(CpuEngine::default()), 0)
    }

    pub fn engine_name(&self) -> &'static str {
        self.engine.name()
    }

    pub fn threshold(&self) -> u32 {
        self.threshold
    }

    /// Counts the cycles spent copying in `stats.cycles` while on (benchmarks sample a share
    /// of the bursts: reading the clock costs cycles too).
    pub fn set_timing(&mut self, on: bool) {
        self.timing = on;
    }

    /// Whether every copy is done by the time [`Copier::flush`] returns.
    pub fn synchronous(&self) -> bool {
        self.sync
    }

    /// Whether a caller may copy on the spot itself with [`copy_bytes`] and report the
    /// copies with [`Copier::count_inline`]: every copy goes to the CPU and none is timed.
    #[inline(always)]
    pub fn inline(&self) -> bool {
        self.sync && !self.timing
    }

    /// Counts `copies` copies of `bytes` bytes in all that a caller did itself (see
    /// [`Copier::inline`]).
    #[inline(always)]
    pub fn count_inline(&mut self, copies: u64, bytes: u64) {
        self.stats.cpu += copies;
        self.stats.cpu_bytes += bytes;
    }

    /// Adds a copy to the current batch: done at once on the CPU when it is small, else kept
    /// for the engine until [`Copier::flush`].
    ///
    /// # Safety
    /// As [`CopyEngine::submit`], until the batch that [`Copier::flush`] returns completes.
    #[inline(always)]
    pub unsafe fn copy(&mut self, op: CopyOp) {
        if self.sync || op.len < self.threshold {
            self.stats.cpu += 1;
            self.stats.cpu_bytes += op.len as u64;
            let t = if self.timing { cycles() } else { 0 };
            // SAFETY: the caller's contract.
            unsafe { copy_bytes(op.src, op.dst, op.len as usize) };
            if self.timing {
                self.stats.cycles += cycles() - t;
            }
        } else {
            self.pending.push(op);
        }
    }

    /// Submits the batch the engine is to do and returns its cookie; `None` when every copy of
    /// the batch is already done (small copies, the CPU engine, or a full engine ring whose
    /// copies the CPU then did).
    pub fn flush(&mut self) -> Option<u64> {
        if self.pending.is_empty() {
            return None;
        }
        let t = if self.timing { cycles() } else { 0 };
        let r = self.submit_pending();
        if self.timing {
            self.stats.cycles += cycles() - t;
        }
        r
    }

    fn submit_pending(&mut self) -> Option<u64> {
        // SAFETY: every op was accepted by `copy`, whose caller promised what submit needs.
        match unsafe { self.engine.submit(&self.pending) } {
            Ok(cookie) => {
                self.stats.engine += self.pending.len() as u64;
                self.stats.engine_bytes += self.pending.iter().map(|o| o.len as u64).sum::<u64>();
                self.pending.clear();
                Some(cookie)
            }
            Err(SubmitError::Full) => {
                for op in self.pending.drain(..) {
                    self.stats.cpu_fallback += 1;
                    self.stats.cpu_bytes += op.len as u64;
                    // SAFETY: as above.
                    unsafe { std::ptr::copy_nonoverlapping(op.src, op.dst, op.len as usize) };
                }
                None
            }
        }
    }

    /// The newest batch cookie the engine finished (with every earlier one).
    pub fn completed(&mut self) -> Option<u64> {
        if !self.timing {
            return self.engine.completed();
        }
        let t = cycles();
        let r = self.engine.completed();
        self.stats.cycles += cycles() - t;
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An engine that completes a batch only when told, and refuses batches when "full".
    struct Slow {
        next: u64,
        done: Option<u64>,
        full: bool,
        queued: Vec<CopyOp>,
    }

    impl CopyEngine for Slow {
        fn name(&self) -> &'static str {
            "slow"
        }
        unsafe fn submit(&mut self, ops: &[CopyOp]) -> Result<u64, SubmitError> {
            if self.full {
                return Err(SubmitError::Full);
            }
            self.queued.extend_from_slice(ops);
            self.next += 1;
            Ok(self.next - 1)
        }
        fn completed(&mut self) -> Option<u64> {
            self.done
        }
    }

    #[test]
    fn small_copies_go_to_the_cpu_and_a_full_engine_falls_back() {
        let src = vec![7u8; 4096];
        let mut dst = vec![0u8; 4096];
        let mut c = Copier::new(Box::new(Slow { next: 0, done: None, full: false, queued: vec![] }), 256);
        // SAFETY: src and dst outlive the copier's batches and do not overlap.
        unsafe {
            c.copy(CopyOp { src: src.as_ptr(), dst: dst.as_mut_ptr(), len: 64 });
            c.copy(CopyOp { src: src.as_ptr(), dst: dst.as_mut_ptr().add(1024), len: 1024 });
        }
        assert_eq!(&dst[..64], &[7u8; 64][..], "a small copy is done at once");
        assert_eq!(dst[1024], 0, "a large one waits for the engine");
        assert_eq!(c.flush(), Some(0));
        assert_eq!(c.stats, CopyStats { cpu: 1, engine: 1, engine_bytes: 1024, cpu_fallback: 0, cpu_bytes: 64, cycles: 0 });
        assert_eq!(c.completed(), None);

        let mut full = Copier::new(Box::new(Slow { next: 0, done: None, full: true, queued: vec![] }), 256);
        // SAFETY: as above.
        unsafe { full.copy(CopyOp { src: src.as_ptr(), dst: dst.as_mut_ptr().add(2048), len: 1500 }) };
        assert_eq!(full.flush(), None, "the CPU did it");
        assert_eq!(&dst[2048..2048 + 1500], &src[..1500]);
        assert_eq!(full.stats.cpu_fallback, 1);
    }

    #[test]
    fn small_and_large_copies_move_exactly_their_bytes() {
        let src: Vec<u8> = (0..9100u32).map(|i| (i * 7 + 1) as u8).collect();
        for n in (0..=200).chain([255, 256, 1500, 2048, 4095, 8192, 8193, 9000]) {
            let mut dst = vec![0xEEu8; 9100];
            // SAFETY: n <= 9000 < 9100 - 5 for both; distinct vectors.
            unsafe { copy_bytes(src.as_ptr().add(3), dst.as_mut_ptr().add(5), n) };
            assert_eq!(&dst[5..5 + n], &src[3..3 + n], "{n} bytes");
            assert!(dst[..5].iter().chain(&dst[5 + n..]).all(|&b| b == 0xEE), "{n}: nothing else written");
        }
    }

    #[test]
    fn the_cpu_engine_is_synchronous() {
        let src = [1u8, 2, 3];
        let mut dst = [0u8; 3];
        let mut c = Copier::cpu();
        // SAFETY: both arrays are valid for 3 bytes.
        unsafe { c.copy(CopyOp { src: src.as_ptr(), dst: dst.as_mut_ptr(), len: 3 }) };
        assert_eq!(c.flush(), None);
        assert_eq!(dst, src);
        assert_eq!(c.stats.cpu_bytes, 3);
    }
}
