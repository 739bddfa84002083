//! The dmadev copy engine on DPDK's software device (dma_skeleton): batches of copies of every
//! size complete in order with the right bytes, a full ring refuses a batch whole, and the
//! copier's CPU fallback and size threshold work over it. Needs root and huge pages.

use vectorlb_dpdk::dma::DmaEngine;
use vectorlb_dpdk::Eal;
use vectorlb_io::copy::SubmitError;
use vectorlb_io::{Copier, CopyEngine, CopyOp};

fn wait(e: &mut dyn CopyEngine, cookie: u64) {
    let t = std::time::Instant::now();
    while e.completed().is_none_or(|c| c < cookie) {
        assert!(t.elapsed() < std::time::Duration::from_secs(10), "batch {cookie} never completed");
        std::hint::spin_loop();
    }
}

#[test]
fn the_software_dmadev_copies_batches_in_order() {
    let eal = Eal::init(&["-l".into(), "0".into(), "--in-memory".into(), "--iova-mode=va".into(), "--log-level".into(), "*:warning".into()], &["dma_skeleton".into()]).unwrap();
    let mut e = DmaEngine::open(&eal, "dma_skeleton", 64).unwrap();
    assert!(e.ring_size() >= 32, "{}", e.ring_size());
    let src: Vec<u8> = (0..64 * 9000).map(|i| (i * 7 % 251) as u8).collect();
    let mut dst = vec![0u8; src.len()];
    let sizes = [1usize, 60, 64, 256, 1500, 2048, 4400, 9000];
    let mut last = 0;
    for round in 0..50 {
        let ops: Vec<CopyOp> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let off = ((round * 8 + i) % 64) * 9000;
                // SAFETY: offsets within the two vectors (64 slots of 9000 bytes).
                CopyOp { src: unsafe { src.as_ptr().add(off) }, dst: unsafe { dst.as_mut_ptr().add(off) }, len: n as u32 }
            })
            .collect();
        // Ring slots come back as completions are collected: a full ring waits for them.
        let t = std::time::Instant::now();
        last = loop {
            // SAFETY: src/dst outlive the batch (we wait for it below) and do not overlap.
            match unsafe { e.submit(&ops) } {
                Ok(c) => break c,
                Err(SubmitError::Full) => {
                    e.completed();
                    assert!(t.elapsed().as_secs() < 10, "the ring never drains");
                }
            }
        };
        assert_eq!(last, round as u64, "cookies count batches");
    }
    wait(&mut e, last);
    for round in 0..50 {
        for (i, &n) in sizes.iter().enumerate() {
            let off = ((round * 8 + i) % 64) * 9000;
            assert_eq!(&dst[off..off + n], &src[off..off + n], "round {round} op {i}");
        }
    }
    assert_eq!(e.errors, 0);

    // A batch larger than the ring is refused whole (the copier then uses the CPU).
    let big: Vec<CopyOp> = (0..e.ring_size() as usize + 1).map(|_| CopyOp { src: src.as_ptr(), dst: dst.as_mut_ptr(), len: 8 }).collect();
    // SAFETY: as above.
    assert_eq!(unsafe { e.submit(&big) }, Err(SubmitError::Full));

    // Through a copier: small copies on the CPU, large ones on the device.
    let mut c = Copier::new(Box::new(e), 256);
    let mut out = vec![0u8; 4096];
    // SAFETY: src/out live until the batch completes (waited for below).
    unsafe {
        c.copy(CopyOp { src: src.as_ptr(), dst: out.as_mut_ptr(), len: 64 });
        c.copy(CopyOp { src: src.as_ptr().add(1000), dst: out.as_mut_ptr().add(1024), len: 2048 });
    }
    let cookie = c.flush().expect("the large copy went to the device");
    let t = std::time::Instant::now();
    while c.completed().is_none_or(|d| d < cookie) {
        assert!(t.elapsed().as_secs() < 10);
    }
    assert_eq!(&out[..64], &src[..64]);
    assert_eq!(&out[1024..3072], &src[1000..3048]);
    assert_eq!((c.stats.cpu, c.stats.engine), (1, 1));
}
