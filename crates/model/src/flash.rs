// SPDX-License-Identifier: Apache-2.0
//! NAND flash timing: channels, dies, a page-mapped FTL and greedy garbage collection.
//!
//! [`Flash`] keeps, for every channel and every die, the spans of time (ns) it is booked
//! for, and books each page of a request on them as NVMeVirt does, in the drive's time: a
//! page takes the first time from its issue at which its die and channel are both free, so
//! a read booked for later (one that waits on data still on its way) leaves the idle time
//! before it to requests booked after it for earlier (see [`crate::busy`]):
//!
//! * **read** of a page: the die senses it (`read_us`, starting when the die is free), then
//!   the requested bytes of that page cross the channel (`bytes / channel_mb_s`, starting when
//!   both the sense is done and the channel is free). The die stays busy until its data has
//!   left (no cache read).
//! * **program** of a page: the bytes cross the channel into the die (starting when both are
//!   free), then the die programs the page (`program_us`).
//! * **garbage collection** (on writes only): each valid page of a victim is sensed, moved out
//!   and back over the channel and programmed; the victim is then erased (`erase_us`).
//!
//! A request completes when its last page does. Logical page `p` lives on channel
//! `p % channels`, die `(p / channels) % dies_per_channel` of that channel, so consecutive
//! pages spread over all channels first, then over the dies of each channel.

use crate::busy::Busy;
use crate::ftl::{Ftl, GcWork, Geometry};
use crate::{FlashConfig, FlashStats, ModelError};

/// Stateful, deterministic timing model of a flash drive of a given logical capacity.
///
/// Times are nanoseconds on the caller's clock (any origin); results depend only on the
/// request sequence, never on the speed of the machine. Memory: the FTL's page maps
/// ([`map_bytes`](Self::map_bytes), about 8.3 bytes per page at 7 % over-provisioning, e.g.
/// 1 MiB for 4 GiB of 32 KiB pages) are built on the first write or discard, so a read-only
/// model costs only a few bytes per die.
pub struct Flash {
    cfg: FlashConfig,
    geo: Geometry,
    logical_bytes: u64,
    read_ns: u64,
    program_ns: u64,
    erase_ns: u64,
    ns_per_byte: f64,
    channels: Vec<Busy>,
    dies: Vec<Busy>,
    /// Time before which booked spans are forgotten (see [`Flash::forget_before`]).
    forgotten_ns: u64,
    ftl: Option<Ftl>,
    stats: FlashStats,
}

/// Global die index and channel of logical page `lpn` (striped over channels, then dies).
fn home(cfg: &FlashConfig, lpn: u64) -> (usize, usize) {
    let stripe = lpn % u64::from(cfg.dies());
    let ch = (stripe % u64::from(cfg.channels)) as usize;
    let die_in_ch = (stripe / u64::from(cfg.channels)) as usize;
    (ch * cfg.dies_per_channel as usize + die_in_ch, ch)
}

fn us_to_ns(us: f64) -> u64 {
    (us * 1000.0).round() as u64
}

impl Flash {
    /// A fresh (empty, idle) drive exposing `logical_bytes` of capacity.
    pub fn new(cfg: FlashConfig, logical_bytes: u64) -> Result<Flash, ModelError> {
        cfg.validate()?;
        let geo = Geometry::new(&cfg, logical_bytes)?;
        Ok(Flash {
            read_ns: us_to_ns(cfg.read_us),
            program_ns: us_to_ns(cfg.program_us),
            erase_ns: us_to_ns(cfg.erase_us),
            ns_per_byte: 1000.0 / cfg.channel_mb_s,
            channels: vec![Busy::default(); cfg.channels as usize],
            dies: vec![Busy::default(); geo.dies as usize],
            forgotten_ns: 0,
            ftl: None,
            stats: FlashStats::default(),
            logical_bytes,
            geo,
            cfg,
        })
    }

    /// The configuration the model was built with.
    pub fn config(&self) -> &FlashConfig {
        &self.cfg
    }

    /// Logical capacity, bytes.
    pub fn logical_bytes(&self) -> u64 {
        self.logical_bytes
    }

