// SPDX-License-Identifier: Apache-2.0
//! The model check: do the emulated devices deliver what they are configured for?
//!
//! * drives: a large sequential offloaded scan (EXEC crc32c over one contiguous object) on a
//!   drive whose model promises X MB/s internal read must run within the tolerance of X;
//! * links: conventional reads of the same object from an unpaced drive through a link
//!   configured for Y MB/s must run within the tolerance of Y;
//! * no model: with neither, nothing may sleep;
//! * the paths users take: the same scan through an embedded target whose namespace the
//!   model's own [`insitu_model::Pacer`] paces (`insitu image create|mount --model`), and
//!   through an NVMe/TCP target started with the model (`insitu target start --model`),
//!   each within its own, tighter tolerance of the rate (default 3 %).
//!
//! "As long as this machine can go that fast": each kind is first measured with no model; a
//! check whose rate is above 90 % of that ceiling and misses is reported as limited by the
//! machine, not failed. Exits 1 if any check fails.

use super::emu::Network;
use super::pull::{exec_remote, pull, PullStats};
use super::rig::{random_fill, write_image, Drive, Placer};
use super::{parse_drive, parse_link};
use crate::common::{command, gbps, machine, median, Machine, Work};
use crate::Error;
use insitu_daemon::{NamespaceSpec, SubsystemConfig, Target, TargetConfig};
use insitu_engine::{Engine, NamespaceConfig};
use insitu_image::human;
use insitu_initiator::{ConnectOptions, Session};
use insitu_model::DeviceModel;
use insitu_offload::InputStream;
use insitu_proto::{Descriptor, Extent, VirtualObject, SECTOR};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// What [`model_check`](crate::model_check) checks.
#[derive(Debug, Clone)]
pub struct ModelCheckOptions {
    /// Drive models to check, comma-separated (presets, PRESET@MB_S or custom:MB_S).
    /// Default `custom:500,custom:1000,custom:2000,newport,smartssd,intel-p4600`.
    pub drives: String,
    /// Links to check, comma-separated (names or MB/s). Default `10gbe,25gbe,40gbe`.
    pub links: String,
    /// Bytes scanned per measurement, at least 16 MiB. Default 1 GiB.
    pub size: u64,
    /// Largest accepted deviation from the configured rate, as a fraction. Default 0.10.
    pub tolerance: f64,
    /// The same for the `image --model` and `target --model` scans. Default 0.03.
    pub path_tolerance: f64,
    /// Measurements per check; the median is reported. Default 3 (0 counts as 1).
    pub repeat: usize,
    /// Work directory for the image. Default `None`: a new directory in /dev/shm, removed
    /// afterwards.
    pub dir: Option<PathBuf>,
}

/// The report of [`model_check`](crate::model_check).
#[derive(Debug, Clone, Serialize)]
pub struct ModelCheckReport {
    /// `model-check`.
    pub benchmark: &'static str,
    /// The command line that ran it.
    pub command: String,
    /// Bytes scanned per measurement.
    pub size_bytes: u64,
    /// Measurements per check.
    pub repeat: usize,
    /// Largest accepted deviation of the drive and link checks, as a fraction.
    pub tolerance: f64,
    /// The same for the image and target scans.
    pub path_tolerance: f64,
    /// The work directory.
    pub work_dir: String,
    /// This machine's rates with no model.
    pub ceilings: ModelCheckCeilings,
    /// How each kind of check is measured, in words.
    pub method: ModelCheckMethod,
    /// Every check, in the order run.
    pub checks: Vec<ModelCheck>,
    /// Checks whose status is `fail`.
    pub failed: usize,
    /// The machine it ran on.
    pub machine: Machine,
}

/// The rates of [`ModelCheckReport::ceilings`], GB/s (medians).
#[derive(Debug, Clone, Serialize)]
pub struct ModelCheckCeilings {
    /// The offloaded scan on an unpaced drive.
    pub offload_scan_gbps: f64,
    /// Conventional reads from an unpaced drive with no link model.
    pub conventional_read_gbps: f64,
}

/// The method of [`ModelCheckReport::method`], in words.
#[derive(Debug, Clone, Serialize)]
pub struct ModelCheckMethod {
    /// The drive checks.
    pub drive: &'static str,
    /// The link checks.
    pub link: &'static str,
    /// The `image --model` scans.
    pub image: &'static str,
    /// The `target --model` scans.
    pub target: &'static str,
    /// When a miss is the machine's, not the model's.
    pub limit: &'static str,
}

