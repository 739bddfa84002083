//! A high-dynamic-range histogram of u64 values (nanoseconds here), in the manner of
//! HdrHistogram: log-linear buckets, constant memory and O(1) recording over the whole u64
//! range, and about three significant digits (a relative error of at most 1/512).
//!
//! Values below 2^S are counted exactly. Above, a value v with its top bit at position m lands
//! in bucket b = m - (S - 1), sub-bucket v >> b, which lies in [2^(S-1), 2^S): each power of two
//! is split into 2^(S-1) equal slots.

const S: u32 = 10;
const SUB: usize = 1 << S;
const HALF: usize = SUB / 2;
const SLOTS: usize = SUB + (64 - S as usize) * HALF;

#[derive(Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    count: u64,
    sum: u128,
    min: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Histogram {{ count: {}, min: {}, max: {} }}", self.count, self.min, self.max)
    }
}

#[inline]
fn index(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let b = (63 - v.leading_zeros()) - (S - 1);
    let sub = (v >> b) as usize;
    SUB + (b as usize - 1) * HALF + (sub - HALF)
}

/// The highest value that lands in slot `i`.
fn highest(i: usize) -> u64 {
    if i < SUB {
        return i as u64;
    }
    let k = i - SUB;
    let b = (k / HALF + 1) as u32;
    let sub = (k % HALF + HALF) as u64;
    ((((sub + 1) as u128) << b) - 1).min(u64::MAX as u128) as u64
}

impl Histogram {
    pub fn new() -> Self {
        Histogram { counts: vec![0; SLOTS], count: 0, sum: 0, min: u64::MAX, max: 0 }
    }

    #[inline]
    pub fn record(&mut self, v: u64) {
        self.counts[index(v)] += 1;
        self.count += 1;
        self.sum += v as u128;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    pub fn add(&mut self, o: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        self.count += o.count;
        self.sum += o.sum;
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    pub fn min(&self) -> u64 {
        if self.count == 0 {
            0
        } else {
            self.min
        }
    }

    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64
        }
    }

    /// The value at percentile `p` (0..=100): the smallest recorded value's slot such that at
    /// least p % of the values are at or below it, reported as the slot's highest value (never
    /// above the largest recorded value). 0 when empty.
    pub fn percentile(&self, p: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((p.clamp(0.0, 100.0) / 100.0) * self.count as f64).ceil().max(1.0) as u64;
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return highest(i).min(self.max).max(self.min);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rng;

    fn exact(sorted: &[u64], p: f64) -> u64 {
        let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
        sorted[rank - 1]
    }

    #[test]
    fn slots_cover_the_range_in_order() {
        let _serial = crate::MEMORY_TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let mut last = 0;
        for v in (0..5000u64).chain([u64::MAX / 3, u64::MAX - 1, u64::MAX]) {
            let i = index(v);
            assert!(i < SLOTS, "{v}");
            assert!(v <= highest(i), "{v} above its slot's highest {}", highest(i));
            assert!(i >= last || v > 5000);
            last = i;
        }
        assert_eq!(index(u64::MAX), SLOTS - 1);
        assert_eq!(highest(SLOTS - 1), u64::MAX);
        // Slot boundaries: the value after a slot's highest starts the next slot.
        for i in 0..SLOTS - 1 {
            assert_eq!(index(highest(i)), i);
            assert_eq!(index(highest(i) + 1), i + 1, "slot {i}");
        }
    }

    #[test]
    fn percentiles_within_three_digits_of_exact() {
        let _serial = crate::MEMORY_TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let mut r = Rng(0x1234_5678_9abc_def1);
        let mut h = Histogram::new();
        let mut v = Vec::new();
        for _ in 0..200_000 {
            // Log-uniform over 1 ns .. ~1 s: every bucket size gets exercised.
            let x = 1u64 << r.below(30);
            let x = x + r.below(x);
            h.record(x);
            v.push(x);
        }
        v.sort_unstable();
        for p in [0.0, 1.0, 25.0, 50.0, 90.0, 99.0, 99.9, 99.99, 100.0] {
            let (got, want) = (h.percentile(p), exact(&v, p));
            assert!(got >= want, "p{p}: {got} < exact {want}");
            assert!((got - want) as f64 <= want as f64 / 512.0 + 1.0, "p{p}: {got} vs exact {want}");
        }
        assert_eq!(h.percentile(100.0), *v.last().unwrap());
        assert_eq!(h.min(), v[0]);
        assert_eq!(h.count(), 200_000);
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        assert!((h.mean() - mean).abs() < 1e-6 * mean);
    }

    #[test]
    fn small_values_are_exact_and_merge_adds() {
        let _serial = crate::MEMORY_TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let mut a = Histogram::new();
        let mut b = Histogram::new();
        assert_eq!(a.percentile(50.0), 0);
        for x in 1..=100 {
            a.record(x);
        }
        for x in 101..=200 {
            b.record(x);
        }
        assert_eq!(a.percentile(50.0), 50);
        assert_eq!(a.percentile(99.0), 99);
        a.add(&b);
        assert_eq!((a.count(), a.min(), a.max()), (200, 1, 200));
        assert_eq!(a.percentile(50.0), 100);
        assert_eq!(a.percentile(75.0), 150);
    }
}
