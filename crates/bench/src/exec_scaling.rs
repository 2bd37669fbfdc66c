// SPDX-License-Identifier: Apache-2.0
//! The concurrent-EXEC benchmark: how offload throughput on one memory-backed namespace
//! grows with the number of EXECs running at once, with the namespace's buffer pool and
//! without it (every buffer allocated fresh and freed, as targets did before the pool), and
//! how much memory the pool held.
//!
//! Each of `n` threads runs crc32c EXECs on an embedded target, one after another, each over
//! the next object of a file of equal objects, until `rounds` passes are done; every digest
//! is checked against the host's. Configurations alternate within each repetition so drift
//! affects them alike; medians are reported.

use crate::common::{command, gbps, machine, median, timed_workers, Machine, Work, REAL_SPEED};
use crate::dataset::Rng;
use crate::Error;
use insitu_engine::{Engine, NamespaceConfig, PoolStats};
use insitu_proto::{Descriptor, ExecResult, Extent, Value, VirtualObject, SECTOR};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// What [`exec_scaling`] measures.
#[derive(Debug, Clone)]
pub struct ExecScalingOptions {
    /// Bytes per EXEC (one object each): a multiple of 512. Default 4 MiB.
    pub object_size: u64,
    /// Objects in the file. Default 64 (with the default size, a 256 MiB file).
    pub objects: usize,
    /// Passes over all objects per measurement. Default 4.
    pub rounds: usize,
    /// Numbers of concurrent EXECs to measure. Default 1, 2, 4, 8.
    pub streams: Vec<usize>,
    /// Measurements of each configuration; the median is reported. Default 3.
    pub repeat: usize,
    /// Work directory for the file. Default `None`: a new directory in memory (/dev/shm),
    /// removed afterwards.
    pub dir: Option<PathBuf>,
}

impl Default for ExecScalingOptions {
    fn default() -> Self {
        ExecScalingOptions { object_size: 4 << 20, objects: 64, rounds: 4, streams: vec![1, 2, 4, 8], repeat: 3, dir: None }
    }
}

/// The report of [`exec_scaling`].
#[derive(Debug, Clone, Serialize)]
pub struct ExecScalingReport {
    /// The command line that ran it.
    pub command: String,
    /// Bytes per EXEC.
    pub object_size_bytes: u64,
    /// Objects in the file.
    pub objects: usize,
    /// Passes over all objects per measurement.
    pub rounds: usize,
    /// Measurements of each configuration.
    pub repeat: usize,
    /// Numbers of concurrent EXECs measured.
    pub streams: Vec<usize>,
    /// The kernel every EXEC runs: crc32c.
    pub function: &'static str,
    /// One row per number of streams and pool setting, pooled first.
    pub results: Vec<ExecScalingRow>,
    /// Throughput at the most streams over that at the fewest.
    pub scaling: ExecScaling,
    /// The pooled namespace's buffer pool after the whole run.
    pub pool: PoolReport,
    /// The work directory.
    pub work_dir: String,
    /// The machine it ran on.
    pub machine: Machine,
    /// The device model: none, this machine's real speed.
    pub model: &'static str,
}

/// One number of streams and pool setting of [`ExecScalingReport::results`].
#[derive(Debug, Clone, Serialize)]
pub struct ExecScalingRow {
    /// EXECs at once.
    pub streams: usize,
    /// Whether the namespace kept a buffer pool.
    pub pooled: bool,
    /// Median rate, GB/s.
    pub gbps: f64,
    /// EXECs per second at the median.
    pub execs_per_s: f64,
    /// Seconds of every measurement.
    pub seconds: Vec<f64>,
    /// Most bytes the namespace's buffers held at once, over the whole run.
    pub pool_peak_bytes: u64,
    /// Buffers allocated, over the whole run.
    pub pool_allocations: u64,
    /// Buffers reused from the pool, over the whole run.
    pub pool_reuses: u64,
}