    /// Work counters so far.
    pub fn stats(&self) -> &FlashStats {
        &self.stats
    }

    /// Bytes of memory the FTL page maps take once built (see the type docs).
    pub fn map_bytes(&self) -> u64 {
        self.geo.map_bytes()
    }

    /// Physical blocks per die (logical share plus over-provisioning and spares).
    pub fn blocks_per_die(&self) -> u32 {
        self.geo.blocks_per_die
    }

    /// Time, ns, at which every channel and die is idle.
    pub fn idle_at(&self) -> u64 {
        self.channels.iter().chain(&self.dies).map(Busy::end).max().unwrap_or(0)
    }

    /// Time a transfer of `bytes` occupies a channel, ns.
    fn xfer_ns(&self, bytes: u64) -> u64 {
        (bytes as f64 * self.ns_per_byte).round() as u64
    }

    /// The pages `[offset, offset + len)` touches, clipped to the capacity, with the bytes of
    /// each page it covers.
    fn pages(&self, offset: u64, len: u64) -> impl Iterator<Item = (u64, u64)> {
        let pb = u64::from(self.cfg.page_bytes);
        let end = offset.saturating_add(len).min(self.logical_bytes);
        let first = offset / pb;
        let last = if end > offset { end.div_ceil(pb) } else { first };
        (first..last).map(move |lpn| (lpn, end.min((lpn + 1) * pb) - offset.max(lpn * pb)))
    }

    /// Books a read of `len` bytes at `offset` issued at `at_ns`; returns its completion
    /// time, ns. Bytes beyond the capacity are ignored; an empty read completes at `at_ns`.
    pub fn read(&mut self, at_ns: u64, offset: u64, len: u64) -> u64 {
        let mut done = at_ns;
        for (lpn, bytes) in self.pages(offset, len) {
            let (die, ch) = home(&self.cfg, lpn);
            let out = self.book(at_ns, die, ch, self.read_ns, self.xfer_ns(bytes), 0);
            done = done.max(out);
            self.stats.host_pages_read += 1;
        }
        done
    }

    /// Forgets the booked spans that end before `t_ns`: a request issued before the last
    /// of them on its die or channel no longer takes idle time before it, but starts after
    /// it, as behind a plain "free from" time. A caller on a clock calls this as the clock
    /// advances (a model never told keeps every span; touching spans merge, so a drive kept
    /// busy keeps few).
    pub fn forget_before(&mut self, t_ns: u64) {
        if t_ns > self.forgotten_ns {
            self.forgotten_ns = t_ns;
            self.channels.iter_mut().chain(&mut self.dies).for_each(|b| b.forget_before(t_ns));
        }
    }

    /// The time before which booked spans are forgotten (0 when none are).
    pub fn forgotten_before(&self) -> u64 {
        self.forgotten_ns
    }

    /// Books one page's work from `at_ns` on: `die` busy alone for `before_ns` (a sense),
    /// then `xfer_ns` on channel `ch` too (the die holds its page until the transfer is
    /// done), then `die` alone for `after_ns` (a program), all at the first time each is
    /// free; returns when the transfer ends.
    fn book(&mut self, at_ns: u64, die: usize, ch: usize, before_ns: u64, xfer_ns: u64, after_ns: u64) -> u64 {
        let whole = before_ns + xfer_ns + after_ns;
        let mut start = self.dies[die].fit(at_ns, whole);
        loop {
            let xfer = self.channels[ch].fit(start + before_ns, xfer_ns);
            let end = xfer + xfer_ns + after_ns;
            match self.dies[die].overlap_end(start, end) {
                None => {
                    self.dies[die].book(start, end);
                    self.channels[ch].book(xfer, xfer + xfer_ns);
                    return xfer + xfer_ns;
                }
                // The die is booked before the channel is free: from after that booking.
                Some(busy_until) => start = self.dies[die].fit(busy_until, whole),
            }
        }
    }

