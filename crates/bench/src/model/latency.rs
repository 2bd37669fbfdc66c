// SPDX-License-Identifier: Apache-2.0
//! The latency benchmark: where the time of one scan query goes — grep over one file on an
//! emulated drive, conventional vs offloaded, split into compute, media, link and protocol.
//!
//! * compute: CPU time of the thread running the kernel (the host's, or the drive's plus
//!   the stalls its CPU budget imposed), from the thread CPU clock;
//! * media: time the kernel waited for data the drive had not read yet (paced by the flash
//!   model), measured where the kernel asks for its next chunk;
//! * link: time spent waiting for the link model to deliver (data, or descriptor and result);
//! * protocol: the rest of the wall time — commands, copies, thread hand-offs, encoding.
//!
//! The parts are measured on the critical path (the thread that runs the kernel and the
//! thread that issues the command), so they add up to the total.

use super::emu::Network;
use super::meter::{self, Meter};
use super::pull::{exec_remote, pull, PullStats};
use super::rig::{write_image, write_object, Drive, Placer};
use super::{ModelChoice, Models, ModelsReport};
use crate::common::{command, machine, median, Machine, Work};
use crate::dataset::Rng;
use crate::Error;
use insitu_offload::{Args, Record};
use insitu_proto::{Descriptor, ExecResult, Value, VirtualObject};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

/// What [`latency`](crate::latency) measures.
#[derive(Debug, Clone)]
pub struct LatencyOptions {
    /// Drive and link models. Default: `newport` behind `10gbe`.
    pub model: ModelChoice,
    /// Size of the scanned file in bytes. Default 64 MiB.
    pub size: u64,
    /// Literal text to grep for (about 1 % of the generated log lines contain ERROR).
    /// Default `ERROR`.
    pub pattern: String,
    /// Queries of each kind; the one with the median total is reported. Default 5 (0
    /// counts as 1).
    pub repeat: usize,
    /// Work directory for the image. Default `None`: a new directory in /dev/shm, removed
    /// afterwards.
    pub dir: Option<PathBuf>,
}

impl Default for LatencyOptions {
    fn default() -> Self {
        LatencyOptions { model: ModelChoice::default(), size: 64 << 20, pattern: "ERROR".into(), repeat: 5, dir: None }
    }
}

/// A web-server-like log of `len` bytes; about 1 % of lines are errors.
fn log_text(len: usize, seed: u64) -> Vec<u8> {
    const LEVELS: [&str; 3] = ["INFO", "DEBUG", "WARN"];
    const PATHS: [&str; 4] = ["/api/items", "/api/users", "/static/app.js", "/login"];
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(len + 128);
    let mut ts = 1_700_000_000u64;
    while out.len() < len {
        ts += rng.below(3);
        let level = if rng.below(100) == 0 { "ERROR" } else { LEVELS[rng.below(3) as usize] };
        let line = format!(
            "{ts} {level} host-{} GET {}/{} {} {}ms\n",
            rng.below(64),
            PATHS[rng.below(4) as usize],
            rng.below(1_000_000),
            200 + 100 * rng.below(4),
            rng.below(900)
        );
        out.extend_from_slice(line.as_bytes());
    }
    out.truncate(len);
    out
}

/// The report of [`latency`](crate::latency).
#[derive(Debug, Clone, Serialize)]
pub struct LatencyReport {
    /// `latency`.
    pub benchmark: &'static str,
    /// The command line that ran it.
    pub command: String,
    /// The drive and link.
    pub models: ModelsReport,
    /// The query.
    pub query: LatencyQuery,
    /// Queries of each kind.
    pub repeat: usize,
    /// The conventional query with the median total.
    pub conventional: QueryTimes,
    /// The offloaded query with the median total.
    pub offload: QueryTimes,
    /// Conventional total over offloaded total.
    pub speedup: f64,
    /// What each resource needs for the query alone, from the models (they overlap).
    pub model_s: LatencyModelSeconds,
    /// What each part of [`QueryTimes`] counts, in words.
    pub parts: LatencyParts,
    /// The machine it ran on.
    pub machine: Machine,
}

/// The query of [`LatencyReport::query`].
#[derive(Debug, Clone, Serialize)]
pub struct LatencyQuery {
    /// `grep`.
    pub function: &'static str,
    /// The literal text searched for.
    pub pattern: String,
    /// Size of the scanned file, bytes.
    pub file_bytes: u64,
    /// Lines that matched; `None` (null) if the result had no count.
    pub matches: Option<u64>,
    /// The work directory.
    pub work_dir: String,
}