/// One check of [`ModelCheckReport::checks`]. The `no model` check has `slept_ns` and none
/// of the rates; the others have the rates and no `slept_ns`; only the image and target
/// scans have their own `tolerance`. Fields that are `None` are absent from the JSON.
#[derive(Debug, Clone, Serialize)]
pub struct ModelCheck {
    /// `no model`, `drive internal read`, `image --model scan`, `target --model scan` or
    /// `link`.
    pub kind: &'static str,
    /// The model or link checked.
    pub name: String,
    /// Nanoseconds anything slept with no model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slept_ns: Option<u64>,
    /// The rate the model promises, GB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub configured_gbps: Option<f64>,
    /// The rate measured (median), GB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured_gbps: Option<f64>,
    /// `measured_gbps / configured_gbps`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    /// This machine's rate for the kind with no model, GB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ceiling_gbps: Option<f64>,
    /// The check's own tolerance, where it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<f64>,
    /// `pass`, `fail` or `machine-limited`.
    pub status: &'static str,
}

impl ModelCheck {
    /// The check that nothing sleeps with no model: `slept` nanoseconds did.
    fn no_model(slept: u64) -> ModelCheck {
        ModelCheck {
            kind: "no model",
            name: "none".into(),
            slept_ns: Some(slept),
            configured_gbps: None,
            measured_gbps: None,
            ratio: None,
            ceiling_gbps: None,
            tolerance: None,
            status: if slept == 0 { "pass" } else { "fail" },
        }
    }

    /// A check of a configured rate against the measured one.
    fn rate(kind: &'static str, name: &str, want: f64, got: f64, ceiling: f64, status: &'static str) -> ModelCheck {
        ModelCheck {
            kind,
            name: name.to_string(),
            slept_ns: None,
            configured_gbps: Some(want),
            measured_gbps: Some(got),
            ratio: Some(got / want),
            ceiling_gbps: Some(ceiling),
            tolerance: None,
            status,
        }
    }
}

impl Default for ModelCheckOptions {
    fn default() -> Self {
        ModelCheckOptions {
            drives: "custom:500,custom:1000,custom:2000,newport,smartssd,intel-p4600".into(),
            links: "10gbe,25gbe,40gbe".into(),
            size: 1 << 30,
            tolerance: 0.10,
            path_tolerance: 0.03,
            repeat: 3,
            dir: None,
        }
    }
}

/// Seconds for an offloaded crc32c over `obj`.
fn scan(drive: &Drive, obj: &VirtualObject) -> Result<f64, Error> {
    let net = Network::new(None)?;
    let desc = Descriptor::new("crc32c", vec![obj.clone()]).encode();
    let t = Instant::now();
    exec_remote(drive, &net, &desc)?;
    Ok(t.elapsed().as_secs_f64())
}

/// Seconds for EXEC crc32c over `obj` on an embedded target over `image` paced as
/// `insitu image create|mount --model` paces it: the model's [`insitu_model::Pacer`] as the
/// namespace's pacing, a new one (a fresh drive) per measurement.
fn image_scan(image: &Path, model: &DeviceModel, obj: &VirtualObject) -> Result<f64, Error> {
    let len = std::fs::metadata(image).map_err(|e| format!("{}: {e}", image.display()))?.len();
    let pacer = model.pacer(len).map_err(|e| format!("model {}: {e}", model.name))?;
    let mut t = Engine::new();
    t.add_namespace(image, NamespaceConfig { pacing: Some(Arc::new(pacer)), ..NamespaceConfig::default() }).map_err(|e| format!("{}: {e}", image.display()))?;
    let desc = Descriptor::new("crc32c", vec![obj.clone()]).encode();
    let started = Instant::now();
    t.exec(1, &desc).map_err(|e| format!("EXEC on the image paced by {}: {e}", model.name))?;
    Ok(started.elapsed().as_secs_f64())
}

