//! A TCP relay into a network namespace: a listener on `127.0.0.1:PORT` *inside* the
//! namespace whose connections are carried to `127.0.0.1:PORT` of the test's own namespace.
//! A process run in a test's namespace (kube-proxy, say) then reaches the API server on the
//! host's loopback without any interface or address added to the host.

use std::io;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub struct Relay {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Listens on 127.0.0.1:`port` in the namespace `/var/run/netns/NETNS`.
pub fn into_netns(netns: &str, port: u16) -> io::Result<Relay> {
    let ns = std::fs::File::open(format!("/var/run/netns/{netns}"))?;
    // The listener is made on a thread that entered the namespace (a socket stays in the
    // namespace it was made in); that thread ends right after.
    let listener = std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns on a descriptor we own; only this short-lived thread changes namespace.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            TcpListener::bind(("127.0.0.1", port))
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the namespace thread panicked")))
    })?;
    listener.set_nonblocking(true)?;
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let thread = std::thread::spawn(move || {
        while !st.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((inside, _)) => {
                    let _ = inside.set_nonblocking(false);
                    if let Ok(outside) = TcpStream::connect(("127.0.0.1", port)) {
                        pipe(inside, outside);
                    }
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    });
    Ok(Relay { stop, thread: Some(thread) })
}

/// Copies both ways until either side closes.
fn pipe(a: TcpStream, b: TcpStream) {
    for (mut from, mut to) in [(a.try_clone(), b.try_clone()), (b.try_clone(), a.try_clone())].into_iter().filter_map(|(x, y)| Some((x.ok()?, y.ok()?))) {
        std::thread::spawn(move || {
            let _ = io::copy(&mut from, &mut to);
            let _ = to.shutdown(Shutdown::Write);
        });
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