/// One query's time split into parts that add up to the total, seconds.
#[derive(Debug, Clone, Serialize)]
pub struct QueryTimes {
    /// Wall time of the query.
    pub total_s: f64,
    /// CPU time of the kernel (offloaded: plus the stalls of the drive's CPU budget).
    pub compute_s: f64,
    /// Time the kernel waited for data not yet read from the drive.
    pub media_s: f64,
    /// Time waiting for the link model.
    pub link_s: f64,
    /// The rest.
    pub protocol_s: f64,
    /// Bytes that crossed the link model.
    pub link_bytes: u64,
}

/// What the models alone need for the query, seconds; `None` (null) without the model.
#[derive(Debug, Clone, Serialize)]
pub struct LatencyModelSeconds {
    /// The file at the drive's internal read rate.
    pub media_engine: Option<f64>,
    /// The file at the drive's host read rate.
    pub media_host: Option<f64>,
    /// The conventional query's link bytes over the link.
    pub link_conventional: Option<f64>,
    /// The offloaded query's link bytes over the link.
    pub link_offload: Option<f64>,
}

/// What each part of [`QueryTimes`] counts, in words ([`LatencyReport::parts`]).
#[derive(Debug, Clone, Serialize)]
pub struct LatencyParts {
    /// `compute_s`.
    pub compute: &'static str,
    /// `media_s`.
    pub media: &'static str,
    /// `link_s`.
    pub link: &'static str,
    /// `protocol_s`.
    pub protocol: &'static str,
}

/// One query's parts, seconds, and what it returned.
struct Query {
    total: f64,
    compute: f64,
    media: f64,
    link: f64,
    link_bytes: u64,
    records: Vec<Record>,
}

impl Query {
    fn times(&self) -> QueryTimes {
        let protocol = (self.total - self.compute - self.media - self.link).max(0.0);
        QueryTimes { total_s: self.total, compute_s: self.compute, media_s: self.media, link_s: self.link, protocol_s: protocol, link_bytes: self.link_bytes }
    }
}

const NS: f64 = 1e-9;

fn conventional(drive: &Drive, models: &Models, file: &VirtualObject, args: &[(String, Value)]) -> Result<Query, Error> {
    let net = Network::new(models.link.clone())?;
    let meter = Meter::new(None)?;
    let stats = PullStats::default();
    let registry = meter::registry(&meter);
    let kernel = registry.get("grep").ok_or_else(|| "no grep kernel".to_string())?;
    let t = Instant::now();
    let records = pull(drive, &net, std::slice::from_ref(file), &stats, |p| {
        let job = kernel.prepare(&Args::new(args)).map_err(|e| format!("grep: {e}"))?;
        let mut input = p.next_object(file.length);
        job.run(&mut [&mut input], &mut []).map_err(|e| format!("host grep: {e}"))
    })?;
    let total = t.elapsed().as_secs_f64();
    let m = meter.read();
    Ok(Query {
        total,
        compute: m.cpu_ns as f64 * NS,
        media: stats.media_wait_ns.load(Relaxed) as f64 * NS,
        link: net.waited_ns() as f64 * NS,
        link_bytes: net.bytes(),
        records,
    })
}

fn offloaded(drive: &Drive, models: &Models, file: &VirtualObject, args: &[(String, Value)]) -> Result<Query, Error> {
    let net = Network::new(models.link.clone())?;
    let before = drive.meter.read();
    let t = Instant::now();
    let mut d = Descriptor::new("grep", vec![file.clone()]);
    d.args = args.to_vec();
    let out = exec_remote(drive, &net, &d.encode())?;
    let records = ExecResult::decode(&out.result).map_err(|e| format!("EXEC result: {e}"))?.records;
    let total = t.elapsed().as_secs_f64();
    let m = drive.meter.read() - before;
    Ok(Query {
        total,
        compute: (m.cpu_ns + m.stall_ns) as f64 * NS,
        media: m.input_wait_ns as f64 * NS,
        link: net.waited_ns() as f64 * NS,
        link_bytes: net.bytes(),
        records,
    })
}

