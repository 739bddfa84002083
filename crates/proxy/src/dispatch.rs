//! Priority dispatch of request work over a pool of threads (seed 000: NGINX's thread pool,
//! whose tasks Intel's Dynamic Load Balancer hands out by priority).
//!
//! A request's blocking work (reading a static object, for now) becomes an *item* with a
//! *class*, 0 the most urgent. Items wait in one bounded queue per class; the pool's threads
//! take them:
//!
//! * **priority** mode: the most urgent non-empty class first, except that a lower class with
//!   a `share` is guaranteed that percentage of the picks while it has items waiting (it earns
//!   `share` credit at every pick it does not get and is served when its credit reaches 100),
//!   so no class starves;
//! * **fifo** mode: one queue in arrival order whatever the class (the comparison point, and
//!   what a plain thread pool does);
//! * **inline** mode: no pool; the work runs on the connection's own thread when submitted
//!   (what a server without thread pools does; with `reuseport` listeners across processes,
//!   the kernel's connection spreading).
//!
//! A full class queue refuses the item at once ([`Rejected::Full`], a 503 for the client);
//! an item that waited longer than `max_wait` is dropped when its turn comes
//! ([`Rejected::Expired`]); with `lifo_above = N`, a class holding more than N items serves
//! its newest first (adaptive LIFO: under overload the fresh requests, whose clients still
//! wait, go first and the stale ones expire).
//!
//! Work that goes on in parts (a body sent chunk by chunk) queues each later part with
//! [`Dispatcher::submit_continued`]: ordered by its class like the rest, so a higher class
//! never waits for more than the parts in progress, but never refused or expired, since the
//! request was admitted.
//!
//! Two backends hold the waiting items ([`Backend`]):
//!
//! * **software**: a queue per class behind a mutex and a condition variable: an item costs
//!   two lock round trips, small next to the work it carries (a file read), and the lock is
//!   never held while work runs;
//! * **eventdev**: a DPDK event device (`event_sw`, DPDK's software scheduler, or a Dynamic
//!   Load Balancer's `event_dlb2` on hosts that have one) with one queue per class at a
//!   descending queue priority: the device orders the items and places them on its consumer
//!   ports. The ports belong to the pool, not to a thread: a free thread, under the queue's
//!   lock, runs the scheduler, moves what each port holds into the port's slot and runs the
//!   most urgent item of all the slots, so an item placed on a port never waits for a thread
//!   that is busy. Each consumer has a main port (every class, in the device's priority order)
//!   and a catch-up port (every class but the first), through which a lower class's item is
//!   taken when its class is owed its share or it is overdue. Shares, limits and expiry are
//!   counted as in the software queue, so both pass the same tests. Differences: the slots
//!   show the pool only the items the device placed (two per consumer), overdue items are
//!   seen only when they reach a slot, and adaptive LIFO is not available (the
//!   device is first in, first out within a class).

use crate::stats::Histogram;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use vectorlb_dpdk::eventdev::{Consumer, EventDev};

pub use crate::config::{Backend, Class, DispatchConfig, Mode, EVENTDEV_QUEUED, EVENTDEV_WORKERS};

/// Why an item did not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    #[error("the class's queue is full")]
    Full,
    #[error("it waited longer than max_wait")]
    Expired,
    #[error("the dispatcher is stopping")]
    Stopped,
}

/// Work for a pool thread: called once, with how long the item waited, or why it will not run.
type Job = Box<dyn FnOnce(Result<Duration, Rejected>) + Send>;

struct Item {
    class: usize,
    queued: Instant,
    /// A later part of admitted work (the next chunk of a body being sent): never refused for
    /// a full queue, never expired, but ordered by its class like the rest.
    continued: bool,
    job: Job,
}

/// Counters of one class.
pub struct ClassStats {
    pub submitted: AtomicU64,
    pub rejected_full: AtomicU64,
    pub expired: AtomicU64,
    pub served: AtomicU64,
    /// Jobs that panicked (a bug; the thread goes on).
    pub panicked: AtomicU64,
    /// Seconds from a request's submission to a thread taking its first item.
    pub wait_seconds: Histogram,
    /// Seconds a request's first item took (for a static object: opening it and reading its
    /// first chunk; later chunks are not in it).
    pub run_seconds: Histogram,
}

/// Counters of one pool thread.
#[derive(Default)]
pub struct WorkerStats {
    pub items: AtomicU64,
    /// Nanoseconds spent running items.
    pub busy_ns: AtomicU64,
}

