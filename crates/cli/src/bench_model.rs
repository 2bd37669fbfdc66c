// SPDX-License-Identifier: Apache-2.0
//! Benchmarks on emulated drives: `insitu bench scrub-scaling`, `break-even`, `latency` and
//! `model-check`.
//!
//! Each runs N embedded targets in this process, one namespace image each (in memory by
//! default), holding objects laid out as extents and addressed by virtual objects built
//! here. The real code paths run end to end (EXEC through the target's streams and kernels;
//! conventional reads through `Target::read` and the same kernels on the host); the device
//! models only pace them: each drive's media obeys its own flash model, its kernels its own
//! CPU budget, and every byte between the targets and the host crosses one shared link
//! model. With `--drive none --link none` nothing is paced and nothing sleeps.
//!
//! Every JSON result records the command line, the models and their parameters, the data
//! sizes and the machine.

mod breakeven;
mod check;
mod emu;
mod latency;
mod math;
mod meter;
mod pull;
mod rig;
mod scrub;
mod workload;

pub(crate) use breakeven::{run as break_even, BreakEvenArgs};
pub(crate) use check::{run as model_check, ModelCheckArgs};
pub(crate) use latency::{run as latency, LatencyArgs};
pub(crate) use scrub::{run as scrub_scaling, ScrubArgs};

use crate::Failure;
use insitu_model::{DeviceModel, LinkConfig, LINK_NAMES};
use serde_json::{json, Value};

/// The drive and link flags every emulated-drive benchmark takes.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct ModelFlags {
    /// Drive model: a preset (samsung-980pro, intel-p4600, daisyplus-openssd, newport,
    /// smartssd), PRESET@MB_S (re-timed to that internal read rate), custom:MB_S, or none
    /// (real speed). See `insitu model list`.
    #[arg(long, value_name = "SPEC", conflicts_with = "drive_mb_s")]
    pub(crate) drive: Option<String>,
    /// A generic drive whose offload engine reads sequentially at MB_S (= --drive custom:MB_S).
    #[arg(long, value_name = "MB_S")]
    pub(crate) drive_mb_s: Option<f64>,
    /// The one link between the targets and the host: 10gbe, 25gbe, 40gbe, 100gbe,
    /// pcie-gen3-x4, pcie-gen4-x4, a payload rate in MB/s, or none (not paced).
    #[arg(long, value_name = "LINK")]
    pub(crate) link: Option<String>,
}

/// A resolved drive and link.
pub(crate) struct Models {
    pub(crate) drive: Option<DeviceModel>,
    pub(crate) link: Option<LinkConfig>,
    pub(crate) link_name: String,
}

impl ModelFlags {
    /// The models asked for, with these defaults for flags not given.
    pub(crate) fn resolve(&self, default_drive: &str, default_link: &str) -> Result<Models, Failure> {
        let drive = match (self.drive_mb_s, self.drive.as_deref()) {
            (Some(r), _) => Some(insitu_model::custom(r).map_err(|e| format!("--drive-mb-s {r}: {e}"))?),
            (None, spec) => parse_drive(spec.unwrap_or(default_drive))?,
        };
        let link_name = self.link.clone().unwrap_or_else(|| default_link.to_string());
        Ok(Models { drive, link: parse_link(&link_name)?, link_name })
    }
}

/// A drive spec, or `none`.
pub(crate) fn parse_drive(spec: &str) -> Result<Option<DeviceModel>, Failure> {
    if spec == "none" {
        return Ok(None);
    }
    insitu_model::parse(spec).map(Some).map_err(|e| format!("--drive {spec}: {e} (or none for real speed)").into())
}

