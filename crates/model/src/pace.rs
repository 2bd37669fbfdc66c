// SPDX-License-Identifier: Apache-2.0
//! Real-time pacing: makes real I/O take the time a modelled device would.
//!
//! A [`Pacer`] runs the timing models on a clock whose zero is the pacer's creation. Each
//! call books its request at "now" and sleeps until the model's completion time, so a caller
//! that is already slower than the model never sleeps, and concurrent callers contend for the
//! modelled channels, dies and links exactly as concurrent requests would.
//!
//! [`Pacer::read`] and friends book and wait in one call, before the real transfer, so the
//! real transfer's own time adds to the modelled time. To overlap the two instead, book first
//! and wait after: `let d = pacer.reserve_read(off, len); do_the_io(); pacer.wait_until(d);`
//! — this is what the [`insitu_media::Pacing`] hook does, with streamed booking: reads for
//! the host and reads for the offload engine are followed as [`ReadStreams`] of their own, so
//! that sequential scans get the drive's sequential rate, and offload reads then cross the
//! engine link.
//!
//! `std::thread::sleep` wakes late (typically 50–100 µs on Linux). The pacer measures that
//! lateness and starts later sleeps earlier by its running average (at most 1 ms), so
//! back-to-back requests average out on the modelled completion times.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::write_cache::WriteCache;
use crate::{DeviceModel, Flash, FlashStats, Link, ModelError, ReadStreams};
use insitu_media::ReadPurpose;

/// Largest oversleep compensation, ns.
const MAX_COMPENSATION_NS: u64 = 1_000_000;

/// Work the modelled drive's write-back cache holds, ns of programming: the media hook
/// acknowledges a write once no more than this much programming is ahead of it, and a
/// flush waits for all of it. 2 ms is about 4 MB on the default back-end, far less than
/// the DRAM and SLC caches of the drives modelled, so bursts are not flattered. Without a
/// cache every 4 KiB write of a durable commit would wait out a whole page program, which
/// no NVMe drive with a volatile write cache makes a host do. The cache also gathers
/// partial pages into whole ones before programming them (see `write_cache.rs`).
pub const WRITE_CACHE_NS: u64 = 2_000_000;

/// Booked flash time kept behind the clock (see [`Flash::forget_before`]): a booking for
/// an earlier time (a read continuing a stream is issued when its reader could have issued
/// it) takes the idle time it finds in it, and before it starts after the last booking
/// forgotten. Short, because every booking searches what is kept; forgotten an eighth at a
/// time, so few bookings pay for the forgetting.
const HISTORY_NS: u64 = 2_000_000;

/// Counters of a [`Pacer`].
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaceStats {
    /// Reads booked on the flash model.
    pub reads: u64,
    /// Writes booked on the flash model.
    pub writes: u64,
    /// Transfers booked on the host link.
    pub link_transfers: u64,
    /// Transfers booked on the engine link.
    pub engine_transfers: u64,
    /// Time callers were put to sleep, ns (summed over threads).
    pub slept_ns: u64,
    /// Current oversleep compensation, ns.
    pub compensation_ns: u64,
}

#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    writes: AtomicU64,
    link: AtomicU64,
    engine: AtomicU64,
    slept: AtomicU64,
}