/// Upper bounds (seconds) of the wait and run histograms: 10 µs to 10 s.
pub const LATENCY_BOUNDS: &[f64] = &[1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

struct State {
    /// Per class (priority mode), or one queue (fifo mode).
    queues: Vec<VecDeque<Item>>,
    /// Waiting items per class (both modes).
    depth: Vec<usize>,
    /// Share credit per class (priority mode).
    credit: Vec<u32>,
    /// Items in the event device, in its threads' slots or in `overflow` (eventdev backend).
    pending: usize,
    /// Later parts of admitted work the event device had no room for (eventdev backend):
    /// taken before the device's items.
    overflow: VecDeque<Item>,
    /// Items handed straight to a sleeping thread (eventdev backend): with nothing else
    /// pending there is no order to decide, so the item skips the device (two scheduling
    /// passes and a wake-up of every thread) and goes to one thread as FIFO's would.
    direct: VecDeque<Item>,
    /// Threads asleep waiting for work (eventdev backend).
    asleep: usize,
    /// The event device's consumer ports (eventdev backend), shared by the pool: whichever
    /// thread is free drives them, under this lock, so an item placed on a port never waits
    /// for a busy thread.
    ports: Vec<Consumer>,
    /// The item each port last gave (two per consumer: main, catch-up), visible to every
    /// thread.
    slots: Vec<Option<Box<Item>>>,
    stop: bool,
}

impl State {
    /// An item of `class` left the eventdev backend's care (device, slot, overflow or direct
    /// hand-off) to run: counted out; a class left empty banks no credit across idle periods.
    fn took(&mut self, class: usize) {
        self.pending -= 1;
        self.depth[class] -= 1;
        if self.depth[class] == 0 {
            self.credit[class] = 0;
        }
    }
}

struct Inner {
    cfg: DispatchConfig,
    state: Mutex<State>,
    ready: Condvar,
    classes: Vec<ClassStats>,
    workers: Vec<WorkerStats>,
    /// The event device (eventdev backend).
    ev: Option<Arc<EventDev>>,
    /// Items handed to an idle thread without the device (eventdev backend).
    handoffs: AtomicU64,
}

/// The pool and its queue. Dropping it tells the threads to stop once the items already queued
/// are done, without waiting for them (it may be dropped on an async runtime's thread, after
/// a reload); [`Dispatcher::stop`] also waits.
pub struct Dispatcher {
    inner: Arc<Inner>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Dispatcher {
    /// Starts `cfg.workers` threads. The configuration was checked when it was parsed; a
    /// dispatcher without classes or threads would serve nothing, so both are at least one.
    pub fn start(mut cfg: DispatchConfig) -> std::io::Result<Dispatcher> {
        cfg.workers = if cfg.mode == Mode::Inline { 0 } else { cfg.workers.max(1) };
        if cfg.classes.is_empty() {
            cfg.classes.push(Class { name: "default".into(), share: 0 });
        }
        let n = cfg.classes.len();
        let queues = if cfg.mode == Mode::Priority { n } else { 1 };
        let (ev, consumers) = match &cfg.backend {
            Backend::Software => (None, Vec::new()),
            Backend::Eventdev(device) => {
                let refuse = |why: String| Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("dispatch backend eventdev: {why}")));
                if cfg.mode == Mode::Inline {
                    return refuse("mode inline has no queue".into());
                }
                if cfg.lifo_above > 0 {
                    return refuse("an event device is first in, first out within a class: lifo_above needs the software backend".into());
                }
                if cfg.workers > EVENTDEV_WORKERS {
                    return refuse(format!("{} workers; at most {EVENTDEV_WORKERS}", cfg.workers));
                }
                if cfg.queue_limit.saturating_mul(n) > EVENTDEV_QUEUED {
                    return refuse(format!("queue_limit {} x {n} classes is above the {EVENTDEV_QUEUED} items the device holds", cfg.queue_limit));
                }
                // Class 0 at the highest priority (0), the last at the lowest (255).
                let prios: Vec<u8> = (0..queues).map(|q| if queues == 1 { 128 } else { (q * 255 / (queues - 1)) as u8 }).collect();
                let dev = EventDev::open(device, &prios, cfg.workers as u8, 2 * EVENTDEV_QUEUED as u32).map_err(|e| std::io::Error::other(e.to_string()))?;
                let consumers = dev.consumers().expect("a new device's consumers");
                (Some(dev), consumers)
            }
        };
        let inner = Arc::new(Inner {
            ev,
            handoffs: AtomicU64::new(0),
            state: Mutex::new(State {
                queues: (0..queues).map(|_| VecDeque::new()).collect(),
                depth: vec![0; n],
                credit: vec![0; n],
                pending: 0,
                overflow: VecDeque::new(),
                direct: VecDeque::new(),
                asleep: 0,
                slots: consumers.iter().flat_map(|_| [None, None]).collect(),
                ports: consumers,
                stop: false,
            }),
            ready: Condvar::new(),
            classes: (0..n)
                .map(|_| ClassStats {
                    submitted: AtomicU64::new(0),
                    rejected_full: AtomicU64::new(0),
                    expired: AtomicU64::new(0),
                    served: AtomicU64::new(0),
                    panicked: AtomicU64::new(0),
                    wait_seconds: Histogram::new(LATENCY_BOUNDS),
                    run_seconds: Histogram::new(LATENCY_BOUNDS),
                })
                .collect(),
            workers: (0..cfg.workers).map(|_| WorkerStats::default()).collect(),
            cfg,
        });
        let mut threads = Vec::new();
        // Each eventdev thread reports whether it could become an EAL thread before it starts.
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        for w in 0..inner.cfg.workers {
            let mine = inner.clone();
            let ready = ready_tx.clone();
            let t = std::thread::Builder::new().name(format!("dispatch-{w}")).spawn(move || {
                if mine.ev.is_none() {
                    drop(ready);
                    return mine.work(w);
                }
                // Every pool thread runs the device's scheduler: it must be an EAL thread.
                let r = mine.lock().ports[0].register().map_err(|e| e.to_string());
                let ok = r.is_ok();
                let _ = ready.send(r);
                drop(ready);
                if ok {
                    mine.work_eventdev(w);
                }
            });
            match t {
                Ok(t) => threads.push(t),
                Err(e) => {
                    // Stop the threads already started before reporting.
                    Dispatcher { inner, threads }.stop();
                    return Err(e);
                }
            }
        }
        drop(ready_tx);
        if inner.ev.is_some() {
            // (Every thread sends once; a thread that failed to start sends nothing, and the
            // loop ends when the others have.)
            for r in ready_rx.iter().take(threads.len()) {
                if let Err(e) = r {
                    Dispatcher { inner, threads }.stop();
                    return Err(std::io::Error::other(format!("dispatch backend eventdev: {e}")));
                }
            }
        }
        Ok(Dispatcher { inner, threads })
    }

    pub fn config(&self) -> &DispatchConfig {
        &self.inner.cfg
    }

    pub fn class_stats(&self) -> &[ClassStats] {
        &self.inner.classes
    }

    pub fn worker_stats(&self) -> &[WorkerStats] {
        &self.inner.workers
    }

    /// Items the eventdev backend handed to an idle thread directly (nothing else pending).
    pub fn handoffs(&self) -> u64 {
        self.inner.handoffs.load(Ordering::Relaxed)
    }

    /// Items waiting, per class.
    pub fn depths(&self) -> Vec<usize> {
        self.inner.lock().depth.clone()
    }

    /// Queues `job` in `class` (clamped to the last class). The job is called exactly once,
    /// on a pool thread, with how long it waited or [`Rejected::Expired`] (items queued before
    /// a stop still run); a full queue or a stopped dispatcher refuses it here and it is not
    /// called.
    pub fn submit(&self, class: usize, job: impl FnOnce(Result<Duration, Rejected>) + Send + 'static) -> Result<(), Rejected> {
        self.enqueue(class, false, Box::new(job))
    }

    /// Queues a later part of work already admitted (the next chunk of a response): ordered by
    /// its class, but neither refused for a full queue nor expired. Refused only when stopping.
    pub fn submit_continued(&self, class: usize, job: impl FnOnce(Result<Duration, Rejected>) + Send + 'static) -> Result<(), Rejected> {
        self.enqueue(class, true, Box::new(job))
    }

    fn enqueue(&self, class: usize, continued: bool, job: Job) -> Result<(), Rejected> {
        let inner = &self.inner;
        let class = class.min(inner.cfg.classes.len() - 1);
        let stats = &inner.classes[class];
        if !continued {
            stats.submitted.fetch_add(1, Ordering::Relaxed);
        }
        if inner.cfg.mode == Mode::Inline {
            if !continued {
                stats.served.fetch_add(1, Ordering::Relaxed);
            }
            inner.run(stats, job, Ok(Duration::ZERO), !continued);
            return Ok(());
        }
        let mut st = inner.lock();
        if st.stop {
            return Err(Rejected::Stopped);
        }
        let (q, limit) = match inner.cfg.mode {
            Mode::Priority => (class, inner.cfg.queue_limit),
            // (Inline items never get here.)
            Mode::Fifo | Mode::Inline => (0, inner.cfg.queue_limit.saturating_mul(inner.cfg.classes.len())),
        };
        let waiting = match (&inner.ev, inner.cfg.mode) {
            (None, _) => st.queues[q].len(),
            (Some(_), Mode::Priority) => st.depth[class],
            (Some(_), _) => st.depth.iter().sum(),
        };
        if !continued && waiting >= limit {
            drop(st);
            stats.rejected_full.fetch_add(1, Ordering::Relaxed);
            return Err(Rejected::Full);
        }
        let item = Item { class, queued: Instant::now(), continued, job };
        match &inner.ev {
            None => st.queues[q].push_back(item),
            Some(_) if st.pending == 0 && st.asleep > 0 => {
                // Nothing else pending and a thread asleep: no order to decide; to it directly.
                st.direct.push_back(item);
                st.pending += 1;
                st.depth[class] += 1;
                drop(st);
                inner.handoffs.fetch_add(1, Ordering::Relaxed);
                inner.ready.notify_one();
                return Ok(());
            }
            Some(ev) => {
                let raw = Box::into_raw(Box::new(item));
                // Queued under the state lock, so the counts never lag the device.
                if !ev.enqueue(q as u8, raw as u64) {
                    // Full. New items are bounded below the device's room, but the later parts
                    // of admitted work are not (one per body being sent): they wait in memory.
                    // SAFETY: the device refused the value, so the box is still ours alone.
                    let item = unsafe { Box::from_raw(raw) };
                    if !continued {
                        drop(st);
                        stats.rejected_full.fetch_add(1, Ordering::Relaxed);
                        return Err(Rejected::Full);
                    }
                    st.overflow.push_back(*item);
                }
                st.pending += 1;
            }
        }
        st.depth[class] += 1;
        drop(st);
        // One thread is enough: any thread takes any item (the event device's ports are
        // shared by the pool).
        inner.ready.notify_one();
        Ok(())
    }

    /// Runs `f` on the pool in `class` and returns its result, or why it did not run.
    pub async fn run<T: Send + 'static>(&self, class: usize, f: impl FnOnce() -> T + Send + 'static) -> Result<T, Rejected> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit(class, move |r| {
            let _ = tx.send(r.map(|_| f()));
        })?;
        // The job is always called (queued items run even after a stop), so the channel only
        // closes without a value if the job panicked.
        rx.await.unwrap_or(Err(Rejected::Stopped))
    }

    /// Stops taking items, lets the threads finish the queued ones (expired ones are dropped
    /// as usual) and waits for them.
    pub fn stop(mut self) {
        self.signal_stop();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }

    fn signal_stop(&self) {
        self.inner.lock().stop = true;
        self.inner.ready.notify_all();
    }
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        self.signal_stop();
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A job runs outside the lock, so a panic cannot poison it mid-update; take it anyway.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next item to run, by the configured policy.
    fn pick(&self, st: &mut State) -> Option<Item> {
        // An item at the front of a queue (its oldest) that waited past max_wait goes first,
        // whatever its class's turn: a new request to be answered Expired, a later part of an
        // admitted one to run, so that neither waits for good behind a busier class (strict
        // priority without a share, or LIFO taking only the newest).
        let now = Instant::now();
        let overdue = st.queues.iter().position(|q| q.front().is_some_and(|i| now.saturating_duration_since(i.queued) > self.cfg.max_wait));
        if let Some(q) = overdue {
            return Some(self.take(st, q, false));
        }
        let q = match self.cfg.mode {
            Mode::Fifo | Mode::Inline => 0,
            Mode::Priority => {
                let top = st.queues.iter().position(|q| !q.is_empty())?;
                let mut due = None;
                for c in top + 1..st.queues.len() {
                    let share = self.cfg.classes[c].share;
                    if share == 0 || st.queues[c].is_empty() {
                        continue;
                    }
                    st.credit[c] = st.credit[c].saturating_add(share);
                    if due.is_none() && st.credit[c] >= 100 {
                        due = Some(c);
                    }
                }
                match due {
                    Some(c) => {
                        st.credit[c] -= 100;
                        c
                    }
                    None => top,
                }
            }
        };
        if st.queues[q].is_empty() {
            return None;
        }
        let lifo = self.cfg.lifo_above > 0 && st.queues[q].len() > self.cfg.lifo_above;
        Some(self.take(st, q, lifo))
    }

    /// Takes the front (or, `back`, the newest) item of the non-empty queue `q`.
    fn take(&self, st: &mut State, q: usize, back: bool) -> Item {
        let queue = &mut st.queues[q];
        let item = if back { queue.pop_back() } else { queue.pop_front() }.expect("the queue is not empty");
        if queue.is_empty() {
            // No banking of credit across idle periods.
            st.credit[q] = 0;
        }
        // Every queued item was counted in its class's depth when it was queued.
        st.depth[item.class] -= 1;
        item
    }

    /// Runs a job, timing it when it runs (not when it is told it will not). A job that
    /// panics loses its own request (its reply channel closes); the thread and the pool live on.
    fn run(&self, stats: &ClassStats, job: Job, r: Result<Duration, Rejected>, timed: bool) {
        let t = Instant::now();
        let ok = r.is_ok();
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(r))).is_err() {
            stats.panicked.fetch_add(1, Ordering::Relaxed);
        }
        if ok && timed {
            stats.run_seconds.observe(t.elapsed().as_secs_f64());
        }
    }

    fn work(&self, w: usize) {
        loop {
            let item = {
                let mut st = self.lock();
                loop {
                    if let Some(item) = self.pick(&mut st) {
                        break item;
                    }
                    if st.stop {
                        return;
                    }
                    st = self.ready.wait(st).unwrap_or_else(|e| e.into_inner());
                }
            };
            self.execute(w, item);
        }
    }

    /// Runs an item taken by pool thread `w`, or answers it Expired.
    fn execute(&self, w: usize, item: Item) {
        let stats = &self.classes[item.class];
        let waited = item.queued.elapsed();
        if waited > self.cfg.max_wait && !item.continued {
            stats.expired.fetch_add(1, Ordering::Relaxed);
            self.run(stats, item.job, Err(Rejected::Expired), false);
            return;
        }
        // Counted before the job runs: whoever sees its result sees it counted.
        if !item.continued {
            stats.wait_seconds.observe(waited.as_secs_f64());
            stats.served.fetch_add(1, Ordering::Relaxed);
        }
        self.workers[w].items.fetch_add(1, Ordering::Relaxed);
        let t = Instant::now();
        self.run(stats, item.job, Ok(waited), !item.continued);
        self.workers[w].busy_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// A pool thread of the eventdev backend: takes a handed-over item, else fills the empty
    /// port slots from the device, chooses one by the policy ([`Inner::choose`]) and runs it.
    fn work_eventdev(&self, w: usize) {
        let mut idle = 0u32;
        loop {
            let mut st = self.lock();
            let next = match st.direct.pop_front().or_else(|| st.overflow.pop_front()) {
                Some(item) => Some(Box::new(item)),
                None => {
                    Self::fill(&mut st);
                    self.choose(&mut st).map(|i| st.slots[i].take().expect("a chosen slot holds an item"))
                }
            };
            if let Some(item) = next {
                st.took(item.class);
                drop(st);
                idle = 0;
                self.execute(w, *item);
                continue;
            }
            if st.stop && st.pending == 0 {
                return;
            }
            // Nothing placed yet. With items pending they are a scheduling pass or two away:
            // look again soon, yielding first, then sleeping briefly; with nothing pending,
            // sleep until an item comes.
            idle += 1;
            if st.pending > 0 && idle < 16 {
                drop(st);
                std::thread::yield_now();
                continue;
            }
            let nap = if st.pending > 0 { Duration::from_micros(200) } else { Duration::from_millis(100) };
            st.asleep += 1;
            let mut st = self.ready.wait_timeout(st, nap).unwrap_or_else(|e| e.into_inner()).0;
            st.asleep -= 1;
            idle = 0;
            // Handed over while asleep: run it now, without a pass of the device.
            if let Some(item) = st.direct.pop_front() {
                st.took(item.class);
                drop(st);
                self.execute(w, item);
            }
        }
    }

    /// Fills the empty port slots from the device while it holds items the slots do not: two
    /// scheduling passes at most (event_sw takes in new items and releases after placing).
    fn fill(st: &mut State) {
        let State { ports, slots, pending, direct, overflow, .. } = st;
        let held = slots.iter().filter(|s| s.is_some()).count();
        if *pending <= held + direct.len() + overflow.len() {
            return;
        }
        for _ in 0..2 {
            if slots.iter().all(Option::is_some) {
                return;
            }
            ports[0].schedule();
            for (i, slot) in slots.iter_mut().enumerate() {
                if slot.is_none() {
                    if let Some((_, v)) = ports[i / 2].dequeue(i % 2 == 1) {
                        // SAFETY: every value in the device is a Box<Item> turned into a
                        // pointer by `enqueue`, and the device delivers each event once.
                        *slot = Some(unsafe { Box::from_raw(v as *mut Item) });
                    }
                }
            }
        }
    }

    /// Which slot's item an idle eventdev thread runs next: an overdue one (the more urgent
    /// class if several are, as the software queue looks at its classes in order); in fifo
    /// mode the oldest; in priority mode the most urgent class (the oldest within a class),
    /// unless a lower class with a share is owed its turn (the same credit as the software
    /// queue's) and a slot holds it.
    fn choose(&self, st: &mut State) -> Option<usize> {
        let held: Vec<(usize, &Item)> = st.slots.iter().enumerate().filter_map(|(i, s)| s.as_deref().map(|it| (i, it))).collect();
        let oldest = |items: &mut dyn Iterator<Item = &(usize, &Item)>| items.min_by_key(|(_, it)| it.queued).map(|(i, _)| *i);
        if held.is_empty() {
            return None;
        }
        let now = Instant::now();
        let overdue = held.iter().filter(|(_, it)| now.saturating_duration_since(it.queued) > self.cfg.max_wait);
        if let Some((i, _)) = overdue.min_by_key(|(_, it)| (it.class, it.queued)) {
            return Some(*i);
        }
        if self.cfg.mode != Mode::Priority {
            return oldest(&mut held.iter());
        }
        let top = held.iter().map(|(_, it)| it.class).min().expect("not empty");
        let mut due = None;
        for c in top + 1..st.depth.len() {
            let share = self.cfg.classes[c].share;
            if share == 0 || st.depth[c] == 0 {
                continue;
            }
            // Capped: a class owed a turn while its items are still in the device must not
            // bank a run of turns for later.
            st.credit[c] = st.credit[c].saturating_add(share).min(100 + share);
            if due.is_none() && st.credit[c] >= 100 && held.iter().any(|(_, it)| it.class == c) {
                due = Some(c);
            }
        }
        let class = match due {
            Some(c) => {
                st.credit[c] -= 100;
                c
            }
            None => top,
        };
        oldest(&mut held.iter().filter(|(_, it)| it.class == class))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn cfg(b: &Backend, mode: Mode, shares: &[u32]) -> DispatchConfig {
        DispatchConfig {
            backend: b.clone(),
            workers: 1,
            mode,
            classes: shares.iter().enumerate().map(|(i, s)| Class { name: format!("c{i}"), share: *s }).collect(),
            queue_limit: 600,
            max_wait: Duration::from_secs(60),
            lifo_above: 0,
        }
    }

    /// Holds the single pool thread until the returned sender is used, so that the test can
    /// queue items behind it and see the order they run in.
    fn block(d: &Dispatcher) -> mpsc::Sender<()> {
        let (tx, rx) = mpsc::channel::<()>();
        let (started_tx, started_rx) = mpsc::channel();
        d.submit(0, move |_| {
            started_tx.send(()).unwrap();
            let _ = rx.recv();
        })
        .unwrap();
        started_rx.recv().unwrap();
        tx
    }

    /// Queues `classes` (in this order) behind a blocked thread and returns the classes in
    /// the order they ran.
    fn order(d: &Dispatcher, classes: &[usize]) -> Vec<usize> {
        let gate = block(d);
        let (tx, rx) = mpsc::channel();
        for &c in classes {
            let tx = tx.clone();
            d.submit(c, move |r| {
                if r.is_ok() {
                    tx.send(c).unwrap();
                }
            })
            .unwrap();
        }
        drop(tx);
        gate.send(()).unwrap();
        rx.iter().collect()
    }

    fn priority_serves_the_most_urgent_class_first(b: &Backend) {
        let d = Dispatcher::start(cfg(b, Mode::Priority, &[0, 0, 0])).unwrap();
        let got = order(&d, &[2, 1, 2, 0, 1, 0]);
        assert_eq!(got, vec![0, 0, 1, 1, 2, 2]);
    }

    fn fifo_serves_in_arrival_order(b: &Backend) {
        let d = Dispatcher::start(cfg(b, Mode::Fifo, &[0, 0, 0])).unwrap();
        let got = order(&d, &[2, 1, 2, 0, 1, 0]);
        assert_eq!(got, vec![2, 1, 2, 0, 1, 0]);
    }

    fn a_lower_class_gets_its_share_while_a_higher_one_is_backlogged(b: &Backend) {
        // 25 %: one pick in four goes to class 1 while both wait.
        let d = Dispatcher::start(cfg(b, Mode::Priority, &[0, 25])).unwrap();
        let mut items = vec![0; 400];
        items.extend(vec![1; 400]);
        let got = order(&d, &items);
        let first: Vec<usize> = got[..400].to_vec();
        let low = first.iter().filter(|c| **c == 1).count();
        assert_eq!(low, 100, "class 1 got {low} of the first 400 picks");
        // Without a share it gets none until class 0 is empty.
        let d = Dispatcher::start(cfg(b, Mode::Priority, &[0, 0])).unwrap();
        let got = order(&d, &items);
        assert!(got[..400].iter().all(|c| *c == 0));
    }

    fn a_full_queue_refuses_at_once_and_counts_it(b: &Backend) {
        let mut c = cfg(b, Mode::Priority, &[0, 0]);
        c.queue_limit = 3;
        let d = Dispatcher::start(c).unwrap();
        let gate = block(&d);
        for _ in 0..3 {
            d.submit(1, |_| {}).unwrap();
        }
        assert_eq!(d.submit(1, |_| panic!("a refused job must not run")), Err(Rejected::Full));
        // Another class has its own room.
        d.submit(0, |_| {}).unwrap();
        assert_eq!(d.depths(), vec![1, 3]);
        assert_eq!(d.class_stats()[1].rejected_full.load(Ordering::Relaxed), 1);
        gate.send(()).unwrap();
        d.stop();
    }

    fn continued_items_are_ordered_but_never_refused_or_expired(b: &Backend) {
        let mut c = cfg(b, Mode::Priority, &[0, 0]);
        c.queue_limit = 1;
        c.max_wait = Duration::from_millis(20);
        let d = Dispatcher::start(c).unwrap();
        let gate = block(&d);
        let (tx, rx) = mpsc::channel();
        for i in 0..3 {
            let tx = tx.clone();
            d.submit_continued(1, move |r| tx.send((1, i, r.is_ok())).unwrap()).unwrap();
        }
        let t = tx.clone();
        d.submit(0, move |r| t.send((0, 0, r.is_ok())).unwrap()).unwrap();
        drop(tx);
        std::thread::sleep(Duration::from_millis(40));
        gate.send(()).unwrap();
        let got: Vec<_> = rx.iter().collect();
        // The new item waited past max_wait: expired; the continued ones ran, in order.
        assert_eq!(got, vec![(0, 0, false), (1, 0, true), (1, 1, true), (1, 2, true)]);
        assert_eq!(d.class_stats()[1].served.load(Ordering::Relaxed), 0, "parts are not requests");
    }

    fn overdue_items_go_first_whatever_their_class(b: &Backend) {
        // Strict priority, no share: class 1 would wait as long as class 0 has items.
        let mut c = cfg(b, Mode::Priority, &[0, 0]);
        c.max_wait = Duration::from_millis(20);
        let d = Dispatcher::start(c).unwrap();
        let gate = block(&d);
        let (tx, rx) = mpsc::channel();
        let t = tx.clone();
        d.submit(1, move |r| t.send(("new", r.is_ok())).unwrap()).unwrap();
        let t = tx.clone();
        d.submit_continued(1, move |r| t.send(("part", r.is_ok())).unwrap()).unwrap();
        std::thread::sleep(Duration::from_millis(40));
        for _ in 0..3 {
            let t = tx.clone();
            d.submit(0, move |r| t.send(("urgent", r.is_ok())).unwrap()).unwrap();
        }
        drop(tx);
        gate.send(()).unwrap();
        let got: Vec<_> = rx.iter().collect();
        // The overdue new request is answered Expired, the overdue part runs, then the rest.
        assert_eq!(got, vec![("new", false), ("part", true), ("urgent", true), ("urgent", true), ("urgent", true)]);
        assert_eq!(d.depths(), vec![0, 0]);
    }

    fn items_that_waited_too_long_are_dropped_not_run(b: &Backend) {
        let mut c = cfg(b, Mode::Priority, &[0]);
        c.max_wait = Duration::from_millis(30);
        let d = Dispatcher::start(c).unwrap();
        let gate = block(&d);
        let (tx, rx) = mpsc::channel();
        for _ in 0..3 {
            let tx = tx.clone();
            d.submit(0, move |r| tx.send(r.map(|_| ())).unwrap()).unwrap();
        }
        std::thread::sleep(Duration::from_millis(60));
        gate.send(()).unwrap();
        let got: Vec<_> = rx.iter().take(3).collect();
        assert_eq!(got, vec![Err(Rejected::Expired); 3]);
        assert_eq!(d.class_stats()[0].expired.load(Ordering::Relaxed), 3);
        assert_eq!(d.class_stats()[0].served.load(Ordering::Relaxed), 1, "only the blocking item ran");
    }

    fn adaptive_lifo_serves_the_newest_first_above_the_threshold(b: &Backend) {
        let mut c = cfg(b, Mode::Priority, &[0]);
        c.lifo_above = 2;
        let d = Dispatcher::start(c).unwrap();
        let gate = block(&d);
        let (tx, rx) = mpsc::channel();
        for i in 0..5 {
            let tx = tx.clone();
            d.submit(0, move |_| tx.send(i).unwrap()).unwrap();
        }
        drop(tx);
        gate.send(()).unwrap();
        let got: Vec<i32> = rx.iter().collect();
        // 5 waiting: newest (4), then 3 (4 left > 2), then 2 (3 left > 2), then FIFO: 0, 1.
        assert_eq!(got, vec![4, 3, 2, 0, 1]);
    }

    fn stop_finishes_the_queued_items(b: &Backend) {
        let d = Dispatcher::start(cfg(b, Mode::Priority, &[0])).unwrap();
        let gate = block(&d);
        let (tx, rx) = mpsc::channel();
        for i in 0..4 {
            let tx = tx.clone();
            d.submit(0, move |r| tx.send((i, r.is_ok())).unwrap()).unwrap();
        }
        drop(tx);
        let inner = d.inner.clone();
        let stopper = std::thread::spawn(move || d.stop());
        // The stop flag is set before the threads are joined; wait for it, then release.
        while !inner.lock().stop {
            std::thread::yield_now();
        }
        gate.send(()).unwrap();
        stopper.join().unwrap();
        let got: Vec<_> = rx.iter().collect();
        assert_eq!(got, vec![(0, true), (1, true), (2, true), (3, true)]);
    }

    fn a_panicking_job_does_not_take_its_thread_down(b: &Backend) {
        let d = Dispatcher::start(cfg(b, Mode::Priority, &[0])).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            assert_eq!(d.run(0, || -> u32 { panic!("a job's bug") }).await, Err(Rejected::Stopped));
            assert_eq!(d.run(0, || 7).await, Ok(7));
        });
        assert_eq!(d.class_stats()[0].panicked.load(Ordering::Relaxed), 1);
    }

    fn inline_mode_runs_each_item_on_the_submitting_thread(b: &Backend) {
        let d = Dispatcher::start(cfg(b, Mode::Inline, &[0, 0])).unwrap();
        assert!(d.worker_stats().is_empty());
        let me = std::thread::current().id();
        let (tx, rx) = mpsc::channel();
        d.submit(1, move |r| tx.send((std::thread::current().id(), r)).unwrap()).unwrap();
        assert_eq!(rx.try_recv().unwrap(), (me, Ok(Duration::ZERO)));
        assert_eq!(d.class_stats()[1].served.load(Ordering::Relaxed), 1);
        assert_eq!(d.depths(), vec![0, 0]);
    }

    fn several_threads_share_the_work_and_account_for_it(b: &Backend) {
        let mut c = cfg(b, Mode::Priority, &[0, 10]);
        c.workers = 3;
        let d = Dispatcher::start(c).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let sum: u64 = rt.block_on(async {
            let mut s = 0;
            for i in 0..300u64 {
                s += d.run((i % 2) as usize, move || i).await.unwrap();
            }
            s
        });
        assert_eq!(sum, (0..300).sum::<u64>());
        let items: u64 = d.worker_stats().iter().map(|w| w.items.load(Ordering::Relaxed)).sum();
        assert_eq!(items, 300);
        assert_eq!(d.class_stats()[0].served.load(Ordering::Relaxed) + d.class_stats()[1].served.load(Ordering::Relaxed), 300);
    }

    fn a_busy_thread_holds_back_nothing_a_free_one_could_run(b: &Backend) {
        // Both threads blocked, then urgent items queued: the device places some of them on
        // the ports of the thread that stays blocked. The freed thread must run them all.
        let mut c = cfg(b, Mode::Priority, &[0, 0]);
        c.workers = 2;
        let d = Dispatcher::start(c).unwrap();
        let (first, second) = (block(&d), block(&d));
        let (tx, rx) = mpsc::channel();
        for i in 0..6 {
            let tx = tx.clone();
            d.submit(i % 2, move |r| tx.send(r.is_ok()).unwrap()).unwrap();
        }
        drop(tx);
        second.send(()).unwrap();
        for i in 0..6 {
            assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(true), "item {i} waits for the blocked thread");
        }
        first.send(()).unwrap();
        d.stop();
    }

    /// Every test of the queue's behaviour, once per backend: the software queue, and the
    /// event device through DPDK's `event_sw`.
    macro_rules! for_each_backend {
        ($($name:ident),* $(,)?) => {
            mod software {
                $(#[test]
                fn $name() {
                    super::$name(&super::Backend::Software)
                })*
            }
            mod event_sw {
                $(#[test]
                fn $name() {
                    super::$name(&super::Backend::Eventdev("event_sw".into()))
                })*
            }
        };
    }

    for_each_backend!(
        priority_serves_the_most_urgent_class_first,
        fifo_serves_in_arrival_order,
        a_lower_class_gets_its_share_while_a_higher_one_is_backlogged,
        a_full_queue_refuses_at_once_and_counts_it,
        continued_items_are_ordered_but_never_refused_or_expired,
        overdue_items_go_first_whatever_their_class,
        items_that_waited_too_long_are_dropped_not_run,
        stop_finishes_the_queued_items,
        a_panicking_job_does_not_take_its_thread_down,
        several_threads_share_the_work_and_account_for_it,
        a_busy_thread_holds_back_nothing_a_free_one_could_run
    );

    #[test]
    fn software_adaptive_lifo() {
        adaptive_lifo_serves_the_newest_first_above_the_threshold(&Backend::Software);
    }

    #[test]
    fn software_inline_mode() {
        inline_mode_runs_each_item_on_the_submitting_thread(&Backend::Software);
    }

    #[test]
    fn event_sw_hands_an_item_to_an_idle_thread_without_the_device() {
        // With nothing pending and a thread asleep, an item goes straight to it (as FIFO's
        // would); with a thread busy, later items go through the device in priority order.
        let d = Dispatcher::start(cfg(&Backend::Eventdev("event_sw".into()), Mode::Priority, &[0, 0])).unwrap();
        for i in 0..20 {
            while d.inner.lock().asleep == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            let (tx, rx) = mpsc::channel();
            d.submit(i % 2, move |r| tx.send(r.is_ok()).unwrap()).unwrap();
            assert!(rx.recv().unwrap());
        }
        assert_eq!(d.handoffs(), 20);
        while d.inner.lock().asleep == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(order(&d, &[1, 1, 0, 1, 0]), vec![0, 0, 1, 1, 1], "behind a busy thread the device orders them");
        assert_eq!(d.handoffs(), 21, "only the item that found the thread asleep");
        assert_eq!(d.depths(), vec![0, 0]);
        d.stop();
    }

    #[test]
    fn event_sw_keeps_the_later_parts_it_has_no_room_for() {
        // 5000 later parts of admitted work behind a blocked thread: more than the device's
        // 4096 events. None is refused; all run once the thread is free.
        let d = Dispatcher::start(cfg(&Backend::Eventdev("event_sw".into()), Mode::Priority, &[0, 0])).unwrap();
        let gate = block(&d);
        let (tx, rx) = mpsc::channel();
        for i in 0..5000u32 {
            let tx = tx.clone();
            d.submit_continued((i % 2) as usize, move |r| tx.send(r.is_ok()).unwrap()).unwrap();
        }
        drop(tx);
        assert_eq!(d.depths().iter().sum::<usize>(), 5000);
        assert!(!d.inner.lock().overflow.is_empty(), "the device took them all: the test tests nothing");
        gate.send(()).unwrap();
        let got: Vec<bool> = rx.iter().collect();
        assert_eq!((got.len(), got.iter().all(|ok| *ok)), (5000, true));
        assert_eq!(d.depths(), vec![0, 0]);
        d.stop();
    }

    #[test]
    fn event_sw_refuses_what_it_cannot_do() {
        let b = Backend::Eventdev("event_sw".into());
        let mut c = cfg(&b, Mode::Priority, &[0]);
        c.lifo_above = 2;
        let e = Dispatcher::start(c).err().expect("lifo refused").to_string();
        assert!(e.contains("lifo_above needs the software backend"), "{e}");
        let e = Dispatcher::start(cfg(&b, Mode::Inline, &[0])).err().expect("inline refused").to_string();
        assert!(e.contains("mode inline"), "{e}");
        let mut c = cfg(&b, Mode::Priority, &[0, 0, 0]);
        c.queue_limit = 1000;
        let e = Dispatcher::start(c).err().expect("too many items refused").to_string();
        assert!(e.contains("queue_limit 1000 x 3 classes"), "{e}");
        let mut c = cfg(&b, Mode::Priority, &[0]);
        c.workers = 32;
        assert!(Dispatcher::start(c).is_err());
        let e = Dispatcher::start(cfg(&Backend::Eventdev("event_nope".into()), Mode::Priority, &[0])).err().expect("unknown device").to_string();
        assert!(e.contains("event_sw"), "{e}");
    }
}
