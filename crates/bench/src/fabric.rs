// SPDX-License-Identifier: Apache-2.0
//! The fabric benchmark: what NVMe/TCP costs. In one run, over the same file, with cold
//! caches before every measurement and kinds alternating so drift affects them alike (odd
//! rounds in the reverse order, so that no side of a ratio always goes first):
//!
//! * raw sequential direct reads of the file (1 MiB requests, one at a time);
//! * raw direct reads with the fabric read's shape: 128 KiB requests, 32 in flight (one
//!   thread per request, as an io_uring or libaio reader at that depth keeps the device
//!   busy); a drive that serves small requests slower than large ones sets the fabric's
//!   ceiling here, not at the 1 MiB rate;
//! * 128 KiB reads at queue depth 32 over NVMe/TCP on loopback, from an in-process target
//!   that sends host reads from the page cache (its default), and from one that reads them
//!   with direct I/O (`--direct-reads`);
//! * EXEC crc32c over the data on an embedded [`Engine`];
//! * the same EXEC over the fabric, its result written to a result object at the end of
//!   the namespace and read back with Read; the bytes on the wire are counted;
//! * the ceiling the fabric reads are held to: plain TCP on loopback serving the same file
//!   with the same request size, connections, requests outstanding and client buffers, and
//!   no NVMe framing; and, for reference, plain TCP from a buffer that stays in cache
//!   ([`crate::tcp`]).
//!
//! Medians are reported, with the ratios fabric/raw (both), fabric/TCP (both) and fabric/embedded.
//!
//! Adding a measurement: a function that takes the [`Rig`] and returns seconds, a series in
//! [`Samples`], a line in [`Samples::round`] and its fields in [`FabricReport`] and [`report`].

use crate::common::{command, drop_caches, gbps, machine, median, timed_workers, Machine, Work, REAL_SPEED};
use crate::dataset::Rng;
use crate::tcp::{tcp_loopback, Source, TcpLoad};
use crate::Error;
use insitu_daemon::{NamespaceSpec, ServerHandle, SubsystemConfig, Target, TargetConfig};
use insitu_engine::{Engine, NamespaceConfig};
use insitu_image::human;
use insitu_initiator::{ConnectOptions, Session};
use insitu_media::{AlignedBuf, Backing, DIRECT_ALIGN};
use insitu_proto::{Descriptor, ExecResult, Extent, Value, VirtualObject, SECTOR};
use serde::Serialize;
use std::fs::File;
use std::path::PathBuf;
use std::time::Instant;

/// What [`fabric`] measures.
#[derive(Debug, Clone)]
pub struct FabricOptions {
    /// Size of the data region in bytes: at least 1 MiB, a multiple of 4 KiB. Default 1 GiB.
    pub size: u64,
    /// Measurements of each kind; the median is reported. Default 3 (0 counts as 1).
    pub repeat: usize,
    /// Work directory for the file. Default `None`: a new directory under /var/tmp, removed
    /// afterwards.
    pub dir: Option<PathBuf>,
}

impl Default for FabricOptions {
    fn default() -> Self {
        FabricOptions { size: 1 << 30, repeat: 3, dir: None }
    }
}

/// Subsystem the in-process target serves.
const NQN: &str = "nqn.2024-01.io.insitu:bench-fabric";
/// Raw read request size.
const RAW_IO: usize = 1 << 20;
/// Fabric read request size.
const READ_IO: usize = 128 << 10;
/// Fabric reads outstanding at once, over all queues.
const QUEUE_DEPTH: usize = 32;
/// Bytes one reading thread asks for per call: 64 `READ_IO` commands, so that the queue's
/// window of commands in flight drains only once per 8 MiB.
const READ_SPAN: usize = 64 * READ_IO;
/// I/O queues the fabric reads spread over.
const IO_QUEUES: u16 = 4;
/// Reserved area after the data region that holds the fabric EXEC's result object.
const RESULT_AREA: u64 = 1 << 20;
/// Extents the EXEC input is described with.
const EXTENTS: u64 = 4;
/// Most bytes a fabric EXEC may move on the wire (descriptor, result, headers).
const WIRE_LIMIT: u64 = 1 << 20;

