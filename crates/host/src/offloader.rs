// SPDX-License-Identifier: Apache-2.0
//! Running a function over files, offloaded or conventionally, and reporting what it cost.

use crate::conventional::{device_read_bytes, make_cold, FileInput, FileOutput};
use crate::device::{self, DeviceMap};
use crate::local::{LocalTarget, LocalTargets};
use crate::pool::OutputPool;
use crate::{virtual_object, OasError};
use insitu_offload::{Args, InputStream, Kernel, OutputSink, ParamType, Registry, SliceInput};
use insitu_proto::{Descriptor, ExecResult, ExtentKind, Record, Value};
use serde::Serialize;
use std::collections::{BTreeSet, HashMap};
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Where the computation runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// EXEC on the target that holds the data.
    Offload,
    /// On the host, reading the files through the file system with a cold cache.
    Conventional,
}

/// One function over some files.
#[derive(Debug, Clone)]
pub struct Request {
    /// Kernel name, e.g. `crc32c`.
    pub function: String,
    /// Typed arguments (see [`parse_args`]).
    pub args: Vec<(String, Value)>,
    /// Input files.
    pub paths: Vec<PathBuf>,
    /// For kernels that write a result file: where (only with one input). Default: the
    /// input path plus [`output_suffix`].
    pub output: Option<PathBuf>,
    /// Offloaded or conventional.
    pub mode: Mode,
    /// Replace existing output files.
    pub force: bool,
}

/// The answer for one input file.
#[derive(Debug, Clone, Serialize)]
pub struct FileResult {
    /// The input path as given.
    pub path: String,
    /// The kernel's fields: `value` (digests), `count`/`matches`/`truncated` (grep),
    /// `lines`/`words`/`bytes` (wc), `output_length` and `output` (result files), ...
    #[serde(flatten)]
    pub fields: serde_json::Map<String, serde_json::Value>,
}

/// What a command cost.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stats {
    /// Bytes that crossed from the target to the host (results; or file data read
    /// conventionally).
    pub bytes_to_host: u64,
    /// Bytes that crossed from the host to the target (descriptors; or result files written
    /// conventionally).
    pub bytes_from_host: u64,
    /// Bytes the target read from its media.
    pub media_bytes: u64,
    /// Wall time of the whole command.
    pub seconds: f64,
    /// EXEC commands sent (0 for the conventional path).
    pub commands: u64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.bytes_to_host += o.bytes_to_host;
        self.bytes_from_host += o.bytes_from_host;
        self.media_bytes += o.media_bytes;
        self.commands += o.commands;
    }
}

/// Results and stats of one [`Request`].
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The function run.
    pub function: String,
    /// `"offload"` or `"conventional"`.
    pub mode: &'static str,
    /// One per input path, in order.
    pub results: Vec<FileResult>,
    /// Totals.
    pub stats: Stats,
}

/// Input bytes one EXEC over ranges covers at most when its ranges are large, so that
/// results carrying some of their bytes (grep's heads and tails) stay within a result object.
const RANGE_RESULT_BUDGET: u64 = 16 << 20;

/// Runs `function` on the host over inputs held in memory, with the same kernel a target
/// runs: one result per input. A host joining the results of pieces computes the pieces it
/// rebuilt (from parity) and the records cut at piece edges this way, so they agree with
/// the offloaded pieces bit for bit.
pub fn run_in_memory(registry: &Registry, function: &str, args: &[(String, Value)], inputs: &[&[u8]]) -> Result<Vec<FileResult>, OasError> {
    let kernel = find_kernel(registry, function)?;
    if kernel.output_count() > 0 {
        return Err(OasError::BadRequest(format!("{function} writes an output object; in memory takes kernels whose result is inline")));
    }
    let job = kernel.prepare(&Args::new(args)).map_err(|e| OasError::BadRequest(format!("{function}: {e}")))?;
    let mut streams: Vec<SliceInput<'_>> = inputs.iter().map(|d| SliceInput::new(d, 1 << 20)).collect();
    let mut ins: Vec<&mut dyn InputStream> = streams.iter_mut().map(|i| i as &mut dyn InputStream).collect();
    let records = job.run(&mut ins, &mut []).map_err(|e| OasError::BadRequest(format!("{function}: {e}")))?;
    Ok(records.iter().map(|r| file_result(&[PathBuf::from("-")], r)).collect())
}

