// SPDX-License-Identifier: Apache-2.0
//! The NVM command set on an I/O queue, and the vendor EXEC command, executed by a queue's
//! worker threads against the insitu target.

use crate::controller::{status, Controller, INVALID_FIELD, INVALID_OPCODE};
use crate::kv;
use crate::lock;
use crate::metrics::CommandCost;
use crate::sink::Sink;
use crate::Shared;
use insitu_engine::{BlockRead, Engine};
use insitu_fabric::{opcode, Command};
use insitu_media::PooledBuf;
use insitu_proto::opcode::IoOpcode;
use insitu_proto::{CommandError, FLAG_RESULT_OBJECT};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// A command ready to run, with any data the host sent.
pub(crate) struct Job {
    pub(crate) cmd: Command,
    pub(crate) data: HostData,
    pub(crate) sqhd: u16,
    /// Reads of the blocks right after `cmd`'s (which is then a read too), each with its
    /// submission queue head: the media reads them all at once (see [`ReadRun`]).
    pub(crate) more: Vec<(Command, u16)>,
}

/// Most bytes one merged media read covers.
const MERGED_READ_MAX: usize = 1 << 20;

/// Reads that arrived back to back for consecutive blocks of one namespace. A host that
/// streams a file sends a queue's worth of 128 KiB reads at once; a disk serves one 1 MiB
/// read faster than eight 128 KiB ones on as many threads, so the connection holds reads
/// while more are already received and hands a run of them to one worker as one job.
#[derive(Default)]
pub(crate) struct ReadRun {
    first: Option<Job>,
    /// Next block after the run, and the run's bytes.
    next_lba: u64,
    bytes: usize,
}

impl ReadRun {
    /// Whether no read is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    /// Adds a read (`job.cmd` is a Read). Returns the run to dispatch now when the read does
    /// not continue it (the read then starts a new run) or the run is full.
    pub(crate) fn push(&mut self, job: Job, target: &Engine) -> Option<Job> {
        let nsid = job.cmd.nsid();
        let Some(lba) = target.namespace(nsid).map(|ns| ns.lba_size() as usize) else {
            return Some(job); // refused by the worker, alone
        };
        let (slba, nlb) = (slba(&job.cmd), nlb(&job.cmd));
        let bytes = nlb as usize * lba;
        let joins = self.first.as_ref().is_some_and(|f| f.cmd.nsid() == nsid && slba == self.next_lba && self.bytes + bytes <= MERGED_READ_MAX);
        if joins {
            let first = self.first.as_mut().expect("a run to join");
            first.more.push((job.cmd, job.sqhd));
            self.next_lba += nlb;
            self.bytes += bytes;
            return None;
        }
        let done = self.first.take();
        self.first = Some(job);
        self.next_lba = slba + nlb;
        self.bytes = bytes;
        done
    }

    /// The held run, leaving none.
    pub(crate) fn take(&mut self) -> Option<Job> {
        self.first.take()
    }
}

/// Data a command brought from the host: in-capsule data, or a transfer received into an
/// aligned buffer of the namespace's pool, which the media writes without another copy.
pub(crate) enum HostData {
    Owned(Vec<u8>),
    Pooled { buf: PooledBuf, len: usize },
}

impl HostData {
    /// A buffer for `len` bytes of a transfer to namespace `nsid`: pooled when the
    /// namespace exists and its buffers are large enough. Its contents are unspecified
    /// until the transfer has filled it.
    pub(crate) fn for_transfer(target: Option<&Engine>, nsid: u32, len: usize) -> HostData {
        match target.and_then(|t| t.namespace(nsid)).map(|ns| ns.buffer_pool()) {
            Some(pool) if len <= pool.buffer_len() => HostData::Pooled { buf: pool.take(), len },
            _ => HostData::Owned(vec![0; len]),
        }
    }
}

impl std::ops::Deref for HostData {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            HostData::Owned(v) => v,
            HostData::Pooled { buf, len } => &buf.as_slice()[..*len],
        }
    }
}

impl std::ops::DerefMut for HostData {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            HostData::Owned(v) => v,
            HostData::Pooled { buf, len } => &mut buf.as_mut_slice()[..*len],
        }
    }
}

/// The starting LBA of an NVM command (dwords 10 and 11).
fn slba(cmd: &Command) -> u64 {
    u64::from(cmd.cdw(10)) | (u64::from(cmd.cdw(11)) << 32)
}