/// How throughput grew from the fewest streams to the most ([`ExecScalingReport::scaling`]).
#[derive(Debug, Clone, Serialize)]
pub struct ExecScaling {
    /// The fewest streams measured.
    pub from_streams: usize,
    /// The most streams measured.
    pub to_streams: usize,
    /// With the pool: rate at `to_streams` over rate at `from_streams`.
    pub pooled_max_to_one: f64,
    /// Without the pool: the same.
    pub unpooled_max_to_one: f64,
    /// At `to_streams`: rate with the pool over rate without.
    pub pooled_to_unpooled_at_max: f64,
}

/// A namespace's buffer pool ([`PoolStats`]) in a report.
#[derive(Debug, Clone, Serialize)]
pub struct PoolReport {
    /// Bytes per buffer.
    pub buffer_bytes: usize,
    /// Most idle buffers kept.
    pub max_idle: usize,
    /// Most bytes held at once.
    pub peak_bytes: u64,
    /// Buffers allocated.
    pub allocations: u64,
    /// Buffers reused.
    pub reuses: u64,
}

/// Runs the benchmark. The report has `results` (one row per number of streams and pool
/// setting: `streams`, `pooled`, `gbps`, `execs_per_s`, `seconds`, and the pool's
/// `pool_peak_bytes`, `pool_allocations`, `pool_reuses`), and `scaling`: for each setting,
/// the throughput at the most streams over that at one (`pooled_max_to_one`,
/// `unpooled_max_to_one`).
pub fn exec_scaling(opts: &ExecScalingOptions) -> Result<ExecScalingReport, Error> {
    let size = opts.object_size;
    if size == 0 || !size.is_multiple_of(SECTOR) || size > u64::from(u32::MAX) * SECTOR || opts.objects == 0 || opts.streams.is_empty() {
        return Err(format!(
            "object size {size}: give a positive multiple of {SECTOR}, at least one object and one stream count (e.g. --object-size 4M --streams 1,2,4,8)"
        )
        .into());
    }
    let mut work = Work::new(opts.dir.clone(), "exec-scaling", size * opts.objects as u64)?;
    let path = work.file("objects.img");
    let expect = write_objects(&path, size, opts.objects)?;
    let descriptors: Vec<Vec<u8>> = (0..opts.objects as u64)
        .map(|i| {
            let sectors = size / SECTOR;
            Descriptor::new("crc32c", vec![VirtualObject { offset: 0, length: size, extents: vec![Extent::data(i * sectors, sectors as u32)] }]).encode()
        })
        .collect();
    let target = |idle_buffers: usize| -> Result<Engine, Error> {
        let mut t = Engine::new();
        t.add_namespace(&path, NamespaceConfig { idle_buffers, ..NamespaceConfig::default() }).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(t)
    };
    // Pooled first, then without a pool (0 idle buffers: each is freed after use).
    let targets = [target(NamespaceConfig::default().idle_buffers)?, target(0)?];
    let rounds = opts.rounds.max(1);
    let mut secs = vec![Vec::new(); opts.streams.len() * targets.len()];
    for _ in 0..opts.repeat.max(1) {
        for (si, &n) in opts.streams.iter().enumerate() {
            for (ti, t) in targets.iter().enumerate() {
                secs[si * targets.len() + ti].push(run(t, &descriptors, &expect, n.max(1), rounds)?);
            }
        }
    }
    let bytes = size * (opts.objects * rounds) as u64;
    let execs = (opts.objects * rounds) as f64;
    let mut results = Vec::new();
    for (si, &n) in opts.streams.iter().enumerate() {
        for (ti, t) in targets.iter().enumerate() {
            let s = &secs[si * targets.len() + ti];
            let m = median(&mut s.clone());
            let pool: PoolStats = t.buffer_stats();
            results.push(ExecScalingRow {
                streams: n,
                pooled: ti == 0,
                gbps: gbps(bytes, m),
                execs_per_s: execs / m,
                seconds: s.clone(),
                pool_peak_bytes: pool.peak_bytes(),
                pool_allocations: pool.allocations,
                pool_reuses: pool.reuses,
            });
        }
    }
    let rate = |pooled: bool, n: usize| results.iter().find(|r| r.pooled == pooled && r.streams == n).map_or(f64::NAN, |r| r.gbps);
    let (least, most) = (opts.streams.iter().copied().min().unwrap_or(1), opts.streams.iter().copied().max().unwrap_or(1));
    let pool = targets[0].buffer_stats();
    let scaling = ExecScaling {
        from_streams: least,
        to_streams: most,
        pooled_max_to_one: rate(true, most) / rate(true, least),
        unpooled_max_to_one: rate(false, most) / rate(false, least),
        pooled_to_unpooled_at_max: rate(true, most) / rate(false, most),
    };
    Ok(ExecScalingReport {
        command: command(),
        object_size_bytes: size,
        objects: opts.objects,
        rounds,
        repeat: opts.repeat.max(1),
        streams: opts.streams.clone(),
        function: "crc32c",
        results,
        scaling,
        pool: PoolReport {
            buffer_bytes: pool.buffer_bytes,
            max_idle: pool.max_idle,
            peak_bytes: pool.peak_bytes(),
            allocations: pool.allocations,
            reuses: pool.reuses,
        },
        work_dir: work.root().display().to_string(),
        machine: machine(),
        model: REAL_SPEED,
    })
}

