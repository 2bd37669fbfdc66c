// SPDX-License-Identifier: Apache-2.0
//! The insitu target: namespaces over files or block devices, the block commands
//! (Read, Write, Flush) and EXEC, the stateless vendor command that runs a kernel over
//! virtual objects next to the data.
//!
//! A [`Engine`] knows no transport. The embedded path calls it directly from the host
//! process; a fabric transport decodes capsules and calls the same methods. Every command
//! returns an NVMe-style [`CommandError`] on failure, whose message names the object at
//! fault and what to do.
//!
//! EXEC validates the whole descriptor (format, function, arguments, extent bounds, output
//! overlaps, namespace visibility) before it reads a single byte, and keeps nothing once it
//! completes.
//!
//! ```
//! use insitu_engine::{Engine, NamespaceConfig};
//! use insitu_proto::{Descriptor, Extent, ExecResult, VirtualObject, Value};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let img = dir.path().join("ns.img");
//! std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
//! let mut target = Engine::new();
//! let nsid = target.add_namespace(&img, NamespaceConfig::default()).unwrap();
//! target.write(nsid, 8, &b"hello world\n".repeat(128)).unwrap(); // 3 blocks at LBA 8
//! let obj = VirtualObject { offset: 0, length: 1200, extents: vec![Extent::data(8, 3)] };
//! let out = target.exec(nsid, &Descriptor::new("wc", vec![obj]).encode()).unwrap();
//! let result = ExecResult::decode(&out.result).unwrap();
//! assert_eq!(result.records[0][0], ("lines".to_string(), Value::U64(100)));
//! ```
#![deny(missing_docs)]

pub mod fence;
mod namespace;
mod stream;

pub use fence::{LockInfo, LockListener, LockPayloadError, LockRequest};
pub use insitu_media::{BlockRead, PoolStats};
pub use namespace::{Namespace, NamespaceConfig, Visibility};
pub use stream::CHUNK;

use insitu_kvcache::{KvCache, KvError};
use insitu_media::Backing;
use insitu_offload::{Args, InputStream, KernelError, OutputSink, Registry};
use insitu_proto::{CommandError, Descriptor, ExecResult, ExtentError, Limits, Status};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// CPU time the calling thread has used, in nanoseconds.
pub use insitu_model::thread_cpu_ns;
/// A CPU budget for the offload engine, standing for a drive's weaker cores: told how much
/// CPU time a kernel spent, it may stall the kernel's thread to keep within the budget
/// (the device model's [`insitu_model::ComputeBudget`] is one). With none set, kernels run
/// at this machine's full speed.
pub use insitu_model::ChargeCpu as ComputeBudget;

/// A namespace identifier, 1-based as in NVMe.
pub type Nsid = u32;

/// What one EXEC did.
#[derive(Debug, Clone)]
pub struct ExecOutcome {
    /// The encoded [`ExecResult`].
    pub result: Vec<u8>,
    /// Bytes read from the media for this command.
    pub media_read_bytes: u64,
    /// Bytes written to output objects (including sector padding).
    pub media_written_bytes: u64,
    /// Wall time of the command on the target.
    pub seconds: f64,
    /// The result was also written to the descriptor's result object (fabric transports
    /// then return only its length).
    pub result_in_object: bool,
}

/// A computational-storage target.
pub struct Engine {
    namespaces: Vec<Namespace>,
    registry: Arc<Registry>,
    limits: Limits,
    max_inline_result: usize,
    compute: Option<Arc<dyn ComputeBudget>>,
    kv: Option<KvCache>,
    fences: fence::Fences,
}

impl Default for Engine {
    fn default() -> Self {
        Engine::new()
    }
}

impl Engine {
    /// A target with no namespaces, the standard kernels, default descriptor limits and a
    /// 16 MiB inline result limit.
    pub fn new() -> Self {
        Engine {
            namespaces: Vec::new(),
            registry: Arc::new(Registry::standard()),
            limits: Limits::default(),
            max_inline_result: 16 << 20,
            compute: None,
            kv: None,
            fences: fence::Fences::default(),
        }
    }