/// The number of logical blocks of an NVM command (dword 12, 0-based on the wire).
fn nlb(cmd: &Command) -> u64 {
    u64::from(cmd.cdw(12) & 0xFFFF) + 1
}

/// Data SGL Length Invalid.
const SGL_LENGTH_INVALID: u16 = status(0, 0x0F);

/// Data a command returns: blocks, sent from the pooled buffer they were read into, or bytes
/// a vendor command produced.
enum Returned {
    Blocks(BlockRead),
    Bytes(Vec<u8>),
}

impl std::ops::Deref for Returned {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Returned::Blocks(b) => b,
            Returned::Bytes(v) => v,
        }
    }
}

struct Done {
    status: u16,
    dw0: u32,
    dw1: u32,
    /// Data the command returns.
    data: Option<Returned>,
    /// Bytes read from or written to the media.
    media: u64,
}

impl Done {
    fn ok() -> Done {
        Done { status: 0, dw0: 0, dw1: 0, data: None, media: 0 }
    }

    fn status(status: u16) -> Done {
        Done { status, ..Done::ok() }
    }
}

fn failed(e: CommandError) -> Done {
    Done::status(e.status.to_nvme_field())
}

/// Runs one I/O command and sends its completion.
pub(crate) fn run(shared: &Shared, target: &Engine, ctrl: &Controller, sink: &Sink, mut job: Job) {
    let started = Instant::now();
    if !job.more.is_empty() {
        let more = std::mem::take(&mut job.more);
        if let Some(rest) = run_reads(shared, target, ctrl, sink, &job.cmd, job.sqhd, &more, started) {
            for (cmd, sqhd) in std::iter::once((job.cmd, job.sqhd)).chain(rest) {
                run(shared, target, ctrl, sink, Job { cmd, data: HostData::Owned(Vec::new()), sqhd, more: Vec::new() });
            }
        }
        return;
    }
    if job.cmd.opcode() == opcode::READ && read_from_page_cache(shared, target, ctrl, sink, &job, started) {
        return;
    }
    let cmd = &job.cmd;
    let (nsid, function) = metric_labels(target, cmd, &job.data);
    let link_in = job.data.len() as u64;
    let done = execute(shared, target, ctrl, cmd, job.data);
    let data = done.data.as_deref().unwrap_or_default();
    let cost = CommandCost { function, status: done.status, took: started.elapsed(), link_bytes: link_in + data.len() as u64, media_bytes: done.media };
    shared.metrics.record(cmd.opcode(), nsid, &cost);
    let _ = sink.complete(cmd.cid(), job.sqhd, done.status, done.dw0, done.dw1, data);
}

/// Reads `first` and the reads after it with one media read and completes each from its
/// part. Gives the commands back, having sent nothing, when any is refused or the read
/// fails, so that each is run alone and gets its own status.
#[allow(clippy::too_many_arguments)]
fn run_reads(
    shared: &Shared,
    target: &Engine,
    ctrl: &Controller,
    sink: &Sink,
    first: &Command,
    sqhd: u16,
    more: &[(Command, u16)],
    started: Instant,
) -> Option<Vec<(Command, u16)>> {
    let cmds: Vec<(&Command, u16)> = std::iter::once((first, sqhd)).chain(more.iter().map(|(c, s)| (c, *s))).collect();
    let sizes: Result<Vec<usize>, u16> = cmds.iter().map(|(c, _)| read_bytes(shared, target, c)).collect();
    let read = sizes.ok().and_then(|sizes| target.read_blocks(first.nsid(), slba(first), sizes.iter().sum()).ok().map(|b| (sizes, b)));
    let Some((sizes, blocks)) = read else {
        return Some(more.to_vec());
    };
    let mut at = 0;
    for ((cmd, sqhd), n) in cmds.into_iter().zip(sizes) {
        ctrl.read_cmds.fetch_add(1, Ordering::Relaxed);
        let cost = CommandCost { function: String::new(), status: 0, took: started.elapsed(), link_bytes: n as u64, media_bytes: n as u64 };
        shared.metrics.record(cmd.opcode(), cmd.nsid(), &cost);
        if sink.complete(cmd.cid(), sqhd, 0, 0, 0, &blocks[at..at + n]).is_err() {
            break; // the connection is gone
        }
        at += n;
    }
    None
}

