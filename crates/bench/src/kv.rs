// SPDX-License-Identifier: Apache-2.0
//! The key-value benchmark: HAYAGUI's comparison of storage stacks under one engine.
//!
//! The same engine ([`KvStore`]: redb, the same cache, every change committed durably) runs
//! the same operations on three stacks, in one run:
//!
//! * `direct`: the target's own stack: the store in a file of accelfs ([`insitu_accelfs`],
//!   the target's file system for private data) on a private-namespace image, as the
//!   target's key-value service keeps it, driven in the target's process (what a kernel or
//!   container on the target gets through the local API);
//! * `redirect`: the engine on the host over a remote namespace attached with
//!   [`insitu_attach::attach`] (ext4 on a loop device over the FUSE file whose every block
//!   I/O crosses NVMe/TCP to an in-process target; the link model paces that fabric);
//! * `syscall`: the engine over the kernel's file system (ext4) on a loop device of a local
//!   image: every I/O is a system call into the kernel's stack.
//!
//! Workloads: YCSB core workloads A–F ([`crate::ycsb`]: a load phase in batches, then the
//! operations, each timed) and db_bench's fillseq, fillrandom, readseq and readrandom with
//! 100 B and 4 KiB values; and a genome-style job ([`crate::genome`]). Every value read is compared with a model of what was written,
//! so a stack that loses or corrupts data fails the benchmark instead of looking fast.
//!
//! Page caches are dropped before every measured phase; redb's cache is bounded
//! ([`insitu_kvstore::CACHE_BYTES`]) on every stack.
//!
//! One drive model (`--drive`, HAYAGUI's Samsung 970 EVO class by default) governs every
//! stack's media: `direct` books each block on it ([`PacedDevice`], as a target with
//! `--model` paces its store), `redirect`'s target runs with it (and with the link), and
//! `syscall`'s loop device is throttled by the kernel to its rates ([`crate::throttle`],
//! which cannot add its per-request latency: see there).

use crate::common::{command, drop_caches, machine, Machine, Work};
use crate::dbbench::{db_bench_key, DbBench, DB_BENCH_VALUE_SIZES as DB_VALUES};
use crate::genome::{self, Files, GenomeRun};
use crate::model::{parse_drive, parse_link, DriveReport};
use crate::throttle::{device_of, FlushPaced, Limits, Throttle};
use crate::ycsb::{Op, Workload, Ycsb, YcsbConfig, FIELD_LEN};
use crate::Error;
use insitu_accelfs::{BlockDevice, FileDevice, Fs};
use insitu_daemon::{NamespaceSpec, ServerHandle, SubsystemConfig, Target, TargetConfig};
use insitu_image::{Fs as MkFs, Scratch};
use insitu_kvstore::wire::{Key, StoreMode};
use insitu_kvstore::{KvStore, KvStoreError, PacedDevice};
use insitu_model::DeviceModel;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// What [`kv`] measures.
#[derive(Debug, Clone)]
pub struct KvBenchOptions {
    /// YCSB records loaded before the YCSB workloads. Default 50,000 (about 50 MB, more
    /// than the engine's cache).
    pub records: u64,
    /// Operations per workload (db_bench: entries). Default 2,000.
    pub operations: u64,
    /// Workloads: `a`..`f` (YCSB), `fillseq`, `fillrandom`, `readseq`, `readrandom`
    /// (db_bench, each with 100 B and 4 KiB values) and `genome` ([`crate::genome`]).
    /// Default: all.
    pub workloads: Vec<String>,
    /// Stacks: `direct`, `redirect`, `syscall`. Default: all.
    pub systems: Vec<String>,
    /// The fabric link of the redirection path (`--link`): a name such as 25gbe, MB/s, or
    /// `none`. Default 25gbe.
    pub link: Option<String>,
    /// The drive model of every stack (`--drive`): a preset, PRESET@MB_S, custom:MB_S, or
    /// `none` (real speed). Default samsung-980pro.
    pub drive: Option<String>,
    /// Work directory for the images (default: a new directory under /var/tmp, removed).
    pub dir: Option<PathBuf>,
    /// Seed of the workload generators.
    pub seed: u64,
    /// Bases of the genome job's reference sequence. Default 4 Mi.
    pub genome_reference_bases: usize,
    /// Bytes of the genome job's target sequence (100-base reads). Default 256 MiB.
    pub genome_target_bytes: usize,
}

