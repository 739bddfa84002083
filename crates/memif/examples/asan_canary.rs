//! Proves a build is instrumented by AddressSanitizer: reads one byte past a heap buffer.
//! scripts/asan-memif.sh runs it and requires ASan to report the overflow before it trusts
//! the hostile-peer tests' clean result.

fn main() {
    let v = std::hint::black_box(Box::new([0u8; 16]));
    let p = std::hint::black_box(v.as_ptr());
    // SAFETY: none: this is the deliberate out-of-bounds read the sanitizer must catch.
    let x = unsafe { std::ptr::read_volatile(p.add(16)) };
    println!("read {x} past the end: not an ASan build");
}