/// Seconds for the same EXEC sent over NVMe/TCP on loopback to an in-process target serving
/// `image` with `model`, as `insitu target start --model` runs it (a new target per
/// measurement); the result goes to a result object at `result_sector`.
fn target_scan(image: &Path, model: &DeviceModel, obj: &VirtualObject, result_sector: u64) -> Result<f64, Error> {
    const NQN: &str = "nqn.2024-01.io.insitu:model-check";
    let cfg = TargetConfig {
        listen: ([127, 0, 0, 1], 0).into(),
        subsystems: vec![SubsystemConfig { nqn: NQN.into(), namespaces: vec![NamespaceSpec::sharable(image)], allow_hosts: vec![] }],
        model: Some(model.clone()),
        ..TargetConfig::default()
    };
    let server = Target::bind(cfg).map_err(|e| format!("cannot start a target with model {}: {e}", model.name))?.spawn();
    let session = Session::connect(ConnectOptions::new(server.local_addr().to_string(), NQN))
        .map_err(|e| format!("cannot connect to the target at {}: {e}", server.local_addr()))?;
    let mut d = Descriptor::new("crc32c", vec![obj.clone()]);
    d.result = Some(VirtualObject { offset: 0, length: 4096, extents: vec![Extent::data(result_sector, (4096 / SECTOR) as u32)] });
    let desc = d.encode();
    let started = Instant::now();
    session.exec(1, &desc).map_err(|e| format!("EXEC over NVMe/TCP with model {}: {e}", model.name))?;
    let secs = started.elapsed().as_secs_f64();
    let _ = session.disconnect();
    server.shutdown();
    Ok(secs)
}

/// Seconds for conventional reads of `obj` through `net`; also returns the time callers
/// slept on the link.
fn read(drive: &Drive, net: &Network, obj: &VirtualObject) -> Result<f64, Error> {
    let stats = PullStats::default();
    let t = Instant::now();
    pull(drive, net, std::slice::from_ref(obj), &stats, |p| -> Result<(), String> {
        let mut s = p.next_object(obj.length);
        while let Some(c) = s.next_chunk().map_err(|e| format!("conventional read: {e}"))? {
            std::hint::black_box(c);
        }
        Ok(())
    })?;
    Ok(t.elapsed().as_secs_f64())
}

fn status(got: f64, want: f64, ceiling: f64, tol: f64) -> &'static str {
    if (got - want).abs() <= tol * want {
        "pass"
    } else if want > 0.9 * ceiling {
        "machine-limited"
    } else {
        "fail"
    }
}

fn measure(repeat: usize, mut f: impl FnMut() -> Result<f64, Error>) -> Result<f64, Error> {
    let mut v = Vec::new();
    for _ in 0..repeat {
        v.push(f()?);
    }
    Ok(median(&mut v))
}