/// The report of [`kv`].
#[derive(Debug, Clone, Serialize)]
pub struct KvReport {
    /// The command line that ran it.
    pub command: String,
    /// YCSB records loaded.
    pub records: u64,
    /// Operations per workload.
    pub operations: u64,
    /// Workloads asked for.
    pub workloads: Vec<String>,
    /// Stacks asked for.
    pub systems: Vec<String>,
    /// The redirection stack's link, as given.
    pub link: String,
    /// The drive model, as given.
    pub drive: String,
    /// The drive model with its derived rates (its own host link dropped); `None` (null)
    /// for real speed.
    pub drive_model: Option<DriveReport>,
    /// How each stack run follows the drive model.
    pub drive_applied: DriveApplied,
    /// The engine every stack runs, in words.
    pub engine: String,
    /// The YCSB parameters.
    pub ycsb: YcsbParams,
    /// The db_bench parameters.
    pub db_bench: DbBenchParams,
    /// One row per workload and stack, in the order run.
    pub results: Vec<KvRow>,
    /// The genome job, one run per stack.
    pub genome: Vec<GenomeRun>,
    /// Per workload (and `genome`), how much faster direct was than each baseline.
    pub ratios: BTreeMap<String, KvRatios>,
    /// Every value read was checked against what was written.
    pub verified: bool,
    /// The machine it ran on.
    pub machine: Machine,
}

/// How each stack follows the drive model ([`KvReport::drive_applied`]); a stack not run
/// is absent.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DriveApplied {
    /// The direct stack.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct: Option<StackPacing>,
    /// The redirection stack.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redirect: Option<StackPacing>,
    /// The system-call stack.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub syscall: Option<StackPacing>,
}

/// How one stack follows the drive model.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum StackPacing {
    /// In words (a string in the JSON).
    Note(&'static str),
    /// The system-call stack on a drive with flash: the kernel's block throttle and the
    /// model's flushes.
    Kernel {
        /// The throttle on the loop device.
        kernel_throttle: KernelThrottle,
        /// What each fsync costs, in words.
        flush: &'static str,
    },
}

/// The kernel's throttle on the system-call stack's loop device.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum KernelThrottle {
    /// Applied at these rates.
    Applied(Limits),
    /// Not applied, and why.
    NotApplied {
        /// Why the kernel could not throttle the device.
        not_applied: String,
    },
}

/// The YCSB parameters of [`KvReport::ycsb`].
#[derive(Debug, Clone, Serialize)]
pub struct YcsbParams {
    /// Fields per record.
    pub field_count: usize,
    /// Bytes per field.
    pub field_bytes: usize,
    /// The Zipfian constant of the request distribution.
    pub zipfian_constant: f64,
    /// Bytes per key.
    pub key_bytes: usize,
    /// Records per load transaction.
    pub load_batch: usize,
}

/// The db_bench parameters of [`KvReport::db_bench`].
#[derive(Debug, Clone, Serialize)]
pub struct DbBenchParams {
    /// Value sizes, each run in turn.
    pub value_bytes: Vec<usize>,
    /// Bytes per key.
    pub key_bytes: usize,
    /// Entries per fill.
    pub entries: u64,
    /// Entries per chunk of readseq.
    pub readseq_chunk: usize,
}

/// One workload on one stack ([`KvReport::results`]).
#[derive(Debug, Clone, Serialize)]
pub struct KvRow {
    /// The workload: `a`..`f`, or a db_bench phase with its value size (`fillseq-100`).
    pub workload: String,
    /// The stack.
    pub system: String,
    /// Operations per second.
    pub ops_per_s: f64,
    /// Median latency, µs.
    pub p50_us: f64,
    /// 99th-percentile latency, µs.
    pub p99_us: f64,
    /// Operations timed.
    pub operations: u64,
    /// Seconds of the phase.
    pub seconds: f64,
    /// Reads of keys that were (rightly) absent.
    pub not_found: u64,
}

/// How much better direct did than each baseline measured ([`KvReport::ratios`]); a
/// baseline not measured is absent.
#[derive(Debug, Clone, Default, Serialize)]
pub struct KvRatios {
    /// Over the redirection stack.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct_to_redirect: Option<f64>,
    /// Over the system-call stack.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct_to_syscall: Option<f64>,
}

/// Every workload name, in the order they run.
pub const KV_WORKLOADS: &[&str] = &["a", "b", "c", "f", "d", "e", "fillseq", "fillrandom", "readseq", "readrandom", "genome"];
/// The drive model when none is asked for: the class of HAYAGUI's drive (a Samsung 970
/// EVO), a consumer TLC NVMe SSD.
pub const KV_DEFAULT_DRIVE: &str = "samsung-980pro";
/// Every stack name.
pub const KV_SYSTEMS: &[&str] = &["direct", "redirect", "syscall"];
/// Records per load transaction.
const LOAD_BATCH: usize = 1000;
/// Entries per chunk of db_bench's readseq (an iterator, read in chunks).
const SCAN_CHUNK: usize = 100;

impl Default for KvBenchOptions {
    fn default() -> Self {
        KvBenchOptions {
            records: 50_000,
            operations: 2_000,
            workloads: KV_WORKLOADS.iter().map(|s| s.to_string()).collect(),
            systems: KV_SYSTEMS.iter().map(|s| s.to_string()).collect(),
            link: None,
            drive: None,
            dir: None,
            seed: 42,
            genome_reference_bases: 4 << 20,
            genome_target_bytes: 256 << 20,
        }
    }
}