/// Paces real I/O against a flash model and optional links; shareable between threads.
pub struct Pacer {
    epoch: Instant,
    flash: Option<Mutex<Flash>>,
    link: Option<Mutex<Link>>,
    engine: Option<Mutex<Link>>,
    compensation: AtomicU64,
    counters: Counters,
    /// The streams of host reads and of offload reads (see [`Pacer::reserve_streamed_read`]).
    streams: [Mutex<ReadStreams>; 2],
    /// Pages written through the media hook and not yet programmed.
    write_cache: Mutex<WriteCache>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Pacer {
    /// A pacer over an optional flash model and optional host link; its clock starts now.
    /// With neither, every call returns at once.
    pub fn new(flash: Option<Flash>, link: Option<Link>) -> Pacer {
        Pacer {
            epoch: Instant::now(),
            flash: flash.map(Mutex::new),
            link: link.map(Mutex::new),
            engine: None,
            compensation: AtomicU64::new(0),
            counters: Counters::default(),
            streams: Default::default(),
            write_cache: Mutex::default(),
        }
    }

    /// Adds the link between the flash back-end and the offload engine (see
    /// [`DeviceModel::engine_link`]).
    pub fn with_engine_link(mut self, link: Link) -> Pacer {
        self.engine = Some(Mutex::new(link));
        self
    }

    /// A pacer for `model` over a store of `logical_bytes`: its flash, host link and engine
    /// link, each when the model has one.
    pub fn from_model(model: &DeviceModel, logical_bytes: u64) -> Result<Pacer, ModelError> {
        let flash = model.flash.clone().map(|c| Flash::new(c, logical_bytes)).transpose()?;
        let link = model.link.clone().map(Link::new).transpose()?;
        let mut pacer = Pacer::new(flash, link);
        if let Some(engine) = model.engine_link.clone() {
            pacer = pacer.with_engine_link(Link::new(engine)?);
        }
        Ok(pacer)
    }

    /// Nanoseconds since the pacer was created: the models' clock.
    pub fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// `t` on the models' clock (0 for a time before the pacer was created).
    fn ns_at(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// The flash model, its bookings older than [`HISTORY_NS`] before `now` forgotten.
    fn flash_at<'a>(&self, flash: &'a Mutex<Flash>, now: u64) -> std::sync::MutexGuard<'a, Flash> {
        let mut f = lock(flash);
        let t = now.saturating_sub(HISTORY_NS);
        if t >= f.forgotten_before() + HISTORY_NS / 8 {
            f.forget_before(t);
        }
        f
    }

    fn deadline(&self, done_ns: u64) -> Instant {
        self.epoch + Duration::from_nanos(done_ns)
    }

    /// Books a read on the flash model now and returns when it completes, without waiting.
    pub fn reserve_read(&self, offset: u64, len: u64) -> Instant {
        let now = self.now_ns();
        let Some(flash) = &self.flash else { return self.deadline(now) };
        self.counters.reads.fetch_add(1, Relaxed);
        let done = self.flash_at(flash, now).read(now, offset, len);
        self.deadline(done)
    }

    /// Books a read for `purpose` as part of that purpose's streams (see [`ReadStreams`]): a
    /// read continuing the previous one is issued as a queue-depth-2 reader would have
    /// issued it. An offload read then crosses the engine link, if the model has one (a
    /// host read's link is paced by the transport, which sees the bytes on the wire).
    /// Returns when the data is where it was asked for, without waiting.
    pub fn reserve_streamed_read(&self, offset: u64, len: u64, purpose: ReadPurpose) -> Instant {
        self.reserve_streamed_reads(&[(offset, len as usize)], purpose, None)
    }

    /// [`Pacer::reserve_streamed_read`] for a read issued at `after` (or now, if later):
    /// one that depends on data the model delivers then.
    pub fn reserve_streamed_read_after(&self, offset: u64, len: u64, purpose: ReadPurpose, after: Instant) -> Instant {
        self.reserve_streamed_reads(&[(offset, len as usize)], purpose, Some(after))
    }

    /// [`Pacer::reserve_streamed_read`] (or its `_after` form) for each of `spans` in turn,
    /// booked under one hold of the models: returns when the last arrives.
    pub fn reserve_streamed_reads(&self, spans: &[(u64, usize)], purpose: ReadPurpose, after: Option<Instant>) -> Instant {
        let clock = self.now_ns();
        // A read that depends on data is issued when that arrives, or now if later; one
        // continuing a stream may have been issued earlier, but never before `floor`.
        let floor = after.map_or(0, |t| self.ns_at(t));
        let now = clock.max(floor);
        let mut streams = lock(&self.streams[purpose as usize]);
        let mut flash = self.flash.as_ref().map(|f| self.flash_at(f, clock));
        let mut engine = match (&self.engine, purpose) {
            (Some(engine), ReadPurpose::Offload) => Some(lock(engine)),
            _ => None,
        };
        let mut last = now;
        for &(offset, len) in spans {
            let len = len as u64;
            let (issue, continued, slot) = streams.issue(now, offset);
            let issue = issue.max(floor);
            let flash_done = match flash.as_mut() {
                Some(flash) => {
                    self.counters.reads.fetch_add(1, Relaxed);
                    flash.read(issue, offset, len)
                }
                None => now,
            };
            let done = match engine.as_mut() {
                Some(engine) => {
                    self.counters.engine.fetch_add(1, Relaxed);
                    engine.transfer(flash_done, len)
                }
                None => flash_done,
            };
            streams.record(slot, continued, offset, len, issue, done);
            last = last.max(done);
        }
        self.deadline(last)
    }

