// SPDX-License-Identifier: Apache-2.0
//! The free-space allocator: an extent free list kept sorted and coalesced.
//!
//! An extent list rather than a bitmap: its size follows fragmentation, not device size,
//! and a private namespace holding a few large files (a KV store's redb file, logs) has
//! little of it. The list is written whole into each metadata commit.

use crate::layout::Extent;
use std::collections::BTreeMap;

/// Free blocks: start → count, no two touching (touching extents are merged).
#[derive(Clone, Debug, Default)]
pub(crate) struct FreeList {
    map: BTreeMap<u64, u64>,
    total: u64,
}

impl FreeList {
    /// A list of `extents`, which must not overlap (checked by the caller).
    pub fn from_extents(extents: &[Extent]) -> FreeList {
        let mut f = FreeList::default();
        for e in extents {
            f.insert(*e);
        }
        f
    }

    /// Free blocks in all.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The extents, in block order.
    pub fn extents(&self) -> Vec<Extent> {
        self.map.iter().map(|(s, c)| Extent { start: *s, count: *c }).collect()
    }

    /// Number of extents.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Marks `e` free, merging it with its neighbours.
    pub fn insert(&mut self, e: Extent) {
        if e.count == 0 {
            return;
        }
        let (mut start, mut count) = (e.start, e.count);
        if let Some((&ps, &pc)) = self.map.range(..start).next_back() {
            debug_assert!(ps + pc <= start, "freeing {e:?}, which overlaps free {ps}+{pc}");
            if ps + pc == start {
                self.map.remove(&ps);
                start = ps;
                count += pc;
            }
        }
        if let Some(nc) = self.map.remove(&(start + count)) {
            count += nc;
        }
        debug_assert!(self.map.range(start..start + count).next().is_none(), "freeing {e:?}, which overlaps a free extent");
        self.map.insert(start, count);
        self.total += e.count;
    }

    /// Takes exactly `[start, start + count)` if it is all free (to grow a file in place).
    pub fn take_at(&mut self, start: u64, count: u64) -> bool {
        let Some((&fs, &fc)) = self.map.range(..=start).next_back() else { return false };
        if fs + fc < start + count {
            return false;
        }
        self.map.remove(&fs);
        if fs < start {
            self.map.insert(fs, start - fs);
        }
        if start + count < fs + fc {
            self.map.insert(start + count, fs + fc - start - count);
        }
        self.total -= count;
        true
    }

    /// Takes `count` blocks in at most `max_extents` extents: one extent if any is large
    /// enough (the first from the start, or from the end with `from_end`, which keeps
    /// metadata away from the data that grows at the front), else the largest extents.
    /// `None` (nothing taken) if that cannot be done.
    pub fn take(&mut self, count: u64, max_extents: usize, from_end: bool) -> Option<Vec<Extent>> {
        if count == 0 {
            return Some(Vec::new());
        }
        if count > self.total || max_extents == 0 {
            return None;
        }
        let fits = |(s, c): (&u64, &u64)| (*c >= count).then_some((*s, *c));
        let one = if from_end { self.map.iter().rev().find_map(fits) } else { self.map.iter().find_map(fits) };
        if let Some((s, c)) = one {
            let start = if from_end { s + c - count } else { s };
            assert!(self.take_at(start, count));
            return Some(vec![Extent { start, count }]);
        }
        let mut by_size: Vec<(u64, u64)> = self.map.iter().map(|(s, c)| (*c, *s)).collect();
        by_size.sort_unstable_by(|a, b| b.cmp(a));
        let mut out = Vec::new();
        let mut left = count;
        for (c, s) in by_size.into_iter().take(max_extents) {
            let n = c.min(left);
            out.push(Extent { start: s, count: n });
            left -= n;
            if left == 0 {
                break;
            }
        }
        if left > 0 {
            return None;
        }
        for e in &out {
            assert!(self.take_at(e.start, e.count));
        }
        out.sort();
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x(start: u64, count: u64) -> Extent {
        Extent { start, count }
    }

    #[test]
    fn take_and_free_coalesce() {
        let mut f = FreeList::from_extents(&[x(2, 10), x(20, 5)]);
        assert_eq!(f.total(), 15);
        assert_eq!(f.take(3, 4, false).unwrap(), vec![x(2, 3)]);
        assert_eq!(f.take(2, 4, true).unwrap(), vec![x(23, 2)]);
        assert!(f.take_at(5, 2));
        assert!(!f.take_at(5, 1));
        assert_eq!(f.extents(), vec![x(7, 5), x(20, 3)]);
        // Neither extent alone holds 7 blocks: the largest ones together do.
        assert_eq!(f.take(7, 2, false).unwrap(), vec![x(7, 5), x(20, 2)]);
        assert!(f.take(2, 4, false).is_none());
        f.insert(x(2, 5));
        f.insert(x(12, 8));
        f.insert(x(7, 5));
        f.insert(x(20, 2));
        assert_eq!(f.extents(), vec![x(2, 21)]);
        assert_eq!(f.total(), 21);
        assert!(f.take(22, 4, false).is_none());
    }
}
