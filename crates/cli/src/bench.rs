// SPDX-License-Identifier: Apache-2.0
//! `insitu bench scan`: how close an offloaded checksum comes to the raw read speed of the
//! same blocks, with the conventional host path beside them. Every measurement starts from
//! cold caches; kinds alternate so drift affects them alike; medians are reported.

use crate::dataset::Rng;
use crate::demo::Scratch;
use crate::image::Fs;
use crate::Failure;
use insitu_host::{device, pool::drop_cached_pages, virtual_object, Mode, Offloader, Request};
use insitu_media::{AlignedBuf, Backing, DIRECT_ALIGN};
use insitu_target::CHUNK;
use insitu_wire::{ExtentKind, SECTOR};
use serde_json::json;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Instant;

/// Evicts every clean page cache page on the machine (needs root; best effort otherwise)
/// and the image's own pages.
pub(crate) fn drop_caches(image: &Path) {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
    if let Ok(f) = File::open(image) {
        let _ = drop_cached_pages(&f);
    }
}

/// Reads the data extents of `obj` from `backing` with direct I/O, in the target's chunk
/// size, one request at a time; returns seconds.
fn raw_read(backing: &Backing, obj: &insitu_wire::VirtualObject) -> Result<f64, Failure> {
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

pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the scan benchmark.
pub(crate) fn scan(off: &Offloader, function: &str, size: u64, repeat: usize, dir: Option<std::path::PathBuf>, json_out: bool) -> Result<i32, Failure> {
    if off.registry().get(function).is_none_or(|k| k.output_count() != 0) {
        return Err(format!("{function:?} cannot be benchmarked by scan: choose a function that returns its result inline, e.g. crc32c").into());
    }
    let scratch = Scratch::new(dir, "bench", size + size / 8 + (64 << 20), Fs::Ext4)?;
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
    let gbps = |s: f64| size as f64 / 1e9 / s;
    let (r, o, c) = (gbps(median(&mut raw)), gbps(median(&mut offl)), gbps(median(&mut conv)));
    let out = json!({
        "command": crate::bench_model::command(),
        "function": function,
        "size_bytes": size,
        "repeat": repeat,
        "raw_read_gbps": r,
        "offload_gbps": o,
        "conventional_gbps": c,
        "offload_to_raw_ratio": o / r,
        "extents": obj.extents.len(),
        "seconds": {"raw": raw, "offload": offl, "conventional": conv},
        "machine": crate::bench_model::machine(),
        "direct_io": backing.is_direct(),
        "model": "none (real speed of this machine)",
    });
    if json_out {
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    } else {
        println!("scan of {} MiB, {function}, median of {repeat}:", size >> 20);
        println!("  raw direct read   {r:>7.3} GB/s");
        println!("  offloaded {function:<7} {o:>7.3} GB/s  ({:.1}% of raw)", 100.0 * o / r);
        println!("  conventional      {c:>7.3} GB/s");
    }
    Ok(0)
}