/// Suffix of the default output file of a kernel that writes one.
pub fn output_suffix(function: &str) -> &'static str {
    match function {
        "zstd" => ".zst",
        "rs-encode" => ".parity",
        "sort" => ".sorted",
        "csv-select" => ".select.csv",
        "vector-add" => ".sum",
        "array-merge" => ".merged",
        "pagerank" => ".ranks",
        _ => ".out",
    }
}

/// Parses `key=value` strings into typed arguments, using the kernel's parameter types
/// (`true`/`false` for booleans, decimal for integers). Keys the kernel does not declare are
/// passed as strings, for the target to refuse with the list of accepted ones.
pub fn parse_args(registry: &Registry, function: &str, pairs: &[String]) -> Result<Vec<(String, Value)>, OasError> {
    let kernel = find_kernel(registry, function)?;
    let mut out: Vec<(String, Value)> = Vec::new();
    for pair in pairs {
        let (k, v) = pair.split_once('=').ok_or_else(|| OasError::BadRequest(format!("argument {pair:?} is not of the form key=value")))?;
        let ty = kernel.params().iter().find(|p| p.key == k).map(|p| p.ty);
        let value = match ty {
            Some(ParamType::U64) => Value::U64(v.parse().map_err(|_| OasError::BadRequest(format!("argument {k}: {v:?} is not an unsigned integer")))?),
            Some(ParamType::Bool) => match v {
                "true" | "1" | "yes" => Value::Bool(true),
                "false" | "0" | "no" => Value::Bool(false),
                _ => return Err(OasError::BadRequest(format!("argument {k}: {v:?} is not true or false"))),
            },
            _ => Value::Str(v.to_owned()),
        };
        if out.iter().any(|(key, _)| key == k) {
            return Err(OasError::BadRequest(format!("argument {k} given twice")));
        }
        out.push((k.to_owned(), value));
    }
    Ok(out)
}

fn find_kernel<'r>(registry: &'r Registry, function: &str) -> Result<&'r dyn Kernel, OasError> {
    registry.get(function).ok_or_else(|| {
        let names: Vec<&str> = registry.iter().map(|k| k.name()).collect();
        OasError::BadRequest(format!("unknown function {function:?}; available: {}", names.join(", ")))
    })
}

/// One file's result, cost, and bytes its reads returned (conventional path).
type FileOutcome = Result<(FileResult, Stats, u64), OasError>;

/// An open input file, its metadata, its device, and the attachment or embedded target
/// that serves it.
type OpenFile = (File, fs::Metadata, DeviceMap, Option<insitu_attach::Attachment>, Option<Arc<dyn LocalTarget>>);

/// Open embedded targets: backing path → ((device, inode, size) when opened, target).
type TargetCache = HashMap<PathBuf, ((u64, u64, u64), Arc<dyn LocalTarget>)>;

/// Runs requests, keeping one embedded target open per backing image.
pub struct Offloader {
    registry: Arc<Registry>,
    /// Backing path → (device, inode and size of the file when opened, its target). An
    /// image replaced or resized under the same path gets a new target.
    targets: Mutex<TargetCache>,
    /// What opens them; without it, files of local images cannot be offloaded.
    local: Option<Arc<dyn LocalTargets>>,
    jobs: usize,
    remote: crate::remote::Sessions,
}

impl Default for Offloader {
    fn default() -> Self {
        Offloader::new()
    }
}

