// SPDX-License-Identifier: Apache-2.0
//! `insitu bench fabric`: what NVMe/TCP costs. In one run, over the same file, with cold
//! caches before every measurement and kinds alternating so drift affects them alike:
//!
//! * raw sequential direct reads of the file (1 MiB requests, one at a time);
//! * 128 KiB reads at queue depth 32 over NVMe/TCP on loopback, from an in-process target;
//! * EXEC crc32c over the data on an embedded [`Target`];
//! * the same EXEC over the fabric, its result written to a result object at the end of
//!   the namespace and read back with Read; the bytes on the wire are counted.
//!
//! Medians are reported, with the ratios fabric/raw and fabric/embedded.

use crate::bench::{drop_caches, median};
use crate::dataset::Rng;
use crate::size::human;
use crate::Failure;
use insitu_initiator::{ConnectOptions, Session};
use insitu_media::{AlignedBuf, Backing, DIRECT_ALIGN};
use insitu_nvmf::{NamespaceSpec, Server, SubsystemConfig, TargetConfig};
use insitu_target::{NamespaceConfig, Target};
use insitu_wire::{Descriptor, ExecResult, Extent, Value, VirtualObject, SECTOR};
use serde_json::json;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Subsystem the in-process target serves.
const NQN: &str = "nqn.2024-01.io.insitu:bench-fabric";
/// Raw read request size.
const RAW_IO: usize = 1 << 20;
/// Fabric read request size.
const READ_IO: usize = 128 << 10;
/// Fabric reads outstanding at once (one thread each).
const QUEUE_DEPTH: usize = 32;
/// I/O queues the fabric reads spread over.
const IO_QUEUES: u16 = 4;
/// Reserved area after the data region that holds the fabric EXEC's result object.
const RESULT_AREA: u64 = 1 << 20;
/// Extents the EXEC input is described with.
const EXTENTS: u64 = 4;
/// Most bytes a fabric EXEC may move on the wire (descriptor, result, headers).
const WIRE_LIMIT: u64 = 1 << 20;

/// The benchmark's file: `size` bytes of data then the result area, in a work directory;
/// removed on drop.
struct Work {
    root: PathBuf,
    file: PathBuf,
    remove_root: bool,
}

impl Work {
    fn new(dir: Option<PathBuf>, size: u64) -> Result<Work, Failure> {
        let remove_root = dir.is_none();
        let root = dir.unwrap_or_else(|| PathBuf::from(format!("/var/tmp/insitu-fabric-{}", std::process::id())));
        std::fs::create_dir_all(&root).map_err(|e| format!("cannot create the work directory {}: {e}", root.display()))?;
        let w = Work { file: root.join("fabric.img"), root, remove_root };
        let err = |e: std::io::Error| format!("cannot write the benchmark file {}: {e} (is there {} free?)", w.file.display(), human(size + RESULT_AREA));
        let mut f = File::create(&w.file).map_err(err)?;
        Rng::new(42).write_to(&mut f, size).map_err(err)?;
        f.set_len(size + RESULT_AREA).map_err(err)?;
        f.sync_all().map_err(err)?;
        Ok(w)
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
        if self.remove_root {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// Reads `[0, size)` of `backing` with direct I/O, `RAW_IO` bytes at a time; returns seconds.
fn raw_read(backing: &Backing, size: u64) -> Result<f64, Failure> {
    let mut buf = AlignedBuf::new(RAW_IO + 2 * DIRECT_ALIGN);
    let started = Instant::now();
    let mut pos = 0;
    while pos < size {
        let n = (size - pos).min(RAW_IO as u64) as usize;
        let slice = backing.read_window(&mut buf, pos, n).map_err(|e| format!("raw read of {} at {pos}: {e}", backing.path().display()))?;
        std::hint::black_box(slice);
        pos += n as u64;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Reads `[0, size)` of namespace 1 in `READ_IO` requests from `QUEUE_DEPTH` threads, each
/// taking the next request in order; returns seconds.
fn fabric_read(s: &Session, size: u64) -> Result<f64, Failure> {
    let next = AtomicU64::new(0);
    let error = Mutex::new(None);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..QUEUE_DEPTH {
            scope.spawn(|| {
                let mut buf = vec![0u8; READ_IO];
                loop {
                    let off = next.fetch_add(READ_IO as u64, Ordering::Relaxed);
                    if off >= size {
                        return;
                    }
                    let n = (size - off).min(READ_IO as u64) as usize;
                    if let Err(e) = s.read_into(1, off / SECTOR, &mut buf[..n]) {
                        *error.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!("fabric read at byte {off}: {e}"));
                        next.store(size, Ordering::Relaxed);
                        return;
                    }
                    std::hint::black_box(&buf);
                }
            });
        }
    });
    let secs = started.elapsed().as_secs_f64();
    match error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e.into()),
        None => Ok(secs),
    }
}