/// Runs the model checks, calling `progress` with a line per drive and link checked.
///
/// The report lists every check in `checks` (`configured_gbps`, `measured_gbps`, `ratio`,
/// `status`: pass, fail or machine-limited) and counts the failed ones in `failed`; a
/// failed check is a result, not an [`Error`].
pub fn run(a: &ModelCheckOptions, progress: &mut dyn FnMut(&str)) -> Result<ModelCheckReport, Error> {
    let size = a.size;
    if size < (16 << 20) {
        return Err(format!("--size {}: give at least 16M so the scan is long enough to time", human(size)).into());
    }
    let repeat = a.repeat.max(1);
    let mut placer = Placer::default();
    let obj = placer.place(size, 1, 0);
    let mut work = Work::new(a.dir.clone(), "model-check", placer.used() + (1 << 20))?;
    let path = work.file("check.img");
    write_image(&path, placer.used() + (1 << 20), random_fill(5))?;
    let free = Drive::open(&path, None)?;
    let scan_ceiling = gbps(size, measure(repeat, || scan(&free, &obj))?);
    let read_ceiling = gbps(size, measure(repeat, || read(&free, &Network::new(None)?, &obj))?);
    let mut checks = Vec::new();
    let unpaced_net = Network::new(None)?;
    read(&free, &unpaced_net, &obj)?;
    let slept = free.media_waited_ns() + unpaced_net.waited_ns() + free.meter.read().stall_ns;
    checks.push(ModelCheck::no_model(slept));
    for spec in a.drives.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let model = parse_drive(spec)?.ok_or_else(|| format!("--drives: {spec} is not a model to check"))?;
        let want = model.internal_read_mb_s().ok_or_else(|| format!("--drives: {spec} has no flash model to check"))? / 1000.0;
        // Only the media is checked: the engine's CPU budget would make this a compute test.
        let media_only = insitu_model::DeviceModel { compute: None, ..model.clone() };
        let drive = Drive::open(&path, Some(&media_only))?;
        let got = gbps(size, measure(repeat, || scan(&drive, &obj))?);
        let st = status(got, want, scan_ceiling, a.tolerance);
        checks.push(ModelCheck::rate("drive internal read", &model.name, want, got, scan_ceiling, st));
        progress(&format!("  drive {:<16} configured {want:.3} GB/s, measured {got:.3} GB/s ({:+.1}%): {st}", model.name, 100.0 * (got / want - 1.0)));
        let result_sector = placer.used().div_ceil(SECTOR);
        for (kind, label) in [("image --model scan", "image"), ("target --model scan", "target")] {
            let secs =
                measure(repeat, || if label == "image" { image_scan(&path, &media_only, &obj) } else { target_scan(&path, &media_only, &obj, result_sector) })?;
            let got = gbps(size, secs);
            let st = status(got, want, scan_ceiling, a.path_tolerance);
            checks.push(ModelCheck { tolerance: Some(a.path_tolerance), ..ModelCheck::rate(kind, &model.name, want, got, scan_ceiling, st) });
            progress(&format!("  {label:<6}{:<16} configured {want:.3} GB/s, measured {got:.3} GB/s ({:+.1}%): {st}", model.name, 100.0 * (got / want - 1.0)));
        }
    }
    for spec in a.links.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let link = parse_link(spec)?.ok_or_else(|| format!("--links: {spec} is not a link to check"))?;
        let want = link.mb_s / 1000.0;
        let got = gbps(size, measure(repeat, || read(&free, &Network::new(Some(link.clone()))?, &obj))?);
        let st = status(got, want, read_ceiling, a.tolerance);
        checks.push(ModelCheck::rate("link", spec, want, got, read_ceiling, st));
        progress(&format!("  link  {spec:<16} configured {want:.3} GB/s, measured {got:.3} GB/s ({:+.1}%): {st}", 100.0 * (got / want - 1.0)));
    }
    let failed = checks.iter().filter(|c| c.status == "fail").count();
    Ok(ModelCheckReport {
        benchmark: "model-check",
        command: command(),
        size_bytes: size,
        repeat,
        tolerance: a.tolerance,
        path_tolerance: a.path_tolerance,
        work_dir: work.root().display().to_string(),
        ceilings: ModelCheckCeilings { offload_scan_gbps: scan_ceiling, conventional_read_gbps: read_ceiling },
        method: ModelCheckMethod {
            drive: "EXEC crc32c over one contiguous object on a drive paced by the model (its CPU budget off); rate = bytes / wall time",
            link: "conventional reads (Engine::read, 1 MiB, 4 outstanding) of the object from an unpaced drive through the link model",
            image: "the drive check's EXEC on an embedded target whose namespace the model's Pacer paces (insitu image --model), its CPU budget off",
            target: "the same EXEC over NVMe/TCP on loopback to a target started with the model (insitu target --model), its CPU budget off; connection set-up not timed",
            limit: "a check above 90 % of this machine's unpaced rate that misses is machine-limited, not failed",
        },
        checks,
        failed,
        machine: machine(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_allow_the_tolerance_and_excuse_a_slow_machine() {
        assert_eq!(status(0.95, 1.0, 5.0, 0.1), "pass");
        assert_eq!(status(1.09, 1.0, 5.0, 0.1), "pass");
        assert_eq!(status(0.85, 1.0, 5.0, 0.1), "fail");
        assert_eq!(status(0.85, 1.0, 1.05, 0.1), "machine-limited");
    }

    #[test]
    fn a_small_check_of_a_slow_drive_and_link_passes() {
        let dir = tempfile::tempdir().unwrap();
        // End to end only: how close the rates come is the benchmark's business, and tests
        // run beside each other on a loaded machine.
        let a = ModelCheckOptions {
            drives: "custom:200".into(),
            links: "150".into(),
            size: 16 << 20,
            tolerance: 0.9,
            path_tolerance: 0.9,
            repeat: 1,
            dir: Some(dir.path().to_path_buf()),
        };
        let out = run(&a, &mut |_| {}).unwrap();
        assert_eq!(out.failed, 0, "{out:?}");
        let kinds: Vec<&str> = out.checks.iter().map(|c| c.kind).collect();
        assert_eq!(kinds, ["no model", "drive internal read", "image --model scan", "target --model scan", "link"]);
    }
}
