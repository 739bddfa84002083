//! A DPDK event device as a priority work queue: the proxy's `eventdev` dispatch backend.
//!
//! The device holds 64-bit values (the proxy's work items) in one queue per priority class;
//! consumers (the proxy's pool threads) take them in the device's priority order. `event_sw`
//! (DPDK's software scheduler, a vdev created here) runs everywhere; on a host with Intel's
//! Dynamic Load Balancer, `event_dlb2` does the same in hardware.
//!
//! Ports (see `vl_evdev_setup` in csrc/shim.c): per consumer a *main* port linked to every
//! queue and, with more than one queue, a *catch-up* port linked to all but the first, through
//! which a consumer takes a lower class's item out of turn; one producer port, shared behind
//! a lock. Every port holds at most one scheduled item.
//!
//! The EAL these devices need is started once per process by [`helper_eal`], without huge
//! pages or a PCI scan (unless a PCI event device is named), on a thread of its own so that
//! the EAL's CPU pinning does not reach the caller's threads.

use crate::{ffi, strerror, Eal, Error};
use std::cell::Cell;
use std::ffi::CString;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

/// The process's EAL for helper devices, and the PCI device it was started with.
static HELPER: Mutex<Option<(Arc<Eal>, Option<String>)>> = Mutex::new(None);

/// The first CPU this process may run on (the EAL's one lcore must be one of them).
fn first_cpu() -> usize {
    // SAFETY: a zeroed cpu_set_t is valid; sched_getaffinity writes at most its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
            for cpu in 0..libc::CPU_SETSIZE as usize {
                if libc::CPU_ISSET(cpu, &set) {
                    return cpu;
                }
            }
        }
    }
    0
}

/// Starts (once per process) an EAL for event devices: no huge pages (`--no-huge -m 1024`: address space, touched only as used; an `event_sw`
/// device takes about 18 MB),
/// no shared configuration files, a file prefix of this process's own so it never meets a
/// running daemon's (its runtime directory removed once started), and the PCI device `pci`
/// allowed if given (a DLB). A later call with another PCI device is refused: the EAL cannot
/// be restarted in a process.
pub fn helper_eal(pci: Option<&str>) -> Result<Arc<Eal>, Error> {
    let mut helper = HELPER.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((eal, with)) = helper.as_ref() {
        if pci.is_some() && with.as_deref() != pci {
            return Err(Error::Dpdk {
                what: format!("using event device {}", pci.unwrap_or_default()),
                reason: format!("this process's EAL was started with {} (restart the process to change it)", with.as_deref().unwrap_or("no PCI device")),
            });
        }
        return Ok(eal.clone());
    }
    let args: Vec<String> = vec![
        "-l".into(),
        first_cpu().to_string(),
        "--no-huge".into(),
        "-m".into(),
        "1024".into(),
        "--no-shconf".into(),
        format!("--file-prefix=vectorlb-ev{}", std::process::id()),
        "--log-level=3".into(),
    ];
    let devices: Vec<String> = pci.map(|p| vec![p.to_string()]).unwrap_or_default();
    // rte_eal_init pins its caller to the lcore's CPU: let a thread of its own take that.
    let eal = std::thread::Builder::new()
        .name("eal-init".into())
        .spawn(move || Eal::init(&args, &devices))
        .map_err(|e| Error::Dpdk { what: "starting the EAL's thread".into(), reason: e.to_string() })?
        .join()
        .map_err(|_| Error::Dpdk { what: "starting the EAL".into(), reason: "its thread panicked".into() })??;
    // The runtime directory holds only the telemetry socket (nothing is shared): remove it
    // now, so that no process, however it ends, leaves one behind.
    // SAFETY: the EAL is started; the string is the EAL's own, valid for the process's life.
    let dir = unsafe { std::ffi::CStr::from_ptr(ffi::vl_runtime_dir()) }.to_string_lossy().into_owned();
    if dir.contains("vectorlb-ev") {
        let _ = std::fs::remove_dir_all(&dir);
    }
    *helper = Some((eal.clone(), pci.map(str::to_string)));
    Ok(eal)
}