/// A link name, a rate in MB/s (10 µs latency, like Ethernet), or `none`.
pub(crate) fn parse_link(s: &str) -> Result<Option<LinkConfig>, Failure> {
    if s == "none" {
        return Ok(None);
    }
    if let Some(l) = LinkConfig::named(s) {
        return Ok(Some(l));
    }
    match s.parse::<f64>() {
        Ok(mb_s) if mb_s > 0.0 && mb_s.is_finite() => Ok(Some(LinkConfig { mb_s, latency_us: 10.0 })),
        _ => Err(format!("--link {s}: unknown link; use one of {}, a payload rate in MB/s such as 1200, or none", LINK_NAMES.join(", ")).into()),
    }
}

/// The models as JSON: the drive with its derived rates, and the link.
pub(crate) fn models_json(m: &Models) -> Value {
    let drive = m.drive.as_ref().map_or(Value::Null, |d| serde_json::from_str(&d.to_json()).unwrap_or(Value::Null));
    json!({"drive": drive, "link": {"name": m.link_name, "config": m.link}})
}

/// A short name of the drive model for summaries.
pub(crate) fn drive_name(d: &Option<DeviceModel>) -> String {
    d.as_ref().map_or_else(|| "none (real speed)".into(), |d| d.name.clone())
}

/// The machine the benchmark ran on.
pub(crate) fn machine() -> Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo").lines().find(|l| l.starts_with("model name")).and_then(|l| l.split(':').nth(1)).unwrap_or("").trim().to_string();
    let mem_kib: u64 = read("/proc/meminfo").lines().find(|l| l.starts_with("MemTotal")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0);
    json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "cpu_model": cpu,
        "memory_bytes": mem_kib * 1024,
        "kernel": read("/proc/sys/kernel/osrelease").trim(),
    })
}

/// The exact command line.
pub(crate) fn command() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

/// Host cores this machine has.
pub(crate) fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// CPU time this process has used (all threads, user and system), seconds.
pub(crate) fn process_cpu_s() -> f64 {
    // SAFETY: getrusage writes one struct rusage, which lives on this stack frame.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Share of this machine's cores the process kept busy while `f` ran, with `f`'s result.
pub(crate) fn with_utilization<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let (cpu, t) = (process_cpu_s(), std::time::Instant::now());
    let out = f();
    let wall = t.elapsed().as_secs_f64().max(1e-9);
    (out, (process_cpu_s() - cpu) / (wall * cores() as f64))
}

/// A pass that kept this share of the cores busy was limited by the machine, not the model.
pub(crate) const BUSY: f64 = 0.85;

/// GB/s (10⁹ bytes per second).
pub(crate) fn gbps(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / 1e9 / secs.max(1e-9)
}

/// Median of `v` (sorted in place); NaN when empty.
pub(crate) fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Prints `out` as JSON, or `text` otherwise.
pub(crate) fn emit(json_out: bool, out: &Value, text: impl FnOnce()) {
    if json_out {
        println!("{}", serde_json::to_string_pretty(out).unwrap_or_default());
    } else {
        text();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_resolve_with_defaults_and_errors_name_the_fix() {
        let m = ModelFlags::default().resolve("custom:500", "10gbe").map_err(|f| f.message).unwrap();
        assert!((m.drive.unwrap().internal_read_mb_s().unwrap() - 500.0).abs() < 1e-6);
        assert!((m.link.unwrap().mb_s - 1186.6).abs() < 0.1);
        let m = ModelFlags { drive: Some("none".into()), link: Some("none".into()), ..Default::default() }.resolve("newport", "40gbe").map_err(|f| f.message).unwrap();
        assert!(m.drive.is_none() && m.link.is_none());
        let m = ModelFlags { drive_mb_s: Some(800.0), link: Some("2500".into()), ..Default::default() }.resolve("newport", "40gbe").map_err(|f| f.message).unwrap();
        assert!((m.drive.unwrap().internal_read_mb_s().unwrap() - 800.0).abs() < 1e-6);
        assert_eq!(m.link.unwrap().mb_s, 2500.0);
        let e = parse_link("token-ring").unwrap_err().message;
        assert!(e.contains("token-ring") && e.contains("40gbe") && e.contains("none"), "{e}");
        assert!(parse_drive("floppy").unwrap_err().message.contains("newport"));
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
    }
}
