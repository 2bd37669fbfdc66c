// SPDX-License-Identifier: Apache-2.0
//! Scrub scaling: the virtual-objects paper's scrub experiment (Figs. 3–4) on
//! emulated drives. For 1..=N targets behind one link, every file on every target is
//! checksummed twice:
//!
//! * conventionally: one host thread per target pulls each file's blocks over the shared
//!   link (`Target::read`, [`pull`]) and computes the checksum on the host;
//! * offloaded: one thread per target sends one EXEC per file; only the digests cross.
//!
//! The digests must agree for every file. Reported: throughput of both, their ratio, the
//! bytes each put on the link and the traffic reduction, next to what the models predict
//! (conventional: `min(N × drive host read, link)`; offload: `N × drive internal read`).

use super::emu::Network;
use super::math::traffic_reduction;
use super::pull::{exec_remote, pull, PullStats, IO_BYTES, QUEUE_DEPTH};
use super::rig::{random_fill, write_image, Drive, Placer};
use super::{ModelChoice, Models, ModelsReport};
use crate::common::{command, gbps, machine, median, with_utilization, Machine, Work, BUSY};
use crate::Error;
use insitu_offload::{Args, Registry};
use insitu_proto::{Descriptor, ExecResult, Value, VirtualObject};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

/// Bytes of other data between the extents of a fragmented file.
const GAP: u64 = 64 << 10;

/// What [`scrub_scaling`](crate::scrub_scaling) measures.
#[derive(Debug, Clone)]
pub struct ScrubScalingOptions {
    /// Drive and link models. Default: a generic drive reading 500 MB/s internally
    /// (`custom:500`) behind `10gbe`.
    pub model: ModelChoice,
    /// Largest number of targets; every count from 1 up to it is measured. Default 8.
    pub targets: usize,
    /// Files per target. Default 100.
    pub files: usize,
    /// Size of each file in bytes. Default 16 MiB.
    pub file_size: u64,
    /// Extents per file: 1 is contiguous; more is lightly fragmented (64 KiB of other data
    /// between extents). Default 1.
    pub extents: u32,
    /// Checksum function; it must return its digest inline. Default `crc32c`.
    pub function: String,
    /// Measurements per point; the median is reported. Default 1 (0 counts as 1).
    pub repeat: usize,
    /// Also measure every point with no models: this machine's own ceiling. Default false.
    pub ceiling: bool,
    /// Work directory for the images. Default `None`: a new directory in /dev/shm,
    /// removed afterwards.
    pub dir: Option<PathBuf>,
}

/// The report of [`scrub_scaling`](crate::scrub_scaling).
#[derive(Debug, Clone, Serialize)]
pub struct ScrubReport {
    /// `scrub-scaling`.
    pub benchmark: &'static str,
    /// The command line that ran it.
    pub command: String,
    /// The drive and link.
    pub models: ModelsReport,
    /// The checksum function.
    pub function: String,
    /// The data on every target.
    pub data: ScrubData,
    /// How each path and figure is measured, in words.
    pub method: ScrubMethod,
    /// Measurements per point.
    pub repeat: usize,
    /// One point per number of targets, from 1 up.
    pub points: Vec<ScrubPoint>,
    /// The last point against the first.
    pub summary: ScrubSummary,
    /// The machine it ran on.
    pub machine: Machine,
}

/// The data of [`ScrubReport::data`].
#[derive(Debug, Clone, Serialize)]
pub struct ScrubData {
    /// Largest number of targets.
    pub targets: usize,
    /// Files per target.
    pub files_per_target: usize,
    /// Bytes per file.
    pub file_size_bytes: u64,
    /// Extents per file.
    pub extents_per_file: u32,
    /// Bytes of other data between a file's extents.
    pub gap_bytes: u64,
    /// File bytes per target.
    pub bytes_per_target: u64,
    /// Bytes per target's image.
    pub image_bytes: u64,
    /// The work directory.
    pub work_dir: String,
}

/// The method of [`ScrubReport::method`], in words.
#[derive(Debug, Clone, Serialize)]
pub struct ScrubMethod {
    /// The conventional path.
    pub conventional: String,
    /// The offloaded path.
    pub offload: &'static str,
    /// What the link bytes count.
    pub link_bytes: &'static str,
    /// When a point counts as machine-limited.
    pub machine_limited: &'static str,
}

/// A value for each path of a scrub: conventional and offloaded.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PerPath<T> {
    /// The conventional path's.
    pub conventional: T,
    /// The offloaded path's.
    pub offload: T,
}

