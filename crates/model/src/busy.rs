// SPDX-License-Identifier: Apache-2.0
//! The booked time of one flash resource (a die or a channel).
//!
//! A request is booked when the target learns of it, which is not always when it reaches
//! the drive: a read that depends on data still on its way (SparF's token pages, chosen
//! from its dimension pages) is booked at once for the moment that data arrives. A
//! resource that kept only "free from" would then make every read booked after it wait
//! behind it, although in the drive's time those reads came first and the resource stood
//! idle. [`Busy`] keeps the booked spans themselves, so a later booking for an earlier time
//! takes the idle time between them; what is booked is never moved. Spans long past are
//! forgotten, and the time before the last of them is then never free again: a booking
//! for then starts after it, as it would behind a "free from" time.

use std::collections::VecDeque;

/// The spans (ns, `[start, end)`) during which one resource is booked: in order, disjoint,
/// touching spans merged.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Busy {
    spans: VecDeque<(u64, u64)>,
    /// Where the last forgotten span ended: nothing starts before it.
    forgotten_end: u64,
}

impl Busy {
    /// The earliest time at or after `at` from which the resource is free for `len` ns.
    pub fn fit(&self, at: u64, len: u64) -> u64 {
        let mut t = at.max(self.forgotten_end);
        if self.end() <= t {
            // After everything booked: what bookings in time order mostly find.
            return t;
        }
        let first = self.spans.partition_point(|&(_, end)| end <= t);
        for &(start, end) in self.spans.range(first..) {
            if start >= t.saturating_add(len) {
                break;
            }
            t = t.max(end);
        }
        t
    }

    /// The end of the first booked span that overlaps `[from, to)`, if any.
    pub fn overlap_end(&self, from: u64, to: u64) -> Option<u64> {
        if from < self.forgotten_end && to > from {
            return Some(self.forgotten_end);
        }
        if self.end() <= from {
            return None;
        }
        let i = self.spans.partition_point(|&(_, end)| end <= from);
        self.spans.get(i).filter(|&&(start, _)| start < to).map(|&(_, end)| end)
    }

    /// Books `[from, to)`, which must be free (see [`Busy::fit`]).
    pub fn book(&mut self, from: u64, to: u64) {
        if from >= to {
            return;
        }
        match self.spans.back_mut() {
            Some(last) if last.1 == from => return last.1 = to,
            Some(last) if last.1 < from => return self.spans.push_back((from, to)),
            None => return self.spans.push_back((from, to)),
            _ => {}
        }
        let i = self.spans.partition_point(|&(start, _)| start < from);
        debug_assert!(i == 0 || self.spans[i - 1].1 <= from, "booked over a busy span");
        debug_assert!(self.spans.get(i).is_none_or(|&(start, _)| start >= to), "booked over a busy span");
        let joins_before = i > 0 && self.spans[i - 1].1 == from;
        let joins_after = self.spans.get(i).is_some_and(|&(start, _)| start == to);
        match (joins_before, joins_after) {
            (true, true) => {
                let end = self.spans[i].1;
                self.spans[i - 1].1 = end;
                self.spans.remove(i);
            }
            (true, false) => self.spans[i - 1].1 = to,
            (false, true) => self.spans[i].0 = from,
            (false, false) => self.spans.insert(i, (from, to)),
        }
    }

    /// When the last booked span ends (0 when none was ever booked).
    pub fn end(&self) -> u64 {
        self.spans.back().map_or(self.forgotten_end, |&(_, end)| end)
    }

    /// Forgets the spans that end at or before `t`: the time before the last of them is
    /// no longer free (see the module's documentation).
    pub fn forget_before(&mut self, t: u64) {
        while let Some(&(_, end)) = self.spans.front().filter(|&&(_, end)| end <= t) {
            self.forgotten_end = self.forgotten_end.max(end);
            self.spans.pop_front();
        }
    }

    /// Booked spans kept.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.spans.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_booking_takes_the_first_gap_that_holds_it() {
        let mut b = Busy::default();
        assert_eq!(b.fit(5, 10), 5, "an idle resource starts when asked");
        b.book(100, 200);
        b.book(230, 300);
        assert_eq!(b.fit(0, 100), 0, "ends right where the first span starts");
        assert_eq!(b.fit(0, 101), 300, "too long for either gap");
        assert_eq!(b.fit(150, 30), 200, "inside a span: after it");
        assert_eq!(b.fit(150, 31), 300, "the gap after it is 30 long");
        assert_eq!(b.fit(210, 20), 210);
        assert_eq!(b.fit(400, 1), 400);
        assert_eq!(b.overlap_end(150, 160), Some(200));
        assert_eq!(b.overlap_end(200, 230), None);
        assert_eq!(b.overlap_end(199, 231), Some(200));
        assert_eq!(b.end(), 300);
    }

    #[test]
    fn touching_spans_merge_and_old_ones_are_forgotten() {
        let mut b = Busy::default();
        b.book(10, 20);
        b.book(30, 40);
        b.book(20, 30);
        assert_eq!(b.len(), 1);
        assert_eq!(b.fit(0, 11), 40);
        b.book(50, 60);
        b.book(45, 50);
        b.book(40, 41);
        assert_eq!(b.len(), 2);
        b.forget_before(42);
        assert_eq!(b.len(), 1);
        assert_eq!(b.fit(0, 4), 41, "nothing goes before a forgotten span's end");
        assert_eq!(b.overlap_end(30, 42), Some(41));
        assert_eq!(b.overlap_end(41, 45), None);
        b.book(41, 41);
        assert_eq!(b.len(), 1, "an empty span books nothing");
        b.forget_before(100);
        assert_eq!((b.len(), b.end(), b.fit(0, 1)), (0, 60, 60), "forgotten, the last end stays");
    }

    /// Random bookings, each where `fit` puts it, against a bitmap of busy nanoseconds.
    #[test]
    fn fit_finds_the_earliest_free_run_and_bookings_never_overlap() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let mut b = Busy::default();
        let mut busy = vec![false; 4096];
        for _ in 0..600 {
            let (at, len) = (next(3000), 1 + next(12));
            let got = b.fit(at, len);
            let want = (at..).find(|&t| (t..t + len).all(|u| !busy.get(u as usize).copied().unwrap_or(false))).unwrap();
            assert_eq!(got, want, "fit({at}, {len})");
            if got + len <= busy.len() as u64 {
                assert_eq!(b.overlap_end(got, got + len), None);
                b.book(got, got + len);
                (got..got + len).for_each(|u| busy[u as usize] = true);
            }
        }
    }
}