/// One stack: makes fresh stores by name, and holds the genome job's files.
trait Stack: Files {
    fn open(&mut self, name: &str) -> Result<KvStore, Error>;
    /// Files to evict from the page cache before a measurement.
    fn files(&self) -> Vec<PathBuf>;
}

/// The target's direct stack: an accelfs file system on a private-namespace image; each
/// store is a file of it, as the target keeps its key-value service.
struct Direct {
    image: PathBuf,
    fs: Fs,
    pacing: Option<Arc<dyn insitu_media::Pacing>>,
}

/// accelfs's buffer cache on the direct stack.
const FS_CACHE: usize = 16 << 20;

impl Direct {
    fn new(image: PathBuf, size: u64, drive: Option<&DeviceModel>) -> Result<Direct, Error> {
        let f = std::fs::File::create(&image).map_err(|e| format!("{}: {e}", image.display()))?;
        f.set_len(size).map_err(|e| format!("{}: {e}", image.display()))?;
        let pacing = match drive {
            Some(d) => Some(Arc::new(d.pacer(size).map_err(|e| format!("drive model: {e}"))?) as Arc<dyn insitu_media::Pacing>),
            None => None,
        };
        let fs = Direct::mount(&image, pacing.clone(), true)?;
        Ok(Direct { image, fs, pacing })
    }

    /// accelfs on the image, formatted or opened, paced by the drive model if there is one.
    fn mount(image: &Path, pacing: Option<Arc<dyn insitu_media::Pacing>>, format: bool) -> Result<Fs, Error> {
        let mut dev: Box<dyn BlockDevice> = Box::new(FileDevice::open(image).map_err(|e| format!("{}: {e}", image.display()))?);
        if let Some(p) = pacing {
            dev = Box::new(PacedDevice::new(dev, p, 0));
        }
        let fs = if format { Fs::format(dev, FS_CACHE) } else { Fs::open(dev, FS_CACHE) };
        fs.map_err(|e| format!("accelfs on {}: {e}", image.display()).into())
    }
}

impl Stack for Direct {
    fn open(&mut self, name: &str) -> Result<KvStore, Error> {
        KvStore::open_fs(&self.fs, name).map_err(|e| format!("direct store {name}: {e}").into())
    }
    fn files(&self) -> Vec<PathBuf> {
        vec![self.image.clone()]
    }
}

impl Files for Direct {
    fn put(&mut self, name: &str, data: &[u8]) -> Result<(), Error> {
        let err = |e: insitu_accelfs::Error| format!("accelfs file {name}: {e}");
        if self.fs.list().iter().any(|d| d.name == name) {
            self.fs.remove(name).map_err(err)?;
        }
        let f = self.fs.create(name).map_err(err)?;
        f.write_at(data, 0).map_err(err)?;
        f.sync().map_err(err)?;
        Ok(())
    }
    fn read_at(&mut self, name: &str, buf: &mut [u8], offset: u64) -> Result<usize, Error> {
        let f = self.fs.open_file(name).map_err(|e| format!("accelfs file {name}: {e}"))?;
        f.read_at(buf, offset).map_err(|e| format!("accelfs file {name}: {e}").into())
    }
    fn cold(&mut self) -> Result<(), Error> {
        // A fresh mount: accelfs's buffer cache starts empty.
        drop_caches(&self.image);
        self.fs = Direct::mount(&self.image, self.pacing.clone(), false)?;
        Ok(())
    }
}

impl Drop for Direct {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.image);
    }
}

/// Stores as files of a mounted file system (a local loop image, or an attached namespace).
struct Mounted {
    mnt: PathBuf,
    open: HashMap<String, std::fs::File>,
    /// The drive model whose flushes every sync pays ([`FlushPaced`]), where the kernel
    /// stack runs on a local device that nothing else paces.
    flush_model: Option<Arc<insitu_model::Pacer>>,
}

impl Mounted {
    fn new(mnt: PathBuf, flush_model: Option<Arc<insitu_model::Pacer>>) -> Mounted {
        Mounted { mnt, open: HashMap::new(), flush_model }
    }
}

impl Stack for Mounted {
    fn open(&mut self, name: &str) -> Result<KvStore, Error> {
        let path = self.mnt.join(format!("{name}.redb"));
        let _ = std::fs::remove_file(&path);
        let err = |e: &dyn std::fmt::Display| format!("store {}: {e}", path.display());
        match &self.flush_model {
            Some(p) => {
                let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(|e| err(&e))?;
                let backend = redb::backends::FileBackend::new(file).map_err(|e| err(&e))?;
                KvStore::with_backend(FlushPaced::new(backend, p.clone()), u64::MAX).map_err(|e| err(&e).into())
            }
            None => KvStore::open_file(&path).map_err(|e| err(&e).into()),
        }
    }
    fn files(&self) -> Vec<PathBuf> {
        Vec::new()
    }
}

