//! BoringSSL's memory through the process's Rust allocator.
//!
//! BoringSSL allocates with the C library's `malloc` unless the program defines the three
//! functions below (weak symbols in BoringSSL's `mem.cc`). A full handshake makes a few hundred
//! small allocations; glibc's `malloc`/`free` took about 1.5 % of the proxy's CPU under the
//! `cryptomb` provider. Here they go to Rust's global allocator (mimalloc in the `vectorlb`
//! binary), which the rest of the proxy already uses.
//!
//! Each block carries its size in a 16-byte prefix (BoringSSL asks for it back, and Rust's
//! allocator needs it to free), and is zeroed before it is freed, as BoringSSL's own `free`
//! path does (`OPENSSL_cleanse`): key material does not outlive its buffer.

use std::alloc::Layout;
use std::ffi::c_void;

/// The size prefix; 16 keeps the block as aligned as `malloc`'s.
const PREFIX: usize = 16;

fn layout(size: usize) -> Option<Layout> {
    Layout::from_size_align(size.checked_add(PREFIX)?, PREFIX).ok()
}

/// # Safety
/// Called by BoringSSL as `malloc`.
#[no_mangle]
pub unsafe extern "C" fn OPENSSL_memory_alloc(size: usize) -> *mut c_void {
    let Some(l) = layout(size) else { return std::ptr::null_mut() };
    // SAFETY: the layout's size is at least PREFIX, never zero.
    let p = unsafe { std::alloc::alloc(l) };
    if p.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: p is a fresh block of PREFIX + size bytes aligned to 16: the prefix holds a usize.
    unsafe {
        (p as *mut usize).write(size);
        p.add(PREFIX).cast()
    }
}

/// # Safety
/// `ptr` is null or was returned by [`OPENSSL_memory_alloc`] and not freed since.
#[no_mangle]
pub unsafe extern "C" fn OPENSSL_memory_free(ptr: *mut c_void) {
    if ptr.is_null() {
        return;
    }
    // SAFETY: per the contract the block starts PREFIX bytes before `ptr` and its prefix holds
    // the size it was allocated with, so the layout is the allocation's.
    unsafe {
        let p = (ptr as *mut u8).sub(PREFIX);
        let size = (p as *const usize).read();
        let l = layout(size).expect("the size was valid when the block was allocated");
        std::ptr::write_bytes(p, 0, l.size());
        // The zeroing must not be dropped as a store to memory about to be freed.
        std::hint::black_box(p);
        std::alloc::dealloc(p, l);
    }
}

/// # Safety
/// `ptr` was returned by [`OPENSSL_memory_alloc`] and not freed since.
#[no_mangle]
pub unsafe extern "C" fn OPENSSL_memory_get_size(ptr: *mut c_void) -> usize {
    // SAFETY: per the contract the size prefix sits PREFIX bytes before `ptr`.
    unsafe { ((ptr as *const u8).sub(PREFIX) as *const usize).read() }
}

/// Keeps this module in every binary that links the proxy: BoringSSL's references to the
/// three functions are weak, and a weak reference alone does not pull an object in.
pub fn link() {
    let fns: (unsafe extern "C" fn(usize) -> *mut c_void, unsafe extern "C" fn(*mut c_void), unsafe extern "C" fn(*mut c_void) -> usize) =
        (OPENSSL_memory_alloc, OPENSSL_memory_free, OPENSSL_memory_get_size);
    std::hint::black_box(fns);
}

#[cfg(test)]
mod tests {
    #[test]
    fn boringssl_allocates_through_the_hooks() {
        super::link();
        // SAFETY: BoringSSL's allocator entry points, used as documented.
        unsafe {
            let p = boring_sys::OPENSSL_malloc(100) as *mut u8;
            assert!(!p.is_null());
            assert_eq!(super::OPENSSL_memory_get_size(p.cast()), 100);
            p.write_bytes(0xab, 100);
            let q = boring_sys::OPENSSL_realloc(p.cast(), 1000) as *mut u8;
            assert_eq!(super::OPENSSL_memory_get_size(q.cast()), 1000);
            assert_eq!(std::slice::from_raw_parts(q, 100), &[0xab; 100][..]);
            boring_sys::OPENSSL_free(q.cast());
            // An absurd size is refused, not wrapped around.
            assert!(super::OPENSSL_memory_alloc(usize::MAX - 4).is_null());
        }
    }
}