    /// Books a write on the flash model now (with any garbage collection it forces) and
    /// returns when it completes, without waiting.
    pub fn reserve_write(&self, offset: u64, len: u64) -> Instant {
        let now = self.now_ns();
        let Some(flash) = &self.flash else { return self.deadline(now) };
        self.counters.writes.fetch_add(1, Relaxed);
        let done = self.flash_at(flash, now).write(now, offset, len);
        self.deadline(done)
    }

    fn reserve_on(&self, link: &Option<Mutex<Link>>, count: &AtomicU64, bytes: u64, from_ns: u64) -> Instant {
        let Some(link) = link else { return self.deadline(from_ns) };
        count.fetch_add(1, Relaxed);
        let done = lock(link).transfer(from_ns, bytes);
        self.deadline(done)
    }

    /// Books `bytes` on the host link now and returns when they are delivered.
    pub fn reserve_link(&self, bytes: u64) -> Instant {
        self.reserve_on(&self.link, &self.counters.link, bytes, self.now_ns())
    }

    /// Books `bytes` on the host link from `from` (they could not cross before; the link
    /// may have been idle since, so a time already past books the link in the past) and
    /// returns when they are delivered, without waiting.
    pub fn reserve_link_from(&self, bytes: u64, from: Instant) -> Instant {
        self.reserve_on(&self.link, &self.counters.link, bytes, self.ns_at(from))
    }

    /// Books `bytes` on the engine link now and returns when they are delivered.
    pub fn reserve_engine(&self, bytes: u64) -> Instant {
        self.reserve_on(&self.engine, &self.counters.engine, bytes, self.now_ns())
    }

    /// Sleeps until `deadline` (minus the measured oversleep); returns at once if it passed.
    pub fn wait_until(&self, deadline: Instant) {
        let comp = self.compensation.load(Relaxed);
        let target = deadline.checked_sub(Duration::from_nanos(comp)).unwrap_or(deadline);
        let now = Instant::now();
        if target <= now {
            return;
        }
        std::thread::sleep(target - now);
        let woke = Instant::now();
        let late = (woke.saturating_duration_since(target).as_nanos() as u64).min(MAX_COMPENSATION_NS);
        self.compensation.store(comp - comp / 8 + late / 8, Relaxed);
        self.counters.slept.fetch_add(woke.saturating_duration_since(now).as_nanos() as u64, Relaxed);
    }

    /// Books a read of `len` bytes at `offset` and sleeps until the model completes it.
    pub fn read(&self, offset: u64, len: u64) {
        self.wait_until(self.reserve_read(offset, len));
    }

    /// Books a write and sleeps until the model completes it.
    pub fn write(&self, offset: u64, len: u64) {
        self.wait_until(self.reserve_write(offset, len));
    }

    /// Moves `bytes` over the host link, sleeping until they are delivered.
    pub fn link_transfer(&self, bytes: u64) {
        self.wait_until(self.reserve_link(bytes));
    }

    /// Moves `bytes` over the engine link, sleeping until they are delivered.
    pub fn engine_transfer(&self, bytes: u64) {
        self.wait_until(self.reserve_engine(bytes));
    }

    /// Tells the flash model that a range was discarded (TRIM); takes no time.
    pub fn discard(&self, offset: u64, len: u64) {
        if let Some(flash) = &self.flash {
            lock(flash).discard(offset, len);
        }
    }

    /// Whether any model is configured (a pacer without one never sleeps).
    pub fn is_active(&self) -> bool {
        self.flash.is_some() || self.link.is_some() || self.engine.is_some()
    }

