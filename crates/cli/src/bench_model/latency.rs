// SPDX-License-Identifier: Apache-2.0
//! `insitu bench latency`: where the time of one scan query goes — grep over one file on an
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
use super::rig::{write_image, write_object, Drive, Placer, Work};
use super::{command, drive_name, emit, machine, median, models_json, ModelFlags, Models};
use crate::dataset::Rng;
use crate::size::{human, parse_size};
use crate::Failure;
use insitu_offload::{Args, Record};
use insitu_wire::{Descriptor, ExecResult, Value, VirtualObject};
use serde_json::{json, Value as Json};
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

/// Flags of `insitu bench latency`.
#[derive(clap::Args, Debug)]
pub(crate) struct LatencyArgs {
    /// Drive and link models (default: --drive newport --link 10gbe).
    #[command(flatten)]
    pub(crate) model: ModelFlags,
    /// Size of the scanned file.
    #[arg(long, default_value = "64M")]
    pub(crate) size: String,
    /// Literal text to grep for (about 1 % of the generated log lines contain ERROR).
    #[arg(long, default_value = "ERROR")]
    pub(crate) pattern: String,
    /// Queries of each kind (the one with the median total is reported).
    #[arg(long, default_value_t = 5)]
    pub(crate) repeat: usize,
    /// Work directory for the image (default: a new directory in /dev/shm, removed
    /// afterwards).
    #[arg(long)]
    pub(crate) dir: Option<PathBuf>,
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
        let line = format!("{ts} {level} host-{} GET {}/{} {} {}ms\n", rng.below(64), PATHS[rng.below(4) as usize], rng.below(1_000_000), 200 + 100 * rng.below(4), rng.below(900));
        out.extend_from_slice(line.as_bytes());
    }
    out.truncate(len);
    out
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
    fn json(&self) -> Json {
        let protocol = (self.total - self.compute - self.media - self.link).max(0.0);
        json!({"total_s": self.total, "compute_s": self.compute, "media_s": self.media, "link_s": self.link, "protocol_s": protocol, "link_bytes": self.link_bytes})
    }
}

const NS: f64 = 1e-9;

fn conventional(drive: &Drive, models: &Models, file: &VirtualObject, args: &[(String, Value)]) -> Result<Query, Failure> {
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

fn offloaded(drive: &Drive, models: &Models, file: &VirtualObject, args: &[(String, Value)]) -> Result<Query, Failure> {
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

/// Runs the latency benchmark.
pub(crate) fn run(a: LatencyArgs, json_out: bool) -> Result<i32, Failure> {
    let models = a.model.resolve("newport", "10gbe")?;
    let size = parse_size(&a.size)?;
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
    let out = json!({
        "benchmark": "latency",
        "command": command(),
        "models": models_json(&models),
        "query": {"function": "grep", "pattern": a.pattern, "file_bytes": size, "matches": count, "work_dir": work.root().display().to_string()},
        "repeat": a.repeat.max(1),
        "conventional": c.json(),
        "offload": o.json(),
        "speedup": c.total / o.total,
        // What each resource needs for the query alone, from the models (they overlap).
        "model_s": {
            "media_engine": models.drive.as_ref().and_then(|d| d.internal_read_mb_s()).map(|r| size as f64 / (r * 1e6)),
            "media_host": models.drive.as_ref().and_then(|d| d.host_read_mb_s()).map(|r| size as f64 / (r * 1e6)),
            "link_conventional": models.link.as_ref().map(|l| c.link_bytes as f64 / (l.mb_s * 1e6)),
            "link_offload": models.link.as_ref().map(|l| o.link_bytes as f64 / (l.mb_s * 1e6)),
        },
        "parts": {
            "compute": "thread CPU time of the kernel (offload: plus the stalls of the drive's CPU budget)",
            "media": "time the kernel waited for data not yet read from the drive (flash-model paced)",
            "link": "time waiting for the link model: the data (conventional), the descriptor and result (offload)",
            "protocol": "the rest: commands, copies, thread hand-offs, encoding and decoding",
        },
        "machine": machine(),
    });
    emit(json_out, &out, || {
        println!("latency of grep {:?} over {}, drive {}, link {}:", a.pattern, human(size), drive_name(&models.drive), models.link_name);
        println!("{:<13} {:>9} {:>9} {:>9} {:>9} {:>9}", "", "total ms", "compute", "media", "link", "protocol");
        for (name, q) in [("conventional", &out["conventional"]), ("offload", &out["offload"])] {
            let f = |k: &str| 1e3 * q[k].as_f64().unwrap_or(f64::NAN);
            println!("{name:<13} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}", f("total_s"), f("compute_s"), f("media_s"), f("link_s"), f("protocol_s"));
        }
    });
    Ok(0)
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
        let a = LatencyArgs {
            model: ModelFlags { drive: Some("none".into()), link: Some("none".into()), ..Default::default() },
            size: "2M".into(),
            pattern: "ERROR".into(),
            repeat: 2,
            dir: Some(dir.path().to_path_buf()),
        };
        assert_eq!(run(a, true).map_err(|f| f.message).unwrap(), 0);
    }
}
