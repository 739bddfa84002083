//! What this machine's memory allows a pipeline like vectorlb's: items processed in groups,
//! software-pipelined as `Worker::batch` does (stage 1 prefetches a random line; for two-line
//! items stage 2 reads it and prefetches a second line it points to; the last stage reads the
//! item's line and does about 30 ns of dependent ALU work), over a table that fits the caches
//! (2 MB) and one that does not (400 MB, transparent huge pages requested on an anonymous
//! mapping). The ratio of the two times per item is the floor for the pipeline's "10 M sessions
//! against 1,000" ratio: no hashing, parsing or rewriting, only the memory pattern. It is run
//! for several group sizes and lags (steps between the stages), the pipeline's constants.
//!
//!     cargo run --release -p vectorlb-bench --example dram-floor
//!
//! Prints one JSON line per (lines per item, group, lags).
use std::time::Instant;

const ITEMS: usize = 20_000_000;
const WORK: u64 = 20;

#[inline(always)]
fn prefetch(p: *const u64) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it never faults.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T0)
    }
}

/// A table of `mb` MB: word 0 of each line is the index of another line.
struct Table {
    ptr: *mut u64,
    lines: usize,
    huge_kb: u64,
}

impl Table {
    fn new(mb: usize) -> Table {
        extern "C" {
            fn mmap(a: *mut u8, l: usize, p: i32, f: i32, fd: i32, o: i64) -> *mut u8;
            fn madvise(addr: *mut u8, len: usize, advice: i32) -> i32;
        }
        let bytes = mb << 20;
        // SAFETY: an anonymous private read/write mapping (PROT 3, MAP_PRIVATE|MAP_ANONYMOUS
        // 0x22), checked; MADV_HUGEPAGE (14) is a hint on that mapping.
        let p = unsafe {
            let p = mmap(std::ptr::null_mut(), bytes, 3, 0x22, -1, 0);
            assert!(p as isize != -1, "mmap failed");
            madvise(p, bytes, 14);
            p as *mut u64
        };
        let lines = bytes / 64;
        for i in 0..lines {
            // SAFETY: i < lines: inside the mapping.
            unsafe { *p.add(i * 8) = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) % lines as u64 };
        }
        let huge_kb = std::fs::read_to_string("/proc/self/smaps_rollup")
            .ok()
            .and_then(|s| s.lines().find(|l| l.starts_with("AnonHugePages")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
            .unwrap_or(0);
        Table { ptr: p, lines, huge_kb }
    }

    #[inline(always)]
    fn word(&self, line: usize, w: usize) -> u64 {
        // SAFETY: callers pass line < self.lines (indices are taken modulo lines) and w < 8.
        unsafe { *self.ptr.add(line * 8 + w) }
    }
}

/// Nanoseconds per item.
fn run(t: &Table, lines: usize, group: usize, lag1: usize, lag2: usize) -> f64 {
    let n = t.lines;
    let slots = lag2 + 1;
    let mut idx = vec![0usize; group * slots];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut sum = 0u64;
    let steps = ITEMS / group;
    let start = Instant::now();
    for step in 0..steps + lag2 {
        if step >= lag2 {
            let b = (step - lag2) % slots * group;
            for k in 0..group {
                let mut y = (sum ^ t.word(idx[b + k], 1)) | 1;
                for _ in 0..WORK {
                    y = y.wrapping_mul(0x9e37_79b9).rotate_left(7) ^ k as u64;
                }
                sum = sum.wrapping_add(y);
            }
        }
        if lines == 2 && step >= lag1 && step - lag1 < steps {
            let b = (step - lag1) % slots * group;
            for k in 0..group {
                let next = t.word(idx[b + k], 0) as usize;
                idx[b + k] = next;
                prefetch(t.ptr.wrapping_add(next * 8));
            }
        }
        if step < steps {
            let b = step % slots * group;
            for k in 0..group {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                idx[b + k] = (x as usize) % n;
                prefetch(t.ptr.wrapping_add(idx[b + k] * 8));
            }
        }
    }
    std::hint::black_box(sum);
    start.elapsed().as_secs_f64() * 1e9 / (steps * group) as f64
}

fn main() {
    let small = Table::new(2);
    let large = Table::new(400);
    for lines in [1, 2] {
        for (group, lag1, lag2) in [(16, 1, 2), (8, 2, 4), (4, 4, 8)] {
            let lag1 = if lines == 1 { 0 } else { lag1 };
            let s = run(&small, lines, group, lag1, lag2);
            let l = run(&large, lines, group, lag1, lag2);
            println!(
                "{{\"bench\":\"dram_floor\",\"lines_per_item\":{lines},\"group\":{group},\"lags\":[{lag1},{lag2}],\"ns_2mb\":{s:.1},\"ns_400mb\":{l:.1},\"ratio\":{:.2},\"anon_huge_kb\":{}}}",
                l / s,
                large.huge_kb
            );
        }
    }
}