/// Writes the benchmark's file: `size` random bytes then the result area.
fn write_file(path: &std::path::Path, size: u64) -> Result<(), Error> {
    let err = |e: std::io::Error| format!("cannot write the benchmark file {}: {e} (is there {} free?)", path.display(), human(size + RESULT_AREA));
    let mut f = File::create(path).map_err(err)?;
    Rng::new(42).write_to(&mut f, size).map_err(err)?;
    f.set_len(size + RESULT_AREA).map_err(err)?;
    f.sync_all().map_err(err)?;
    Ok(())
}

/// Reads `[start, end)` of `backing` with direct I/O into `buf`, `RAW_IO` bytes at a time.
fn read_range(backing: &Backing, buf: &mut AlignedBuf, start: u64, end: u64) -> Result<(), String> {
    let mut pos = start;
    while pos < end {
        let n = (end - pos).min(RAW_IO as u64) as usize;
        let slice = backing.read_window(buf, pos, n).map_err(|e| format!("raw read of {} at {pos}: {e}", backing.path().display()))?;
        std::hint::black_box(slice);
        pos += n as u64;
    }
    Ok(())
}

/// Reads `[0, size)` of `backing` with direct I/O, `RAW_IO` bytes at a time; returns seconds.
fn raw_read(backing: &Backing, size: u64) -> Result<f64, Error> {
    let mut buf = AlignedBuf::new(RAW_IO + 2 * DIRECT_ALIGN);
    let started = Instant::now();
    read_range(backing, &mut buf, 0, size)?;
    Ok(started.elapsed().as_secs_f64())
}

/// Reads `[0, size)` of `backing` with direct I/O, `READ_IO` bytes per request and
/// `QUEUE_DEPTH` requests in flight (one thread each, taking the next request from a shared
/// counter); returns seconds.
fn raw_read_shaped(backing: &Backing, size: u64) -> Result<f64, Error> {
    timed_workers(
        QUEUE_DEPTH,
        size.div_ceil(READ_IO as u64),
        || AlignedBuf::new(READ_IO + 2 * DIRECT_ALIGN),
        |buf, i| {
            let off = i * READ_IO as u64;
            let n = (size - off).min(READ_IO as u64) as usize;
            let slice = backing.read_window(buf, off, n).map_err(|e| format!("raw read of {} at {off}: {e}", backing.path().display()))?;
            std::hint::black_box(slice);
            Ok(())
        },
    )
}

/// Reads `[0, size)` of `backing` with direct I/O in the streams the fabric read makes:
/// `IO_QUEUES` threads, each taking the next `READ_SPAN` bytes and reading them in `RAW_IO`
/// requests (what the target would ask of the drive if it merged each queue's window into
/// one read); returns seconds. Next to [`raw_read`] (one stream) it shows what four
/// streams cost on this drive.
fn raw_read_streams(backing: &Backing, size: u64) -> Result<f64, Error> {
    timed_workers(
        usize::from(IO_QUEUES),
        size.div_ceil(READ_SPAN as u64),
        || AlignedBuf::new(RAW_IO + 2 * DIRECT_ALIGN),
        |buf, i| read_range(backing, buf, i * READ_SPAN as u64, ((i + 1) * READ_SPAN as u64).min(size)),
    )
}

