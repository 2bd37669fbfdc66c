// SPDX-License-Identifier: Apache-2.0
//! Page-mapped flash translation layer: the bookkeeping half of [`Flash`](crate::Flash).
//!
//! Every logical page has a home die fixed by striping (see [`Flash`](crate::Flash)); the FTL
//! decides which block and page of that die holds the current copy. Each die has one open
//! block that takes host writes and garbage-collection copies in arrival order, a FIFO list of
//! free blocks, and greedy garbage collection: when a die is down to fewer than
//! [`GC_LOW_WATER`] free blocks, the closed block with the fewest valid pages is the victim,
//! its valid pages are copied to the open block and it is erased. The FTL only counts that
//! work ([`GcWork`]); the caller turns it into die and channel time.

use std::collections::VecDeque;

use crate::{FlashConfig, ModelError};

/// Marks an unmapped logical page or an invalid physical page.
pub(crate) const UNMAPPED: u32 = u32::MAX;
/// Garbage collection runs while a die has fewer free blocks than this.
pub(crate) const GC_LOW_WATER: usize = 2;
/// Blocks per die beyond the logical share that are always provisioned, whatever the
/// over-provisioning fraction, so that a victim with an invalid page always exists.
pub(crate) const SPARE_BLOCKS: u64 = 4;

/// Sizes derived from a [`FlashConfig`] and a logical capacity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// Dies in the drive (channels × dies per channel).
    pub dies: u32,
    /// Pages per block.
    pub pages_per_block: u32,
    /// Physical blocks per die, a multiple of the plane count.
    pub blocks_per_die: u32,
    /// Logical pages exposed (capacity rounded up to whole pages).
    pub logical_pages: u64,
}

impl Geometry {
    /// Sizes the physical array for `logical_bytes` of user capacity.
    pub fn new(cfg: &FlashConfig, logical_bytes: u64) -> Result<Geometry, ModelError> {
        let dies = cfg.channels * cfg.dies_per_channel;
        let ppb = u64::from(cfg.pages_per_block);
        let logical_pages = logical_bytes.div_ceil(u64::from(cfg.page_bytes));
        let per_die = logical_pages.div_ceil(u64::from(dies));
        let with_op = ((per_die as f64) * (1.0 + cfg.over_provisioning)).ceil() as u64;
        let blocks = with_op.div_ceil(ppb).max(per_die.div_ceil(ppb) + SPARE_BLOCKS);
        let blocks = blocks.next_multiple_of(u64::from(cfg.planes_per_die));
        let physical = blocks * ppb * u64::from(dies);
        let max = u64::from(UNMAPPED) - 1;
        if physical > max || logical_pages > max {
            return Err(ModelError::TooLarge { logical_bytes, page_bytes: cfg.page_bytes, pages: physical, max });
        }
        Ok(Geometry { dies, pages_per_block: cfg.pages_per_block, blocks_per_die: blocks as u32, logical_pages })
    }

    /// Physical pages in the whole drive.
    pub fn physical_pages(&self) -> u64 {
        u64::from(self.dies) * u64::from(self.blocks_per_die) * u64::from(self.pages_per_block)
    }

    /// Bytes of memory the page maps take once built: 4 per logical page (L2P), 4 per
    /// physical page (reverse map) and 5 per block (valid count and state).
    pub fn map_bytes(&self) -> u64 {
        let blocks = u64::from(self.dies) * u64::from(self.blocks_per_die);
        4 * self.logical_pages + 4 * self.physical_pages() + 5 * blocks
    }
}

/// Garbage-collection work done before a host write could be placed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GcWork {
    /// Valid pages copied out of victims.
    pub moved: u64,
    /// Victim blocks erased.
    pub erased: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockState {
    Free,
    Open,
    Closed,
}

/// The page maps and block lists of every die.
pub(crate) struct Ftl {
    ppb: u32,
    blocks_per_die: u32,
    l2p: Vec<u32>,
    p2l: Vec<u32>,
    valid: Vec<u32>,
    state: Vec<BlockState>,
    free: Vec<VecDeque<u32>>,
    /// Per die: the open block and the next page to program in it.
    open: Vec<Option<(u32, u32)>>,
}

impl Ftl {
    /// An empty drive: nothing mapped, every block free.
    pub fn new(g: &Geometry) -> Ftl {
        let blocks = g.dies as usize * g.blocks_per_die as usize;
        let free = (0..g.dies).map(|d| (d * g.blocks_per_die..(d + 1) * g.blocks_per_die).collect()).collect();
        Ftl {
            ppb: g.pages_per_block,
            blocks_per_die: g.blocks_per_die,
            l2p: vec![UNMAPPED; g.logical_pages as usize],
            p2l: vec![UNMAPPED; g.physical_pages() as usize],
            valid: vec![0; blocks],
            state: vec![BlockState::Free; blocks],
            free,
            open: vec![None; g.dies as usize],
        }
    }

    /// Places a new copy of logical page `lpn` on `die`, first collecting garbage on that die
    /// if it is short of free blocks. Returns the collection work done.
    pub fn write(&mut self, lpn: u64, die: u32) -> GcWork {
        self.discard(lpn);
        let mut work = GcWork::default();
        while self.free[die as usize].len() < GC_LOW_WATER {
            match self.collect(die) {
                Some(moved) => {
                    work.moved += moved;
                    work.erased += 1;
                }
                None => break,
            }
        }
        let ppn = self.alloc(die);
        self.map(lpn, ppn);
        work
    }