impl Files for Mounted {
    fn put(&mut self, name: &str, data: &[u8]) -> Result<(), Error> {
        let path = self.mnt.join(name);
        self.open.remove(name);
        let err = |e: std::io::Error| format!("{}: {e}", path.display());
        let mut f = std::fs::File::create(&path).map_err(err)?;
        std::io::Write::write_all(&mut f, data).map_err(err)?;
        let model = self.flush_model.as_deref().map(|p| p as &dyn insitu_media::Pacing);
        if let Some(p) = model {
            let _ = p.on_write(0, data.len() as u64);
        }
        insitu_media::paced_flush(model, || f.sync_all()).map_err(err)?;
        Ok(())
    }
    fn read_at(&mut self, name: &str, buf: &mut [u8], offset: u64) -> Result<usize, Error> {
        let path = self.mnt.join(name);
        let f = match self.open.entry(name.to_string()) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert(std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?),
        };
        std::os::unix::fs::FileExt::read_at(f, buf, offset).map_err(|e| format!("{}: {e}", path.display()).into())
    }
    fn cold(&mut self) -> Result<(), Error> {
        self.open.clear();
        drop_caches(Path::new("/"));
        Ok(())
    }
}

/// The redirection stack: an in-process target, its namespace attached and mounted here.
struct Redirect {
    mounted: Mounted,
    server: Option<ServerHandle>,
    image: PathBuf,
    attached: bool,
}

impl Drop for Redirect {
    fn drop(&mut self) {
        // Open files would keep the mount busy, and a mount left behind whose target is
        // gone blocks every later sync(2) on the machine.
        self.mounted.open.clear();
        if self.attached {
            let _ = insitu_attach::detach(&self.mounted.mnt);
        }
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
        let _ = std::fs::remove_file(&self.image);
        let _ = std::fs::remove_dir(&self.mounted.mnt);
    }
}

impl Stack for Redirect {
    fn open(&mut self, name: &str) -> Result<KvStore, Error> {
        self.mounted.open(name)
    }
    fn files(&self) -> Vec<PathBuf> {
        vec![self.image.clone()]
    }
}

impl Files for Redirect {
    fn put(&mut self, name: &str, data: &[u8]) -> Result<(), Error> {
        self.mounted.put(name, data)
    }
    fn read_at(&mut self, name: &str, buf: &mut [u8], offset: u64) -> Result<usize, Error> {
        self.mounted.read_at(name, buf, offset)
    }
    fn cold(&mut self) -> Result<(), Error> {
        self.mounted.cold()
    }
}

fn redirect(root: &Path, size: u64, drive: Option<&DeviceModel>, link: Option<insitu_model::LinkConfig>) -> Result<Redirect, Error> {
    let image = root.join("redirect.img");
    let f = std::fs::File::create(&image).map_err(|e| format!("{}: {e}", image.display()))?;
    f.set_len(size).map_err(|e| format!("{}: {e}", image.display()))?;
    let nqn = "nqn.2024-01.io.insitu:bench-kv";
    let model = match (drive, link) {
        (Some(d), link) => Some(DeviceModel { link, ..d.clone() }),
        (None, Some(l)) => Some(DeviceModel {
            name: "link".into(),
            description: "the fabric link only".into(),
            source: String::new(),
            flash: None,
            link: Some(l),
            engine_link: None,
            compute: None,
        }),
        (None, None) => None,
    };
    let cfg = TargetConfig {
        listen: ([127, 0, 0, 1], 0).into(),
        subsystems: vec![SubsystemConfig { nqn: nqn.into(), namespaces: vec![NamespaceSpec::sharable(&image)], allow_hosts: vec![] }],
        model,
        ..TargetConfig::default()
    };
    let server = Target::bind(cfg).map_err(|e| format!("cannot start the redirection target: {e}"))?.spawn();
    let mnt = root.join("redirect-mnt");
    let url = format!("nvme-tcp://{}/{nqn}/1", server.local_addr());
    let mut r = Redirect { mounted: Mounted::new(mnt.clone(), None), server: Some(server), image, attached: false };
    insitu_attach::attach(&url, &mnt, Some(insitu_attach::Format::Ext4), None)
        .map_err(|e| format!("cannot attach {url} at {} (the redirection baseline needs root, FUSE and loop devices): {e}", mnt.display()))?;
    r.attached = true;
    Ok(r)
}

/// Latencies of one measured phase, µs, and what it did.
#[derive(Default)]
struct Phase {
    lat_us: Vec<f64>,
    secs: f64,
    ops: u64,
    not_found: u64,
}

impl Phase {
    fn row(&mut self, workload: &str, system: &str) -> KvRow {
        self.lat_us.sort_by(f64::total_cmp);
        let pct = |p: f64| self.lat_us.get(((self.lat_us.len() as f64 * p) as usize).min(self.lat_us.len().saturating_sub(1))).copied().unwrap_or(f64::NAN);
        KvRow {
            workload: workload.to_string(),
            system: system.to_string(),
            ops_per_s: self.ops as f64 / self.secs.max(1e-9),
            p50_us: pct(0.50),
            p99_us: pct(0.99),
            operations: self.ops,
            seconds: self.secs,
            not_found: self.not_found,
        }
    }
}