    /// Replaces the kernel registry.
    pub fn with_registry(mut self, registry: Arc<Registry>) -> Self {
        self.registry = registry;
        self
    }

    /// Sets the largest result returned inline (default 16 MiB); larger ones fail with
    /// `RESULT_TOO_LARGE`.
    pub fn with_max_inline_result(mut self, bytes: usize) -> Self {
        self.max_inline_result = bytes;
        self
    }

    /// Makes kernels obey a CPU budget (see [`ComputeBudget`]). Default: none.
    pub fn with_compute_budget(mut self, budget: Arc<dyn ComputeBudget>) -> Self {
        self.compute = Some(budget);
        self
    }

    /// The kernel registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Opens `path` (a file or block device) and adds a namespace over it; returns its NSID.
    pub fn add_namespace(&mut self, path: &Path, cfg: NamespaceConfig) -> Result<Nsid, String> {
        let mut media = Backing::open(path, false).map_err(|e| e.to_string())?.with_cached_reads(cfg.cached_reads);
        if let Some(p) = &cfg.pacing {
            media = media.with_pacing(p.clone());
        }
        let ns = Namespace::new(Arc::new(media), &cfg)?;
        self.namespaces.push(ns);
        Ok(self.namespaces.len() as Nsid)
    }

    /// Keeps a KV cache (see [`insitu_kvcache`]) in the first private namespace, with KV
    /// pages of `page_bytes` on a drive whose flash pages are `flash_page_bytes` (a
    /// multiple): recovers the one a previous run left there, or formats it.
    /// Does nothing when the target has no private namespace (KV commands are then refused).
    pub fn open_kv_cache(&mut self, page_bytes: usize, flash_page_bytes: usize) -> Result<(), String> {
        let Some(ns) = self.namespaces.iter().find(|ns| ns.visibility == Visibility::Private) else { return Ok(()) };
        let store = KvCache::open_on_drive(ns.media.clone(), ns.offset, ns.size, page_bytes, flash_page_bytes).map_err(|e| e.to_string())?;
        self.kv = Some(store);
        Ok(())
    }

    /// The KV cache, or [`KvError::NoStore`] when the target has no private namespace.
    pub fn kv_cache(&self) -> Result<&KvCache, KvError> {
        self.kv.as_ref().ok_or(KvError::NoStore)
    }

    /// The namespace `nsid`, whatever its visibility (for code running on the target).
    pub fn namespace(&self, nsid: Nsid) -> Option<&Namespace> {
        nsid.checked_sub(1).and_then(|i| self.namespaces.get(i as usize))
    }

    /// Number of namespaces, private ones included (NSIDs are 1..=count).
    pub fn namespace_count(&self) -> usize {
        self.namespaces.len()
    }

    /// Bytes read from and written to the media of every namespace since they were opened.
    pub fn media_totals(&self) -> (u64, u64) {
        self.namespaces.iter().fold((0, 0), |(r, w), ns| {
            let c = ns.media.counters();
            (r + c.read_bytes.load(Ordering::Relaxed), w + c.written_bytes.load(Ordering::Relaxed))
        })
    }

    /// NSIDs of the namespaces a host may see.
    pub fn host_namespaces(&self) -> Vec<Nsid> {
        (1..=self.namespaces.len() as Nsid).filter(|n| self.host_ns(*n).is_ok()).collect()
    }

    fn host_ns(&self, nsid: Nsid) -> Result<&Namespace, CommandError> {
        match self.namespace(nsid) {
            None => Err(CommandError::new(Status::INVALID_NAMESPACE, format!("namespace {nsid} does not exist (this target has {})", self.namespaces.len()))),
            Some(ns) if ns.visibility == Visibility::Private => {
                Err(CommandError::new(Status::INVALID_NAMESPACE, format!("namespace {nsid} is private to the target and cannot be addressed by a host")))
            }
            Some(ns) => Ok(ns),
        }
    }

