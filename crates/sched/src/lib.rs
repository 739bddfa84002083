//! Backend schedulers.
//!
//! A [`Scheduler`] is built once per service whenever the service's backend set changes; it is
//! immutable and shared by every worker core through the configuration snapshot. What changes
//! per pick (the round-robin cursor, smooth-WRR credits) lives in a [`PickState`] that each
//! core owns, and the active-session counts that `wlc` reads are the core's own. Cores therefore
//! never write shared memory to schedule.
//!
//! Weight 0 drains a backend: it is never picked for a new session, while the sessions it has
//! continue (they are found in the session table, not scheduled again).

/// Default Maglev lookup-table size (prime, as in the Maglev paper and Katran).
pub const MAGLEV_DEFAULT_SIZE: u32 = 65537;
/// Largest Maglev table accepted.
pub const MAGLEV_MAX_SIZE: u32 = 1 << 24;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Round robin over backends with non-zero weight.
    Rr,
    /// Smooth weighted round robin: over one period of sum(weights) picks each backend is
    /// picked exactly `weight` times, interleaved.
    Wrr,
    /// Weighted least connections: the backend minimising active/weight.
    Wlc,
    /// Source hash: the client address picks the backend, consistently (a Maglev table keyed by
    /// the source address only).
    Sh { table_size: u32 },
    /// Weighted Maglev consistent hashing over the flow's 5-tuple.
    Maglev { table_size: u32 },
}

