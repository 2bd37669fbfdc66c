// SPDX-License-Identifier: Apache-2.0
//! The I/O engine benchmark: how close does an offload kernel come to what the device
//! gives through io_uring ([`insitu_media::UringScanner`]: direct I/O, registered buffers,
//! several reads in flight, completions polled)?
//!
//! Over one file, from cold caches, kinds alternating: an embedded EXEC crc32c (the target's
//! read path, end to end: since this benchmark was first run, an io_uring read-ahead with four
//! 2 MiB reads in flight; before, one `pread` at a time, 1.4-2.3x slower, see
//! bench/results/io-engine-pread.md), and crc32c computed over the same bytes streamed
//! through io_uring at several depths and chunk sizes, on one thread. Every digest must
//! agree. The report has one row per engine and shape (`engine`, `chunk_bytes`, `depth`,
//! `gbps`) and the best io_uring shape's ratio to the EXEC (`best_uring_to_exec`).

use crate::common::{command, drop_caches, gbps, machine, median, Machine, Work};
use crate::dataset::Rng;
use crate::Error;
use insitu_engine::{Engine, NamespaceConfig};
use insitu_image::human;
use insitu_media::{Backing, ReadPurpose, UringScanner};
use insitu_proto::{Descriptor, ExecResult, Extent, VirtualObject, SECTOR};
use serde::Serialize;
use std::fs::File;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::time::Instant;

/// io_uring shapes measured: (chunk bytes, reads in flight).
const SHAPES: [(usize, usize); 4] = [(2 << 20, 1), (2 << 20, 4), (512 << 10, 8), (128 << 10, 16)];

/// What `insitu bench io-engine` measures.
#[derive(Debug, Clone)]
pub struct IoEngineOptions {
    /// Bytes of data scanned per measurement.
    pub size: u64,
    /// Measurements of each kind (medians are reported).
    pub repeat: usize,
    /// Directory for the scratch file (default: a temporary directory on disk).
    pub dir: Option<PathBuf>,
}

/// The report of [`io_engine`].
#[derive(Debug, Clone, Serialize)]
pub struct IoEngineReport {
    /// The command line that ran it.
    pub command: String,
    /// Bytes scanned per measurement.
    pub size_bytes: u64,
    /// Measurements of each kind.
    pub repeat: usize,
    /// Whether the io_uring scans bypassed the page cache.
    pub direct_io: bool,
    /// The kernel every engine computes: crc32c.
    pub kernel: &'static str,
    /// One row per engine and shape: the EXEC first, then each io_uring shape.
    pub results: Vec<IoEngineRow>,
    /// The best io_uring shape's rate over the EXEC's.
    pub best_uring_to_exec: f64,
    /// The crc32c every engine computed, as hex.
    pub digest: String,
    /// Seconds of every measurement.
    pub seconds: IoEngineSeconds,
    /// The machine it ran on.
    pub machine: Machine,
}

/// One engine and shape of [`IoEngineReport::results`].
#[derive(Debug, Clone, Serialize)]
pub struct IoEngineRow {
    /// `EXEC crc32c, end to end` or `io_uring`.
    pub engine: &'static str,
    /// Bytes per read.
    pub chunk_bytes: usize,
    /// Reads in flight.
    pub depth: usize,
    /// Median rate, GB/s.
    pub gbps: f64,
}

/// Seconds of every measurement of [`io_engine`], in the order taken.
#[derive(Debug, Clone, Serialize)]
pub struct IoEngineSeconds {
    /// The embedded EXECs.
    pub exec: Vec<f64>,
    /// The io_uring scans, one list per shape of [`IoEngineReport::results`] after the EXEC.
    pub io_uring: Vec<Vec<f64>>,
}