/// Reads `[0, size)` of namespace 1 in `READ_IO` requests with `QUEUE_DEPTH` in flight, as
/// a kernel initiator drives its queues: one thread per I/O queue, each reading the next
/// `READ_SPAN` bytes with one call that the session splits into `READ_IO` commands and
/// pipelines on one queue (the queue's depth is `QUEUE_DEPTH / IO_QUEUES`); returns seconds.
fn fabric_read(s: &Session, size: u64) -> Result<f64, Error> {
    timed_workers(
        usize::from(IO_QUEUES),
        size.div_ceil(READ_SPAN as u64),
        || vec![0u8; READ_SPAN],
        |buf, i| {
            let off = i * READ_SPAN as u64;
            let n = (size - off).min(READ_SPAN as u64) as usize;
            s.read_into(1, off / SECTOR, &mut buf[..n]).map_err(|e| format!("fabric read at byte {off}: {e}"))?;
            std::hint::black_box(&buf);
            Ok(())
        },
    )
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
    let mut d = Descriptor::new("crc32c", vec![VirtualObject { offset: 0, length: size, extents }]);
    if result_object {
        d.result = Some(VirtualObject { offset: 0, length: RESULT_AREA, extents: vec![Extent::data(sectors, (RESULT_AREA / SECTOR) as u32)] });
    }
    d.encode()
}

/// Runs the embedded EXEC; returns seconds and the result.
fn embedded_exec(t: &Engine, desc: &[u8]) -> Result<(f64, ExecResult), Error> {
    let started = Instant::now();
    let out = t.exec(1, desc).map_err(|e| format!("embedded EXEC: {e}"))?;
    let secs = started.elapsed().as_secs_f64();
    Ok((secs, ExecResult::decode(&out.result).map_err(|e| format!("embedded EXEC result: {e}"))?))
}