    /// Forgets logical page `lpn` (its physical copy becomes invalid).
    pub fn discard(&mut self, lpn: u64) {
        let old = std::mem::replace(&mut self.l2p[lpn as usize], UNMAPPED);
        if old != UNMAPPED {
            self.p2l[old as usize] = UNMAPPED;
            self.valid[(old / self.ppb) as usize] -= 1;
        }
    }

    /// Whether logical page `lpn` currently has a physical copy.
    #[cfg(test)]
    pub fn is_mapped(&self, lpn: u64) -> bool {
        self.l2p[lpn as usize] != UNMAPPED
    }

    /// Valid pages summed over all blocks (equals the number of mapped logical pages).
    #[cfg(test)]
    pub fn valid_pages(&self) -> u64 {
        self.valid.iter().map(|v| u64::from(*v)).sum()
    }

    fn map(&mut self, lpn: u64, ppn: u32) {
        self.l2p[lpn as usize] = ppn;
        self.p2l[ppn as usize] = lpn as u32;
        self.valid[(ppn / self.ppb) as usize] += 1;
    }

    /// The next free page of `die`'s open block, opening a new block when it is full.
    fn alloc(&mut self, die: u32) -> u32 {
        if let Some((block, next)) = self.open[die as usize] {
            if next < self.ppb {
                self.open[die as usize] = Some((block, next + 1));
                return block * self.ppb + next;
            }
            self.state[block as usize] = BlockState::Closed;
        }
        // Invariant (see SPARE_BLOCKS and `write`): a die enters allocation with at least one
        // free block, because collection keeps two and never needs more than one to copy a
        // victim that has at least one invalid page.
        let block = self.free[die as usize].pop_front().expect("FTL invariant: a free block is always available");
        self.state[block as usize] = BlockState::Open;
        self.open[die as usize] = Some((block, 1));
        block * self.ppb
    }

    /// Greedy collection of one victim on `die`: returns the pages moved, or `None` when no
    /// closed block has an invalid page (nothing to gain).
    fn collect(&mut self, die: u32) -> Option<u64> {
        let first = die * self.blocks_per_die;
        let victim = (first..first + self.blocks_per_die).filter(|b| self.state[*b as usize] == BlockState::Closed).min_by_key(|b| self.valid[*b as usize])?;
        if self.valid[victim as usize] >= self.ppb {
            return None;
        }
        let mut moved = 0;
        for ppn in victim * self.ppb..(victim + 1) * self.ppb {
            let lpn = std::mem::replace(&mut self.p2l[ppn as usize], UNMAPPED);
            if lpn != UNMAPPED {
                let new = self.alloc(die);
                self.map(u64::from(lpn), new);
                moved += 1;
            }
        }
        self.valid[victim as usize] = 0;
        self.state[victim as usize] = BlockState::Free;
        self.free[die as usize].push_back(victim);
        Some(moved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(ppb: u32, op: f64) -> FlashConfig {
        FlashConfig {
            channels: 1,
            dies_per_channel: 1,
            planes_per_die: 1,
            page_bytes: 4096,
            pages_per_block: ppb,
            over_provisioning: op,
            power_loss_protection: false,
            ..FlashConfig::default()
        }
    }

    #[test]
    fn geometry_adds_over_provisioning_and_spares() {
        let g = Geometry::new(&cfg(16, 0.07), 2048 * 4096).unwrap();
        assert_eq!(g.logical_pages, 2048);
        assert_eq!(g.blocks_per_die, 137); // ceil(2048 * 1.07 / 16)
        let small = Geometry::new(&cfg(16, 0.07), 64 * 4096).unwrap();
        assert_eq!(small.blocks_per_die, 4 + SPARE_BLOCKS as u32);
        let planes = Geometry::new(&FlashConfig { planes_per_die: 4, ..cfg(16, 0.07) }, 2048 * 4096).unwrap();
        assert_eq!(planes.blocks_per_die, 140);
        assert_eq!(g.map_bytes(), 4 * 2048 + 4 * 137 * 16 + 5 * 137);
    }

    #[test]
    fn huge_drives_are_refused() {
        let e = Geometry::new(&cfg(256, 0.07), 1 << 50).unwrap_err();
        assert!(matches!(e, ModelError::TooLarge { .. }), "{e}");
    }

    #[test]
    fn sequential_fill_needs_no_collection() {
        let g = Geometry::new(&cfg(16, 0.07), 2048 * 4096).unwrap();
        let mut ftl = Ftl::new(&g);
        for lpn in 0..2048 {
            assert_eq!(ftl.write(lpn, 0), GcWork::default());
        }
        assert_eq!(ftl.valid_pages(), 2048);
        ftl.discard(5);
        assert!(!ftl.is_mapped(5) && ftl.is_mapped(6));
        assert_eq!(ftl.valid_pages(), 2047);
    }

    #[test]
    fn random_overwrites_collect_and_keep_every_page_mapped() {
        let g = Geometry::new(&cfg(16, 0.07), 2048 * 4096).unwrap();
        let mut ftl = Ftl::new(&g);
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let (mut moved, mut erased) = (0, 0);
        for i in 0..20_000u64 {
            let lpn = if i < 2048 {
                i
            } else {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % 2048
            };
            let w = ftl.write(lpn, 0);
            moved += w.moved;
            erased += w.erased;
        }
        assert!(erased > 1000 && moved > 0, "erased {erased} moved {moved}");
        assert_eq!(ftl.valid_pages(), 2048);
        assert!((0..2048).all(|l| ftl.is_mapped(l)));
    }
}