/// crc32c over `[0, size)` in `EXTENTS` extents; with `result_object`, the result goes to
/// the reserved area after the data.
fn descriptor(size: u64, result_object: bool) -> Vec<u8> {
    let sectors = size / SECTOR;
    let per = sectors.div_ceil(EXTENTS).min(u64::from(u32::MAX));
    let mut extents = Vec::new();
    let mut at = 0;
    while at < sectors {
        let n = (sectors - at).min(per);
        extents.push(Extent::data(at, n as u32));
        at += n;
    }
    let mut d = Descriptor::new("crc32c", vec![VirtualObject { length: size, extents }]);
    if result_object {
        d.result = Some(VirtualObject { length: RESULT_AREA, extents: vec![Extent::data(sectors, (RESULT_AREA / SECTOR) as u32)] });
    }
    d.encode()
}

/// Runs the embedded EXEC; returns seconds and the result.
fn embedded_exec(t: &Target, desc: &[u8]) -> Result<(f64, ExecResult), Failure> {
    let started = Instant::now();
    let out = t.exec(1, desc).map_err(|e| format!("embedded EXEC: {e}"))?;
    let secs = started.elapsed().as_secs_f64();
    Ok((secs, ExecResult::decode(&out.result).map_err(|e| format!("embedded EXEC result: {e}"))?))
}

/// Runs the EXEC over the fabric and reads its result object; returns seconds, the result
/// and the bytes moved on the wire (both directions).
fn fabric_exec(s: &Session, desc: &[u8], size: u64) -> Result<(f64, ExecResult, u64), Failure> {
    let before = s.stats();
    let started = Instant::now();
    let cqe = s.exec(1, desc).map_err(|e| format!("fabric EXEC: {e}"))?;
    let len = cqe.dw0 as u64;
    if len == 0 || len > RESULT_AREA {
        return Err(format!("fabric EXEC reported a {len}-byte result; the result object holds 1..={RESULT_AREA}").into());
    }
    let raw = s.read(1, size / SECTOR, len.div_ceil(SECTOR) as u32).map_err(|e| format!("reading the fabric EXEC's result object: {e}"))?;
    let secs = started.elapsed().as_secs_f64();
    let after = s.stats();
    let wire = (after.bytes_sent - before.bytes_sent) + (after.bytes_received - before.bytes_received);
    let result = ExecResult::decode(&raw[..len as usize]).map_err(|e| format!("fabric EXEC result object: {e}"))?;
    Ok((secs, result, wire))
}

/// The fabric returns the same bytes as a direct read, at the start and the end.
fn spot_check(s: &Session, backing: &Backing, size: u64) -> Result<(), Failure> {
    let mut buf = AlignedBuf::new(READ_IO + 2 * DIRECT_ALIGN);
    for off in [0, size.saturating_sub(READ_IO as u64)] {
        let n = (size - off).min(READ_IO as u64) as usize;
        let want = backing.read_window(&mut buf, off, n).map_err(|e| e.to_string())?.to_vec();
        let got = s.read(1, off / SECTOR, (n as u64 / SECTOR) as u32).map_err(|e| format!("fabric read at byte {off}: {e}"))?;
        if got != want {
            return Err(format!("the fabric returned different bytes than the file at byte {off}: the target or initiator corrupts reads").into());
        }
    }
    Ok(())
}

/// The crc32c digest of a result, as hex.
fn digest(r: &ExecResult) -> String {
    match r.records.first().and_then(|rec| rec.iter().find(|(k, _)| k == "digest")) {
        Some((_, Value::Str(hex))) => hex.clone(),
        Some((_, other)) => format!("{other:?}"),
        None => String::new(),
    }
}

