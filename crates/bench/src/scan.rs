// SPDX-License-Identifier: Apache-2.0
//! The scan benchmark: how close an offloaded checksum comes to the raw read speed of the
//! same blocks, with the conventional host path beside them. Every measurement starts from
//! cold caches; kinds alternate so drift affects them alike; medians are reported.

use crate::common::{command, drop_caches, gbps, machine, median, Machine, REAL_SPEED};
use crate::dataset::Rng;
use crate::Error;
use insitu_engine::CHUNK;
use insitu_host::{device, virtual_object, Mode, Offloader, Request};
use insitu_image::{Fs, Scratch};
use insitu_media::{AlignedBuf, Backing, DIRECT_ALIGN};
use insitu_proto::{ExtentKind, SECTOR};
use serde::Serialize;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::Instant;

/// What [`scan`] measures.
#[derive(Debug, Clone)]
pub struct ScanOptions {
    /// Checksum function to offload; it must return its result inline. Default `crc32c`.
    pub function: String,
    /// Size of the scanned file in bytes. Default 512 MiB.
    pub size: u64,
    /// Measurements of each kind; the median is reported. Default 3 (0 counts as 1).
    pub repeat: usize,
    /// Work directory for the image. Default `None`: a new directory under /var/tmp,
    /// removed afterwards.
    pub dir: Option<PathBuf>,
}

/// The report of [`scan`].
#[derive(Debug, Clone, Serialize)]
pub struct ScanReport {
    /// The command line that ran it.
    pub command: String,
    /// The checksum function offloaded.
    pub function: String,
    /// Size of the scanned file, bytes.
    pub size_bytes: u64,
    /// Measurements of each kind.
    pub repeat: usize,
    /// Median rate of raw direct reads of the file's extents, GB/s.
    pub raw_read_gbps: f64,
    /// Median rate of the offloaded checksum, GB/s.
    pub offload_gbps: f64,
    /// Median rate of the conventional checksum on the host, GB/s.
    pub conventional_gbps: f64,
    /// `offload_gbps / raw_read_gbps`.
    pub offload_to_raw_ratio: f64,
    /// Extents of the scanned file.
    pub extents: usize,
    /// Seconds of every measurement, by kind.
    pub seconds: ScanSeconds,
    /// The machine it ran on.
    pub machine: Machine,
    /// Whether the raw reads bypassed the page cache.
    pub direct_io: bool,
    /// The device model: none, this machine's real speed.
    pub model: &'static str,
}

/// Seconds of every measurement of [`scan`], in the order taken.
#[derive(Debug, Clone, Serialize)]
pub struct ScanSeconds {
    /// Raw direct reads.
    pub raw: Vec<f64>,
    /// Offloaded checksums.
    pub offload: Vec<f64>,
    /// Conventional checksums.
    pub conventional: Vec<f64>,
}

impl Default for ScanOptions {
    fn default() -> Self {
        ScanOptions { function: "crc32c".into(), size: 512 << 20, repeat: 3, dir: None }
    }
}

/// Reads the data extents of `obj` from `backing` with direct I/O, in the target's chunk
/// size, one request at a time; returns seconds.
fn raw_read(backing: &Backing, obj: &insitu_proto::VirtualObject) -> Result<f64, Error> {
    let mut buf = AlignedBuf::new(CHUNK + 2 * DIRECT_ALIGN);
    let started = Instant::now();
    let mut left = obj.length;
    for e in &obj.extents {
        let len = e.bytes().min(left);
        left -= len;
        if e.kind != ExtentKind::Data {
            continue;
        }
        let mut pos = 0;
        while pos < len {
            let n = (len - pos).min(CHUNK as u64) as usize;
            let slice = backing.read_window(&mut buf, e.start_sector * SECTOR + pos, n).map_err(|e| format!("raw read: {e}"))?;
            std::hint::black_box(slice);
            pos += n as u64;
        }
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Runs the scan benchmark: makes and mounts an ext4 image holding one file of random
/// bytes, then alternates raw direct reads of its extents, the offloaded checksum and the
/// conventional one, each from cold caches (best with root: caches are dropped machine-wide).
///
/// The report has `raw_read_gbps`, `offload_gbps`, `conventional_gbps` (medians),
/// `offload_to_raw_ratio` and the seconds of every measurement. Fails if the function is
/// unknown or returns a result file, or if the two checksums disagree.
pub fn scan(opts: &ScanOptions) -> Result<ScanReport, Error> {
    let (function, size, repeat) = (opts.function.as_str(), opts.size, opts.repeat.max(1));
    let off = Offloader::new().with_local_targets(std::sync::Arc::new(insitu_daemon::LocalEngines));
    if off.registry().get(function).is_none_or(|k| k.output_count() != 0) {
        return Err(format!("{function:?} cannot be benchmarked by scan: choose a function that returns its result inline, e.g. crc32c").into());
    }
    let scratch = Scratch::new(opts.dir.clone(), "bench", size + size / 8 + (64 << 20), Fs::Ext4)?;
    let path = scratch.mnt.join("scan.bin");
    {
        let mut f = File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        Rng::new(42).write_to(&mut f, size).map_err(|e| format!("{}: {e}", path.display()))?;
        f.sync_all().map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let file = File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let map = device::resolve(file.metadata().map_err(|e| e.to_string())?.dev(), &path)?;
    let obj = virtual_object(&file, &path, &map)?;
    let backing = Backing::open(&map.backing, true).map_err(|e| e.to_string())?;
    let req = |mode| Request { function: function.into(), args: vec![], paths: vec![path.clone()], output: None, mode, force: false };
    let (mut raw, mut offl, mut conv) = (Vec::new(), Vec::new(), Vec::new());
    let mut digests = Vec::new();
    for _ in 0..repeat {
        drop_caches(&scratch.image);
        raw.push(raw_read(&backing, &obj)?);
        drop_caches(&scratch.image);
        let r = off.exec(&req(Mode::Offload))?;
        offl.push(r.stats.seconds);
        digests.push(r.results[0].fields["value"].clone());
        drop_caches(&scratch.image);
        let c = off.exec(&req(Mode::Conventional))?;
        conv.push(c.stats.seconds);
        digests.push(c.results[0].fields["value"].clone());
    }
    if digests.windows(2).any(|w| w[0] != w[1]) {
        return Err(format!("offloaded and conventional {function} disagree: {digests:?}").into());
    }
    let (r, o, c) = (gbps(size, median(&mut raw)), gbps(size, median(&mut offl)), gbps(size, median(&mut conv)));
    Ok(ScanReport {
        command: command(),
        function: function.to_string(),
        size_bytes: size,
        repeat,
        raw_read_gbps: r,
        offload_gbps: o,
        conventional_gbps: c,
        offload_to_raw_ratio: o / r,
        extents: obj.extents.len(),
        seconds: ScanSeconds { raw, offload: offl, conventional: conv },
        machine: machine(),
        direct_io: backing.is_direct(),
        model: REAL_SPEED,
    })
}
