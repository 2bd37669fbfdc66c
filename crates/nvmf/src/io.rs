// SPDX-License-Identifier: Apache-2.0
//! The NVM command set on an I/O queue, run by a queue's worker threads against the
//! subsystem's block namespaces; commands of other command sets' namespaces and vendor
//! commands go to what the subsystem registered for them.

use crate::controller::{status, Controller, INVALID_FIELD, INVALID_OPCODE};
use crate::metrics::CommandCost;
use crate::sink::Sink;
use crate::subsystem::NvmSubsystem;
use crate::{BlockNamespaces, IoContext, Outcome, Shared};
use insitu_fabric::{opcode, Command};
use insitu_media::{BlockRead, PooledBuf};
use insitu_proto::opcode::IoOpcode;
use insitu_proto::CommandError;
use std::sync::atomic::Ordering;
use std::sync::Arc;
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
    pub(crate) fn push(&mut self, job: Job, nvm: &NvmSubsystem) -> Option<Job> {
        let nsid = job.cmd.nsid();
        let Some(lba) = nvm.blocks.namespace(nsid).map(|ns| ns.lba_size as usize) else {
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
    pub(crate) fn for_transfer(blocks: Option<&dyn BlockNamespaces>, nsid: u32, len: usize) -> HostData {
        match blocks.and_then(|b| b.namespace(nsid)).map(|ns| ns.buffers) {
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
    /// The `function` label of its metrics.
    function: String,
    /// Completed later by its handler: nothing to send now.
    deferred: bool,
}

impl Done {
    fn ok() -> Done {
        Done { status: 0, dw0: 0, dw1: 0, data: None, media: 0, function: String::new(), deferred: false }
    }

    fn status(status: u16) -> Done {
        Done { status, ..Done::ok() }
    }
}

impl From<Outcome> for Done {
    fn from(o: Outcome) -> Done {
        let data = (!o.data.is_empty()).then_some(Returned::Bytes(o.data));
        Done { status: o.status, dw0: o.dw0, dw1: o.dw1, data, media: o.media_bytes, function: o.function, deferred: o.deferred }
    }
}

fn failed(e: CommandError) -> Done {
    Done::status(e.status.to_nvme_field())
}

/// Runs one I/O command and sends its completion.
pub(crate) fn run(shared: &Shared, nvm: &NvmSubsystem, ctrl: &Arc<Controller>, sink: &Sink, mut job: Job) {
    let started = Instant::now();
    let blocks = nvm.blocks.as_ref();
    if !job.more.is_empty() {
        let more = std::mem::take(&mut job.more);
        if let Some(rest) = run_reads(shared, blocks, ctrl, sink, &job.cmd, job.sqhd, &more, started) {
            for (cmd, sqhd) in std::iter::once((job.cmd, job.sqhd)).chain(rest) {
                run(shared, nvm, ctrl, sink, Job { cmd, data: HostData::Owned(Vec::new()), sqhd, more: Vec::new() });
            }
        }
        return;
    }
    if job.cmd.opcode() == opcode::READ && read_from_page_cache(shared, blocks, ctrl, sink, &job, started) {
        return;
    }
    let cmd = &job.cmd;
    let link_in = job.data.len() as u64;
    let done = execute(shared, nvm, ctrl, sink, cmd, job.sqhd, job.data);
    if done.deferred {
        return;
    }
    let data = done.data.as_deref().unwrap_or_default();
    let cost = CommandCost {
        function: done.function.clone(),
        status: done.status,
        took: started.elapsed(),
        link_bytes: link_in + data.len() as u64,
        media_bytes: done.media,
    };
    shared.metrics.record(cmd.opcode(), metric_nsid(nvm, cmd.nsid()), &cost);
    let _ = sink.complete(cmd.cid(), job.sqhd, done.status, done.dw0, done.dw1, data);
}

/// Records in the metrics a vendor command its handler answered on the connection's own
/// thread ([`Placement::Connection`](crate::Placement)), as [`run`] records those it runs.
pub(crate) fn record_handled(shared: &Shared, nvm: &NvmSubsystem, cmd: &Command, started: Instant, link_in: usize, out: &crate::Outcome) {
    let cost = CommandCost {
        function: out.function.clone(),
        status: out.status,
        took: started.elapsed(),
        link_bytes: (link_in + out.data.len()) as u64,
        media_bytes: out.media_bytes,
    };
    shared.metrics.record(cmd.opcode(), metric_nsid(nvm, cmd.nsid()), &cost);
}

/// Reads `first` and the reads after it with one media read and completes each from its
/// part. Gives the commands back, having sent nothing, when any is refused or the read
/// fails, so that each is run alone and gets its own status.
#[allow(clippy::too_many_arguments)]
fn run_reads(
    shared: &Shared,
    blocks: &dyn BlockNamespaces,
    ctrl: &Controller,
    sink: &Sink,
    first: &Command,
    sqhd: u16,
    more: &[(Command, u16)],
    started: Instant,
) -> Option<Vec<(Command, u16)>> {
    let cmds: Vec<(&Command, u16)> = std::iter::once((first, sqhd)).chain(more.iter().map(|(c, s)| (c, *s))).collect();
    let sizes: Result<Vec<usize>, u16> = cmds.iter().map(|(c, _)| read_bytes(shared, blocks, c)).collect();
    let read = sizes.ok().and_then(|sizes| blocks.read_blocks(first.nsid(), slba(first), sizes.iter().sum()).ok().map(|b| (sizes, b)));
    let Some((sizes, data)) = read else {
        return Some(more.to_vec());
    };
    let mut at = 0;
    for ((cmd, sqhd), n) in cmds.into_iter().zip(sizes) {
        ctrl.read_cmds.fetch_add(1, Ordering::Relaxed);
        let cost = CommandCost { function: String::new(), status: 0, took: started.elapsed(), link_bytes: n as u64, media_bytes: n as u64 };
        shared.metrics.record(cmd.opcode(), cmd.nsid(), &cost);
        if sink.complete(cmd.cid(), sqhd, 0, 0, 0, &data[at..at + n]).is_err() {
            break; // the connection is gone
        }
        at += n;
    }
    None
}

/// A Read that the connection can send straight from the page cache (see
/// [`Sink::complete_from_media`]); false, having done nothing, for any other.
fn read_from_page_cache(shared: &Shared, blocks: &dyn BlockNamespaces, ctrl: &Controller, sink: &Sink, job: &Job, started: Instant) -> bool {
    let cmd = &job.cmd;
    let nsid = cmd.nsid();
    if !blocks.namespace(nsid).is_some_and(|ns| sink.can_send_from(ns.media)) {
        return false;
    }
    let Ok(bytes) = read_bytes(shared, blocks, cmd) else { return false }; // refused by the ordinary path
    let Ok((media, offset)) = blocks.read_source(nsid, slba(cmd), bytes) else { return false };
    // Counted before the completion leaves: a host that reads the SMART log once its reads
    // complete must find them there.
    ctrl.read_cmds.fetch_add(1, Ordering::Relaxed);
    // A failed send ends the connection.
    let _ = sink.complete_from_media(cmd.cid(), job.sqhd, media, offset, bytes);
    let cost = CommandCost { function: String::new(), status: 0, took: started.elapsed(), link_bytes: bytes as u64, media_bytes: bytes as u64 };
    shared.metrics.record(cmd.opcode(), nsid, &cost);
    true
}

/// The bytes a Read asks for, or the status that refuses it: no such namespace, more than
/// MDTS, or an SGL shorter than the data.
fn read_bytes(shared: &Shared, blocks: &dyn BlockNamespaces, cmd: &Command) -> Result<usize, u16> {
    let lba = blocks.namespace(cmd.nsid()).map(|ns| u64::from(ns.lba_size)).ok_or(status(0, 0x0B))?;
    let bytes = (nlb(cmd) * lba) as usize;
    if bytes > shared.cfg.max_transfer() {
        return Err(INVALID_FIELD);
    }
    if (cmd.sgl().1 as usize) < bytes {
        return Err(SGL_LENGTH_INVALID);
    }
    Ok(bytes)
}

fn execute(shared: &Shared, nvm: &NvmSubsystem, ctrl: &Arc<Controller>, sink: &Sink, cmd: &Command, sqhd: u16, data: HostData) -> Done {
    let nsid = cmd.nsid();
    let blocks = nvm.blocks.as_ref();
    let (slba, nlb) = (slba(cmd), nlb(cmd));
    let lba = || blocks.namespace(nsid).map(|ns| u64::from(ns.lba_size));
    // A namespace of another command set takes every command (its opcodes reuse NVM ones).
    if let Some(ns) = nvm.command_set(nsid) {
        return ns.execute(cmd, &data, shared.cfg.max_transfer()).into();
    }
    // The opcode becomes an enum at the edge; anything else is Invalid Command Opcode.
    match IoOpcode::from(cmd.opcode()) {
        IoOpcode::Read => {
            let bytes = match read_bytes(shared, blocks, cmd) {
                Ok(b) => b,
                Err(s) => return Done::status(s),
            };
            ctrl.read_cmds.fetch_add(1, Ordering::Relaxed);
            match blocks.read_blocks(nsid, slba, bytes) {
                Ok(read) => Done { media: bytes as u64, data: Some(Returned::Blocks(read)), ..Done::ok() },
                Err(e) => failed(e),
            }
        }
        IoOpcode::Write => {
            let Some(lba) = lba() else { return Done::status(status(0, 0x0B)) };
            if data.len() as u64 != nlb * lba {
                return Done::status(SGL_LENGTH_INVALID);
            }
            ctrl.write_cmds.fetch_add(1, Ordering::Relaxed);
            blocks.write(nsid, slba, &data).map_or_else(failed, |_| Done { media: data.len() as u64, ..Done::ok() })
        }
        IoOpcode::Flush if nsid == 0xFFFF_FFFF => {
            let all = (1..=blocks.count() as u32).filter(|n| blocks.namespace(*n).is_some_and(|ns| ns.sharable)).try_for_each(|n| blocks.flush(n));
            all.map_or_else(failed, |_| Done::ok())
        }
        IoOpcode::Flush => blocks.flush(nsid).map_or_else(failed, |_| Done::ok()),
        IoOpcode::WriteZeroes => blocks.write_zeroes(nsid, slba, nlb).map_or_else(failed, |_| Done::ok()),
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
                    if let Err(e) = blocks.write_zeroes(nsid, slba, nlb) {
                        return failed(e);
                    }
                }
            }
            Done::ok()
        }
        _ => match nvm.handlers.get(cmd.opcode()) {
            Some((handler, _)) => {
                let ctx = IoContext { ctrl, sink, cid: cmd.cid(), sqhd, max_transfer: shared.cfg.max_transfer() };
                handler.execute(&ctx, cmd, &data).into()
            }
            None => Done::status(INVALID_OPCODE),
        },
    }
}