/// A Read that the connection can send straight from the page cache (see
/// [`Sink::complete_from_media`]); false, having done nothing, for any other.
fn read_from_page_cache(shared: &Shared, target: &Engine, ctrl: &Controller, sink: &Sink, job: &Job, started: Instant) -> bool {
    let cmd = &job.cmd;
    let nsid = cmd.nsid();
    if !target.namespace(nsid).is_some_and(|ns| sink.can_send_from(ns.media())) {
        return false;
    }
    let Ok(bytes) = read_bytes(shared, target, cmd) else { return false }; // refused by the ordinary path
    let Ok((media, offset)) = target.read_source(nsid, slba(cmd), bytes) else { return false };
    // Counted before the completion leaves: a host that reads the SMART log once its reads
    // complete must find them there.
    ctrl.read_cmds.fetch_add(1, Ordering::Relaxed);
    // A failed send ends the connection.
    let _ = sink.complete_from_media(cmd.cid(), job.sqhd, media, offset, bytes);
    let (nsid, function) = metric_labels(target, cmd, &job.data);
    let cost = CommandCost { function, status: 0, took: started.elapsed(), link_bytes: bytes as u64, media_bytes: bytes as u64 };
    shared.metrics.record(cmd.opcode(), nsid, &cost);
    true
}

/// The bytes a Read asks for, or the status that refuses it: no such namespace, more than
/// MDTS, or an SGL shorter than the data.
fn read_bytes(shared: &Shared, target: &Engine, cmd: &Command) -> Result<usize, u16> {
    let lba = target.namespace(cmd.nsid()).map(|ns| u64::from(ns.lba_size())).ok_or(status(0, 0x0B))?;
    let bytes = (nlb(cmd) * lba) as usize;
    if bytes > shared.cfg.max_transfer() {
        return Err(INVALID_FIELD);
    }
    if (cmd.sgl().1 as usize) < bytes {
        return Err(SGL_LENGTH_INVALID);
    }
    Ok(bytes)
}

fn execute(shared: &Shared, target: &Engine, ctrl: &Controller, cmd: &Command, data: HostData) -> Done {
    let nsid = cmd.nsid();
    let (slba, nlb) = (slba(cmd), nlb(cmd));
    let lba = || target.namespace(nsid).map(|ns| u64::from(ns.lba_size()));
    // The key-value namespace speaks the KV command set, whose opcodes reuse NVM ones.
    if let Some(store) = target.kv_service(nsid) {
        let d = crate::kv_service::execute(store, cmd, &data, shared.cfg.max_transfer());
        return Done { status: d.status, dw0: d.dw0, dw1: 0, data: d.data.map(Returned::Bytes), media: d.media };
    }
    // The opcode becomes an enum at the edge; anything else is Invalid Command Opcode.
    match IoOpcode::from(cmd.opcode()) {
        IoOpcode::Read => {
            let bytes = match read_bytes(shared, target, cmd) {
                Ok(b) => b,
                Err(s) => return Done::status(s),
            };
            ctrl.read_cmds.fetch_add(1, Ordering::Relaxed);
            match target.read_blocks(nsid, slba, bytes) {
                Ok(blocks) => Done { media: bytes as u64, data: Some(Returned::Blocks(blocks)), ..Done::ok() },
                Err(e) => failed(e),
            }
        }
        IoOpcode::Write => {
            let Some(lba) = lba() else { return Done::status(status(0, 0x0B)) };
            if data.len() as u64 != nlb * lba {
                return Done::status(SGL_LENGTH_INVALID);
            }
            ctrl.write_cmds.fetch_add(1, Ordering::Relaxed);
            target.write(nsid, slba, &data).map_or_else(failed, |_| Done { media: data.len() as u64, ..Done::ok() })
        }
        IoOpcode::Flush if nsid == 0xFFFF_FFFF => {
            let blocks = target.host_namespaces().into_iter().filter(|n| target.kv_service(*n).is_none());
            let all = blocks.into_iter().try_for_each(|n| target.flush(n));
            all.map_or_else(failed, |_| Done::ok())
        }
        IoOpcode::Flush => target.flush(nsid).map_or_else(failed, |_| Done::ok()),
        IoOpcode::WriteZeroes => target.write_zeroes(nsid, slba, nlb).map_or_else(failed, |_| Done::ok()),
        IoOpcode::Dsm => {
            let ranges = (cmd.cdw(10) & 0xFF) as usize + 1;
            if data.len() < ranges * 16 {
                return Done::status(SGL_LENGTH_INVALID);
            }
            if cmd.cdw(11) & 0x4 == 0 {
                return Done::ok(); // only attributes, no deallocation: nothing to do
            }
            for r in data.chunks_exact(16).take(ranges) {
                let nlb = u64::from(u32::from_le_bytes(r[4..8].try_into().expect("4 bytes")));
                let slba = u64::from_le_bytes(r[8..16].try_into().expect("8 bytes"));
                if nlb > 0 {
                    if let Err(e) = target.write_zeroes(nsid, slba, nlb) {
                        return failed(e);
                    }
                }
            }
            Done::ok()
        }
        IoOpcode::Exec => exec(target, nsid, &data),
        IoOpcode::KvAdmin | IoOpcode::KvAppend | IoOpcode::KvAttend | IoOpcode::KvResult => match kv::execute(target, ctrl, cmd, &data) {
            Ok(d) => Done { dw0: d.dw0, data: d.data.map(Returned::Bytes), media: d.media, ..Done::ok() },
            Err(e) => Done::status(e.status().to_nvme_field()),
        },
        IoOpcode::Lock | IoOpcode::Unlock => lock::execute(target, cmd, &data).map_or_else(failed, |(dw0, dw1)| Done { dw0, dw1, ..Done::ok() }),
        IoOpcode::TransmitFrame => Done::status(crate::ether::transmit(shared, cmd, &data)),
        _ => Done::status(INVALID_OPCODE),
    }
}