impl Algorithm {
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::Rr => "rr",
            Algorithm::Wrr => "wrr",
            Algorithm::Wlc => "wlc",
            Algorithm::Sh { .. } => "sh",
            Algorithm::Maglev { .. } => "maglev",
        }
    }

    /// Whether every node with the same backends picks the same one for a flow (the hash
    /// schedulers); rr, wrr and wlc depend on the node's own history.
    pub fn consistent(&self) -> bool {
        matches!(self, Algorithm::Sh { .. } | Algorithm::Maglev { .. })
    }

    /// Parses a scheduler name; hash schedulers get the default table size.
    pub fn parse(name: &str) -> Option<Algorithm> {
        Some(match name {
            "rr" => Algorithm::Rr,
            "wrr" => Algorithm::Wrr,
            "wlc" => Algorithm::Wlc,
            "sh" => Algorithm::Sh { table_size: MAGLEV_DEFAULT_SIZE },
            "maglev" => Algorithm::Maglev { table_size: MAGLEV_DEFAULT_SIZE },
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedError {
    #[error("maglev table size {0} is not prime (try 65537)")]
    TableSizeNotPrime(u32),
    #[error("maglev table size {0} is out of range (3..={MAGLEV_MAX_SIZE})")]
    TableSizeOutOfRange(u32),
    /// More backends than the table has entries.
    #[error("{backends} backends do not fit a maglev table of {table_size}; use a larger prime")]
    TooManyBackends { backends: usize, table_size: u32 },
}

/// What the scheduler knows of a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub weight: u32,
    /// A stable identity (a hash of the backend's address and port): Maglev permutations depend
    /// on it, not on the backend's position in the list, so reordering changes nothing.
    pub key: u64,
}

/// Per-core mutable scheduling state for one service.
#[derive(Debug, Clone, Default)]
pub struct PickState {
    cursor: usize,
    credit: Vec<i64>,
}

#[derive(Debug, Clone)]
pub struct Scheduler {
    alg: Algorithm,
    weights: Vec<u32>,
    /// Indices of backends with non-zero weight.
    eligible: Vec<u32>,
    /// Maglev lookup table for `sh` and `maglev`: entry -> backend index.
    table: Vec<u32>,
}

pub fn is_prime(n: u32) -> bool {
    if n < 2 {
        return false;
    }
    if n.is_multiple_of(2) {
        return n == 2;
    }
    let mut d = 3u32;
    while (d as u64) * (d as u64) <= n as u64 {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 2;
    }
    true
}

/// A 64-bit mixer (the finaliser of SplitMix64), used for permutation seeds.
#[inline]
pub fn mix64(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Builds a weighted Maglev table (Eisenbud et al., NSDI 2016, §3.4 with weights): each backend
/// walks its own permutation of the table and claims free entries, taking turns in proportion to
/// its weight.
pub fn maglev_table(targets: &[Target], size: u32) -> Result<Vec<u32>, SchedError> {
    if !(3..=MAGLEV_MAX_SIZE).contains(&size) {
        return Err(SchedError::TableSizeOutOfRange(size));
    }
    if !is_prime(size) {
        return Err(SchedError::TableSizeNotPrime(size));
    }
    let mut live: Vec<usize> = (0..targets.len()).filter(|&i| targets[i].weight > 0).collect();
    // Claim order decides contested entries: order by identity so the list order does not matter.
    live.sort_by_key(|&i| (targets[i].key, i));
    if live.len() > size as usize {
        return Err(SchedError::TooManyBackends { backends: live.len(), table_size: size });
    }
    let m = size as u64;
    let mut table = vec![u32::MAX; size as usize];
    if live.is_empty() {
        return Ok(table);
    }
    let wmax = live.iter().map(|&i| targets[i].weight as u64).max().unwrap();
    let perm: Vec<(u64, u64)> = live
        .iter()
        .map(|&i| {
            let k = targets[i].key;
            let offset = mix64(k ^ 0x6d61_676c_6576_0001) % m;
            let skip = mix64(k ^ 0x6d61_676c_6576_0002) % (m - 1) + 1;
            (offset, skip)
        })
        .collect();
    let mut next = vec![0u64; live.len()];
    let mut claimed = vec![0u64; live.len()];
    let mut filled = 0u64;
    let mut round = 0u64;
    while filled < m {
        round += 1;
        for (j, &i) in live.iter().enumerate() {
            // Backend j may hold round * w / wmax entries by the end of this round.
            while claimed[j] * wmax < round * targets[i].weight as u64 && filled < m {
                let (offset, skip) = perm[j];
                let mut c = (offset + next[j] * skip) % m;
                while table[c as usize] != u32::MAX {
                    next[j] += 1;
                    c = (offset + next[j] * skip) % m;
                }
                table[c as usize] = i as u32;
                next[j] += 1;
                claimed[j] += 1;
                filled += 1;
            }
        }
    }
    Ok(table)
}

impl Scheduler {
    pub fn new(alg: Algorithm, targets: &[Target]) -> Result<Self, SchedError> {
        let weights: Vec<u32> = targets.iter().map(|t| t.weight).collect();
        let eligible = (0..targets.len() as u32).filter(|&i| weights[i as usize] > 0).collect();
        let table = match alg {
            Algorithm::Sh { table_size } | Algorithm::Maglev { table_size } => maglev_table(targets, table_size)?,
            _ => Vec::new(),
        };
        Ok(Scheduler { alg, weights, eligible, table })
    }

    pub fn algorithm(&self) -> Algorithm {
        self.alg
    }

    /// Whether any backend can take new sessions.
    pub fn has_eligible(&self) -> bool {
        !self.eligible.is_empty()
    }

    /// Whether backend `i` can take new sessions (weight above 0, not marked down).
    pub fn is_eligible(&self, i: u32) -> bool {
        self.weights.get(i as usize).is_some_and(|w| *w > 0)
    }

    /// Picks a backend index for a new session, or `None` when every backend is drained.
    /// `flow_hash` hashes the whole 5-tuple, `src_hash` the client address; `active` holds this
    /// core's active-session count per backend (read by `wlc` only).
    #[inline]
    pub fn pick(&self, st: &mut PickState, flow_hash: u64, src_hash: u64, active: &[u32]) -> Option<u32> {
        if self.eligible.is_empty() {
            return None;
        }
        match self.alg {
            Algorithm::Rr => {
                let i = self.eligible[st.cursor % self.eligible.len()];
                st.cursor = st.cursor.wrapping_add(1);
                Some(i)
            }
            Algorithm::Wrr => {
                if st.credit.len() != self.weights.len() {
                    st.credit = vec![0; self.weights.len()];
                }
                let total: i64 = self.eligible.iter().map(|&i| self.weights[i as usize] as i64).sum();
                let mut best = self.eligible[0];
                for &i in &self.eligible {
                    st.credit[i as usize] += self.weights[i as usize] as i64;
                    if st.credit[i as usize] > st.credit[best as usize] {
                        best = i;
                    }
                }
                st.credit[best as usize] -= total;
                Some(best)
            }
            Algorithm::Wlc => {
                let mut best = self.eligible[0];
                for &i in &self.eligible[1..] {
                    let (ai, wi) = (active.get(i as usize).copied().unwrap_or(0) as u64, self.weights[i as usize] as u64);
                    let (ab, wb) = (active.get(best as usize).copied().unwrap_or(0) as u64, self.weights[best as usize] as u64);
                    // ai/wi < ab/wb without division.
                    if ai * wb < ab * wi {
                        best = i;
                    }
                }
                Some(best)
            }
            Algorithm::Sh { .. } => Some(self.table[(src_hash % self.table.len() as u64) as usize]),
            Algorithm::Maglev { .. } => Some(self.table[(flow_hash % self.table.len() as u64) as usize]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets(weights: &[u32]) -> Vec<Target> {
        weights.iter().enumerate().map(|(i, &w)| Target { weight: w, key: mix64(i as u64 + 1000) }).collect()
    }

    fn counts(s: &Scheduler, n: usize, picks: usize) -> Vec<usize> {
        let mut st = PickState::default();
        let mut c = vec![0; n];
        for k in 0..picks {
            let h = mix64(k as u64);
            c[s.pick(&mut st, h, h, &vec![0; n]).unwrap() as usize] += 1;
        }
        c
    }

    #[test]
    fn rr_skips_drained() {
        let s = Scheduler::new(Algorithm::Rr, &targets(&[1, 0, 5])).unwrap();
        assert_eq!(counts(&s, 3, 10), vec![5, 0, 5]);
    }

    #[test]
    fn wrr_exact_ratio_and_interleaved() {
        let s = Scheduler::new(Algorithm::Wrr, &targets(&[5, 1, 1])).unwrap();
        let mut st = PickState::default();
        let seq: Vec<u32> = (0..7).map(|_| s.pick(&mut st, 0, 0, &[]).unwrap()).collect();
        // nginx's smooth WRR sequence for 5:1:1.
        assert_eq!(seq, vec![0, 0, 1, 0, 2, 0, 0]);
        assert_eq!(counts(&s, 3, 700), vec![500, 100, 100]);
    }

    #[test]
    fn wlc_prefers_least_loaded_per_weight() {
        let s = Scheduler::new(Algorithm::Wlc, &targets(&[1, 2, 1])).unwrap();
        let mut st = PickState::default();
        assert_eq!(s.pick(&mut st, 0, 0, &[3, 5, 2]), Some(2));
        assert_eq!(s.pick(&mut st, 0, 0, &[3, 5, 4]), Some(1));
        let drained = Scheduler::new(Algorithm::Wlc, &targets(&[0, 0])).unwrap();
        assert_eq!(drained.pick(&mut st, 0, 0, &[0, 0]), None);
    }

    #[test]
    fn maglev_rejects_bad_sizes() {
        assert_eq!(maglev_table(&targets(&[1]), 65536).err(), Some(SchedError::TableSizeNotPrime(65536)));
        assert!(maglev_table(&targets(&[1]), 2).is_err());
        assert!(maglev_table(&targets(&[1; 10]), 7).is_err());
    }

    #[test]
    fn maglev_balance_equal_weights() {
        for n in [3usize, 10, 100] {
            let t = maglev_table(&targets(&vec![1; n]), MAGLEV_DEFAULT_SIZE).unwrap();
            let mut c = vec![0usize; n];
            for &b in &t {
                c[b as usize] += 1;
            }
            let ideal = MAGLEV_DEFAULT_SIZE as f64 / n as f64;
            for &x in &c {
                assert!((x as f64 - ideal).abs() / ideal < 0.01, "n={n} counts={c:?}");
            }
        }
    }

    #[test]
    fn maglev_weights_are_proportional() {
        let t = maglev_table(&targets(&[1, 2, 3, 0]), MAGLEV_DEFAULT_SIZE).unwrap();
        let mut c = [0usize; 4];
        for &b in &t {
            c[b as usize] += 1;
        }
        assert_eq!(c[3], 0);
        let total = MAGLEV_DEFAULT_SIZE as f64;
        for (i, w) in [1.0, 2.0, 3.0].iter().enumerate() {
            let share = c[i] as f64 / total;
            assert!((share - w / 6.0).abs() < 0.01, "{c:?}");
        }
    }

    #[test]
    fn maglev_removal_disrupts_about_one_nth() {
        for n in [5usize, 10, 50] {
            let all = targets(&vec![1; n]);
            let before = maglev_table(&all, MAGLEV_DEFAULT_SIZE).unwrap();
            // Remove the backend in the middle; the rest keep their identity keys.
            let removed = n / 2;
            let mut rest = all.clone();
            rest.remove(removed);
            let after = maglev_table(&rest, MAGLEV_DEFAULT_SIZE).unwrap();
            let map_back = |i: u32| if (i as usize) < removed { i } else { i + 1 };
            let moved = before.iter().zip(&after).filter(|(b, a)| **b != map_back(**a)).count();
            let frac = moved as f64 / MAGLEV_DEFAULT_SIZE as f64;
            let ideal = 1.0 / n as f64;
            // The removed backend's own entries must move; Maglev moves a little more.
            assert!(frac >= ideal * 0.99 && frac < ideal * 1.6, "n={n}: moved {frac:.4}, ideal {ideal:.4}");
        }
    }

    #[test]
    fn maglev_ignores_order() {
        let t = targets(&[1, 1, 1]);
        let a = maglev_table(&t, 251).unwrap();
        let rev: Vec<Target> = t.iter().rev().copied().collect();
        let b = maglev_table(&rev, 251).unwrap();
        assert!(a.iter().zip(&b).all(|(x, y)| *x == 2 - *y));
    }

    #[test]
    fn primes() {
        assert!(is_prime(65537) && is_prime(4093) && !is_prime(65535) && !is_prime(1) && is_prime(2));
    }
}