/// One number of targets of [`ScrubReport::points`]. Rates are medians, in GB/s.
#[derive(Debug, Clone, Serialize)]
pub struct ScrubPoint {
    /// Targets scrubbed at once.
    pub targets: usize,
    /// Conventional scrubbing.
    pub conventional_gbps: f64,
    /// Offloaded scrubbing.
    pub offload_gbps: f64,
    /// `offload_gbps / conventional_gbps`.
    pub offload_to_conventional: f64,
    /// Bytes one conventional pass put on the link.
    pub conventional_link_bytes: u64,
    /// Bytes one offloaded pass put on the link.
    pub offload_link_bytes: u64,
    /// Share of the conventional link bytes the offload saved.
    pub traffic_reduction: f64,
    /// Seconds of every pass.
    pub seconds: PerPath<Vec<f64>>,
    /// Most share of the cores a pass kept busy.
    pub cpu_busy: PerPath<f64>,
    /// What the models predict for the conventional path; `None` (null) with neither a
    /// drive nor a link model.
    pub expected_conventional_gbps: Option<f64>,
    /// What the models predict for the offloaded path; `None` (null) without a drive model.
    pub expected_offload_gbps: Option<f64>,
    /// With `--ceiling`: the conventional rate with no models; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ceiling_conventional_gbps: Option<f64>,
    /// With `--ceiling`: the offloaded rate with no models; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ceiling_offload_gbps: Option<f64>,
    /// Whether the machine, not the model, set the pace of each path.
    pub machine_limited: PerPath<bool>,
}

/// The summary of [`ScrubReport::summary`].
#[derive(Debug, Clone, Serialize)]
pub struct ScrubSummary {
    /// The last point's `offload_to_conventional`.
    pub offload_to_conventional_at_max: f64,
    /// The last point's `traffic_reduction`.
    pub traffic_reduction_at_max: f64,
    /// The last point's offload rate over the first's.
    pub offload_scaling_max_over_one: f64,
}

impl Default for ScrubScalingOptions {
    fn default() -> Self {
        ScrubScalingOptions {
            model: ModelChoice::default(),
            targets: 8,
            files: 100,
            file_size: 16 << 20,
            extents: 1,
            function: "crc32c".into(),
            repeat: 1,
            ceiling: false,
            dir: None,
        }
    }
}

/// One pass over `n` targets: seconds, digests per target and file, link bytes.
struct Pass {
    secs: f64,
    digests: Vec<Vec<String>>,
    link_bytes: u64,
    /// Share of the machine's cores busy during the pass.
    busy: f64,
}

fn digest_of(records: &[Vec<(String, Value)>], what: &str) -> Result<String, String> {
    match records.first().and_then(|r| r.iter().find(|(k, _)| k == "digest")) {
        Some((_, Value::Str(d))) => Ok(d.clone()),
        _ => Err(format!("{what}: the result has no digest")),
    }
}

fn join<T>(h: std::thread::ScopedJoinHandle<'_, Result<T, String>>) -> Result<T, String> {
    h.join().unwrap_or_else(|_| Err("a benchmark thread panicked".into()))
}

/// Runs `per_drive` on every drive at once, each on its own thread, behind one network
/// link, and times the whole pass.
fn pass(drives: &[Drive], link: &Models, per_drive: impl Fn(&Drive, &Network) -> Result<Vec<String>, String> + Sync) -> Result<Pass, Error> {
    let net = Network::new(link.link.clone())?;
    let started = Instant::now();
    let (digests, busy) = with_utilization(|| {
        std::thread::scope(|s| {
            let handles: Vec<_> = drives.iter().map(|d| s.spawn(|| per_drive(d, &net))).collect();
            handles.into_iter().map(join).collect::<Result<Vec<_>, String>>()
        })
    });
    Ok(Pass { secs: started.elapsed().as_secs_f64(), digests: digests?, link_bytes: net.bytes(), busy })
}

/// Conventional: each target's files pulled over the link and checksummed on the host.
fn conventional(drives: &[Drive], link: &Models, files: &[VirtualObject], function: &str) -> Result<Pass, Error> {
    let registry = Registry::standard();
    let kernel = registry.get(function).ok_or_else(|| format!("no function {function:?}: use a checksum such as crc32c, xxh3, sha256, blake3"))?;
    pass(drives, link, |d, net| {
        let stats = PullStats::default();
        pull(d, net, files, &stats, |p| {
            files
                .iter()
                .enumerate()
                .map(|(i, f)| {
                    let mut input = p.next_object(f.length);
                    let job = kernel.prepare(&Args::new(&[])).map_err(|e| e.to_string())?;
                    let records = job.run(&mut [&mut input], &mut []).map_err(|e| format!("host {function} of file {i} on {}: {e}", d.image.display()))?;
                    digest_of(&records, "host checksum")
                })
                .collect()
        })
    })
}