fn key(k: &[u8]) -> Key {
    Key::new(k).expect("benchmark keys are 1-16 bytes")
}

/// Checks a value read against the model.
fn check(system: &str, k: &[u8], got: &[u8], model: &HashMap<Vec<u8>, Vec<u8>>) -> Result<(), Error> {
    match model.get(k) {
        Some(want) if want == got => Ok(()),
        Some(want) => Err(format!(
            "{system}: key {} read {} bytes that differ from the {} written: the stack corrupts data",
            String::from_utf8_lossy(k),
            got.len(),
            want.len()
        )
        .into()),
        None => Err(format!("{system}: key {} has a value that was never written", String::from_utf8_lossy(k)).into()),
    }
}

/// Reads `k` and checks it; a key the model lacks must be absent.
fn read_checked(store: &KvStore, system: &str, k: &[u8], model: &HashMap<Vec<u8>, Vec<u8>>, phase: &mut Phase) -> Result<Option<Vec<u8>>, Error> {
    match store.retrieve(&key(k)) {
        Ok(v) => check(system, k, &v, model).map(|()| Some(v)),
        Err(KvStoreError::KeyNotFound) if !model.contains_key(k) => {
            phase.not_found += 1;
            Ok(None)
        }
        Err(e) => Err(format!("{system}: read of {}: {e}", String::from_utf8_lossy(k)).into()),
    }
}

fn put(store: &KvStore, system: &str, k: &[u8], v: &[u8], model: &mut HashMap<Vec<u8>, Vec<u8>>) -> Result<(), Error> {
    store.store(&key(k), v, StoreMode::Upsert).map_err(|e| format!("{system}: store of {}: {e}", String::from_utf8_lossy(k)))?;
    model.insert(k.to_vec(), v.to_vec());
    Ok(())
}

/// Read-merge-write of one field, as YCSB's key-value bindings update a record.
fn update_field(
    store: &KvStore,
    system: &str,
    k: &[u8],
    field: usize,
    data: &[u8],
    model: &mut HashMap<Vec<u8>, Vec<u8>>,
    phase: &mut Phase,
) -> Result<(), Error> {
    let Some(mut v) = read_checked(store, system, k, model, phase)? else { return Ok(()) };
    let at = field * FIELD_LEN;
    if at + data.len() > v.len() {
        return Err(format!("{system}: record {} has {} bytes, too short for field {field}", String::from_utf8_lossy(k), v.len()).into());
    }
    v[at..at + data.len()].copy_from_slice(data);
    put(store, system, k, &v, model)
}

/// Loads the YCSB records (not measured) in durable batches.
fn ycsb_load(store: &KvStore, gen: &Ycsb, model: &mut HashMap<Vec<u8>, Vec<u8>>) -> Result<(), Error> {
    let mut batch: Vec<(Key, Vec<u8>)> = Vec::with_capacity(LOAD_BATCH);
    let flush = |batch: &mut Vec<(Key, Vec<u8>)>| -> Result<(), Error> {
        store.store_many(batch.iter().map(|(k, v)| (k, v.as_slice()))).map_err(|e| format!("YCSB load: {e}"))?;
        batch.clear();
        Ok(())
    };
    for (k, v) in gen.load() {
        model.insert(k.to_vec(), v.clone());
        batch.push((key(&k), v));
        if batch.len() == LOAD_BATCH {
            flush(&mut batch)?;
        }
    }
    flush(&mut batch)
}

/// Runs one YCSB workload's operations on `store`, each timed.
fn ycsb_run(store: &KvStore, system: &str, gen: &mut Ycsb, model: &mut HashMap<Vec<u8>, Vec<u8>>) -> Result<Phase, Error> {
    let mut phase = Phase::default();
    let started = Instant::now();
    for op in gen.operations() {
        let t = Instant::now();
        match op {
            Op::Read { key: k } => {
                read_checked(store, system, &k, model, &mut phase)?;
            }
            Op::Update { key: k, field, data } | Op::ReadModifyWrite { key: k, field, data } => {
                update_field(store, system, &k, field, &data, model, &mut phase)?
            }
            Op::Insert { key: k, value } => put(store, system, &k, &value, model)?,
            Op::Scan { start, count } => {
                for (k, v) in store.scan(&key(&start), count).map_err(|e| format!("{system}: scan: {e}"))? {
                    check(system, k.as_bytes(), &v, model)?;
                }
            }
        }
        phase.lat_us.push(t.elapsed().as_secs_f64() * 1e6);
        phase.ops += 1;
    }
    phase.secs = started.elapsed().as_secs_f64();
    Ok(phase)
}