/// EXEC over the fabric: the descriptor arrived as the command's data; the result goes to
/// the descriptor's result object and its length to dword 0 (dword 1: media bytes read, in
/// KiB, saturating).
fn exec(target: &Engine, nsid: u32, descriptor: &[u8]) -> Done {
    if descriptor.len() >= 32 && descriptor[22] & FLAG_RESULT_OBJECT == 0 {
        return Done::status(INVALID_FIELD);
    }
    match target.exec(nsid, descriptor) {
        Ok(out) => Done {
            dw0: out.result.len() as u32,
            dw1: u32::try_from(out.media_read_bytes >> 10).unwrap_or(u32::MAX),
            media: out.media_read_bytes + out.media_written_bytes,
            ..Done::ok()
        },
        Err(e) => failed(e),
    }
}

/// The namespace and function labels of a command's metrics. Both come from the host, so
/// only namespaces and functions this target has get series of their own (any other
/// namespace is 0, any other function `unknown`): a host cannot grow the metrics, and the
/// target's memory, without bound.
fn metric_labels(target: &Engine, cmd: &Command, data: &[u8]) -> (u32, String) {
    let nsid = cmd.nsid();
    let nsid = if nsid == 0xFFFF_FFFF || target.namespace(nsid).is_some() || target.kv_service(nsid).is_some() { nsid } else { 0 };
    let function = match cmd.opcode() {
        opcode::EXEC => {
            let f = function_name(data);
            if target.registry().get(&f).is_some() {
                f
            } else {
                "unknown".to_string()
            }
        }
        _ => String::new(),
    };
    (nsid, function)
}

/// The function name of a descriptor, for metrics labels (empty when malformed): the
/// length byte at offset 16, the name at offset 32, from the alphabet `a-z 0-9 _ -`.
fn function_name(descriptor: &[u8]) -> String {
    let n = descriptor.get(16).map_or(0, |n| usize::from(*n)).min(32);
    match descriptor.get(32..32 + n) {
        Some(name) if name.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_' || *b == b'-') => {
            String::from_utf8_lossy(name).into_owned()
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use insitu_engine::NamespaceConfig;

    #[test]
    fn metric_labels_are_bounded_by_what_the_target_has() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("ns.img");
        std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
        let mut t = Engine::new();
        t.add_namespace(&img, NamespaceConfig::default()).unwrap();
        let exec = |nsid: u32| {
            let mut c = Command::zeroed();
            c.set_opcode(opcode::EXEC).set_nsid(nsid);
            c
        };
        let desc = |f: &str| insitu_proto::Descriptor::new(f, vec![]).encode();
        assert_eq!(metric_labels(&t, &exec(1), &desc("crc32c")), (1, "crc32c".to_string()));
        assert_eq!(metric_labels(&t, &exec(7), &desc("crc32c")), (0, "crc32c".to_string()));
        assert_eq!(metric_labels(&t, &exec(1), &desc("made-up-function")), (1, "unknown".to_string()));
        assert_eq!(metric_labels(&t, &exec(1), b"garbage"), (1, "unknown".to_string()));
        let mut flush = Command::zeroed();
        flush.set_opcode(opcode::FLUSH).set_nsid(0xFFFF_FFFF);
        assert_eq!(metric_labels(&t, &flush, &[]), (0xFFFF_FFFF, String::new()));
    }
}