impl Offloader {
    /// An offloader with the standard kernels, running up to one file per CPU at a time.
    pub fn new() -> Self {
        let jobs = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2).max(2);
        Offloader { registry: Arc::new(Registry::standard()), targets: Mutex::new(HashMap::new()), local: None, jobs, remote: Default::default() }
    }

    /// Serves files of local images (not attached over the fabric) with targets `local`
    /// opens in this process: the embedded default.
    pub fn with_local_targets(mut self, local: Arc<dyn LocalTargets>) -> Self {
        self.local = Some(local);
        self
    }

    /// Sets how many files are processed at once (default: number of CPUs, at least 2).
    pub fn with_jobs(mut self, jobs: usize) -> Self {
        self.jobs = jobs.max(1);
        self
    }

    /// The kernels known to this host.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Runs `req`. Arguments, paths and output files are checked before any data is read.
    pub fn exec(&self, req: &Request) -> Result<Report, OasError> {
        let started = Instant::now();
        let kernel = find_kernel(&self.registry, &req.function)?;
        kernel.prepare(&Args::new(&req.args)).map_err(|e| OasError::BadRequest(format!("{}: {e}", req.function)))?;
        if req.paths.is_empty() {
            return Err(OasError::BadRequest("no input files given".into()));
        }
        // One EXEC per file, except for kernels that combine several inputs into one output
        // (vector-add, array-merge): those get every file in one descriptor.
        let gathers = kernel.max_inputs() > 1 && kernel.output_count() > 0;
        if gathers && req.paths.len() > kernel.max_inputs() {
            return Err(OasError::BadRequest(format!("{} takes at most {} input files", req.function, kernel.max_inputs())));
        }
        let groups: Vec<&[PathBuf]> = if gathers { vec![&req.paths[..]] } else { req.paths.chunks(1).collect() };
        let outputs = self.plan_outputs(kernel, req, &groups)?;
        for p in &req.paths {
            let meta = fs::metadata(p).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound if p.starts_with("swift:") => {
                    OasError::BadRequest(format!("{}: Swift objects are resolved by the `insitu` command of the Python package, with --swift-dir", p.display()))
                }
                std::io::ErrorKind::NotFound => OasError::BadRequest(format!("{}: {e}", p.display())),
                _ => OasError::Io { path: p.clone(), source: e },
            })?;
            if !meta.is_file() {
                return Err(OasError::BadRequest(format!("{}: not a regular file", p.display())));
            }
        }
        let devices: BTreeSet<String> =
            if req.mode == Mode::Conventional { req.paths.iter().filter_map(|p| map_of(p).ok()).map(|m| m.device).collect() } else { BTreeSet::new() };
        let before: Vec<Option<u64>> = devices.iter().map(|d| device_read_bytes(d)).collect();

        let next = AtomicUsize::new(0);
        let slots: Vec<Mutex<Option<FileOutcome>>> = groups.iter().map(|_| Mutex::new(None)).collect();
        std::thread::scope(|s| {
            for _ in 0..self.jobs.min(groups.len()) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(group) = groups.get(i) else { break };
                    let out = outputs.get(i).and_then(|o| o.as_deref());
                    let r = match req.mode {
                        Mode::Offload => self.offload_one(kernel, req, group, out),
                        Mode::Conventional => conventional_one(kernel, req, group, out),
                    };
                    let failed = r.is_err();
                    *slots[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
                    if failed {
                        next.store(usize::MAX / 2, Ordering::Relaxed);
                    }
                });
            }
        });
        let mut stats = Stats::default();
        let mut results = Vec::with_capacity(req.paths.len());
        let mut app_read = 0;
        for slot in slots {
            match slot.into_inner().unwrap_or_else(|e| e.into_inner()) {
                Some(Ok((r, s, read))) => {
                    results.push(r);
                    stats.add(&s);
                    app_read += read;
                }
                Some(Err(e)) => return Err(e),
                None => {}
            }
        }
        if req.mode == Mode::Conventional {
            // Count what the device actually delivered (read-ahead and metadata included)
            // when every file sits on a loop device; otherwise what the reads returned.
            let after: Vec<Option<u64>> = devices.iter().map(|d| device_read_bytes(d)).collect();
            let delta: Option<u64> = before.iter().zip(&after).map(|(b, a)| Some(a.as_ref()?.saturating_sub(*b.as_ref()?))).sum();
            let all_on_devices = req.paths.iter().all(|p| map_of(p).is_ok());
            stats.bytes_to_host = match delta {
                Some(d) if all_on_devices && !devices.is_empty() => d,
                _ => app_read,
            };
            stats.media_bytes = stats.bytes_to_host;
        }
        stats.seconds = started.elapsed().as_secs_f64();
        let mode = if req.mode == Mode::Offload { "offload" } else { "conventional" };
        Ok(Report { function: req.function.clone(), mode, results, stats })
    }

    fn plan_outputs(&self, kernel: &dyn Kernel, req: &Request, groups: &[&[PathBuf]]) -> Result<Vec<Option<PathBuf>>, OasError> {
        if kernel.output_count() == 0 {
            if req.output.is_some() {
                return Err(OasError::BadRequest(format!("{} returns its result inline and takes no --output", req.function)));
            }
            return Ok(vec![None; groups.len()]);
        }
        if req.output.is_some() && groups.len() != 1 {
            return Err(OasError::BadRequest("--output needs exactly one input file".into()));
        }
        let suffix = match req.mode {
            Mode::Offload => output_suffix(&req.function).to_owned(),
            Mode::Conventional => format!("{}.host", output_suffix(&req.function)),
        };
        let outs: Vec<PathBuf> = match &req.output {
            Some(o) => vec![o.clone()],
            None => groups.iter().map(|g| PathBuf::from(format!("{}{suffix}", g[0].display()))).collect(),
        };
        for o in &outs {
            if o.exists() && !req.force {
                return Err(OasError::BadRequest(format!("{} exists; remove it or pass --force to replace it", o.display())));
            }
        }
        Ok(outs.into_iter().map(Some).collect())
    }

    fn target_for(&self, map: &DeviceMap) -> Result<Arc<dyn LocalTarget>, OasError> {
        let meta = fs::metadata(&map.backing).map_err(|e| OasError::Io { path: map.backing.clone(), source: e })?;
        let id = (meta.dev(), meta.ino(), meta.len());
        let mut targets = self.targets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((known, t)) = targets.get(&map.backing) {
            if *known == id {
                return Ok(t.clone());
            }
        }
        let Some(local) = &self.local else {
            return Err(OasError::BadRequest(format!(
                "{} is a local image and this program serves no embedded target; attach it over the fabric (insitu attach) instead",
                map.backing.display()
            )));
        };
        // An image may carry a device model (`insitu image create --model`): the embedded
        // target then paces its media and its kernels like that device.
        let model = image_model(&map.backing)?;
        let t = local.open(&map.backing, self.registry.clone(), model.as_ref())?;
        targets.insert(map.backing.clone(), (id, t.clone()));
        Ok(t)
    }

    /// Opens the file at `path` and finds what serves it: a namespace attached over the
    /// fabric, or an image served by an embedded target.
    fn open_on_target(&self, path: &Path) -> Result<OpenFile, OasError> {
        let io = |e| OasError::Io { path: path.to_owned(), source: e };
        let file = File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        let map = device::resolve(meta.dev(), path)?;
        let remote = insitu_attach::lookup_disk(&map.backing);
        let target = match remote {
            Some(_) => None,
            None => Some(self.target_for(&map)?),
        };
        Ok((file, meta, map, remote, target))
    }

    /// Sends `d` to the target of the file at `path`: over the fabric when its file system is
    /// attached (`remote`), else to the embedded target of its image.
    fn run_descriptor(
        &self,
        remote: Option<&insitu_attach::Attachment>,
        target: Option<&dyn LocalTarget>,
        map: &DeviceMap,
        path: &Path,
        d: Descriptor,
    ) -> Result<(Vec<u8>, Stats), OasError> {
        match (remote, target) {
            (Some(att), _) => crate::remote::exec(&self.remote, att, map, path, d).map(|o| (o.result, o.stats)),
            (None, Some(t)) => {
                let bytes = d.encode();
                t.exec(&bytes).map_err(|e| OasError::Target { path: path.to_owned(), source: e }).map(|o| {
                    let stats = Stats {
                        bytes_to_host: o.result.len() as u64,
                        bytes_from_host: bytes.len() as u64,
                        media_bytes: o.media_read_bytes,
                        seconds: 0.0,
                        commands: 1,
                    };
                    (o.result, stats)
                })
            }
            (None, None) => unreachable!("a target is opened when no attachment is found"),
        }
    }

    /// Runs `function` over byte ranges `(start, length)` of one file, offloaded to the
    /// target that holds it: one result per range, in order, as if each range were a file
    /// of its own. A piece of a larger object (an erasure-coded fragment after its header)
    /// is computed where it lies this way; kernels with an `edges` argument report what a
    /// host needs to join the results of consecutive pieces.
    pub fn exec_ranges(&self, function: &str, args: &[(String, Value)], path: &Path, ranges: &[(u64, u64)]) -> Result<(Vec<FileResult>, Stats), OasError> {
        let started = Instant::now();
        let kernel = find_kernel(&self.registry, function)?;
        kernel.prepare(&Args::new(args)).map_err(|e| OasError::BadRequest(format!("{function}: {e}")))?;
        if kernel.output_count() > 0 {
            return Err(OasError::BadRequest(format!("{function} writes an output object; ranges take kernels whose result is inline")));
        }
        let (file, meta, map, remote, target) = self.open_on_target(path)?;
        let whole = virtual_object(&file, path, &map)?;
        let mut objects = Vec::with_capacity(ranges.len());
        for &(start, len) in ranges {
            let bad = || OasError::BadRequest(format!("{}: range {start}+{len} runs past the file's {} bytes", path.display(), meta.len()));
            objects.push(whole.range(start, len).ok_or_else(bad)?);
        }
        // As many ranges per EXEC as a descriptor takes, fewer when they are large (their
        // results may carry some of their bytes).
        let largest = ranges.iter().map(|r| r.1).max().unwrap_or(0).max(1);
        let per = (RANGE_RESULT_BUDGET / largest).clamp(1, kernel.max_inputs().clamp(1, insitu_proto::Limits::default().max_inputs as usize) as u64) as usize;
        let mut stats = Stats::default();
        let mut results = Vec::with_capacity(ranges.len());
        for (batch, spans) in objects.chunks(per).zip(ranges.chunks(per)) {
            let mut d = Descriptor::new(function, batch.to_vec());
            d.args = args.to_vec();
            let (bytes, s) = self.run_descriptor(remote.as_ref(), target.as_deref(), &map, path, d)?;
            stats.add(&s);
            let result =
                ExecResult::decode(&bytes).map_err(|e| OasError::BadRequest(format!("{}: the target sent an unreadable result: {e}", path.display())))?;
            if result.records.len() != batch.len() {
                return Err(OasError::BadRequest(format!("{}: the target sent {} records for {} ranges", path.display(), result.records.len(), batch.len())));
            }
            for (record, (start, len)) in result.records.iter().zip(spans) {
                let mut fr = file_result(std::slice::from_ref(&path.to_path_buf()), record);
                fr.fields.insert("start".into(), (*start).into());
                fr.fields.insert("length".into(), (*len).into());
                results.push(fr);
            }
        }
        stats.seconds = started.elapsed().as_secs_f64();
        Ok((results, stats))
    }

    fn offload_one(&self, kernel: &dyn Kernel, req: &Request, group: &[PathBuf], out: Option<&Path>) -> FileOutcome {
        let path = &group[0];
        let (file, meta, map, remote, target) = self.open_on_target(path)?;
        let mut inputs = vec![virtual_object(&file, path, &map)?];
        let mut total = meta.len();
        for other in &group[1..] {
            let io = |e| OasError::Io { path: other.to_owned(), source: e };
            let f = File::open(other).map_err(io)?;
            let m = f.metadata().map_err(io)?;
            if device::resolve(m.dev(), other)?.backing != map.backing {
                return Err(OasError::BadRequest(format!("{} and {} are on different devices; one EXEC reads one namespace", path.display(), other.display())));
            }
            inputs.push(virtual_object(&f, other, &map)?);
            total += m.len();
        }
        let mut d = Descriptor::new(&req.function, inputs);
        d.args = req.args.clone();
        let slot = match out {
            Some(dest) => {
                let (slot, obj) = take_output_slot(kernel, req, &meta, total, &map, dest)?;
                d.outputs.push(obj);
                Some(slot)
            }
            None => None,
        };
        let ran = self.run_descriptor(remote.as_ref(), target.as_deref(), &map, path, d);
        let (result_bytes, stats) = match ran {
            Ok(r) => r,
            Err(e) => {
                if let Some(slot) = slot {
                    let _ = slot.release();
                }
                return Err(e);
            }
        };
        let result =
            ExecResult::decode(&result_bytes).map_err(|e| OasError::BadRequest(format!("{}: the target sent an unreadable result: {e}", path.display())))?;
        let record = result.records.into_iter().next().unwrap_or_default();
        let mut fr = file_result(group, &record);
        if let (Some(slot), Some(dest)) = (slot, out) {
            let len = match record.iter().find(|(k, _)| k == "output_length") {
                Some((_, Value::U64(n))) => *n,
                _ => return Err(OasError::BadRequest(format!("{}: result has no output_length", req.function))),
            };
            slot.commit(len, dest).map_err(|e| OasError::Io { path: dest.to_owned(), source: e })?;
            fr.fields.insert("output".into(), dest.display().to_string().into());
        }
        Ok((fr, stats, 0))
    }
}