/// A db_bench fill: every entry stored (and remembered in `model`), each timed, from cold
/// caches.
fn fill(
    stack: &dyn Stack,
    store: &KvStore,
    system: &str,
    entries: impl Iterator<Item = ([u8; 16], Vec<u8>)>,
    model: &mut HashMap<Vec<u8>, Vec<u8>>,
) -> Result<Phase, Error> {
    let mut phase = Phase::default();
    cold(stack);
    let started = Instant::now();
    for (k, v) in entries {
        let t = Instant::now();
        put(store, system, &k, &v, model)?;
        phase.lat_us.push(t.elapsed().as_secs_f64() * 1e6);
        phase.ops += 1;
    }
    phase.secs = started.elapsed().as_secs_f64();
    Ok(phase)
}

/// The db_bench phases on fresh stores: fillseq, then readseq and readrandom over what it
/// wrote; fillrandom on another store. Returns `(workload, phase)` rows.
fn db_bench(stack: &mut dyn Stack, system: &str, wanted: &[&str], n: u64, seed: u64, progress: &mut dyn FnMut(&str)) -> Result<Vec<(String, Phase)>, Error> {
    let mut out = Vec::new();
    let want = |w: &str| wanted.contains(&w);
    for len in DB_VALUES {
        let tag = |w: &str| format!("{w}-{len}");
        let seed = seed ^ len as u64;
        if want("fillseq") || want("readseq") || want("readrandom") {
            let store = stack.open(&format!("seq-{len}"))?;
            let mut model = HashMap::new();
            let phase = fill(stack, &store, system, DbBench::FillSeq.entries(n, len, seed), &mut model)?;
            if want("fillseq") {
                progress(&format!("{system} {}", tag("fillseq")));
                out.push((tag("fillseq"), phase));
            }
            if want("readseq") {
                cold(stack);
                let mut phase = Phase::default();
                let started = Instant::now();
                let mut next = Some(db_bench_key(0));
                while let Some(start) = next.take() {
                    let t = Instant::now();
                    let chunk = store.scan(&key(&start), SCAN_CHUNK + 1).map_err(|e| format!("{system}: readseq: {e}"))?;
                    let took = t.elapsed().as_secs_f64() * 1e6;
                    let read = chunk.len().min(SCAN_CHUNK);
                    for (k, v) in &chunk[..read] {
                        check(system, k.as_bytes(), v, &model)?;
                        phase.lat_us.push(took / read as f64);
                    }
                    phase.ops += read as u64;
                    next = chunk.get(SCAN_CHUNK).map(|(k, _)| k.as_bytes().try_into().expect("16-byte keys"));
                }
                phase.secs = started.elapsed().as_secs_f64();
                if phase.ops != n {
                    return Err(format!("{system}: readseq found {} entries, {n} were written", phase.ops).into());
                }
                progress(&format!("{system} {}", tag("readseq")));
                out.push((tag("readseq"), phase));
            }
            if want("readrandom") {
                cold(stack);
                let mut phase = Phase::default();
                let started = Instant::now();
                for k in DbBench::ReadRandom.keys(n, seed) {
                    let t = Instant::now();
                    if read_checked(&store, system, &k, &model, &mut phase)?.is_none() {
                        return Err(format!("{system}: readrandom did not find a written key").into());
                    }
                    phase.lat_us.push(t.elapsed().as_secs_f64() * 1e6);
                    phase.ops += 1;
                }
                phase.secs = started.elapsed().as_secs_f64();
                progress(&format!("{system} {}", tag("readrandom")));
                out.push((tag("readrandom"), phase));
            }
        }
        if want("fillrandom") {
            let store = stack.open(&format!("random-{len}"))?;
            let phase = fill(stack, &store, system, DbBench::FillRandom.entries(n, len, seed.wrapping_add(1)), &mut HashMap::new())?;
            progress(&format!("{system} {}", tag("fillrandom")));
            out.push((tag("fillrandom"), phase));
        }
    }
    Ok(out)
}

/// Drops the page cache (everything, as root) before a measured phase.
fn cold(stack: &dyn Stack) {
    let files = stack.files();
    if files.is_empty() {
        drop_caches(Path::new("/"));
    }
    for f in &files {
        drop_caches(f);
    }
}