/// The query with the median total.
fn pick(mut qs: Vec<Query>) -> Query {
    let mut totals: Vec<f64> = qs.iter().map(|q| q.total).collect();
    let m = median(&mut totals);
    let i = qs.iter().position(|q| q.total == m).unwrap_or(0);
    qs.swap_remove(i)
}

/// Runs the latency benchmark: one grep query over a generated log, conventional and
/// offloaded, `repeat` times each; the results must agree.
///
/// The report has the `conventional` and `offload` queries split into `total_s`,
/// `compute_s`, `media_s`, `link_s` and `protocol_s` (with `link_bytes`), the `speedup`
/// and what the models alone need (`model_s`).
pub fn run(a: &LatencyOptions) -> Result<LatencyReport, Error> {
    let models = a.model.resolve("newport", "10gbe")?;
    let size = a.size;
    if size == 0 || a.pattern.is_empty() {
        return Err("--size must be at least 1 byte and --pattern not empty".to_string().into());
    }
    let mut placer = Placer::default();
    let file = placer.place(size, 1, 0);
    let mut work = Work::new(a.dir.clone(), "latency", placer.used() + (1 << 20))?;
    let path = work.file("latency.img");
    write_image(&path, placer.used() + (1 << 20), |_, b| b.fill(0))?;
    write_object(&path, &file, &log_text(size as usize, 7))?;
    let drive = Drive::open(&path, models.drive.as_ref())?;
    let args = vec![("pattern".to_string(), Value::Str(a.pattern.clone()))];
    let (mut conv, mut off) = (Vec::new(), Vec::new());
    for _ in 0..a.repeat.max(1) {
        conv.push(conventional(&drive, &models, &file, &args)?);
        off.push(offloaded(&drive, &models, &file, &args)?);
    }
    let (c, o) = (pick(conv), pick(off));
    if c.records != o.records {
        return Err(format!("grep disagrees: host {:?}, offloaded {:?}", c.records.first().map(|r| &r[0]), o.records.first().map(|r| &r[0])).into());
    }
    let count = o.records.first().and_then(|r| r.iter().find(|(k, _)| k == "count")).and_then(|(_, v)| match v {
        Value::U64(n) => Some(*n),
        _ => None,
    });
    Ok(LatencyReport {
        benchmark: "latency",
        command: command(),
        models: ModelsReport::new(&models),
        query: LatencyQuery { function: "grep", pattern: a.pattern.clone(), file_bytes: size, matches: count, work_dir: work.root().display().to_string() },
        repeat: a.repeat.max(1),
        conventional: c.times(),
        offload: o.times(),
        speedup: c.total / o.total,
        model_s: LatencyModelSeconds {
            media_engine: models.drive.as_ref().and_then(|d| d.internal_read_mb_s()).map(|r| size as f64 / (r * 1e6)),
            media_host: models.drive.as_ref().and_then(|d| d.host_read_mb_s()).map(|r| size as f64 / (r * 1e6)),
            link_conventional: models.link.as_ref().map(|l| c.link_bytes as f64 / (l.mb_s * 1e6)),
            link_offload: models.link.as_ref().map(|l| o.link_bytes as f64 / (l.mb_s * 1e6)),
        },
        parts: LatencyParts {
            compute: "thread CPU time of the kernel (offload: plus the stalls of the drive's CPU budget)",
            media: "time the kernel waited for data not yet read from the drive (flash-model paced)",
            link: "time waiting for the link model: the data (conventional), the descriptor and result (offload)",
            protocol: "the rest: commands, copies, thread hand-offs, encoding and decoding",
        },
        machine: machine(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_have_about_one_percent_errors() {
        let t = log_text(1 << 20, 1);
        assert_eq!(t.len(), 1 << 20);
        let lines = t.split(|b| *b == b'\n').count();
        let errors = t.split(|b| *b == b'\n').filter(|l| l.windows(5).any(|w| w == b"ERROR")).count();
        assert!(errors * 200 > lines && errors * 50 < lines, "{errors} of {lines}");
    }

    #[test]
    fn a_small_query_agrees_on_both_paths() {
        let dir = tempfile::tempdir().unwrap();
        let a = LatencyOptions {
            model: ModelChoice { drive: Some("none".into()), link: Some("none".into()), ..Default::default() },
            size: 2 << 20,
            pattern: "ERROR".into(),
            repeat: 2,
            dir: Some(dir.path().to_path_buf()),
        };
        let out = run(&a).unwrap();
        assert_eq!(out.query.file_bytes, 2 << 20);
    }
}
