//! What this machine's memory allows a pipeline like vectorlb's: items processed in groups,
//! software-pipelined exactly as `Worker::batch` does (stage 1 prefetches a random line, stage 2
//! reads it and, for two-line items, prefetches a second line it points to, stage 3 reads that
//! and does `work` rounds of dependent ALU work, about 1.5 ns each), over a table that fits the
//! caches (2 MB) and one that does not (400 MB, transparent huge pages requested). The ratio of
//! the two times per item is the floor for the pipeline's "10 M sessions against 1,000" ratio
//! on this machine: no hashing, parsing or rewriting, only the memory pattern.
//!
//!     rustc -O scripts/dram-floor.rs -o /tmp/dram-floor && /tmp/dram-floor
//!
//! Prints one JSON line per (lines per item, work).
use std::time::Instant;

const GROUP: usize = 16;
const ITEMS: usize = 20_000_000;

#[inline(always)]
fn prefetch(p: *const u64) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it never faults.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T0)
    }
}

/// Nanoseconds per item over a table of `mb` MB.
fn run(mb: usize, lines: usize, work: u64) -> f64 {
    let n = mb * 1024 * 1024 / 64;
    let mut a = vec![0u64; n * 8];
    #[cfg(target_os = "linux")]
    {
        extern "C" {
            fn madvise(addr: *mut u8, len: usize, advice: i32) -> i32;
        }
        // SAFETY: the range is the vector's own allocation; MADV_HUGEPAGE (14) is a hint.
        unsafe { madvise((a.as_mut_ptr() as usize & !0x1f_ffff) as *mut u8, n * 64, 14) };
    }
    for i in 0..n {
        a[i * 8] = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) % n as u64;
    }
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut idx = [0usize; GROUP * 3];
    let mut sum = 0u64;
    let steps = ITEMS / GROUP;
    let t = Instant::now();
    for step in 0..steps + 2 {
        if step >= 2 {
            let b = (step - 2) % 3 * GROUP;
            for k in 0..GROUP {
                let v = a[idx[b + k] * 8 + 1];
                let mut y = (sum ^ v) | 1;
                for _ in 0..work {
                    y = y.wrapping_mul(0x9e37_79b9).rotate_left(7) ^ k as u64;
                }
                sum = sum.wrapping_add(y);
            }
        }
        if step >= 1 && step - 1 < steps {
            let b = (step - 1) % 3 * GROUP;
            for k in 0..GROUP {
                let next = a[idx[b + k] * 8] as usize;
                if lines == 2 {
                    idx[b + k] = next;
                    prefetch(&a[next * 8]);
                }
            }
        }
        if step < steps {
            let b = step % 3 * GROUP;
            for k in 0..GROUP {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                idx[b + k] = (x as usize) % n;
                prefetch(&a[idx[b + k] * 8]);
            }
        }
    }
    let ns = t.elapsed().as_secs_f64() * 1e9 / (steps * GROUP) as f64;
    std::hint::black_box(sum);
    ns
}

fn main() {
    for lines in [1, 2] {
        for work in [0u64, 20] {
            let small = run(2, lines, work);
            let large = run(400, lines, work);
            println!(
                "{{\"bench\":\"dram_floor\",\"lines_per_item\":{lines},\"work\":{work},\"ns_2mb\":{small:.1},\"ns_400mb\":{large:.1},\"ratio\":{:.2}}}",
                large / small
            );
        }
    }
}