static NEXT_VDEV: AtomicU32 = AtomicU32::new(0);

/// Held while a device is created, configured or removed: DPDK's table of event devices has no
/// lock of its own, and proxies (or tests) open and close devices from several threads.
static DEVICES: Mutex<()> = Mutex::new(());

/// A PCI address in DPDK's spelling (`0000:6d:00.0`, lower case), from that or `6d:00.0`;
/// None for anything else.
pub fn pci_address(s: &str) -> Option<String> {
    let hex = |t: &str, max: usize| !t.is_empty() && t.len() <= max && t.bytes().all(|b| b.is_ascii_hexdigit());
    let (rest, function) = s.rsplit_once('.')?;
    let parts: Vec<&str> = rest.split(':').collect();
    let (domain, bus, slot) = match parts[..] {
        [d, b, s] => (d, b, s),
        [b, s] => ("0", b, s),
        _ => return None,
    };
    if !(hex(domain, 4) && hex(bus, 2) && hex(slot, 2) && function.len() == 1 && (b'0'..=b'7').contains(&function.as_bytes()[0])) {
        return None;
    }
    let n = |t: &str| u32::from_str_radix(t, 16).ok();
    let (d, b, sl) = (n(domain)?, n(bus)?, n(slot)?);
    (sl < 32).then(|| format!("{d:04x}:{b:02x}:{sl:02x}.{function}"))
}

/// A configured, started event device.
pub struct EventDev {
    dev: u8,
    /// The vdev created for it (software devices), removed again on drop.
    vdev: Option<CString>,
    /// The software scheduler's service, run by the consumers ([`Consumer::schedule`]).
    service: Option<u32>,
    consumers: u8,
    catch_up: bool,
    producer: Mutex<()>,
    taken: Mutex<bool>,
    _eal: Arc<Eal>,
}

impl EventDev {
    /// Opens `device` with one queue per entry of `priorities` (0 the most urgent, 255 the
    /// least), `consumers` consumer ports and room for `events` items (capped by the device):
    /// `event_sw` creates a software device; a PCI address uses the event device the EAL
    /// probed there (a DLB).
    pub fn open(device: &str, priorities: &[u8], consumers: u8, events: u32) -> Result<Arc<EventDev>, Error> {
        let what = || format!("event device {device} ({} queues, {consumers} consumers)", priorities.len());
        if priorities.is_empty() || priorities.len() > 255 || consumers == 0 {
            return Err(Error::Dpdk { what: what(), reason: "needs 1 to 255 queues and at least one consumer".into() });
        }
        let pci = pci_address(device);
        if pci.is_none() && device != "event_sw" {
            return Err(Error::Dpdk { what: what(), reason: "the device is \"event_sw\" (software) or the PCI address of a hardware event device (0000:6d:00.0)".into() });
        }
        let eal = helper_eal(pci.as_deref())?;
        let vdev = pci.is_none().then(|| CString::new(format!("event_sw_vl{}", NEXT_VDEV.fetch_add(1, Ordering::Relaxed))).expect("no NUL"));
        let pci_c = pci.as_deref().map(|p| CString::new(p).expect("hex digits"));
        // event_sw's ports keep the credits (room for events) their releases give back, up to
        // twice this quantum (default 32) each: with 64 ports that is most of its 4096. One
        // keeps the device's room for the items themselves.
        let args = CString::new("credit_quanta=1").expect("no NUL");
        let mut service = u32::MAX;
        let vdev_ptr = vdev.as_ref().map_or(std::ptr::null(), |v| v.as_ptr());
        let pci_ptr = pci_c.as_ref().map_or(std::ptr::null(), |v| v.as_ptr());
        let table = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the strings and the priorities outlive the call; `service` is a valid out
        // pointer; the device table is ours alone while `table` is held. On failure the call
        // removed the vdev it created.
        let r = unsafe { ffi::vl_evdev_setup(vdev_ptr, args.as_ptr(), pci_ptr, priorities.len() as u8, priorities.as_ptr(), consumers, events, &mut service) };
        if r < 0 {
            let reason = match -r {
                libc::E2BIG => "more queues or ports than the device has".to_string(),
                libc::ENODEV if pci.is_some() => "no event device at this PCI address (is it bound to vfio-pci, with DPDK's dlb2 driver installed?)".to_string(),
                _ => strerror(r),
            };
            return Err(Error::Dpdk { what: what(), reason });
        }
        drop(table);
        Ok(Arc::new(EventDev {
            dev: r as u8,
            vdev,
            service: (service != u32::MAX).then_some(service),
            consumers,
            catch_up: priorities.len() > 1,
            producer: Mutex::new(()),
            taken: Mutex::new(false),
            _eal: eal,
        }))
    }