/// Offloaded: one EXEC per file on every target at once; only digests come back.
fn offloaded(drives: &[Drive], link: &Models, descriptors: &[Vec<u8>]) -> Result<Pass, Error> {
    pass(drives, link, |d, net| {
        descriptors
            .iter()
            .map(|desc| {
                let out = exec_remote(d, net, desc)?;
                let r = ExecResult::decode(&out.result).map_err(|e| format!("EXEC result: {e}"))?;
                digest_of(&r.records, "EXEC")
            })
            .collect()
    })
}

fn agree(a: &Pass, b: &Pass, what: &str) -> Result<(), Error> {
    for (t, (x, y)) in a.digests.iter().zip(&b.digests).enumerate() {
        if let Some(i) = x.iter().zip(y).position(|(p, q)| p != q) {
            return Err(format!("{what}: target {t} file {i}: conventional {} but offloaded {}: the data path corrupts data", x[i], y[i]).into());
        }
    }
    Ok(())
}

/// One point (conventional, offloaded): median rates, the passes' link bytes; the model's
/// expectations and the machine limits are left for the caller.
fn measure(drives: &[Drive], models: &Models, files: &[VirtualObject], descs: &[Vec<u8>], function: &str, repeat: usize) -> Result<ScrubPoint, Error> {
    let (mut conv, mut off, mut cb, mut ob, mut busy) = (Vec::new(), Vec::new(), 0, 0, PerPath::<f64>::default());
    for _ in 0..repeat {
        let c = conventional(drives, models, files, function)?;
        let o = offloaded(drives, models, descs)?;
        agree(&c, &o, "digests disagree")?;
        conv.push(c.secs);
        off.push(o.secs);
        (cb, ob) = (c.link_bytes, o.link_bytes);
        busy = PerPath { conventional: busy.conventional.max(c.busy), offload: busy.offload.max(o.busy) };
    }
    let bytes = drives.len() as u64 * files.iter().map(|f| f.length).sum::<u64>();
    let (c, o) = (gbps(bytes, median(&mut conv.clone())), gbps(bytes, median(&mut off.clone())));
    Ok(ScrubPoint {
        targets: drives.len(),
        conventional_gbps: c,
        offload_gbps: o,
        offload_to_conventional: o / c,
        conventional_link_bytes: cb,
        offload_link_bytes: ob,
        traffic_reduction: traffic_reduction(ob, cb),
        seconds: PerPath { conventional: conv, offload: off },
        cpu_busy: busy,
        expected_conventional_gbps: None,
        expected_offload_gbps: None,
        ceiling_conventional_gbps: None,
        ceiling_offload_gbps: None,
        machine_limited: PerPath::default(),
    })
}