/// Writes `objects` objects of random bytes; returns the host's crc32c of each, as the
/// kernel reports it.
fn write_objects(path: &Path, size: u64, objects: usize) -> Result<Vec<String>, Error> {
    let err = |e: std::io::Error| format!("cannot write the benchmark file {}: {e}", path.display());
    let mut f = std::fs::File::create(path).map_err(err)?;
    let mut rng = Rng::new(7);
    let mut buf = vec![0u8; size as usize];
    let mut digests = Vec::with_capacity(objects);
    for _ in 0..objects {
        rng.fill(&mut buf);
        std::io::Write::write_all(&mut f, &buf).map_err(err)?;
        digests.push(format!("{:08x}", crc32c::crc32c(&buf)));
    }
    f.sync_all().map_err(err)?;
    Ok(digests)
}

/// `streams` threads take the next EXEC until `rounds` passes are done; returns seconds.
fn run(t: &Engine, descriptors: &[Vec<u8>], expect: &[String], streams: usize, rounds: usize) -> Result<f64, Error> {
    let total = (descriptors.len() * rounds) as u64;
    timed_workers(
        streams,
        total,
        || (),
        |(), i| {
            let obj = i as usize % descriptors.len();
            check(t, &descriptors[obj], &expect[obj], obj)
        },
    )
}

/// Runs one EXEC and compares its digest with the host's.
fn check(t: &Engine, descriptor: &[u8], expect: &str, obj: usize) -> Result<(), String> {
    let out = t.exec(1, descriptor).map_err(|e| format!("EXEC on object {obj}: {e}"))?;
    let r = ExecResult::decode(&out.result).map_err(|e| format!("EXEC result of object {obj}: {e}"))?;
    match r.records.first().and_then(|rec| rec.iter().find(|(k, _)| k == "digest")) {
        Some((_, Value::Str(d))) if d == expect => Ok(()),
        other => Err(format!("object {obj}: the offloaded crc32c is {other:?}, the host's {expect}: the target read other bytes than the file holds")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_configuration_is_measured_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let opts = ExecScalingOptions { object_size: 1 << 20, objects: 4, rounds: 1, streams: vec![1, 2], repeat: 1, dir: Some(dir.path().to_path_buf()) };
        let r = exec_scaling(&opts).unwrap();
        assert_eq!(r.results.len(), 4);
        assert!(r.results.iter().all(|row| row.gbps > 0.0));
        // Without a pool nothing is kept; with one, buffers are reused across EXECs.
        let unpooled = r.results.iter().find(|row| !row.pooled && row.streams == 2).unwrap();
        assert_eq!(unpooled.pool_reuses, 0);
        assert!(r.pool.reuses > 0);
        assert!(r.pool.peak_bytes > 0);
        assert!(!dir.path().join("objects.img").exists(), "the work file is removed");
    }

    #[test]
    fn bad_sizes_are_refused_before_any_work() {
        let opts = ExecScalingOptions { object_size: 1000, ..ExecScalingOptions::default() };
        assert!(exec_scaling(&opts).unwrap_err().to_string().contains("multiple of 512"));
    }
}