/// All YCSB workloads asked for, on one store loaded once (YCSB's recommended sequence
/// runs A, B, C, F, D on one load; E follows here on the same data).
fn ycsb_all(
    stack: &mut dyn Stack,
    system: &str,
    workloads: &[Workload],
    opts: &KvBenchOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<(String, Phase)>, Error> {
    if workloads.is_empty() {
        return Ok(Vec::new());
    }
    let store = stack.open("ycsb")?;
    let mut model = HashMap::new();
    let loader = Ycsb::new(&YcsbConfig { workload: workloads[0], records: opts.records, operations: 0, seed: opts.seed });
    ycsb_load(&store, &loader, &mut model)?;
    progress(&format!("{system} loaded {} records", opts.records));
    let mut out = Vec::new();
    for (i, w) in workloads.iter().enumerate() {
        let mut gen = Ycsb::new(&YcsbConfig { workload: *w, records: opts.records, operations: opts.operations, seed: opts.seed.wrapping_add(i as u64 + 1) });
        cold(stack);
        let phase = ycsb_run(&store, system, &mut gen, &mut model)?;
        progress(&format!("{system} workload {w}: {:.0} ops/s", phase.ops as f64 / phase.secs.max(1e-9)));
        out.push((w.to_string(), phase));
    }
    Ok(out)
}

/// How much better direct did than each baseline measured, from each stack's `value` and
/// `better(direct, baseline)`; `None` without a direct measurement.
fn versus_baselines(value: impl Fn(&str) -> Option<f64>, better: impl Fn(f64, f64) -> f64) -> Option<KvRatios> {
    let d = value("direct")?;
    Some(KvRatios { direct_to_redirect: value("redirect").map(|v| better(d, v)), direct_to_syscall: value("syscall").map(|v| better(d, v)) })
}

/// Runs the key-value benchmark. Every row of `results` has `workload`, `system`,
/// `ops_per_s`, `p50_us`, `p99_us`; `genome` has the genome job's seconds (whole and per
/// step) and findings per stack; `ratios` gives, per workload, direct's throughput over each
/// baseline's (for `genome`, the baseline's time over direct's). Fails when a stack returns a value that was not written.
pub fn kv(opts: &KvBenchOptions, progress: &mut dyn FnMut(&str)) -> Result<KvReport, Error> {
    for w in &opts.workloads {
        if !KV_WORKLOADS.contains(&w.as_str()) {
            return Err(format!("--workloads: unknown workload {w:?}; known: {}", KV_WORKLOADS.join(",")).into());
        }
    }
    for s in &opts.systems {
        if !KV_SYSTEMS.contains(&s.as_str()) {
            return Err(format!("--systems: unknown system {s:?}; known: {}", KV_SYSTEMS.join(",")).into());
        }
    }
    if opts.records == 0 || opts.operations == 0 {
        return Err("--records and --operations must be at least 1".into());
    }
    let link_name = opts.link.clone().unwrap_or_else(|| "25gbe".into());
    let link = parse_link(&link_name)?;
    let drive_name = opts.drive.clone().unwrap_or_else(|| KV_DEFAULT_DRIVE.into());
    // The drive's own host link is not used: the fabric's link is `link`.
    let drive = parse_drive(&drive_name)?.map(|d| DeviceModel { link: None, ..d });
    let mut applied = DriveApplied::default();
    let ycsb: Vec<Workload> =
        KV_WORKLOADS[..6].iter().filter(|w| opts.workloads.iter().any(|x| x == *w)).map(|w| w.parse().expect("a YCSB workload name")).collect();
    let db: Vec<&str> = opts.workloads.iter().map(String::as_str).filter(|w| w.starts_with("fill") || w.starts_with("read")).collect();
    let genome_bytes = if opts.workloads.iter().any(|w| w == "genome") { (opts.genome_target_bytes + opts.genome_reference_bases * 3) as u64 } else { 0 };
    // Room for the YCSB data (and its inserts) or the largest db_bench store, three times over.
    let data = (opts.records + opts.operations) * 1200 + opts.operations * 4200;
    let store_bytes = (data * 3 + genome_bytes * 2).max(64 << 20).next_multiple_of(1 << 20);
    let work = Work::on_disk(opts.dir.clone(), "kv", store_bytes * 2)?;
    let root = work.root().to_path_buf();
    let mut rows = Vec::new();
    let genome_data =
        opts.workloads.iter().any(|w| w == "genome").then(|| genome::GenomeData::generate(opts.genome_reference_bases, opts.genome_target_bytes, opts.seed));
    let (mut genome_found, mut genome_rows) = (Vec::new(), Vec::new());
    for system in KV_SYSTEMS.iter().filter(|s| opts.systems.iter().any(|x| x == *s)) {
        let fs_bytes = store_bytes * 6;
        let (mut scratch, mut throttle) = (None, None);
        let mut stack: Box<dyn Stack> = match *system {
            "direct" => {
                applied.direct = Some(StackPacing::Note(if drive.is_some() { "every block booked on the drive model" } else { "real speed" }));
                Box::new(Direct::new(root.join("direct.img"), fs_bytes, drive.as_ref())?)
            }
            "redirect" => {
                applied.redirect = Some(StackPacing::Note(if drive.is_some() { "the target's media paced by the drive model" } else { "real speed" }));
                Box::new(redirect(&root, fs_bytes, drive.as_ref(), link.clone())?)
            }
            _ => {
                let s = Scratch::new(Some(root.join("syscall")), "kv-syscall", fs_bytes, MkFs::Ext4)?;
                let (mut flush_model, mut how) = (None, StackPacing::Note("real speed"));
                if let Some(d) = drive.as_ref().filter(|d| d.flash.is_some()) {
                    let limits = Limits::of(d.flash.as_ref().expect("filtered"));
                    flush_model = Some(Arc::new(d.pacer(fs_bytes).map_err(|e| format!("drive model: {e}"))?));
                    let kernel_throttle = match device_of(&s.mnt).and_then(|dev| Throttle::apply(dev, limits)) {
                        Ok(t) => {
                            throttle = Some(t);
                            KernelThrottle::Applied(limits)
                        }
                        Err(why) => {
                            progress(&format!("syscall: the kernel cannot throttle the loop device ({why}); only flushes follow the drive model"));
                            KernelThrottle::NotApplied { not_applied: why }
                        }
                    };
                    how = StackPacing::Kernel { kernel_throttle, flush: "each fsync lasts the model's flush" };
                }
                let m = Mounted::new(s.mnt.clone(), flush_model);
                applied.syscall = Some(how);
                scratch = Some(s);
                Box::new(m)
            }
        };
        for (workload, mut phase) in ycsb_all(stack.as_mut(), system, &ycsb, opts, progress)? {
            rows.push(phase.row(&workload, system));
        }
        for (workload, mut phase) in db_bench(stack.as_mut(), system, &db, opts.operations, opts.seed, progress)? {
            rows.push(phase.row(&workload, system));
        }
        if let Some(data) = &genome_data {
            genome::stage(stack.as_mut(), data)?;
            stack.cold()?;
            let (found, steps, secs) = genome::run(stack.as_mut())?;
            progress(&format!("{system} genome: {secs:.2} s"));
            let r = genome::report(system, &found, &steps, secs, data);
            if let Some(first) = genome_found.first() {
                if *first != found {
                    return Err(format!("the genome job found {found:?} on {system} but {first:?} on the first stack: a stack corrupts data").into());
                }
            }
            genome_found.push(found);
            genome_rows.push(r);
        }
        drop(stack);
        drop(throttle);
        drop(scratch);
    }
    let _ = std::fs::remove_dir(root.join("syscall"));
    let mut ratios = BTreeMap::new();
    let rate = |w: &str, s: &str| rows.iter().find(|r| r.workload == w && r.system == s).map(|r| r.ops_per_s);
    let mut names: Vec<&str> = Vec::new();
    for r in &rows {
        if !names.contains(&r.workload.as_str()) {
            names.push(&r.workload);
        }
    }
    for w in names {
        if let Some(r) = versus_baselines(|s| rate(w, s), |direct, base| direct / base) {
            ratios.insert(w.to_string(), r);
        }
    }
    let secs = |s: &str| genome_rows.iter().find(|r| r.system == s).map(|r| r.seconds);
    if let Some(r) = versus_baselines(secs, |direct, base| base / direct) {
        ratios.insert("genome".into(), r);
    }
    Ok(KvReport {
        command: command(),
        records: opts.records,
        operations: opts.operations,
        workloads: opts.workloads.clone(),
        systems: opts.systems.clone(),
        link: link_name,
        drive: drive_name,
        drive_model: drive.as_ref().map(DriveReport::new),
        drive_applied: applied,
        engine: format!("redb {} with a {} MiB cache, every change durable before it returns", "4", insitu_kvstore::CACHE_BYTES >> 20),
        ycsb: YcsbParams { field_count: crate::ycsb::FIELD_COUNT, field_bytes: FIELD_LEN, zipfian_constant: 0.99, key_bytes: 16, load_batch: LOAD_BATCH },
        db_bench: DbBenchParams { value_bytes: DB_VALUES.to_vec(), key_bytes: 16, entries: opts.operations, readseq_chunk: SCAN_CHUNK },
        results: rows,
        genome: genome_rows,
        ratios,
        verified: true,
        machine: machine(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stack_pacing_keeps_its_json_shapes() {
        let limits = Limits { read_bps: 1, write_bps: 2, read_iops: 3, write_iops: 4 };
        let applied = DriveApplied {
            direct: Some(StackPacing::Note("real speed")),
            redirect: None,
            syscall: Some(StackPacing::Kernel { kernel_throttle: KernelThrottle::Applied(limits), flush: "f" }),
        };
        let want = json!({
            "direct": "real speed",
            "syscall": {"kernel_throttle": {"read_bps": 1, "write_bps": 2, "read_iops": 3, "write_iops": 4}, "flush": "f"},
        });
        assert_eq!(serde_json::to_value(&applied).unwrap(), want);
        let refused = StackPacing::Kernel { kernel_throttle: KernelThrottle::NotApplied { not_applied: "no cgroup".into() }, flush: "f" };
        assert_eq!(serde_json::to_value(&refused).unwrap(), json!({"kernel_throttle": {"not_applied": "no cgroup"}, "flush": "f"}));
        let ratios = KvRatios { direct_to_redirect: None, direct_to_syscall: Some(f64::NAN) };
        assert_eq!(serde_json::to_value(&ratios).unwrap(), json!({"direct_to_syscall": null}));
    }
}