    fn lba_range(ns: &Namespace, nsid: Nsid, slba: u64, bytes: usize) -> Result<u64, CommandError> {
        let lba = u64::from(ns.lba_size);
        if !(bytes as u64).is_multiple_of(lba) {
            return Err(CommandError::new(Status::INVALID_FIELD, format!("transfer of {bytes} bytes is not a multiple of the {lba}-byte block size")));
        }
        let start = slba.checked_mul(lba).filter(|s| s.checked_add(bytes as u64).is_some_and(|e| e <= ns.size));
        start.map(|s| ns.offset + s).ok_or_else(|| {
            CommandError::new(
                Status::LBA_OUT_OF_RANGE,
                format!("LBA {slba} + {} blocks is beyond namespace {nsid} ({} blocks)", bytes as u64 / lba, ns.size / lba),
            )
        })
    }

    /// Reads whole logical blocks starting at `slba` into `buf`.
    pub fn read(&self, nsid: Nsid, slba: u64, buf: &mut [u8]) -> Result<(), CommandError> {
        buf.copy_from_slice(&self.read_blocks(nsid, slba, buf.len())?);
        Ok(())
    }

    /// Reads `bytes` (whole logical blocks) starting at `slba` into a buffer of the
    /// namespace's pool, and returns the data where it landed: a transport sends it from
    /// there, without a copy.
    pub fn read_blocks(&self, nsid: Nsid, slba: u64, bytes: usize) -> Result<BlockRead, CommandError> {
        let ns = self.host_ns(nsid)?;
        let off = Self::lba_range(ns, nsid, slba, bytes)?;
        let mut buf = ns.pool.take_at_least(bytes + 2 * insitu_media::DIRECT_ALIGN);
        let window =
            ns.media.read_window(&mut buf, off, bytes).map_err(|e| CommandError::new(Status::DATA_TRANSFER_ERROR, format!("namespace {nsid}: {e}")))?;
        let skip = window.as_ptr() as usize - buf.as_slice().as_ptr() as usize;
        Ok(BlockRead::new(buf, skip, bytes))
    }

    /// The media and byte offset that `bytes` at `slba` of a host namespace are read from,
    /// after the same checks as [`Engine::read_blocks`]: a transport that can send straight
    /// from the media (see [`insitu_media::Backing::send_from_page_cache`]) uses it.
    pub fn read_source(&self, nsid: Nsid, slba: u64, bytes: usize) -> Result<(&insitu_media::Backing, u64), CommandError> {
        let ns = self.host_ns(nsid)?;
        let off = Self::lba_range(ns, nsid, slba, bytes)?;
        Ok((&ns.media, off))
    }

    /// The buffer pools of every namespace, summed.
    pub fn buffer_stats(&self) -> PoolStats {
        self.namespaces.iter().map(|ns| ns.pool.stats()).fold(PoolStats::default(), |a, b| PoolStats {
            buffer_bytes: a.buffer_bytes.max(b.buffer_bytes),
            allocations: a.allocations + b.allocations,
            reuses: a.reuses + b.reuses,
            in_use: a.in_use + b.in_use,
            idle: a.idle + b.idle,
            peak_buffers: a.peak_buffers + b.peak_buffers,
            max_idle: a.max_idle + b.max_idle,
        })
    }

    /// Writes whole logical blocks starting at `slba`.
    pub fn write(&self, nsid: Nsid, slba: u64, data: &[u8]) -> Result<(), CommandError> {
        let ns = self.host_ns(nsid)?;
        let off = Self::lba_range(ns, nsid, slba, data.len())?;
        self.fences.check(nsid, off - ns.offset, data.len() as u64)?;
        ns.media.write_at(data, off).map_err(|e| CommandError::new(Status::DATA_TRANSFER_ERROR, format!("namespace {nsid}: {e}")))
    }

    /// Makes `nlb` logical blocks from `slba` read as zeros (Write Zeroes, and Dataset
    /// Management deallocate).
    pub fn write_zeroes(&self, nsid: Nsid, slba: u64, nlb: u64) -> Result<(), CommandError> {
        let ns = self.host_ns(nsid)?;
        let bytes = nlb.checked_mul(u64::from(ns.lba_size)).and_then(|b| usize::try_from(b).ok());
        let bytes = bytes.ok_or_else(|| CommandError::new(Status::LBA_OUT_OF_RANGE, format!("{nlb} blocks is too many")))?;
        let off = Self::lba_range(ns, nsid, slba, bytes)?;
        self.fences.check(nsid, off - ns.offset, bytes as u64)?;
        ns.media.zero_range(off, bytes as u64).map_err(|e| CommandError::new(Status::DATA_TRANSFER_ERROR, format!("namespace {nsid}: {e}")))
    }

