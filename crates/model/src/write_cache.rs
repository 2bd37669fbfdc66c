// SPDX-License-Identifier: Apache-2.0
//! The drive's write-back cache, as the media hook sees it.
//!
//! A drive with a volatile write cache acknowledges a write once the data is in its DRAM
//! and programs flash pages later, whole: 4 KiB writes that fill a 32 KiB page cost one
//! program, not eight. [`WriteCache`] keeps the pages written in part; a page is programmed
//! (booked on the [`Flash`] model) when it is complete, when the cache must make room, or
//! at a flush. How long a write then waits is the pacer's business
//! ([`WRITE_CACHE_NS`](crate::WRITE_CACHE_NS)).

use crate::Flash;
use std::collections::{HashMap, VecDeque};

/// Pages the cache holds open at most before it programs the oldest: 4 MiB of the
/// default 32 KiB pages.
pub(crate) const OPEN_PAGES: usize = 128;
/// Coverage is tracked in sectors of this many bytes.
const SECTOR: u64 = 512;

/// Partly written pages and when everything booked so far is programmed.
#[derive(Debug, Default)]
pub(crate) struct WriteCache {
    /// Logical page → bitmap of the sectors written.
    open: HashMap<u64, Vec<u64>>,
    /// Open pages, oldest first.
    order: VecDeque<u64>,
    /// When the last program booked completes, ns.
    programmed_ns: u64,
}

impl WriteCache {
    /// Takes `len` bytes at `offset` at time `now`; returns how many page programs that
    /// booked.
    pub(crate) fn write(&mut self, flash: &mut Flash, now: u64, offset: u64, len: u64) -> u64 {
        let pb = u64::from(flash.config().page_bytes);
        let end = offset.saturating_add(len).min(flash.logical_bytes());
        if offset >= end {
            return 0;
        }
        let mut booked = 0;
        let mut lpn = offset / pb;
        while lpn * pb < end {
            let (page_start, page_end) = (lpn * pb, ((lpn + 1) * pb).min(flash.logical_bytes()));
            let (from, to) = (offset.max(page_start), end.min(page_end));
            let sectors = (page_end - page_start).div_ceil(SECTOR) as usize;
            let bits = self.open.entry(lpn).or_insert_with(|| vec![0; sectors.div_ceil(64)]);
            if bits.iter().all(|w| *w == 0) {
                self.order.push_back(lpn);
            }
            for s in (from - page_start) / SECTOR..(to - page_start).div_ceil(SECTOR) {
                bits[(s / 64) as usize] |= 1 << (s % 64);
            }
            if (0..sectors).all(|s| bits[s / 64] & (1 << (s % 64)) != 0) {
                self.program(flash, now, lpn);
                booked += 1;
            }
            lpn += 1;
        }
        while self.open.len() > OPEN_PAGES {
            let Some(oldest) = self.order.pop_front() else { break };
            if self.open.contains_key(&oldest) {
                self.program(flash, now, oldest);
                booked += 1;
            }
        }
        booked
    }

    /// Programs every open page at `now`; returns when all booked programs complete, ns,
    /// and how many programs the flush booked.
    pub(crate) fn flush(&mut self, flash: &mut Flash, now: u64) -> (u64, u64) {
        let mut booked = 0;
        while let Some(lpn) = self.order.pop_front() {
            if self.open.contains_key(&lpn) {
                self.program(flash, now, lpn);
                booked += 1;
            }
        }
        (self.programmed_ns, booked)
    }

    /// When every program booked so far completes, ns.
    pub(crate) fn programmed_ns(&self) -> u64 {
        self.programmed_ns
    }

    fn program(&mut self, flash: &mut Flash, now: u64, lpn: u64) {
        self.open.remove(&lpn);
        let pb = u64::from(flash.config().page_bytes);
        let len = ((lpn + 1) * pb).min(flash.logical_bytes()) - lpn * pb;
        let done = flash.write(now, lpn * pb, len);
        self.programmed_ns = self.programmed_ns.max(done);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FlashConfig;

    fn flash() -> Flash {
        // 32 KiB pages programmed in 1 ms on one die.
        let cfg = FlashConfig { channels: 1, dies_per_channel: 1, page_bytes: 32768, program_us: 1000.0, channel_mb_s: 32768.0, ..FlashConfig::default() };
        Flash::new(cfg, 8 << 20).unwrap()
    }

    #[test]
    fn small_writes_filling_a_page_cost_one_program() {
        let (mut f, mut c) = (flash(), WriteCache::default());
        let booked: u64 = (0..8).map(|i| c.write(&mut f, 0, i * 4096, 4096)).sum();
        assert_eq!(booked, 1, "eight 4 KiB writes fill one 32 KiB page");
        assert_eq!(f.stats().host_pages_written, 1);
        // Rewriting the same 4 KiB again and again while it waits costs nothing more.
        for _ in 0..10 {
            assert_eq!(c.write(&mut f, 0, 32768, 4096), 0);
        }
        let (done, booked) = c.flush(&mut f, 0);
        assert_eq!((f.stats().host_pages_written, booked), (2, 1), "the flush programs the partial page once");
        assert!(done >= 2_000_000, "two programs on one die: {done}");
        assert_eq!(c.flush(&mut f, done), (done, 0), "nothing left to program");
    }

    #[test]
    fn the_cache_programs_its_oldest_page_when_full() {
        let (mut f, mut c) = (flash(), WriteCache::default());
        for i in 0..OPEN_PAGES as u64 {
            assert_eq!(c.write(&mut f, 0, i * 32768, 512), 0);
        }
        assert_eq!(c.write(&mut f, 0, OPEN_PAGES as u64 * 32768, 512), 1);
        assert!(!c.open.contains_key(&0), "the oldest page went to flash");
    }

    #[test]
    fn unaligned_writes_and_the_last_partial_page_are_covered() {
        let cfg = FlashConfig { page_bytes: 4096, ..FlashConfig::default() };
        let mut f = Flash::new(cfg, 4096 * 3 + 1024).unwrap();
        let mut c = WriteCache::default();
        // Bytes 100..12388: page 0 counts as whole (its first sector is touched), pages 1
        // and 2 are whole, and the last page, 1 KiB long, has one sector of two.
        assert_eq!(c.write(&mut f, 0, 100, 4096 * 3), 3);
        assert_eq!(c.write(&mut f, 0, 4096 * 3 + 512, 512), 1, "its second sector completes the last page");
        assert_eq!(c.write(&mut f, 0, 4096 * 3 + 1024, 4096), 0, "past the end: nothing");
        c.flush(&mut f, 0);
        assert_eq!(f.stats().host_pages_written, 4);
    }
}
