//! A DPDK dmadev as a [`CopyEngine`]: Intel DSA (`dma_idxd`), I/OAT (`dma_ioat`), or any other
//! dmadev; DPDK's software `dma_skeleton` (a thread that copies) on machines without one, so
//! the path runs everywhere.
//!
//! Addresses are given to the device as IOVAs equal to virtual addresses, which needs the EAL
//! in IOVA-as-VA mode (`--iova-mode=va`; DSA through the kernel's idxd driver with shared
//! virtual memory works this way); [`DmaEngine::open`] refuses otherwise.
//!
//! Batches complete in order. The engine counts copies submitted and completed; a batch's
//! cookie is done once the completed count passes the batch's last copy.

use crate::{ffi, strerror, Eal, Error};
use std::collections::VecDeque;
use std::ffi::CString;
use std::sync::Arc;
use vectorlb_io::copy::SubmitError;
use vectorlb_io::{CopyEngine, CopyOp};

pub struct DmaEngine {
    dev: i16,
    name: String,
    desc: u16,
    next_cookie: u64,
    submitted: u64,
    completed_ops: u64,
    /// (cookie, the copy count at which it is complete), oldest first.
    batches: VecDeque<(u64, u64)>,
    done: Option<u64>,
    /// Copies the device reported as failed (their bytes are not to be trusted).
    pub errors: u64,
    /// Set when the device refused a copy it had room for: from then on every batch is left
    /// to the CPU (submit answers Full).
    broken: bool,
    src: Vec<u64>,
    dst: Vec<u64>,
    len: Vec<u32>,
    _eal: Arc<Eal>,
}

// SAFETY: the engine is used by one thread at a time (&mut self); a dmadev vchan may be driven
// from any thread as long as it is one at a time.
unsafe impl Send for DmaEngine {}

impl Drop for DmaEngine {
    fn drop(&mut self) {
        // Let what was submitted finish before the device stops (the memory it writes may be
        // freed right after).
        for _ in 0..1_000_000 {
            if self.completed().is_some_and(|c| c + 1 >= self.next_cookie) || self.next_cookie == 0 {
                break;
            }
            std::hint::spin_loop();
        }
        // SAFETY: a device we configured and started.
        unsafe { ffi::vl_dma_stop(self.dev) };
    }
}

/// Names of the dmadevs the EAL found.
pub fn count() -> usize {
    // SAFETY: a query.
    unsafe { ffi::vl_dma_count() }.max(0) as usize
}

impl DmaEngine {
    /// Opens dmadev `name` (e.g. `dma_skeleton`, `0000:6a:01.0-wq0.0`) with a ring of `desc`
    /// descriptors.
    pub fn open(eal: &Arc<Eal>, name: &str, desc: u16) -> Result<DmaEngine, Error> {
        // SAFETY: a query.
        if unsafe { ffi::vl_iova_is_va() } == 0 {
            return Err(Error::Dpdk { what: format!("dmadev {name}"), reason: "the EAL is not in IOVA-as-VA mode: add --iova-mode=va to [runtime].eal".into() });
        }
        let c = CString::new(name).map_err(|_| Error::Nul { what: "a dmadev name", value: name.into() })?;
        // SAFETY: a valid C string.
        let dev = unsafe { ffi::vl_dma_by_name(c.as_ptr()) };
        if dev < 0 {
            return Err(Error::Dpdk { what: format!("dmadev {name}"), reason: format!("not found ({} dmadev(s) present; a software one: --vdev dma_skeleton)", count()) });
        }
        let dev = dev as i16;
        // SAFETY: a device id the EAL gave.
        let r = unsafe { ffi::vl_dma_setup(dev, desc) };
        if r < 0 {
            return Err(Error::Dpdk { what: format!("setting up dmadev {name}"), reason: strerror(r) });
        }
        let mut buf = [0 as std::os::raw::c_char; 64];
        // SAFETY: a 64-byte buffer.
        unsafe { ffi::vl_dma_name(dev, buf.as_mut_ptr(), buf.len()) };
        // SAFETY: NUL-terminated by snprintf.
        let dev_name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
        Ok(DmaEngine {
            dev,
            name: dev_name,
            desc: r as u16,
            next_cookie: 0,
            submitted: 0,
            completed_ops: 0,
            batches: VecDeque::new(),
            done: None,
            errors: 0,
            broken: false,
            src: Vec::with_capacity(256),
            dst: Vec::with_capacity(256),
            len: Vec::with_capacity(256),
            _eal: eal.clone(),
        })
    }

    pub fn device(&self) -> &str {
        &self.name
    }

    /// Descriptors in the device's ring.
    pub fn ring_size(&self) -> u16 {
        self.desc
    }
}

impl CopyEngine for DmaEngine {
    fn name(&self) -> &'static str {
        "dma"
    }

    unsafe fn submit(&mut self, ops: &[CopyOp]) -> Result<u64, SubmitError> {
        if self.broken || ops.len() > self.desc as usize {
            return Err(SubmitError::Full);
        }
        self.src.clear();
        self.dst.clear();
        self.len.clear();
        for o in ops {
            self.src.push(o.src as u64);
            self.dst.push(o.dst as u64);
            self.len.push(o.len);
        }
        // SAFETY: three arrays of ops.len() elements; the addresses are valid until completion
        // (the caller's contract), and IOVA = VA (checked at open).
        let r = unsafe { ffi::vl_dma_copy_batch(self.dev, self.src.as_ptr(), self.dst.as_ptr(), self.len.as_ptr(), ops.len() as u16) };
        if r == -libc::ENOSPC {
            return Err(SubmitError::Full);
        }
        if r < 0 {
            // A device error after part of the batch was enqueued: the counts no longer line
            // up with batches, so the engine stops taking work (the CPU copies from now on).
            // Earlier batches still complete; this one's copies are redone by the caller.
            self.broken = true;
            self.errors += 1;
            return Err(SubmitError::Full);
        }
        self.submitted += ops.len() as u64;
        let c = self.next_cookie;
        self.next_cookie += 1;
        self.batches.push_back((c, self.submitted));
        Ok(c)
    }

    fn completed(&mut self) -> Option<u64> {
        if !self.batches.is_empty() {
            loop {
                let mut errs = 0u32;
                // SAFETY: a started device; errs is a valid out pointer.
                let n = unsafe { ffi::vl_dma_completed(self.dev, 256, &mut errs) };
                self.errors += errs as u64;
                self.completed_ops += n as u64;
                if n < 256 {
                    break;
                }
            }
            while let Some(&(c, end)) = self.batches.front() {
                if end > self.completed_ops {
                    break;
                }
                self.done = Some(c);
                self.batches.pop_front();
            }
        }
        self.done
    }
}