/// Runs the scrub-scaling benchmark: for 1..=`targets` emulated drives behind one link,
/// checksums every file conventionally and offloaded, checks the digests agree, and calls
/// `progress` with a line per point.
///
/// The report has one entry in `points` per target count (`conventional_gbps`,
/// `offload_gbps`, `offload_to_conventional`, link bytes, `traffic_reduction`, what the
/// models predict and whether the machine limited the pass) and a `summary`.
pub fn run(a: &ScrubScalingOptions, progress: &mut dyn FnMut(&str)) -> Result<ScrubReport, Error> {
    let models = a.model.resolve("custom:500", "10gbe")?;
    let file_size = a.file_size;
    if a.targets == 0 || a.files == 0 || file_size == 0 {
        return Err("--targets, --files and --file-size must be at least 1".to_string().into());
    }
    if Registry::standard().get(&a.function).is_none_or(|k| k.output_count() != 0) {
        return Err(format!("--function {}: choose a checksum that returns its digest inline, e.g. crc32c", a.function).into());
    }
    let mut placer = Placer::default();
    let files: Vec<VirtualObject> = (0..a.files).map(|_| placer.place(file_size, a.extents, GAP)).collect();
    let image_bytes = placer.used() + (1 << 20);
    let mut work = Work::new(a.dir.clone(), "scrub", a.targets as u64 * image_bytes)?;
    let (mut paced, mut free) = (Vec::new(), Vec::new());
    for t in 0..a.targets {
        let path = work.file(&format!("target{t}.img"));
        write_image(&path, image_bytes, random_fill(1000 + t as u64))?;
        paced.push(Drive::open(&path, models.drive.as_ref())?);
        free.push(Drive::open(&path, None)?);
    }
    let descs: Vec<Vec<u8>> = files.iter().map(|f| Descriptor::new(&a.function, vec![f.clone()]).encode()).collect();
    let unpaced = Models { drive: None, link: None, link_name: "none".into() };
    let host_read = models.drive.as_ref().and_then(|d| d.host_read_mb_s());
    let internal = models.drive.as_ref().and_then(|d| d.internal_read_mb_s());
    let link = models.link.as_ref().map(|l| l.mb_s);
    let mut points = Vec::new();
    for n in 1..=a.targets {
        let mut p = measure(&paced[..n], &models, &files, &descs, &a.function, a.repeat.max(1))?;
        let nf = n as f64;
        let conv_model = match (host_read, link) {
            (Some(h), Some(l)) => Some((nf * h).min(l)),
            (h, l) => h.map(|h| nf * h).or(l),
        };
        p.expected_conventional_gbps = conv_model.map(|m| m / 1000.0);
        p.expected_offload_gbps = internal.map(|i| nf * i / 1000.0);
        let mut limited = PerPath { conventional: p.cpu_busy.conventional >= BUSY, offload: p.cpu_busy.offload >= BUSY };
        if a.ceiling {
            let c = measure(&free[..n], &unpaced, &files, &descs, &a.function, 1)?;
            p.ceiling_conventional_gbps = Some(c.conventional_gbps);
            p.ceiling_offload_gbps = Some(c.offload_gbps);
            // The machine, not the model, also sets the pace where the model asks for more
            // than 90 % of what this machine does with no model at all (a rate that is not a
            // number limits nothing).
            let above = |want: Option<f64>, ceil: f64| want.is_some_and(|w| w.is_finite() && ceil.is_finite() && w > 0.9 * ceil);
            limited.conventional |= above(p.expected_conventional_gbps, c.conventional_gbps);
            limited.offload |= above(p.expected_offload_gbps, c.offload_gbps);
        }
        p.machine_limited = limited;
        progress(&format!(
            "  {n} target(s): conventional {:.3} GB/s, offload {:.3} GB/s ({:.2}x), traffic reduced {:.4}%",
            p.conventional_gbps,
            p.offload_gbps,
            p.offload_to_conventional,
            100.0 * p.traffic_reduction
        ));
        points.push(p);
    }
    let (first, last) = (&points[0], &points[points.len() - 1]);
    let summary = ScrubSummary {
        offload_to_conventional_at_max: last.offload_to_conventional,
        traffic_reduction_at_max: last.traffic_reduction,
        offload_scaling_max_over_one: last.offload_gbps / first.offload_gbps.max(1e-12),
    };
    Ok(ScrubReport {
        benchmark: "scrub-scaling",
        command: command(),
        models: ModelsReport::new(&models),
        function: a.function.clone(),
        data: ScrubData {
            targets: a.targets,
            files_per_target: a.files,
            file_size_bytes: file_size,
            extents_per_file: a.extents.max(1),
            gap_bytes: GAP,
            bytes_per_target: a.files as u64 * file_size,
            image_bytes,
            work_dir: work.root().display().to_string(),
        },
        method: ScrubMethod {
            conventional: format!(
                "one host thread per target pulls every file over the shared link in {} KiB reads, {QUEUE_DEPTH} outstanding, and checksums it on the host",
                IO_BYTES >> 10
            ),
            offload: "one thread per target sends one EXEC per file; the descriptor and the digest cross the link",
            link_bytes: "payload plus NVMe/TCP command, data-PDU and completion headers, both directions",
            machine_limited: "the pass kept at least 85 % of the cores busy, or (with --ceiling) the model asks for more than 90 % of the unpaced rate",
        },
        repeat: a.repeat.max(1),
        points,
        summary,
        machine: machine(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_scrub_agrees_and_reduces_traffic() {
        let dir = tempfile::tempdir().unwrap();
        let a = ScrubScalingOptions {
            model: ModelChoice { drive: Some("none".into()), link: Some("none".into()), ..Default::default() },
            targets: 2,
            files: 3,
            file_size: 1 << 20,
            extents: 2,
            function: "crc32c".into(),
            repeat: 1,
            ceiling: false,
            dir: Some(dir.path().to_path_buf()),
        };
        let out = run(&a, &mut |_| {}).unwrap();
        assert_eq!(out.points.len(), 2);
        for p in &out.points {
            // 3 files of 1 MiB per target moved conventionally; a few hundred bytes offloaded.
            assert!(p.conventional_link_bytes >= (p.targets as u64 * 3) << 20, "{p:?}");
            assert!(p.traffic_reduction > 0.999, "{p:?}");
        }
        assert!(!dir.path().join("target0.img").exists(), "images are removed");
    }
}
