//! Client affinity (Kubernetes' `sessionAffinity: ClientIP`): a service's new flows from a
//! client that opened one within the last `timeout` go to the backend that client had, instead
//! of where the scheduler would send them. Entries, not a hash: a client keeps its backend
//! while the backend set changes around it, and loses it once the timeout passes without a
//! new flow (kube-proxy's `recent` match and IPVS persistence behave the same way: the time
//! counts from the client's last new connection).
//!
//! One table per service, shared by every worker (a client's flows may arrive on any queue):
//! a lock taken only when a flow is created, never per packet. The table is bounded
//! ([`MAX_ENTRIES`]): when full, expired entries go first; if none has, the new client is
//! served by the scheduler without an entry (counted), so a flood of source addresses costs
//! affinity for the newest clients, never memory.

use crate::hash::FxHashMap;
use std::sync::Mutex;

/// Clients remembered per service.
pub const MAX_ENTRIES: usize = 65_536;

/// The longest timeout, in seconds: Kubernetes' own limit for `timeoutSeconds` (a day).
pub const MAX_TIMEOUT_S: u32 = 86_400;

/// A timeout given in seconds (the file's and the API's `affinity_timeout_s`) as the service's
/// milliseconds; an error naming the range for 0 or more than a day.
pub fn timeout_ms(seconds: u32) -> Result<u32, String> {
    if seconds == 0 || seconds > MAX_TIMEOUT_S {
        return Err(format!("{seconds}: seconds from 1 to {MAX_TIMEOUT_S} (leave it out for no affinity)"));
    }
    Ok(seconds * 1000)
}

#[derive(Debug)]
pub struct Affinity {
    /// Milliseconds an entry lives after the client's last new flow.
    pub timeout_ms: u32,
    table: Mutex<FxHashMap<u128, Entry>>,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    backend: u32,
    expire: u32,
}

/// Whether `t` (a time in the core's wrapping millisecond clock) is still ahead of `now`.
fn ahead(t: u32, now: u32) -> bool {
    (t.wrapping_sub(now) as i32) > 0
}

impl Affinity {
    pub fn new(timeout_ms: u32) -> Affinity {
        Affinity { timeout_ms, table: Mutex::new(FxHashMap::default()) }
    }

    /// The backend id client `client` was given, if its entry has not expired.
    pub fn lookup(&self, client: u128, now: u32) -> Option<u32> {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        match t.get(&client) {
            Some(e) if ahead(e.expire, now) => Some(e.backend),
            Some(_) => {
                t.remove(&client);
                None
            }
            None => None,
        }
    }

    /// Remembers (or refreshes) that `client` goes to `backend`; false when the table is full
    /// of live entries and the client is not remembered.
    pub fn record(&self, client: u128, backend: u32, now: u32) -> bool {
        let expire = now.wrapping_add(self.timeout_ms.max(1));
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if t.len() >= MAX_ENTRIES && !t.contains_key(&client) {
            t.retain(|_, e| ahead(e.expire, now));
            if t.len() >= MAX_ENTRIES {
                return false;
            }
        }
        t.insert(client, Entry { backend, expire });
        true
    }

    /// Clients remembered (expired ones included until they are next looked at).
    pub fn len(&self) -> usize {
        self.table.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_lives_for_the_timeout_after_the_last_flow() {
        let a = Affinity::new(10_000);
        assert_eq!(a.lookup(7, 0), None);
        assert!(a.record(7, 3, 0));
        assert_eq!(a.lookup(7, 9_999), Some(3));
        // A new flow at 9 s refreshes it: still there at 18 s.
        assert!(a.record(7, 3, 9_000));
        assert_eq!(a.lookup(7, 18_000), Some(3));
        assert_eq!(a.lookup(7, 19_000), None, "expired 10 s after the last flow");
        assert!(a.is_empty(), "an expired entry is removed when looked at");
    }

    #[test]
    fn the_clock_may_wrap() {
        let a = Affinity::new(10_000);
        let now = u32::MAX - 1_000;
        a.record(1, 2, now);
        assert_eq!(a.lookup(1, now.wrapping_add(5_000)), Some(2));
        assert_eq!(a.lookup(1, now.wrapping_add(11_000)), None);
    }

    #[test]
    fn a_full_table_makes_room_from_expired_entries_only() {
        let a = Affinity::new(1_000);
        for c in 0..MAX_ENTRIES as u128 {
            assert!(a.record(c, 1, 0));
        }
        assert!(!a.record(u128::MAX, 1, 500), "full of live entries: not remembered");
        assert_eq!(a.lookup(5, 500), Some(1), "the others keep theirs");
        assert!(a.record(u128::MAX, 1, 2_000), "once they expired, room is made");
        assert_eq!(a.len(), 1);
    }
}