/// Runs the EXEC over the fabric and reads its result object; returns seconds, the result
/// and the bytes moved on the wire (both directions).
fn fabric_exec(s: &Session, desc: &[u8], size: u64) -> Result<(f64, ExecResult, u64), Error> {
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
fn spot_check(s: &Session, backing: &Backing, size: u64) -> Result<(), Error> {
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
pub(crate) fn digest(r: &ExecResult) -> String {
    match r.records.first().and_then(|rec| rec.iter().find(|(k, _)| k == "digest")) {
        Some((_, Value::Str(hex))) => hex.clone(),
        Some((_, other)) => format!("{other:?}"),
        None => String::new(),
    }
}

/// The file, an in-process NVMe/TCP target serving it with a session connected, and an
/// embedded target over the same file.
struct Rig {
    work: Work,
    path: PathBuf,
    size: u64,
    backing: Backing,
    server: ServerHandle,
    session: Session,
    /// A second target over the file that reads host data with direct I/O.
    direct: (ServerHandle, Session),
    embedded: Engine,
    /// crc32c with the result inline (embedded) and in a result object (fabric).
    inline_desc: Vec<u8>,
    fabric_desc: Vec<u8>,
}

impl Rig {
    fn new(opts: &FabricOptions) -> Result<Rig, Error> {
        let size = opts.size;
        let mut work = Work::on_disk(opts.dir.clone(), "fabric", size + RESULT_AREA)?;
        let path = work.file("fabric.img");
        write_file(&path, size)?;
        let backing = Backing::open(&path, true).map_err(|e| e.to_string())?;
        let serve = |direct_reads: bool| -> Result<(ServerHandle, Session), Error> {
            let cfg = TargetConfig {
                listen: ([127, 0, 0, 1], 0).into(),
                subsystems: vec![SubsystemConfig { nqn: NQN.into(), namespaces: vec![NamespaceSpec::sharable(&path)], allow_hosts: vec![] }],
                direct_reads,
                ..TargetConfig::default()
            };
            let server = Target::bind(cfg).map_err(|e| format!("cannot start the in-process target: {e}"))?.spawn();
            let depth = (QUEUE_DEPTH / IO_QUEUES as usize) as u16;
            let opts = ConnectOptions {
                io_queues: IO_QUEUES,
                queue_depth: depth,
                max_io_bytes: Some(READ_IO),
                ..ConnectOptions::new(server.local_addr().to_string(), NQN)
            };
            let session = Session::connect(opts).map_err(|e| format!("cannot connect to the in-process target at {}: {e}", server.local_addr()))?;
            spot_check(&session, &backing, size)?;
            Ok((server, session))
        };
        let (server, session) = serve(false)?;
        let direct = serve(true)?;
        let mut embedded = Engine::new();
        embedded.add_namespace(&path, NamespaceConfig::default()).map_err(|e| format!("{}: {e}", path.display()))?;
        let (inline_desc, fabric_desc) = (descriptor(size, false), descriptor(size, true));
        Ok(Rig { work, path, size, backing, server, session, direct, embedded, inline_desc, fabric_desc })
    }

    /// Drops the caches before a measurement.
    fn cold(&self) {
        drop_caches(&self.path);
    }
}

/// Every measurement of one run, by kind, in the order taken.
#[derive(Default)]
struct Samples {
    raw: Vec<f64>,
    /// Raw direct reads with the fabric read's request size and depth.
    raw_shaped: Vec<f64>,
    /// Raw direct reads in the streams the fabric's queues make once merged.
    raw_streams: Vec<f64>,
    fabric_read: Vec<f64>,
    /// Fabric reads from the target that reads host data with direct I/O.
    fabric_read_direct: Vec<f64>,
    embedded_exec: Vec<f64>,
    fabric_exec: Vec<f64>,
    /// Plain TCP on loopback moving the file's bytes as a fabric read does.
    tcp: Vec<f64>,
    /// Plain TCP on loopback moving as many bytes from a buffer in cache.
    tcp_cached: Vec<f64>,
    /// Bytes on the wire of each fabric EXEC.
    wire: Vec<u64>,
    /// EXEC results (embedded, fabric, embedded, ...): they must all agree.
    digests: Vec<ExecResult>,
}

/// The kinds of measurement in a round, in the order of an even round.
#[derive(Clone, Copy)]
enum Kind {
    Raw,
    RawShaped,
    RawStreams,
    FabricRead,
    FabricReadDirect,
    Tcp,
    TcpCached,
    EmbeddedExec,
    FabricExec,
}

const ROUND: [Kind; 9] =
    [Kind::Raw, Kind::RawShaped, Kind::RawStreams, Kind::FabricRead, Kind::FabricReadDirect, Kind::Tcp, Kind::TcpCached, Kind::EmbeddedExec, Kind::FabricExec];

impl Samples {
    /// One measurement of each kind, each from cold caches; `reversed` runs them in the
    /// opposite order, so that over an even number of rounds neither side of a ratio always
    /// goes first on a disk that slows (or warms) as it is read.
    fn round(&mut self, rig: &Rig, reversed: bool) -> Result<(), Error> {
        let mut kinds = ROUND;
        if reversed {
            kinds.reverse();
        }
        for kind in kinds {
            self.measure(rig, kind)?;
        }
        Ok(())
    }

    fn measure(&mut self, rig: &Rig, kind: Kind) -> Result<(), Error> {
        let load = TcpLoad { request: READ_IO, connections: usize::from(IO_QUEUES), depth: QUEUE_DEPTH, span: READ_SPAN };
        rig.cold();
        match kind {
            Kind::Raw => self.raw.push(raw_read(&rig.backing, rig.size)?),
            Kind::RawShaped => self.raw_shaped.push(raw_read_shaped(&rig.backing, rig.size)?),
            Kind::RawStreams => self.raw_streams.push(raw_read_streams(&rig.backing, rig.size)?),
            Kind::FabricRead => self.fabric_read.push(fabric_read(&rig.session, rig.size)?),
            Kind::FabricReadDirect => self.fabric_read_direct.push(fabric_read(&rig.direct.1, rig.size)?),
            Kind::Tcp => self.tcp.push(tcp_loopback(rig.size, load, Source::File(&rig.path)).map_err(|e| format!("loopback TCP ceiling: {e}"))?),
            Kind::TcpCached => self.tcp_cached.push(tcp_loopback(rig.size, load, Source::Cached).map_err(|e| format!("loopback TCP ceiling from cache: {e}"))?),
            Kind::EmbeddedExec => {
                let (secs, r) = embedded_exec(&rig.embedded, &rig.inline_desc)?;
                self.embedded_exec.push(secs);
                self.digests.push(r);
            }
            Kind::FabricExec => {
                let (secs, r, bytes) = fabric_exec(&rig.session, &rig.fabric_desc, rig.size)?;
                self.fabric_exec.push(secs);
                self.digests.push(r);
                self.wire.push(bytes);
            }
        }
        Ok(())
    }
}

/// The report of [`fabric`]. Rates are medians, in GB/s; a ratio `a_to_b` is `a / b`, and
/// its `_paired` form the median of the per-round ratios (steadier on a disk whose speed
/// drifts between rounds).
#[derive(Debug, Clone, Serialize)]
pub struct FabricReport {
    /// The command line that ran it.
    pub command: String,
    /// Size of the data, bytes.
    pub size_bytes: u64,
    /// Measurements of each kind.
    pub repeat: usize,
    /// Raw sequential direct reads, 1 MiB at a time.
    pub raw_read_gbps: f64,
    /// Raw direct reads with the fabric read's request size and depth.
    pub raw_read_shaped_gbps: f64,
    /// Raw 1 MiB direct reads in the fabric's streams.
    pub raw_read_streams_gbps: f64,
    /// Fabric reads from the target that sends host reads from the page cache.
    pub fabric_read_gbps: f64,
    /// Fabric reads from the target that reads host data with direct I/O.
    pub fabric_read_direct_gbps: f64,
    /// EXEC crc32c on the embedded target.
    pub embedded_exec_gbps: f64,
    /// The same EXEC over the fabric, with its result object read back.
    pub fabric_exec_gbps: f64,
    /// Plain TCP on loopback serving the file with the fabric read's shape.
    pub tcp_loopback_gbps: f64,
    /// Plain TCP on loopback from a buffer that stays in cache.
    pub tcp_loopback_cached_gbps: f64,
    /// Fabric read over raw read.
    pub fabric_read_to_raw: f64,
    /// Fabric read over the shaped raw read.
    pub fabric_read_to_raw_shaped: f64,
    /// Fabric read over raw read, paired.
    pub fabric_read_to_raw_paired: f64,
    /// Fabric read over the shaped raw read, paired.
    pub fabric_read_to_raw_shaped_paired: f64,
    /// Fabric read over the raw reads in streams.
    pub fabric_read_to_raw_streams: f64,
    /// Fabric read over the raw reads in streams, paired.
    pub fabric_read_to_raw_streams_paired: f64,
    /// Direct-I/O fabric read over raw read.
    pub fabric_read_direct_to_raw: f64,
    /// Direct-I/O fabric read over raw read, paired.
    pub fabric_read_direct_to_raw_paired: f64,
    /// Fabric read over the direct-I/O fabric read, paired.
    pub fabric_read_to_direct_paired: f64,
    /// Fabric read over plain TCP serving the file.
    pub fabric_read_to_tcp: f64,
    /// Fabric read over plain TCP from cache.
    pub fabric_read_to_tcp_cached: f64,
    /// Fabric EXEC over embedded EXEC.
    pub fabric_exec_to_embedded: f64,
    /// Fabric EXEC over embedded EXEC, paired.
    pub fabric_exec_to_embedded_paired: f64,
    /// Most bytes one fabric EXEC moved on the wire, both directions.
    pub fabric_exec_wire_bytes: u64,
    /// The crc32c of the data, as hex.
    pub digest: String,
    /// The shapes of the requests.
    pub requests: FabricRequests,
    /// What the page-cache target's session moved over the whole run.
    pub session_wire_bytes: SessionWireBytes,
    /// Seconds of every measurement.
    pub seconds: FabricSeconds,
    /// The machine it ran on.
    pub machine: Machine,
    /// Whether the raw reads bypassed the page cache.
    pub direct_io: bool,
    /// Whether the file lives in memory (tmpfs).
    pub in_memory: bool,
    /// How the fabric runs.
    pub transport: &'static str,
    /// Where the targets send host reads from.
    pub host_reads: &'static str,
    /// The device model: none, this machine's real speed.
    pub model: &'static str,
}

/// The request shapes of [`FabricReport::requests`].
#[derive(Debug, Clone, Serialize)]
pub struct FabricRequests {
    /// Bytes per raw read.
    pub raw_read_bytes: usize,
    /// Raw reads in flight.
    pub raw_queue_depth: usize,
    /// Bytes per fabric read command.
    pub fabric_read_bytes: usize,
    /// Fabric reads in flight, over all queues.
    pub fabric_queue_depth: usize,
    /// I/O queues the fabric reads spread over.
    pub io_queues: u16,
    /// Extents the EXEC input is described with.
    pub exec_extents: u64,
    /// Largest transfer the session's target accepts, bytes.
    pub max_transfer_bytes: usize,
}

/// Bytes a session moved ([`FabricReport::session_wire_bytes`]).
#[derive(Debug, Clone, Serialize)]
pub struct SessionWireBytes {
    /// Bytes written to the target's sockets.
    pub sent: u64,
    /// Bytes read from them.
    pub received: u64,
    /// Times the association was re-established.
    pub reconnects: u64,
}

/// Seconds of every measurement of [`fabric`], by kind, in the order taken.
#[derive(Debug, Clone, Serialize)]
pub struct FabricSeconds {
    /// Raw sequential direct reads.
    pub raw: Vec<f64>,
    /// Raw direct reads with the fabric read's shape.
    pub raw_shaped: Vec<f64>,
    /// Raw direct reads in the fabric's streams.
    pub raw_streams: Vec<f64>,
    /// Fabric reads from the page-cache target.
    pub fabric_read: Vec<f64>,
    /// Fabric reads from the direct-I/O target.
    pub fabric_read_direct: Vec<f64>,
    /// Plain TCP serving the file.
    pub tcp_loopback: Vec<f64>,
    /// Plain TCP from cache.
    pub tcp_loopback_cached: Vec<f64>,
    /// Embedded EXECs.
    pub embedded_exec: Vec<f64>,
    /// Fabric EXECs.
    pub fabric_exec: Vec<f64>,
}

/// The report of a run.
fn report(rig: &Rig, s: &Samples, repeat: usize) -> FabricReport {
    let size = rig.size;
    let rate = |v: &[f64]| gbps(size, median(&mut v.to_vec()));
    let (r, fr, e, fe) = (rate(&s.raw), rate(&s.fabric_read), rate(&s.embedded_exec), rate(&s.fabric_exec));
    let frd = rate(&s.fabric_read_direct);
    let (tcp, tcp_cached, rs, rst) = (rate(&s.tcp), rate(&s.tcp_cached), rate(&s.raw_shaped), rate(&s.raw_streams));
    // The ratio within a round cancels the drift of a shared disk between rounds, which the
    // ratio of medians does not. Seconds are inverse rates: base over measured.
    let within = |base: &[f64], measured: &[f64]| median(&mut base.iter().zip(measured).map(|(b, m)| b / m).collect::<Vec<f64>>());
    let paired = |raw: &[f64]| within(raw, &s.fabric_read);
    let stats = rig.session.stats();
    let in_memory = rig.backing.is_in_memory();
    FabricReport {
        command: command(),
        size_bytes: size,
        repeat,
        raw_read_gbps: r,
        raw_read_shaped_gbps: rs,
        raw_read_streams_gbps: rst,
        fabric_read_gbps: fr,
        fabric_read_direct_gbps: frd,
        embedded_exec_gbps: e,
        fabric_exec_gbps: fe,
        tcp_loopback_gbps: tcp,
        tcp_loopback_cached_gbps: tcp_cached,
        fabric_read_to_raw: fr / r,
        fabric_read_to_raw_shaped: fr / rs,
        fabric_read_to_raw_paired: paired(&s.raw),
        fabric_read_to_raw_shaped_paired: paired(&s.raw_shaped),
        fabric_read_to_raw_streams: fr / rst,
        fabric_read_to_raw_streams_paired: paired(&s.raw_streams),
        fabric_read_direct_to_raw: frd / r,
        fabric_read_direct_to_raw_paired: within(&s.raw, &s.fabric_read_direct),
        fabric_read_to_direct_paired: within(&s.fabric_read_direct, &s.fabric_read),
        fabric_read_to_tcp: fr / tcp,
        fabric_read_to_tcp_cached: fr / tcp_cached,
        fabric_exec_to_embedded: fe / e,
        fabric_exec_to_embedded_paired: within(&s.embedded_exec, &s.fabric_exec),
        fabric_exec_wire_bytes: s.wire.iter().copied().max().unwrap_or(0),
        digest: s.digests.first().map(digest).unwrap_or_default(),
        requests: FabricRequests {
            raw_read_bytes: RAW_IO,
            raw_queue_depth: 1,
            fabric_read_bytes: READ_IO,
            fabric_queue_depth: QUEUE_DEPTH,
            io_queues: IO_QUEUES,
            exec_extents: EXTENTS,
            max_transfer_bytes: rig.session.max_transfer(),
        },
        session_wire_bytes: SessionWireBytes { sent: stats.bytes_sent, received: stats.bytes_received, reconnects: stats.reconnects },
        seconds: FabricSeconds {
            raw: s.raw.clone(),
            raw_shaped: s.raw_shaped.clone(),
            raw_streams: s.raw_streams.clone(),
            fabric_read: s.fabric_read.clone(),
            fabric_read_direct: s.fabric_read_direct.clone(),
            tcp_loopback: s.tcp.clone(),
            tcp_loopback_cached: s.tcp_cached.clone(),
            embedded_exec: s.embedded_exec.clone(),
            fabric_exec: s.fabric_exec.clone(),
        },
        machine: machine(),
        direct_io: rig.backing.is_direct(),
        in_memory,
        transport: "NVMe/TCP over loopback to an in-process insitu target, no digests",
        host_reads: if in_memory {
            "page cache (sendfile), by both targets: media in memory is always sent from it"
        } else {
            "page cache (sendfile); fabric_read_direct_*: direct I/O (--direct-reads)"
        },
        model: REAL_SPEED,
    }
}

/// Runs the fabric benchmark: writes a file of random bytes, serves it from an in-process
/// NVMe/TCP target on 127.0.0.1 (any free port) and from an embedded target, and measures
/// every kind `repeat` times, alternating, from cold caches.
///
/// The report has `raw_read_gbps`, `raw_read_shaped_gbps` (direct reads of the fabric read's
/// request size and depth), `raw_read_streams_gbps` (1 MiB direct reads in the fabric's streams,
/// see [`raw_read_streams`], with `fabric_read_to_raw_streams` and its paired median),
/// `fabric_read_gbps` (host reads sent from the page cache, the target's default),
/// `fabric_read_direct_gbps` (a target reading them with direct I/O, with
/// `fabric_read_direct_to_raw`, its paired median, and `fabric_read_to_direct_paired`),
/// `embedded_exec_gbps`,
/// `fabric_exec_gbps`, `tcp_loopback_gbps` (plain TCP serving the file's bytes with the
/// fabric read's shape) and `tcp_loopback_cached_gbps` (plain TCP from a buffer in cache; see
/// [`crate::tcp`]) (medians), the ratios `fabric_read_to_raw`, `fabric_read_to_raw_shaped`,
/// their medians of per-round ratios `fabric_read_to_raw_paired` and
/// `fabric_read_to_raw_shaped_paired` (steadier on a disk whose speed drifts), `fabric_read_to_tcp`,
/// `fabric_read_to_tcp_cached` and `fabric_exec_to_embedded` (with its median of per-round
/// ratios `fabric_exec_to_embedded_paired`), `fabric_exec_wire_bytes` and the seconds of every
/// measurement. Odd rounds measure in the reverse order. Fails if the fabric returns other bytes than the file or the EXEC results
/// disagree; [`fabric_wire_check`] then tells whether the EXEC kept the data off the wire.
pub fn fabric(opts: &FabricOptions) -> Result<FabricReport, Error> {
    let (size, repeat) = (opts.size, opts.repeat.max(1));
    if size < RAW_IO as u64 || !size.is_multiple_of(4096) {
        return Err(format!("--size {size}: give at least 1M, a multiple of 4K, e.g. --size 1G").into());
    }
    let rig = Rig::new(opts)?;
    let mut samples = Samples::default();
    for i in 0..repeat {
        samples.round(&rig, i % 2 == 1)?;
    }
    if samples.digests.windows(2).any(|w| w[0] != w[1]) {
        let all: Vec<String> = samples.digests.iter().map(digest).collect();
        return Err(format!("embedded and fabric crc32c disagree (embedded, fabric, ...): {all:?}").into());
    }
    let out = report(&rig, &samples, repeat);
    let Rig { session, server, direct, work, .. } = rig;
    for (server, session) in [(server, session), direct] {
        let _ = session.disconnect();
        server.shutdown();
    }
    drop(work);
    Ok(out)
}

/// Fails if a fabric EXEC in `report` (from [`fabric`]) moved 1 MiB or more on the wire:
/// the data, not just the descriptor and result, crossed the fabric.
pub fn fabric_wire_check(report: &FabricReport) -> Result<(), Error> {
    let wire_max = report.fabric_exec_wire_bytes;
    if wire_max >= WIRE_LIMIT {
        return Err(format!("a fabric EXEC moved {wire_max} bytes on the wire, over the {WIRE_LIMIT}-byte bound: the data is crossing the fabric").into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use insitu_proto::Limits;

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
        let out = fabric(&FabricOptions { size: 2 << 20, repeat: 1, dir: Some(dir.path().to_path_buf()) }).unwrap();
        assert!(fabric_wire_check(&out).is_ok(), "{out:?}");
        assert_eq!(out.size_bytes, 2 << 20);
        // One round: its paired ratio is the ratio of the rates.
        let (paired, plain) = (out.fabric_read_to_raw_paired, out.fabric_read_to_raw);
        assert!(paired > 0.0 && (paired - plain).abs() < 1e-9 * plain, "{paired} vs {plain}");
        let (paired, plain) = (out.fabric_exec_to_embedded_paired, out.fabric_exec_to_embedded);
        assert!(paired > 0.0 && (paired - plain).abs() < 1e-9 * plain, "{paired} vs {plain}");
        let positive = [
            ("raw_read_streams_gbps", out.raw_read_streams_gbps),
            ("fabric_read_to_raw_streams", out.fabric_read_to_raw_streams),
            ("fabric_read_to_raw_streams_paired", out.fabric_read_to_raw_streams_paired),
            ("tcp_loopback_gbps", out.tcp_loopback_gbps),
            ("fabric_read_to_tcp", out.fabric_read_to_tcp),
        ];
        for (key, x) in positive {
            assert!(x > 0.0, "{key} in {out:?}");
        }
        assert!(!dir.path().join("fabric.img").exists(), "the work file is removed");
    }
}
