//! The whole packet path: a `vectorlb_lb::Worker` built from `fuzz/pipeline.toml` (every
//! forwarding mode, IPv4 and IPv6, SNAT, a 16-session table) runs a sequence of fuzzed frames.
//!
//! Input layout (missing bytes read as zero):
//!
//! ```text
//! byte 0      flags: bit 0: two cores (core_shift 1), bit 1: this is core 1,
//!                    bit 2: batch size 4 instead of 256 (several sub-batches per call)
//! bytes 1..5  now0, u32 LE: worker clock (ms) of the first process() call
//! bytes 5..9  dt, u32 LE: the second call runs at now0 + dt (wrapping)
//! byte 9      split: the first min(split, n) frames go to the first call, the rest to the second
//! then up to 32 frames, each a u16 LE length (mod 1600) followed by that many bytes (the last
//! frame is cut short if the input ends)
//! ```
//!
//! A fresh worker is built per input (only the immutable configuration snapshot is shared), so
//! every crash reproduces from its input alone. After each `process` call every `Tx(port)`
//! verdict must name an existing port and its buffer must pass `parse_frame`; after the second
//! call the worker idles at now1 and then 20 s later (past every timeout of the config), after
//! which, when the clock never went backwards by the wrapping rules (dt < 2^30), the session
//! table must be empty.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, OnceLock};
use vectorlb_config::Config;
use vectorlb_lb::{Control, HeapBuf, PacketBuf, Verdict, Worker};
use vectorlb_packet::parse_frame;

const CONFIG: &str = include_str!("../pipeline.toml");
const MAX_FRAMES: usize = 32;
const MAX_FRAME_LEN: usize = 1600;

struct Setup {
    config: Config,
    control: Arc<Control>,
    ports: u16,
}

fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let config = Config::parse(CONFIG).expect("fuzz/pipeline.toml parses");
        let control = Control::new(&config.spec).expect("fuzz/pipeline.toml builds");
        let ports = config.spec.ports.len() as u16;
        Setup { config, control, ports }
    })
}

struct Input<'a> {
    data: &'a [u8],
    at: usize,
}

impl Input<'_> {
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        for x in b.iter_mut() {
            if let Some(&v) = self.data.get(self.at) {
                *x = v;
            }
            self.at += 1;
        }
        b
    }
}

fn check_tx(bufs: &[HeapBuf], verdicts: &[Verdict], ports: u16, now: u32) {
    for (i, (b, v)) in bufs.iter().zip(verdicts).enumerate() {
        if let Verdict::Tx(port) = *v {
            assert!(port < ports, "frame {i}: Tx({port}) but the config has {ports} ports");
            let d = b.data();
            if let Err(e) = parse_frame(d) {
                let hex: String = d.iter().map(|x| format!("{x:02x}")).collect();
                panic!("frame {i}: transmitted frame does not parse ({e:?}) at now={now}: {hex}");
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let s = setup();
    let mut inp = Input { data, at: 0 };
    let [flags] = inp.bytes::<1>();
    let now0 = u32::from_le_bytes(inp.bytes::<4>());
    let dt = u32::from_le_bytes(inp.bytes::<4>());
    let [split] = inp.bytes::<1>();

    let mut frames: Vec<&[u8]> = Vec::new();
    let mut rest = data.get(10..).unwrap_or(&[]);
    while frames.len() < MAX_FRAMES && rest.len() >= 2 {
        let len = u16::from_le_bytes([rest[0], rest[1]]) as usize % MAX_FRAME_LEN;
        let body = &rest[2..];
        let take = len.min(body.len());
        frames.push(&body[..take]);
        rest = &body[take..];
    }

    let (cores, core) = if flags & 1 != 0 { (2, ((flags >> 1) & 1) as u16) } else { (1, 0) };
    let mut wc = s.config.worker_config(core, cores);
    if flags & 4 != 0 {
        wc.batch = 4;
    }
    let mut worker = Worker::new(s.control.clone(), wc).expect("worker");

    let mut bufs: Vec<HeapBuf> = frames.iter().map(|f| HeapBuf::from_frame(f)).collect();
    let mut verdicts = vec![Verdict::Kernel; bufs.len()];
    let k = (split as usize).min(bufs.len());
    let now1 = now0.wrapping_add(dt);

    let (b0, b1) = bufs.split_at_mut(k);
    let (v0, v1) = verdicts.split_at_mut(k);
    worker.process(b0, v0, now0);
    check_tx(b0, v0, s.ports, now0);
    worker.process(b1, v1, now1);
    check_tx(b1, v1, s.ports, now1);

    worker.idle(now1, 1000);
    let later = now1.wrapping_add(20_000);
    worker.idle(later, 1000);
    if dt < 1 << 30 {
        assert_eq!(worker.table.len(), 0, "sessions left after idling past every timeout (now0={now0} dt={dt})");
    }
});