    /// Books a write of `len` bytes at `offset` issued at `at_ns`, including any garbage
    /// collection it forces; returns its completion time, ns (when the last page is
    /// programmed). A partial page costs a whole page program. Bytes beyond the capacity are
    /// ignored.
    pub fn write(&mut self, at_ns: u64, offset: u64, len: u64) -> u64 {
        let mut done = at_ns;
        for (lpn, bytes) in self.pages(offset, len) {
            let (die, ch) = home(&self.cfg, lpn);
            let geo = &self.geo;
            let gc = self.ftl.get_or_insert_with(|| Ftl::new(geo)).write(lpn, die as u32);
            let at = self.collect_time(at_ns, die, ch, gc);
            let loaded = self.book(at, die, ch, 0, self.xfer_ns(bytes), self.program_ns);
            done = done.max(loaded + self.program_ns);
            self.stats.host_pages_written += 1;
        }
        done
    }

    /// Books garbage-collection work on `die`, one step after another from `at_ns`: every
    /// moved page is sensed, crosses the channel out and back, and is programmed; then each
    /// victim is erased. Returns when the last step ends (`at_ns` when there is none).
    fn collect_time(&mut self, at_ns: u64, die: usize, ch: usize, gc: GcWork) -> u64 {
        let page = self.xfer_ns(u64::from(self.cfg.page_bytes));
        let mut at = at_ns;
        for _ in 0..gc.moved {
            at = self.book(at, die, ch, self.read_ns, 2 * page, self.program_ns) + self.program_ns;
        }
        for _ in 0..gc.erased {
            let start = self.dies[die].fit(at, self.erase_ns);
            self.dies[die].book(start, start + self.erase_ns);
            at = start + self.erase_ns;
        }
        self.stats.gc_pages_moved += gc.moved;
        self.stats.erases += gc.erased;
        at
    }

    /// Forgets the whole pages inside `[offset, offset + len)` (TRIM / deallocate), so
    /// garbage collection no longer copies them; the last page of a capacity that is not a
    /// whole number of pages counts as whole. Takes no flash time.
    pub fn discard(&mut self, offset: u64, len: u64) {
        let pb = u64::from(self.cfg.page_bytes);
        let cap = self.logical_bytes;
        let pages = self.pages(offset, len);
        // Nothing is mapped before the first write.
        let Some(ftl) = self.ftl.as_mut() else { return };
        for (lpn, bytes) in pages {
            if bytes == pb.min(cap - lpn * pb) {
                ftl.discard(lpn);
            }
        }
    }