/// Where an image's device model is recorded: `IMAGE.model`, holding a model spec such as
/// `newport` or `custom:500` (see `insitu model list`).
pub fn model_sidecar(image: &Path) -> PathBuf {
    PathBuf::from(format!("{}.model", image.display()))
}

/// The device model recorded for an image, if any.
fn image_model(image: &Path) -> Result<Option<insitu_model::DeviceModel>, OasError> {
    let path = model_sidecar(image);
    match fs::read_to_string(&path) {
        Ok(spec) => insitu_model::parse(spec.trim()).map(Some).map_err(|e| OasError::BadRequest(format!("{}: {e}", path.display()))),
        Err(_) => Ok(None),
    }
}

fn map_of(path: &Path) -> Result<DeviceMap, OasError> {
    let meta = fs::metadata(path).map_err(|e| OasError::Io { path: path.to_owned(), source: e })?;
    device::resolve(meta.dev(), path)
}

/// Takes a pool file on the output's file system and maps it as an output object.
fn take_output_slot(
    kernel: &dyn Kernel,
    req: &Request,
    input_meta: &fs::Metadata,
    input_total: u64,
    map: &DeviceMap,
    dest: &Path,
) -> Result<(crate::pool::Slot, insitu_proto::VirtualObject), OasError> {
    let parent = dest.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let io = |e| OasError::Io { path: parent.to_owned(), source: e };
    if fs::metadata(parent).map_err(io)?.dev() != input_meta.dev() {
        return Err(OasError::BadRequest(format!(
            "{}: an offloaded result must be written on the same file system as its input; choose an --output there or use --conventional",
            dest.display()
        )));
    }
    let pool = OutputPool::at(&device::mount_root(parent).map_err(io)?).map_err(io)?;
    let capacity = kernel.output_capacity(&Args::new(&req.args), input_total);
    let slot = pool.acquire(capacity).map_err(|e| OasError::Io { path: pool.dir().to_owned(), source: e })?;
    match virtual_object(&slot.file, &slot.path, map) {
        Ok(obj) if obj.extents.iter().all(|e| e.kind == ExtentKind::Data) => Ok((slot, obj)),
        Ok(_) => {
            let p = slot.path.clone();
            let _ = slot.release();
            Err(OasError::NotOffloadable { path: p, offset: 0, reason: "of this pool file is not allocated".into() })
        }
        Err(e) => {
            let _ = slot.release();
            Err(e)
        }
    }
}

