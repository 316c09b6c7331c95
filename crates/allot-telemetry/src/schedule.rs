//! Pacing for collectors: per-source interval and timeout, exponential backoff on failure, and a
//! bounded buffer between a collector and its consumer. Time is passed in (ms), so it is tested
//! without a clock.

use std::collections::VecDeque;

/// When a source is next due.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollectorSchedule {
    pub interval_ms: u64,
    /// How long one collection may take (the collector passes it to its I/O).
    pub timeout_ms: u64,
    /// The longest wait after repeated failures.
    pub backoff_max_ms: u64,
    next_due_ms: u64,
    consecutive_failures: u32,
}

impl CollectorSchedule {
    /// Due first at `start_ms`.
    pub fn new(interval_ms: u64, timeout_ms: u64, backoff_max_ms: u64, start_ms: u64) -> Self {
        CollectorSchedule {
            interval_ms: interval_ms.max(1),
            timeout_ms,
            backoff_max_ms: backoff_max_ms.max(interval_ms),
            next_due_ms: start_ms,
            consecutive_failures: 0,
        }
    }

    pub fn is_due(&self, now_ms: u64) -> bool {
        now_ms >= self.next_due_ms
    }

    pub fn next_due_ms(&self) -> u64 {
        self.next_due_ms
    }

    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    /// A collection succeeded at `now_ms`: due again one interval later.
    pub fn record_success(&mut self, now_ms: u64) {
        self.consecutive_failures = 0;
        self.next_due_ms = now_ms.saturating_add(self.interval_ms);
    }

    /// A collection failed at `now_ms`: wait interval × 2^failures, at most `backoff_max_ms`.
    pub fn record_failure(&mut self, now_ms: u64) {
        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        let factor = 1u64.checked_shl(self.consecutive_failures.min(63)).unwrap_or(u64::MAX);
        let delay = self.interval_ms.saturating_mul(factor).min(self.backoff_max_ms);
        self.next_due_ms = now_ms.saturating_add(delay);
    }
}

/// A FIFO that keeps the newest `capacity_max` items and counts what it dropped.
#[derive(Clone, Debug)]
pub struct BoundedBuffer<T> {
    items: VecDeque<T>,
    capacity_max: usize,
    dropped: u64,
}

impl<T> BoundedBuffer<T> {
    pub fn new(capacity_max: usize) -> Self {
        BoundedBuffer { items: VecDeque::new(), capacity_max: capacity_max.max(1), dropped: 0 }
    }

    /// Appends `item`, dropping the oldest one when full.
    pub fn push(&mut self, item: T) {
        if self.items.len() == self.capacity_max {
            self.items.pop_front();
            self.dropped += 1;
        }
        self.items.push_back(item);
    }

    /// Takes everything buffered, oldest first.
    pub fn drain(&mut self) -> Vec<T> {
        self.items.drain(..).collect()
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Items dropped because the buffer was full, since it was made.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_limit_and_success_resets_it() {
        let mut s = CollectorSchedule::new(1_000, 500, 10_000, 0);
        assert!(s.is_due(0));
        s.record_success(0);
        assert!(!s.is_due(999));
        assert!(s.is_due(1_000));
        s.record_failure(1_000);
        assert_eq!(s.next_due_ms(), 3_000);
        s.record_failure(3_000);
        assert_eq!(s.next_due_ms(), 7_000);
        s.record_failure(7_000);
        assert_eq!(s.next_due_ms(), 15_000); // 8 s, under the 10 s limit
        s.record_failure(15_000);
        assert_eq!(s.next_due_ms(), 25_000); // 16 s capped at 10 s
        for _ in 0..100 {
            s.record_failure(25_000);
        }
        assert_eq!(s.next_due_ms(), 35_000);
        assert_eq!(s.consecutive_failures(), 104);
        s.record_success(40_000);
        assert_eq!((s.next_due_ms(), s.consecutive_failures()), (41_000, 0));
    }

    #[test]
    fn buffer_keeps_the_newest_and_counts_drops() {
        let mut b = BoundedBuffer::new(3);
        for i in 0..5 {
            b.push(i);
        }
        assert_eq!((b.len(), b.dropped()), (3, 2));
        assert_eq!(b.drain(), vec![2, 3, 4]);
        assert!(b.is_empty());
    }
}