    /// Maps every logical page as if the drive had been written once sequentially, takes no
    /// time and resets the counters: the state of a full drive for steady-state write
    /// experiments.
    pub fn precondition(&mut self) {
        let geo = &self.geo;
        let ftl = self.ftl.get_or_insert_with(|| Ftl::new(geo));
        for lpn in 0..geo.logical_pages {
            ftl.write(lpn, home(&self.cfg, lpn).0 as u32);
        }
        self.stats = FlashStats::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB4: u64 = 4096;

    /// `channels` × `dies` of 4 KiB pages: 50 µs sense, 200 µs program, 1 ms erase, 400 MB/s
    /// channels (a page crosses in 10.24 µs).
    fn small(channels: u32, dies: u32) -> FlashConfig {
        FlashConfig {
            channels,
            dies_per_channel: dies,
            planes_per_die: 1,
            page_bytes: 4096,
            pages_per_block: 16,
            read_us: 50.0,
            program_us: 200.0,
            erase_us: 1000.0,
            channel_mb_s: 400.0,
            over_provisioning: 0.07,
            power_loss_protection: false,
        }
    }

    fn xorshift(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    #[test]
    fn reads_on_one_die_are_sense_plus_transfer_and_serialise() {
        let mut f = Flash::new(small(1, 1), 1 << 20).unwrap();
        assert_eq!(f.read(0, 0, KIB4), 60_240);
        assert_eq!(f.read(0, KIB4, KIB4), 120_480);
        assert_eq!(f.read(1_000_000, 0, KIB4), 1_060_240);
        // Two pages in one request: the second waits for the die.
        assert_eq!(f.read(2_000_000, 0, 2 * KIB4), 2_120_480);
        // Only the bytes asked for cross the channel.
        assert_eq!(f.read(3_000_000, 100, 512), 3_051_280);
        assert_eq!(f.stats().host_pages_read, 6);
        assert_eq!(f.read(5, 0, 0), 5);
    }

    #[test]
    fn channels_work_in_parallel() {
        let mut f = Flash::new(small(2, 1), 1 << 20).unwrap();
        // Pages 0 and 1 live on channels 0 and 1.
        assert_eq!(f.read(0, 0, 2 * KIB4), 60_240);
        assert_eq!(f.idle_at(), 60_240);
    }

    #[test]
    fn dies_sense_in_parallel_but_share_their_channel() {
        let mut f = Flash::new(small(1, 2), 1 << 20).unwrap();
        // Both dies sense at once; the transfers queue on the single channel.
        assert_eq!(f.read(0, 0, 2 * KIB4), 70_480);
        // Separate requests contend the same way.
        let mut f = Flash::new(small(1, 2), 1 << 20).unwrap();
        assert_eq!(f.read(0, 0, KIB4), 60_240);
        assert_eq!(f.read(0, KIB4, KIB4), 70_480);
        assert_eq!(f.read(0, 2 * KIB4, KIB4), 120_480);
    }

    #[test]
    fn a_read_booked_for_later_leaves_the_idle_time_before_it() {
        let mut f = Flash::new(small(1, 1), 1 << 20).unwrap();
        // A read that depends on data arriving at 1 ms, booked first.
        assert_eq!(f.read(1_000_000, 0, KIB4), 1_060_240);
        // Reads booked after it for now run in the idle time before it, in order...
        assert_eq!(f.read(0, KIB4, KIB4), 60_240);
        assert_eq!(f.read(0, 2 * KIB4, KIB4), 120_480);
        // ...until one no longer fits before it: that one goes after it.
        let mut t = 120_480;
        while t + 60_240 <= 1_000_000 {
            t = f.read(0, 3 * KIB4, KIB4);
        }
        assert_eq!(f.read(0, 3 * KIB4, KIB4), 1_120_480);
        assert_eq!(f.idle_at(), 1_120_480);
        // A write waits for its die the same way: transfer, then program.
        assert_eq!(f.write(0, 4 * KIB4, KIB4), 1_120_480 + 10_240 + 200_000);
        // Once forgotten, the idle time before a booking is no longer taken.
        f.forget_before(2_000_000);
        assert_eq!(f.forgotten_before(), 2_000_000);
        assert_eq!(f.read(0, 0, KIB4), 1_330_720 + 60_240);
    }

    #[test]
    fn writes_are_transfer_then_program() {
        let mut f = Flash::new(small(1, 1), 1 << 20).unwrap();
        assert_eq!(f.write(0, 0, KIB4), 210_240);
        assert_eq!(f.write(0, KIB4, KIB4), 420_480);
        // A partial page programs a whole page but moves only its bytes.
        assert_eq!(f.write(1_000_000, 0, 512), 1_201_280);
        let mut f = Flash::new(small(1, 2), 1 << 20).unwrap();
        assert_eq!(f.write(0, 0, 2 * KIB4), 220_480);
    }

    #[test]
    fn requests_past_the_capacity_are_clipped() {
        let mut f = Flash::new(small(1, 1), 10 * KIB4 + 100).unwrap();
        assert_eq!(f.read(0, 10 * KIB4, 4096), 50_000 + 250);
        assert_eq!(f.read(0, 20 * KIB4, 4096), 0);
        assert_eq!(f.write(0, 20 * KIB4, 4096), 0);
    }

    #[test]
    fn sequential_bandwidth_matches_the_formula_in_both_regimes() {
        // 1 × 2 is die-bound, 2 × 8 and the default are channel-bound.
        for cfg in [small(1, 2), small(2, 8), FlashConfig::default()] {
            let total = 64u64 << 20;
            let mut f = Flash::new(cfg.clone(), total).unwrap();
            let done = (0..total / (1 << 20)).map(|i| f.read(0, i << 20, 1 << 20)).max().unwrap();
            let got = total as f64 * 1000.0 / done as f64;
            let want = cfg.seq_read_mb_s();
            assert!((got - want).abs() < want * 0.01, "{cfg:?}: {got} vs {want}");
        }
    }

    #[test]
    fn sequential_first_writes_have_no_amplification() {
        let mut f = Flash::new(small(2, 2), 2048 * KIB4).unwrap();
        let mut t = 0;
        for i in 0..2048 / 8 {
            t = f.write(t, i * 8 * KIB4, 8 * KIB4);
        }
        assert_eq!(f.stats().host_pages_written, 2048);
        assert_eq!((f.stats().gc_pages_moved, f.stats().erases), (0, 0));
        assert_eq!(f.stats().write_amplification(), 1.0);
        // Overwriting sequentially invalidates whole blocks: collection moves nothing.
        for i in 0..2048 / 8 {
            t = f.write(t, i * 8 * KIB4, 8 * KIB4);
        }
        assert!(f.stats().erases > 0);
        assert_eq!(f.stats().write_amplification(), 1.0);
    }

    /// Fills a drive sequentially, then overwrites random pages at queue depth 1; returns the
    /// mean service time (ns) of the fill writes and of the last `n` overwrites.
    fn random_overwrite(f: &mut Flash, n: u64) -> (u64, u64) {
        let pages = f.logical_bytes() / KIB4;
        let mut t = 0;
        for p in 0..pages {
            t = f.write(t, p * KIB4, KIB4);
        }
        let fill = t / pages;
        let mut x = 0x2545_F491_4F6C_DD1D;
        let warmup = 2 * pages;
        let mut steady = 0;
        for i in 0..warmup + n {
            let done = f.write(t, (xorshift(&mut x) % pages) * KIB4, KIB4);
            if i >= warmup {
                steady += done - t;
            }
            t = done;
        }
        (fill, steady / n)
    }

    #[test]
    fn sustained_random_overwrites_collect_garbage_and_slow_down() {
        let mut f = Flash::new(small(1, 1), 2048 * KIB4).unwrap();
        assert_eq!(f.blocks_per_die(), 137);
        let (fill, steady) = random_overwrite(&mut f, 2048);
        let wa = f.stats().write_amplification();
        assert!(wa > 2.0 && wa < 20.0, "write amplification {wa}");
        assert!(f.stats().erases > 0 && f.stats().gc_pages_moved > 0);
        assert_eq!(fill, 210_240);
        assert!(steady as f64 > 2.0 * fill as f64, "steady {steady} vs fill {fill}");
    }

    #[test]
    fn discarded_pages_are_not_copied() {
        let mut with = Flash::new(small(1, 1), 2048 * KIB4).unwrap();
        with.precondition();
        assert_eq!(with.stats(), &FlashStats::default());
        with.discard(0, 1024 * KIB4);
        let mut without = Flash::new(small(1, 1), 2048 * KIB4).unwrap();
        without.precondition();
        let mut x = 7u64;
        for i in 0..4096 {
            let lpn = 1024 + xorshift(&mut x) % 1024;
            with.write(i, lpn * KIB4, KIB4);
            without.write(i, lpn * KIB4, KIB4);
        }
        assert!(with.stats().gc_pages_moved < without.stats().gc_pages_moved / 2);
        assert!(with.map_bytes() > 0);
    }

    #[test]
    fn bad_configs_name_the_field() {
        let bad = |cfg: FlashConfig, field: &str| {
            let e = Flash::new(cfg, 1 << 20).err().expect("must be refused").to_string();
            assert!(e.contains(field), "{e}");
        };
        bad(FlashConfig { channels: 0, ..small(1, 1) }, "`channels`");
        bad(FlashConfig { page_bytes: 100, ..small(1, 1) }, "`page_bytes`");
        bad(FlashConfig { channel_mb_s: 0.0, ..small(1, 1) }, "`channel_mb_s`");
        bad(FlashConfig { read_us: -1.0, ..small(1, 1) }, "`read_us`");
        bad(FlashConfig { over_provisioning: f64::NAN, ..small(1, 1) }, "`over_provisioning`");
        FlashConfig::default().validate().unwrap();
    }
}