fn conventional_one(kernel: &dyn Kernel, req: &Request, group: &[PathBuf], out: Option<&Path>) -> FileOutcome {
    let path = &group[0];
    let mut inputs = Vec::with_capacity(group.len());
    for p in group {
        let io = |e| OasError::Io { path: p.to_owned(), source: e };
        let file = File::open(p).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        make_cold(&file, map_of(p).ok().as_ref()).map_err(io)?;
        inputs.push(FileInput::new(file, len));
    }
    let job = kernel.prepare(&Args::new(&req.args)).map_err(|e| OasError::BadRequest(e.to_string()))?;
    let tmp = out.map(|o| PathBuf::from(format!("{}.insitu-tmp", o.display())));
    let mut sink = match &tmp {
        Some(t) => {
            Some(FileOutput::new(OpenOptions::new().write(true).create(true).truncate(true).open(t).map_err(|e| OasError::Io { path: t.clone(), source: e })?))
        }
        None => None,
    };
    let run = {
        let mut ins: Vec<&mut dyn InputStream> = inputs.iter_mut().map(|i| i as &mut dyn InputStream).collect();
        let mut outs: Vec<&mut dyn OutputSink> = sink.iter_mut().map(|s| s as &mut dyn OutputSink).collect();
        job.run(&mut ins, &mut outs)
    };
    let records = match run {
        Ok(r) => r,
        Err(e) => {
            if let Some(t) = &tmp {
                let _ = fs::remove_file(t);
            }
            return Err(OasError::BadRequest(format!("{}: {e}", path.display())));
        }
    };
    let record = records.into_iter().next().unwrap_or_default();
    let mut fr = file_result(group, &record);
    let mut written = 0;
    if let (Some(t), Some(dest)) = (&tmp, out) {
        written = record.iter().find_map(|(k, v)| if let ("output_length", Value::U64(n)) = (k.as_str(), v) { Some(*n) } else { None }).unwrap_or(0);
        fs::rename(t, dest).map_err(|e| OasError::Io { path: dest.to_owned(), source: e })?;
        fr.fields.insert("output".into(), dest.display().to_string().into());
    }
    let stats = Stats { bytes_from_host: written, ..Stats::default() };
    Ok((fr, stats, inputs.iter().map(|i| i.read_bytes).sum()))
}

/// Turns a kernel record into JSON fields: digests become `value`, grep's flat match list
/// becomes `[[line, offset], ...]`.
/// A group of several inputs is reported under its first path, with `inputs` listing all.
fn file_result(group: &[PathBuf], record: &Record) -> FileResult {
    let path = &group[0];
    let mut fields = serde_json::Map::new();
    if group.len() > 1 {
        fields.insert("inputs".into(), group.iter().map(|p| serde_json::Value::from(p.display().to_string())).collect());
    }
    for (k, v) in record {
        let key = if k == "digest" { "value" } else { k.as_str() };
        let json = match v {
            Value::U64(n) => (*n).into(),
            Value::I64(n) => (*n).into(),
            Value::Str(s) => s.clone().into(),
            Value::Bool(b) => (*b).into(),
            Value::Bytes(b) => b.iter().map(|x| format!("{x:02x}")).collect::<String>().into(),
            Value::U64List(l) if k == "matches" => serde_json::Value::Array(l.chunks(2).map(|c| serde_json::json!(c)).collect()),
            Value::U64List(l) => serde_json::json!(l),
        };
        fields.insert(key.to_owned(), json);
    }
    FileResult { path: path.display().to_string(), fields }
}