    /// Queues `value` on `queue`; false when the device is full.
    pub fn enqueue(&self, queue: u8, value: u64) -> bool {
        let _port = self.producer.lock().unwrap_or_else(|e| e.into_inner());
        let port = self.consumers * (1 + self.catch_up as u8);
        // SAFETY: the producer port is used under its lock only.
        unsafe { ffi::vl_evdev_enqueue(self.dev, port, queue, value) == 1 }
    }

    /// The consumer handles, once (each drives its own ports, from one thread at a time).
    pub fn consumers(self: &Arc<Self>) -> Option<Vec<Consumer>> {
        let mut taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        if *taken {
            return None;
        }
        *taken = true;
        Some((0..self.consumers).map(|index| Consumer { dev: self.clone(), index, _not_sync: PhantomData }).collect())
    }
}

impl Drop for EventDev {
    fn drop(&mut self) {
        let _table = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the consumers hold an Arc of the device, so none is left using a port; the
        // device table is ours alone while `_table` is held.
        unsafe { ffi::vl_evdev_close(self.dev, self.vdev.as_ref().map_or(std::ptr::null(), |v| v.as_ptr())) };
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Registration {
    No,
    Yes,
    Failed,
}

/// Unregisters the thread from the EAL when it exits.
struct Unregister;

impl Drop for Unregister {
    fn drop(&mut self) {
        // SAFETY: this thread registered itself (see Consumer::schedule).
        unsafe { ffi::vl_thread_unregister() };
    }
}

thread_local! {
    static REGISTERED: Cell<Registration> = const { Cell::new(Registration::No) };
    static UNREGISTER: Unregister = const { Unregister };
}

/// One consumer's ports. Send (a thread of its own), not Sync (a port is single-threaded).
pub struct Consumer {
    dev: Arc<EventDev>,
    index: u8,
    _not_sync: PhantomData<Cell<()>>,
}

impl Consumer {
    /// Makes the calling thread an EAL thread (DPDK's service functions index per-lcore state
    /// by it) until it exits, if the device has a software scheduler to run; call it first on
    /// the consumer's thread. Fails when DPDK has no lcore left (128 threads at once).
    pub fn register(&self) -> Result<(), Error> {
        if self.dev.service.is_none() {
            return Ok(());
        }
        REGISTERED.with(|r| {
            if r.get() == Registration::No {
                // SAFETY: plain call on this thread; undone by the guard at the thread's exit.
                let ok = unsafe { ffi::vl_thread_register() } == 0;
                r.set(if ok { Registration::Yes } else { Registration::Failed });
                if ok {
                    UNREGISTER.with(|_| ());
                }
            }
            if r.get() == Registration::Yes {
                Ok(())
            } else {
                Err(Error::Dpdk { what: "registering an event device consumer's thread with DPDK".into(), reason: "no lcore left (at most 128 threads at once)".into() })
            }
        })
    }

    /// One pass of a software device's scheduler (nothing for hardware). `event_sw` places
    /// items on ports before it takes in what the ports sent it (new items, releases), so an
    /// item queued or a port freed since the last pass needs two passes. Registers the thread
    /// ([`Consumer::register`]) if it was not; false (and no pass) if that fails.
    pub fn schedule(&self) -> bool {
        let Some(sid) = self.dev.service else { return true };
        if self.register().is_err() {
            return false;
        }
        // SAFETY: an EAL-registered thread; DPDK serialises concurrent runs of an MT-unsafe
        // service.
        unsafe { ffi::vl_evdev_schedule(sid) };
        true
    }

    /// The next item scheduled to this consumer's main port (`catch_up` false: any queue, in
    /// priority order) or catch-up port (true: any queue but the first), as (queue, value).
    pub fn dequeue(&self, catch_up: bool) -> Option<(u8, u64)> {
        if catch_up && !self.dev.catch_up {
            return None;
        }
        let port = self.index * (1 + self.dev.catch_up as u8) + catch_up as u8;
        let (mut value, mut queue) = (0u64, 0u8);
        // SAFETY: this consumer's ports are used by this (non-Sync) handle only.
        let n = unsafe { ffi::vl_evdev_dequeue(self.dev.dev, port, &mut value, &mut queue) };
        (n == 1).then_some((queue, value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_opened_and_closed_from_many_threads_at_once_are_all_found() {
        // DPDK finds a device by name among as many slots as devices are attached: one created
        // while another in a lower slot closes was lost ("No such device") before opening and
        // closing were serialized.
        let threads: Vec<_> = (0..6)
            .map(|t| {
                std::thread::spawn(move || {
                    for i in 0..40u64 {
                        let d = EventDev::open("event_sw", &[0, 255], 1, 64).unwrap_or_else(|e| panic!("thread {t}, device {i}: {e}"));
                        assert!(d.enqueue(1, i));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    #[test]
    fn event_sw_serves_the_more_urgent_queue_first() {
        let dev = EventDev::open("event_sw", &[0, 255], 1, 1024).unwrap();
        let c = dev.consumers().unwrap().pop().unwrap();
        assert!(dev.consumers().is_none(), "handed out once");
        for v in 0..3u64 {
            assert!(dev.enqueue(1, v));
        }
        for v in 3..6u64 {
            assert!(dev.enqueue(0, v));
        }
        let mut got = Vec::new();
        for _ in 0..1000 {
            assert!(c.schedule());
            if let Some((q, v)) = c.dequeue(false) {
                got.push((q, v));
            }
            if got.len() == 5 {
                break;
            }
        }
        // The main port: the urgent queue first; the first low item went to the catch-up port
        // (linked to the low queue only), where it waits to be taken out of turn.
        assert_eq!(got, vec![(0, 3), (0, 4), (0, 5), (1, 1), (1, 2)]);
        assert_eq!(c.dequeue(true), Some((1, 0)));
        assert_eq!(c.dequeue(true), None);
        // A second device in the same process.
        let other = EventDev::open("event_sw", &[0], 2, 64).unwrap();
        assert!(other.enqueue(0, 9));
        assert!(EventDev::open("event_dlb9", &[0], 1, 64).is_err());
        // Many devices one after the other: each gives its scheduling service back (DPDK has
        // 64 service slots).
        drop(other);
        for _ in 0..80 {
            let d = EventDev::open("event_sw", &[0, 255], 1, 64).unwrap();
            assert!(d.enqueue(1, 1));
        }
    }

    #[test]
    fn pci_addresses_are_read_strictly() {
        assert_eq!(pci_address("0000:6D:00.0").as_deref(), Some("0000:6d:00.0"));
        assert_eq!(pci_address("6d:00.1").as_deref(), Some("0000:6d:00.1"));
        for bad in ["::.", "6d:00", "6d:00.8", "6d:20.0", "00000:6d:00.0", "6d:0g.0", "event_sw", "", "6d:00.0,x=1"] {
            assert_eq!(pci_address(bad), None, "{bad}");
        }
    }
}