/// The namespace label of a command's metrics. The NSID comes from the host, so only
/// namespaces this subsystem has get series of their own (any other is 0): a host cannot
/// grow the metrics, and the target's memory, without bound.
fn metric_nsid(nvm: &NvmSubsystem, nsid: u32) -> u32 {
    if nsid == 0xFFFF_FFFF || nvm.has(nsid) {
        nsid
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Block namespaces that exist in number only.
    struct Counted(usize);

    impl BlockNamespaces for Counted {
        fn count(&self) -> usize {
            self.0
        }
        fn namespace(&self, _: u32) -> Option<crate::BlockNamespace<'_>> {
            None
        }
        fn read_blocks(&self, _: u32, _: u64, _: usize) -> Result<BlockRead, CommandError> {
            unreachable!("not read")
        }
        fn read_source(&self, _: u32, _: u64, _: usize) -> Result<(&insitu_media::Backing, u64), CommandError> {
            unreachable!("not read")
        }
        fn write(&self, _: u32, _: u64, _: &[u8]) -> Result<(), CommandError> {
            unreachable!("not written")
        }
        fn write_zeroes(&self, _: u32, _: u64, _: u64) -> Result<(), CommandError> {
            unreachable!("not written")
        }
        fn flush(&self, _: u32) -> Result<(), CommandError> {
            Ok(())
        }
        fn media_totals(&self) -> (u64, u64) {
            (0, 0)
        }
    }

    #[test]
    fn metric_namespaces_are_bounded_by_what_the_subsystem_has() {
        let nvm = NvmSubsystem::new("nqn.2024-01.io.insitu:t", Arc::new(Counted(2)));
        assert_eq!(metric_nsid(&nvm, 1), 1);
        assert_eq!(metric_nsid(&nvm, 2), 2);
        assert_eq!(metric_nsid(&nvm, 3), 0);
        assert_eq!(metric_nsid(&nvm, 0), 0);
        assert_eq!(metric_nsid(&nvm, 0xFFFF_FFFF), 0xFFFF_FFFF);
    }
}
