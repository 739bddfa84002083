//! Whether this machine's huge pages save address translations: a chase of dependent loads
//! through a random cycle of cache lines, over regions of 2 to 24 MB, once with transparent
//! huge pages requested (`MADV_HUGEPAGE`) and once refused (`MADV_NOHUGEPAGE`). On bare metal
//! the huge-page chase is faster once the 4 KB pages outgrow the TLB; in a VM whose host backs
//! guest memory with 4 KB pages both run alike. It also shows how much cache this guest gets
//! (where the latency jumps to DRAM's).
//!
//!     cargo run --release -p vectorlb-bench --example page-chase
//!
//! A second part measures the reach of the TLB: a chase through K lines that each sit in a
//! different 4 KB page, the pages picked at random in a region of 2, 16 or 400 MB (huge pages
//! requested). The lines fit the L2 cache in every case, so a slower chase is address
//! translation: if the guest's huge pages were huge in the TLB too, K lines in a 16 MB region
//! (8 huge pages) would chase as fast as in 2 MB.
//!
//! Prints one JSON line per (size, pages), then one per (region, lines).
use std::time::Instant;

extern "C" {
    fn mmap(a: *mut u8, l: usize, p: i32, f: i32, fd: i32, o: i64) -> *mut u8;
    fn madvise(addr: *mut u8, len: usize, advice: i32) -> i32;
    fn munmap(addr: *mut u8, len: usize) -> i32;
}

const MADV_HUGEPAGE: i32 = 14;
const MADV_NOHUGEPAGE: i32 = 15;
const HUGE: usize = 2 << 20;

fn huge_kb() -> u64 {
    std::fs::read_to_string("/proc/self/smaps_rollup")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("AnonHugePages")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

/// A region of `bytes` starting on a 2 MB boundary, with `advice`: (the mapping to unmap,
/// `bytes + HUGE` long; the region).
fn region(bytes: usize, advice: i32) -> (*mut u8, *mut u64) {
    // SAFETY: an anonymous private read/write mapping (PROT 3, MAP_PRIVATE|MAP_ANONYMOUS 0x22)
    // one huge page larger than needed, checked; `p` is its first 2 MB boundary, so
    // [p, p + bytes) lies inside it. madvise is a hint on that range.
    unsafe {
        let base = mmap(std::ptr::null_mut(), bytes + HUGE, 3, 0x22, -1, 0);
        assert!(base as isize != -1, "mmap failed");
        let p = ((base as usize + HUGE - 1) & !(HUGE - 1)) as *mut u64;
        madvise(p as *mut u8, bytes, advice);
        (base, p)
    }
}

/// Nanoseconds per load, and the huge pages the region got (KB).
fn chase(mb: usize, advice: i32) -> (f64, u64) {
    let bytes = mb << 20;
    let before = huge_kb();
    let (base, p) = region(bytes, advice);
    let lines = bytes / 64;
    let mut perm: Vec<usize> = (0..lines).collect();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in (1..lines).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        perm.swap(i, (x as usize) % (i + 1));
    }
    for k in 0..lines {
        // SAFETY: perm[k] < lines: word 0 of a line inside the region.
        unsafe { *p.add(perm[k] * 8) = perm[(k + 1) % lines] as u64 };
    }
    let got = huge_kb().saturating_sub(before);
    let n = 5_000_000;
    let mut i = perm[0];
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: every stored value is a line index < lines.
        i = unsafe { *p.add(i * 8) } as usize;
    }
    std::hint::black_box(i);
    let ns = t.elapsed().as_secs_f64() * 1e9 / n as f64;
    // SAFETY: unmapping exactly the mapping made above.
    unsafe { munmap(base, bytes + HUGE) };
    (ns, got)
}

/// Nanoseconds per load of a chase through `k` lines, each in its own 4 KB page of a region of
/// `mb` MB (at most one line per page; `k` is cut to the region's pages).
fn reach(mb: usize, k: usize) -> (f64, usize) {
    let bytes = mb << 20;
    let pages = bytes / 4096;
    let k = k.min(pages);
    let (base, p) = region(bytes, MADV_HUGEPAGE);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as usize
    };
    // Touch every page (the kernel backs the region), then pick k distinct pages in random
    // order and a random line in each.
    for pg in 0..pages {
        // SAFETY: pg * 512 words < bytes / 8.
        unsafe { *p.add(pg * 512) = 0 };
    }
    let mut order: Vec<usize> = (0..pages).collect();
    for i in 0..k {
        let j = i + next() % (pages - i);
        order.swap(i, j);
    }
    let at: Vec<usize> = order[..k].iter().map(|pg| pg * 512 + (next() % 64) * 8).collect();
    for i in 0..k {
        // SAFETY: every `at` is a word index inside the region.
        unsafe { *p.add(at[i]) = at[(i + 1) % k] as u64 };
    }
    let mut i = at[0];
    for _ in 0..4 * k {
        // SAFETY: stored values are word indices inside the region.
        i = unsafe { *p.add(i) } as usize;
    }
    let n = 2_000_000;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..n {
            // SAFETY: as above.
            i = unsafe { *p.add(i) } as usize;
        }
        best = best.min(t.elapsed().as_secs_f64() * 1e9 / n as f64);
    }
    std::hint::black_box(i);
    // SAFETY: unmapping exactly the mapping made above.
    unsafe { munmap(base, bytes + HUGE) };
    (best, k)
}

fn main() {
    for mb in [2usize, 4, 8, 16, 24] {
        let (thp, got) = chase(mb, MADV_HUGEPAGE);
        let (small, _) = chase(mb, MADV_NOHUGEPAGE);
        println!("{{\"bench\":\"page_chase\",\"mb\":{mb},\"ns_huge\":{thp:.1},\"ns_4k\":{small:.1},\"huge_kb\":{got}}}");
    }
    for k in [500usize, 2000, 4000, 8000] {
        for mb in [2usize, 16, 400] {
            let (ns, lines) = reach(mb, k);
            println!("{{\"bench\":\"tlb_reach\",\"region_mb\":{mb},\"lines_in_distinct_pages\":{lines},\"ns_per_load\":{ns:.1}}}");
        }
    }
}