/// Runs the benchmark; see the module docs.
pub fn io_engine(opts: &IoEngineOptions) -> Result<IoEngineReport, Error> {
    let (size, repeat) = (opts.size, opts.repeat.max(1));
    if size < 4 << 20 || !size.is_multiple_of(4096) {
        return Err(format!("--size {size}: give at least 4M, a multiple of 4K, e.g. --size 1G").into());
    }
    let mut work = Work::on_disk(opts.dir.clone(), "io-engine", size)?;
    let path = work.file("io-engine.img");
    {
        let err = |e: std::io::Error| format!("cannot write {}: {e} (is there {} free?)", path.display(), human(size));
        let mut f = File::create(&path).map_err(err)?;
        Rng::new(7).write_to(&mut f, size).map_err(err)?;
        f.sync_all().map_err(err)?;
    }
    let media = Backing::open(&path, true).map_err(|e| e.to_string())?;
    let mut target = Engine::new();
    target.add_namespace(&path, NamespaceConfig::default()).map_err(|e| format!("{}: {e}", path.display()))?;
    let desc = Descriptor::new("crc32c", vec![VirtualObject { offset: 0, length: size, extents: vec![Extent::data(0, (size / SECTOR) as u32)] }]).encode();
    let mut scanners = SHAPES
        .iter()
        .map(|&(chunk, depth)| UringScanner::new(depth, chunk))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("io_uring is not available here: {e}"))?;

    let mut exec_secs = Vec::new();
    let mut uring_secs = vec![Vec::new(); SHAPES.len()];
    let mut digests = Vec::new();
    for _ in 0..repeat {
        drop_caches(&path);
        let started = Instant::now();
        let out = target.exec(1, &desc).map_err(|e| format!("embedded EXEC: {e}"))?;
        exec_secs.push(started.elapsed().as_secs_f64());
        digests.push(("exec".to_string(), crate::fabric::digest(&ExecResult::decode(&out.result).map_err(|e| format!("EXEC result: {e}"))?)));
        for (i, s) in scanners.iter_mut().enumerate() {
            drop_caches(&path);
            let started = Instant::now();
            let mut crc = 0u32;
            s.scan(&media, 0, size, ReadPurpose::Offload, |b| {
                crc = crc32c::crc32c_append(crc, b);
                ControlFlow::Continue(())
            })
            .map_err(|e| format!("io_uring scan of {}: {e}", path.display()))?;
            uring_secs[i].push(started.elapsed().as_secs_f64());
            digests.push((format!("io_uring {i}"), format!("{crc:08x}")));
        }
    }
    if let Some((name, d)) = digests.iter().find(|(_, d)| *d != digests[0].1) {
        return Err(format!("{name} computed crc32c {d}, the EXEC {}: the engines read different bytes", digests[0].1).into());
    }
    let today = gbps(size, median(&mut exec_secs.clone()));
    // The EXEC's own read path: 2 MiB chunks, 4 in flight (the target's stream constants).
    let mut rows = vec![IoEngineRow { engine: "EXEC crc32c, end to end", chunk_bytes: 2 << 20, depth: 4, gbps: today }];
    let mut best = 0f64;
    for (&(chunk, depth), secs) in SHAPES.iter().zip(&uring_secs) {
        let r = gbps(size, median(&mut secs.clone()));
        best = best.max(r);
        rows.push(IoEngineRow { engine: "io_uring", chunk_bytes: chunk, depth, gbps: r });
    }
    let report = IoEngineReport {
        command: command(),
        size_bytes: size,
        repeat,
        direct_io: media.is_direct(),
        kernel: "crc32c",
        results: rows,
        best_uring_to_exec: best / today,
        digest: digests[0].1.clone(),
        seconds: IoEngineSeconds { exec: exec_secs, io_uring: uring_secs },
        machine: machine(),
    };
    drop(work);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_engines_agree_on_a_small_file() {
        let dir = tempfile::tempdir().unwrap();
        let r = match io_engine(&IoEngineOptions { size: 4 << 20, repeat: 1, dir: Some(dir.path().to_owned()) }) {
            Err(e) if e.to_string().contains("io_uring is not available") => return,
            r => r.unwrap(),
        };
        assert_eq!(r.results.len(), 1 + SHAPES.len());
        assert!(r.best_uring_to_exec > 0.0);
        assert_eq!(r.digest.len(), 8);
    }
}