    /// Locks the blocks of a path of sharable namespace `nsid` for a container: host
    /// writes to them are refused until [`Engine::unlock`]. Returns the lock id.
    pub fn lock(&self, nsid: Nsid, req: LockRequest) -> Result<u64, CommandError> {
        let ns = self.host_ns(nsid)?;
        if let Some((o, l)) = req.extents.iter().find(|(o, l)| o.checked_add(*l).is_none_or(|e| e > ns.size)) {
            return Err(CommandError::new(Status::LBA_OUT_OF_RANGE, format!("extent at byte {o} of {l} bytes is beyond namespace {nsid} ({} bytes)", ns.size)));
        }
        Ok(self.fences.lock(nsid, req))
    }

    /// Releases lock `id` of namespace `nsid`; an unknown id (released, or taken before a
    /// restart) is an Invalid Field error.
    pub fn unlock(&self, nsid: Nsid, id: u64) -> Result<(), CommandError> {
        self.host_ns(nsid)?;
        self.fences.unlock(nsid, id)
    }

    /// The locks held.
    pub fn locks(&self) -> Vec<LockInfo> {
        self.fences.held()
    }

    /// How many locks are held.
    pub fn lock_count(&self) -> usize {
        self.fences.count()
    }

    /// Who hears of locks taken and released (the container runtime refreshes its view).
    pub fn set_lock_listener(&self, listener: Arc<dyn LockListener>) {
        self.fences.set_listener(listener);
    }

    /// Makes every completed write to the namespace durable.
    pub fn flush(&self, nsid: Nsid) -> Result<(), CommandError> {
        let ns = self.host_ns(nsid)?;
        ns.media.flush().map_err(|e| CommandError::new(Status::DATA_TRANSFER_ERROR, format!("flush of namespace {nsid}: {e}")))
    }