    /// The flash model's counters, if there is one.
    pub fn flash_stats(&self) -> Option<FlashStats> {
        self.flash.as_ref().map(|f| lock(f).stats().clone())
    }

    /// The pacer's counters.
    pub fn stats(&self) -> PaceStats {
        let c = &self.counters;
        PaceStats {
            reads: c.reads.load(Relaxed),
            writes: c.writes.load(Relaxed),
            link_transfers: c.link.load(Relaxed),
            engine_transfers: c.engine.load(Relaxed),
            slept_ns: c.slept.load(Relaxed),
            compensation_ns: self.compensation.load(Relaxed),
        }
    }
}

/// The media layer's hook: [`Backing`](insitu_media::Backing) calls it before each transfer,
/// and the pacer books the transfer and sleeps until the model completes it. Discards
/// (`zero_range`) arrive as writes.
/// The media asks before each transfer and waits after it, so a transfer takes the longer
/// of the real and the modelled time, not their sum.
impl insitu_media::Pacing for Pacer {
    fn on_read(&self, offset: u64, len: u64, purpose: ReadPurpose) -> Instant {
        self.reserve_streamed_read(offset, len, purpose)
    }

    fn on_read_after(&self, offset: u64, len: u64, purpose: ReadPurpose, after: Instant) -> Instant {
        self.reserve_streamed_read_after(offset, len, purpose, after)
    }

    fn on_reads(&self, spans: &[(u64, usize)], purpose: ReadPurpose, after: Option<Instant>) -> Option<Instant> {
        (!spans.is_empty()).then(|| self.reserve_streamed_reads(spans, purpose, after))
    }

    /// A write ends both read streams: the next read pays the full latency. It is
    /// acknowledged from the write-back cache ([`WRITE_CACHE_NS`]) and programmed later.
    fn on_write(&self, offset: u64, len: u64) -> Instant {
        for s in &self.streams {
            lock(s).interrupt();
        }
        let now = self.now_ns();
        let Some(flash) = &self.flash else { return self.deadline(now) };
        let mut cache = lock(&self.write_cache);
        let booked = cache.write(&mut self.flash_at(flash, now), now, offset, len);
        self.counters.writes.fetch_add(booked, Relaxed);
        self.deadline(cache.programmed_ns().saturating_sub(WRITE_CACHE_NS).max(now))
    }

    /// A flush programs the cache's partial pages and waits until everything is programmed,
    /// or, on a drive with power-loss protection, only until the cache holds it all.
    fn on_flush(&self) -> Instant {
        let now = self.now_ns();
        let Some(flash) = &self.flash else { return self.deadline(now) };
        // The cache before the flash, as a write takes them.
        let mut cache = lock(&self.write_cache);
        let mut flash = self.flash_at(flash, now);
        let (done, booked) = cache.flush(&mut flash, now);
        self.counters.writes.fetch_add(booked, Relaxed);
        let durable = if flash.config().power_loss_protection { done.saturating_sub(WRITE_CACHE_NS) } else { done };
        self.deadline(durable.max(now))
    }

    fn on_discard(&self, offset: u64, len: u64) {
        self.discard(offset, len);
    }

    fn wait_until(&self, deadline: Instant) {
        Pacer::wait_until(self, deadline);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FlashConfig, LinkConfig};
    use insitu_media::Pacing;

    #[test]
    fn a_protected_cache_makes_a_flush_cheap() {
        let cfg = FlashConfig {
            channels: 1,
            dies_per_channel: 1,
            page_bytes: 4096,
            program_us: 1000.0,
            channel_mb_s: 4096.0,
            power_loss_protection: true,
            ..FlashConfig::default()
        };
        let p = Pacer::new(Some(Flash::new(cfg, 1 << 20).unwrap()), None);
        p.on_write(0, 4096);
        p.on_write(4096, 512);
        assert!(p.on_flush() <= Instant::now(), "the cache is durable: nothing to wait for");
        assert_eq!(p.stats().writes, 2, "the whole page at once, the partial one at the flush");
        assert_eq!(p.flash_stats().unwrap().host_pages_written, 2, "the pages are still programmed");
    }