/// Runs the fabric benchmark.
pub(crate) fn run(size: u64, repeat: usize, dir: Option<PathBuf>, json_out: bool) -> Result<i32, Failure> {
    if size < RAW_IO as u64 || !size.is_multiple_of(4096) {
        return Err(format!("--size {size}: give at least 1M, a multiple of 4K, e.g. --size 1G").into());
    }
    let work = Work::new(dir, size)?;
    let path: &Path = &work.file;
    let backing = Backing::open(path, true).map_err(|e| e.to_string())?;
    let cfg = TargetConfig {
        listen: ([127, 0, 0, 1], 0).into(),
        subsystems: vec![SubsystemConfig { nqn: NQN.into(), namespaces: vec![NamespaceSpec::sharable(path)], allow_hosts: vec![] }],
        ..TargetConfig::default()
    };
    let server = Server::bind(cfg).map_err(|e| format!("cannot start the in-process target: {e}"))?.spawn();
    let opts = ConnectOptions { io_queues: IO_QUEUES, queue_depth: QUEUE_DEPTH as u16, ..ConnectOptions::new(server.local_addr().to_string(), NQN) };
    let session = Session::connect(opts).map_err(|e| format!("cannot connect to the in-process target at {}: {e}", server.local_addr()))?;
    let mut embedded = Target::new();
    embedded.add_namespace(path, NamespaceConfig::default()).map_err(|e| format!("{}: {e}", path.display()))?;
    spot_check(&session, &backing, size)?;
    let (inline_desc, fabric_desc) = (descriptor(size, false), descriptor(size, true));

    let (mut raw, mut fread, mut emb, mut fexec, mut wire) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut digests = Vec::new();
    for _ in 0..repeat {
        drop_caches(path);
        raw.push(raw_read(&backing, size)?);
        drop_caches(path);
        fread.push(fabric_read(&session, size)?);
        drop_caches(path);
        let (secs, r) = embedded_exec(&embedded, &inline_desc)?;
        emb.push(secs);
        digests.push(r);
        drop_caches(path);
        let (secs, r, bytes) = fabric_exec(&session, &fabric_desc, size)?;
        fexec.push(secs);
        digests.push(r);
        wire.push(bytes);
    }
    if digests.windows(2).any(|w| w[0] != w[1]) {
        let all: Vec<String> = digests.iter().map(digest).collect();
        return Err(format!("embedded and fabric crc32c disagree (embedded, fabric, ...): {all:?}").into());
    }
    let wire_max = wire.iter().copied().max().unwrap_or(0);
    let stats = session.stats();
    let mdts = session.max_transfer();
    let _ = session.disconnect();
    server.shutdown();

    let gbps = |s: f64| size as f64 / 1e9 / s;
    let (r, fr, e, fe) = (gbps(median(&mut raw.clone())), gbps(median(&mut fread.clone())), gbps(median(&mut emb.clone())), gbps(median(&mut fexec.clone())));
    let out = json!({
        "command": crate::bench_model::command(),
        "size_bytes": size,
        "repeat": repeat,
        "raw_read_gbps": r,
        "fabric_read_gbps": fr,
        "embedded_exec_gbps": e,
        "fabric_exec_gbps": fe,
        "fabric_read_to_raw": fr / r,
        "fabric_exec_to_embedded": fe / e,
        "fabric_exec_wire_bytes": wire_max,
        "digest": digest(&digests[0]),
        "requests": {
            "raw_read_bytes": RAW_IO, "raw_queue_depth": 1,
            "fabric_read_bytes": READ_IO, "fabric_queue_depth": QUEUE_DEPTH, "io_queues": IO_QUEUES,
            "exec_extents": EXTENTS, "max_transfer_bytes": mdts,
        },
        "session_wire_bytes": {"sent": stats.bytes_sent, "received": stats.bytes_received, "reconnects": stats.reconnects},
        "seconds": {"raw": raw, "fabric_read": fread, "embedded_exec": emb, "fabric_exec": fexec},
        "machine": crate::bench_model::machine(),
        "direct_io": backing.is_direct(),
        "transport": "NVMe/TCP over loopback to an in-process insitu target, no digests",
        "model": "none (real speed of this machine)",
    });
    if json_out {
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    } else {
        println!("fabric benchmark over {}, median of {repeat}, cold caches, NVMe/TCP on loopback:", human(size));
        println!("  raw direct read, 1 MiB requests           {r:>7.3} GB/s");
        println!("  fabric read, 128 KiB at QD{QUEUE_DEPTH}, {IO_QUEUES} queues    {fr:>7.3} GB/s  ({:.1}% of raw)", 100.0 * fr / r);
        println!("  embedded EXEC crc32c                      {e:>7.3} GB/s");
        println!("  fabric EXEC crc32c + result read          {fe:>7.3} GB/s  ({:.1}% of embedded)", 100.0 * fe / e);
        println!("  fabric EXEC bytes on the wire             {wire_max:>7} B     (for {} of data)", human(size));
    }
    if wire_max >= WIRE_LIMIT {
        return Err(format!("a fabric EXEC moved {wire_max} bytes on the wire, over the {WIRE_LIMIT}-byte bound: the data is crossing the fabric").into());
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use insitu_wire::Limits;

    #[test]
    fn descriptors_cover_the_data_and_put_the_result_after_it() {
        let size = 10 << 20;
        let d = Descriptor::decode(&descriptor(size, true), &Limits::default()).unwrap();
        let input = &d.inputs[0];
        assert_eq!((input.length, input.extent_bytes(), input.extents.len() as u64), (size, size, EXTENTS));
        assert!(input.extents.windows(2).all(|w| w[0].start_sector + u64::from(w[0].sectors) == w[1].start_sector));
        let r = d.result.clone().expect("result object");
        assert_eq!((r.extents[0].start_sector, r.length), (size / SECTOR, RESULT_AREA));
        assert!(d.check_extents(size + RESULT_AREA).is_ok());
        assert!(Descriptor::decode(&descriptor(size, false), &Limits::default()).unwrap().result.is_none());
    }

    #[test]
    fn fabric_and_embedded_agree_on_a_small_file() {
        let dir = tempfile::tempdir().unwrap();
        let code = run(2 << 20, 1, Some(dir.path().to_path_buf()), true).map_err(|f| f.message).unwrap();
        assert_eq!(code, 0);
        assert!(!dir.path().join("fabric.img").exists(), "the work file is removed");
    }
}