    /// Runs the compute descriptor `descriptor` on namespace `nsid`.
    pub fn exec(&self, nsid: Nsid, descriptor: &[u8]) -> Result<ExecOutcome, CommandError> {
        let started = Instant::now();
        let ns = self.host_ns(nsid)?;
        let d =
            Descriptor::decode(descriptor, &self.limits).map_err(|e| CommandError::new(Status::BAD_DESCRIPTOR, format!("compute descriptor rejected: {e}")))?;
        let kernel = self.registry.get(&d.function).ok_or_else(|| {
            let known: Vec<&str> = self.registry.iter().map(|k| k.name()).collect();
            CommandError::new(Status::UNKNOWN_FUNCTION, format!("no function {:?} on this target; available: {}", d.function, known.join(", ")))
        })?;
        if d.inputs.len() > kernel.max_inputs() {
            return Err(CommandError::new(
                Status::INVALID_FIELD,
                format!("{} takes at most {} input object(s), the descriptor has {}", d.function, kernel.max_inputs(), d.inputs.len()),
            ));
        }
        if d.outputs.len() != kernel.output_count() {
            return Err(CommandError::new(
                Status::INVALID_FIELD,
                format!("{} takes {} output object(s), the descriptor has {}", d.function, kernel.output_count(), d.outputs.len()),
            ));
        }
        d.check_extents(ns.size).map_err(|e| {
            let status = match e {
                ExtentError::OutOfRange { .. } => Status::LBA_OUT_OF_RANGE,
                _ => Status::INVALID_FIELD,
            };
            CommandError::new(status, format!("namespace {nsid}: {e}"))
        })?;
        // Output objects are writes: refused on blocks a container holds locked.
        for x in d.outputs.iter().chain(&d.result).flat_map(|o| &o.extents).filter(|x| x.kind == insitu_proto::ExtentKind::Data) {
            self.fences.check(nsid, x.start_sector * 512, u64::from(x.sectors) * 512)?;
        }
        let job = kernel.prepare(&Args::new(&d.args)).map_err(kernel_error)?;

        let media_read = AtomicU64::new(0);
        let mut media_written = 0;
        let plans: Vec<_> = d.inputs.iter().map(|o| stream::segments(ns, o)).collect();
        // A reader thread reads ahead while the kernel computes, to hide the device's
        // latency and its model's. With media in memory there is nothing to hide: a read is
        // a copy, and the kernel makes it itself, in smaller chunks that stay in its core's
        // cache, without a hand-off between threads.
        let inline = ns.media.is_in_memory() && !ns.media.is_paced() && self.compute.is_none();
        let records = std::thread::scope(|s| {
            let feed = if inline {
                stream::Feed::inline(stream::Reader::new(ns, &plans, stream::INLINE_CHUNK, &media_read))
            } else {
                let (tx, rx, rtx, rrx) = stream::channels();
                let reader = stream::Reader::new(ns, &plans, CHUNK, &media_read);
                s.spawn(move || stream::produce(reader, tx, rrx));
                stream::Feed::threaded(rx, rtx)
            };
            let meter = self.compute.clone().map(stream::Meter::start);
            let mut inputs: Vec<stream::ObjectInput> =
                d.inputs.iter().enumerate().map(|(i, o)| stream::ObjectInput::new(i, o.length, feed.clone(), meter.clone())).collect();
            let mut outputs: Vec<stream::ObjectOutput<'_>> = d.outputs.iter().enumerate().map(|(i, o)| stream::ObjectOutput::new(ns, i, o)).collect();
            let mut in_refs: Vec<&mut dyn InputStream> = inputs.iter_mut().map(|i| i as &mut dyn InputStream).collect();
            let mut out_refs: Vec<&mut dyn OutputSink> = outputs.iter_mut().map(|o| o as &mut dyn OutputSink).collect();
            let result = job.run(&mut in_refs, &mut out_refs);
            // What the kernel computed after its last read (a merge, PageRank's iterations).
            if let Some(m) = &meter {
                m.charge();
            }
            // Dropping the streams hangs up the feed, which stops the reader if the kernel
            // ended early.
            drop(in_refs);
            drop(inputs);
            drop(feed);
            drop(out_refs);
            media_written = outputs.iter().map(|o| o.media_bytes).sum();
            result
        })
        .map_err(kernel_error)?;
        let result = ExecResult { records }.encode();
        let limit = d.result.as_ref().map_or(self.max_inline_result as u64, |r| r.length);
        if result.len() as u64 > limit {
            return Err(CommandError::new(
                Status::RESULT_TOO_LARGE,
                format!(
                    "result of {} bytes exceeds the {limit}-byte limit; narrow the request (e.g. max_matches), split it, or give a larger result object",
                    result.len()
                ),
            ));
        }
        if let Some(obj) = &d.result {
            let mut out = stream::ObjectOutput::new(ns, d.outputs.len(), obj);
            out.write(&result).and_then(|_| out.finish()).map_err(kernel_error)?;
            media_written += out.media_bytes;
        }
        if !d.outputs.is_empty() || d.result.is_some() {
            ns.media.flush().map_err(|e| CommandError::new(Status::DATA_TRANSFER_ERROR, format!("flush of outputs: {e}")))?;
        }
        Ok(ExecOutcome {
            result,
            media_read_bytes: media_read.load(Ordering::Relaxed),
            media_written_bytes: media_written,
            seconds: started.elapsed().as_secs_f64(),
            result_in_object: d.result.is_some(),
        })
    }
}

fn kernel_error(e: KernelError) -> CommandError {
    let status = match e {
        KernelError::BadArgument { .. } => Status::BAD_ARGUMENT,
        KernelError::BadShape(_) => Status::INVALID_FIELD,
        KernelError::OutputTooSmall { .. } => Status::OUTPUT_TOO_SMALL,
        KernelError::Io(_) => Status::DATA_TRANSFER_ERROR,
        _ => Status::KERNEL_FAILED,
    };
    CommandError::new(status, e.to_string())
}

#[cfg(test)]
mod tests;