    #[test]
    fn writes_are_acknowledged_from_the_cache_and_a_flush_waits_for_their_programs() {
        // One die, 4 KiB pages programmed in 1 ms each: the cache holds two programs.
        let cfg = FlashConfig { channels: 1, dies_per_channel: 1, page_bytes: 4096, program_us: 1000.0, channel_mb_s: 4096.0, ..FlashConfig::default() };
        let p = Pacer::new(Some(Flash::new(cfg, 1 << 20).unwrap()), None);
        let t = Instant::now();
        let ack = p.on_write(0, 4096);
        assert!(ack <= Instant::now(), "a write into an empty cache is acknowledged at once");
        let flush = p.on_flush();
        assert!(flush >= t + Duration::from_micros(1000), "the flush waits for the program");
        // Ten more programs queue 11 ms of work: the last is acknowledged only once at most
        // 2 ms are ahead of it, about 9 ms from now, and the flush 2 ms after that.
        let mut last = ack;
        for i in 1..=10 {
            last = p.on_write(i * 4096, 4096);
        }
        let ahead = last.saturating_duration_since(t);
        assert!(ahead >= Duration::from_millis(8) && ahead <= Duration::from_millis(10), "{ahead:?}");
        let drained = p.on_flush().saturating_duration_since(last);
        assert!(drained >= Duration::from_micros(1900) && drained <= Duration::from_micros(2100), "{drained:?}");
    }

    #[test]
    fn a_batch_of_reads_books_as_its_reads_one_by_one() {
        // Two channels of four dies; reads that depend on data arriving 50 ms from now, so
        // both pacers book them from the same moment whatever their clocks read.
        let cfg = FlashConfig { channels: 2, dies_per_channel: 4, page_bytes: 4096, ..FlashConfig::default() };
        let spans: Vec<(u64, usize)> = vec![(0, 4096), (8192, 8192), (40 * 4096, 4096), (4096, 4096), (3 << 20, 3 * 4096)];
        let after = Instant::now() + Duration::from_millis(50);
        for purpose in [ReadPurpose::Offload, ReadPurpose::Host] {
            let batch = Pacer::new(Some(Flash::new(cfg.clone(), 8 << 20).unwrap()), None);
            let one = Pacer::new(Some(Flash::new(cfg.clone(), 8 << 20).unwrap()), None);
            let got = batch.reserve_streamed_reads(&spans, purpose, Some(after));
            let want = spans.iter().map(|&(o, l)| one.reserve_streamed_read_after(o, l as u64, purpose, after)).max().unwrap();
            let apart = if got > want { got - want } else { want - got };
            assert!(apart <= Duration::from_micros(1), "{got:?} against {want:?}");
            assert!(got > after + Duration::from_micros(20), "the reads take the model's time from when they are issued");
            assert_eq!(batch.stats().reads, one.stats().reads);
            assert_eq!(batch.flash_stats().unwrap().host_pages_read, one.flash_stats().unwrap().host_pages_read);
        }
        let p = Pacer::new(Some(Flash::new(cfg, 8 << 20).unwrap()), None);
        assert_eq!(insitu_media::Pacing::on_reads(&p, &[], ReadPurpose::Offload, None), None, "nothing to book");
    }

    fn slow_flash() -> Flash {
        // One die: a 4 KiB read takes 10 ms sense + 4096 B at 4.096 MB/s = 11 ms.
        let cfg = FlashConfig { channels: 1, dies_per_channel: 1, page_bytes: 4096, read_us: 10_000.0, channel_mb_s: 4.096, ..FlashConfig::default() };
        Flash::new(cfg, 1 << 20).unwrap()
    }

    #[test]
    fn a_pacer_without_models_never_sleeps() {
        let p = Pacer::new(None, None);
        assert!(!p.is_active());
        let t = Instant::now();
        for i in 0..1000 {
            p.read(i * 4096, 4096);
            p.write(i * 4096, 4096);
            p.link_transfer(1 << 20);
            p.engine_transfer(1 << 20);
        }
        assert!(t.elapsed() < Duration::from_millis(50));
        assert_eq!(p.stats(), PaceStats::default());
        assert!(p.flash_stats().is_none());
    }

    #[test]
    fn reads_sleep_until_the_model_completes() {
        let p = Pacer::new(Some(slow_flash()), None);
        let t = Instant::now();
        p.read(0, 4096);
        let deadline = p.on_read(4096, 4096, ReadPurpose::Host); // the stream starts: full latency
        insitu_media::Pacing::wait_until(&p, deadline);
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(21) && took < Duration::from_millis(300), "{took:?}");
        assert_eq!(p.stats().reads, 2);
        assert_eq!(p.flash_stats().unwrap().host_pages_read, 2);
    }

    #[test]
    fn a_dependent_read_is_issued_when_what_it_depends_on_arrives() {
        // Two dies on one channel: two reads booked now overlap their 10 ms senses, but a
        // read issued after the first's data arrives starts its sense only then.
        let cfg = FlashConfig { channels: 1, dies_per_channel: 2, page_bytes: 4096, read_us: 10_000.0, channel_mb_s: 4096.0, ..FlashConfig::default() };
        let p = Pacer::new(Some(Flash::new(cfg.clone(), 1 << 20).unwrap()), None);
        let t = Instant::now();
        let first = p.on_read(0, 4096, ReadPurpose::Offload);
        let together = p.on_read(4096, 4096, ReadPurpose::Offload).saturating_duration_since(t);
        assert!(together < Duration::from_millis(15), "{together:?}");
        let p = Pacer::new(Some(Flash::new(cfg, 1 << 20).unwrap()), None);
        let first_dep = p.on_read(0, 4096, ReadPurpose::Offload);
        let after = p.on_read_after(4096, 4096, ReadPurpose::Offload, first_dep);
        assert!(after.saturating_duration_since(first_dep) >= Duration::from_millis(10), "{:?}", after.saturating_duration_since(first_dep));
        assert!(first <= t + Duration::from_millis(15));
    }

    #[test]
    fn backing_transfers_obey_the_pacer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ns.img");
        std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
        let pacer = std::sync::Arc::new(Pacer::new(Some(slow_flash()), None));
        let media = insitu_media::Backing::open(&path, false).unwrap().with_pacing(pacer.clone());
        let t = Instant::now();
        let mut out = [0u8; 4096];
        media.read_at(&mut out, 0).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(10), "{:?}", t.elapsed());
        media.write_at(&out, 8192).unwrap();
        assert_eq!((pacer.stats().reads, pacer.stats().writes), (1, 1));
    }

    #[test]
    fn reservations_overlap_with_the_callers_work() {
        let p = Pacer::new(Some(slow_flash()), Some(Link::new(LinkConfig { mb_s: 1.0, latency_us: 0.0 }).unwrap()));
        let t = Instant::now();
        let d = p.reserve_read(0, 4096);
        std::thread::sleep(Duration::from_millis(11));
        p.wait_until(d);
        let took = t.elapsed();
        assert!(took < Duration::from_millis(20), "{took:?}");
        // 10 kB at 1 MB/s is 10 ms on the link.
        let t = Instant::now();
        p.link_transfer(10_000);
        assert!(t.elapsed() >= Duration::from_millis(9), "{:?}", t.elapsed());
        p.write(0, 4096);
        p.discard(0, 4096);
        let s = p.stats();
        assert_eq!((s.reads, s.writes, s.link_transfers), (1, 1, 1));
    }

    #[test]
    fn a_link_booked_from_the_past_counts_the_time_it_was_idle() {
        // 10 kB at 1 MB/s: 10 ms on the link, from when the bytes could start crossing.
        let p = Pacer::new(None, Some(Link::new(LinkConfig { mb_s: 1.0, latency_us: 0.0 }).unwrap()));
        let from = Instant::now();
        std::thread::sleep(Duration::from_millis(6));
        let d = p.reserve_link_from(10_000, from);
        assert_eq!(d, from + Duration::from_millis(10), "booked from when the bytes were ready, not from now");
        // The link is busy until then: the next bytes queue behind them, whatever their start.
        assert_eq!(p.reserve_link_from(10_000, from), d + Duration::from_millis(10));
        assert_eq!(p.stats().link_transfers, 2);
    }
}
