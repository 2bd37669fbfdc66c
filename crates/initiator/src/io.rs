// SPDX-License-Identifier: Apache-2.0
//! The I/O-queue commands of a [`Session`]: block reads and writes split at MDTS, Flush,
//! Write Zeroes, Dataset Management, EXEC and passthrough.

use crate::assoc::{pipeline, pipeline_spread, run_one, start_pipeline, Association, Piece, Started};
use crate::cmd::{self, MAX_DSM_RANGES, MAX_NLB};
use crate::queue::QError;
use crate::session::check;
use crate::{InitiatorError, Session};
use insitu_fabric::{opcode, Command, Completion};
use std::sync::Arc;

impl Session {
    /// Reads `nlb` logical blocks from `slba`.
    pub fn read(&self, nsid: u32, slba: u64, nlb: u32) -> Result<Vec<u8>, InitiatorError> {
        self.require_io("Read")?;
        let lba = self.lba_size(nsid)?;
        let mut buf = vec![0u8; nlb as usize * lba as usize];
        self.read_into(nsid, slba, &mut buf)?;
        Ok(buf)
    }

    /// Reads `buf.len()` bytes (a multiple of the block size) from `slba` into `buf`.
    pub fn read_into(&self, nsid: u32, slba: u64, buf: &mut [u8]) -> Result<(), InitiatorError> {
        self.require_io("Read")?;
        let nlb = blocks("Read", buf.len(), self.lba_size(nsid)?)?;
        self.read_runs_into(nsid, &[(slba, nlb)], buf)
    }

    /// Reads the runs `(slba, nlb)` of `runs` into `buf`, one after the other in the order
    /// given (`buf.len()` must be their total size), all in flight at once: what a host
    /// reading many scattered pieces of a layer (SparF's chosen columns and pages) needs,
    /// one round trip for all of them rather than one each.
    ///
    /// Several runs are spread over every I/O queue of the session, in contiguous shares,
    /// each queue's share driven by a thread of its own: a controller serves each queue
    /// (connection) on its own, so hundreds of small reads on one queue wait on that one
    /// connection. A single run stays on one queue (the next in turn): a caller issuing
    /// large reads from several threads (a layer's blocks read ahead) already spreads them.
    pub fn read_runs_into(&self, nsid: u32, runs: &[(u64, u64)], buf: &mut [u8]) -> Result<(), InitiatorError> {
        const C: &str = "Read";
        self.require_io(C)?;
        let lba = self.lba_size(nsid)?;
        let total: u64 = runs.iter().map(|&(_, n)| n.saturating_mul(u64::from(lba))).fold(0, u64::saturating_add);
        if total != buf.len() as u64 {
            return Err(InitiatorError::InvalidArgument {
                command: C,
                detail: format!("{} runs of {total} bytes into a buffer of {} bytes", runs.len(), buf.len()),
            });
        }
        if runs.is_empty() {
            return Ok(());
        }
        let mut split = Vec::new();
        let results = self.run(C, true, |a| {
            split.clear();
            let mut at = 0usize;
            for &(slba, nlb) in runs {
                split.extend(cmd::split_blocks(slba, nlb, lba, a.split_at).into_iter().map(|(s, n, off)| (s, n, at + off)));
                at += nlb as usize * lba as usize;
            }
            let pieces = split
                .iter()
                .map(|&(s, n, off)| Piece { cmd: cmd::rw(opcode::READ, nsid, s, n), out: &[], in_at: off, in_len: n as usize * lba as usize })
                .collect();
            if runs.len() > 1 {
                pipeline_spread(&a.io, self.pick_index(a), pieces, &mut *buf)
            } else {
                pipeline(self.pick(a), pieces, &mut *buf)
            }
        })?;
        for ((cqe, got), (s, n, _)) in results.iter().zip(&split) {
            check(C, cqe)?;
            let want = *n as usize * lba as usize;
            if *got != want {
                return Err(InitiatorError::Protocol { command: C, detail: format!("the controller returned {got} of {want} bytes for LBA {s}") });
            }
        }
        Ok(())
    }

    /// Writes `data` (a multiple of the block size) at `slba`.
    pub fn write(&self, nsid: u32, slba: u64, data: &[u8]) -> Result<(), InitiatorError> {
        const C: &str = "Write";
        self.require_io(C)?;
        let lba = self.lba_size(nsid)?;
        let nlb = blocks(C, data.len(), lba)?;
        let results = self.run(C, false, |a| {
            let pieces = cmd::split_blocks(slba, nlb, lba, a.split_at)
                .into_iter()
                .map(|(s, n, off)| Piece { cmd: cmd::rw(opcode::WRITE, nsid, s, n), out: &data[off..off + n as usize * lba as usize], in_at: 0, in_len: 0 })
                .collect();
            pipeline(self.pick(a), pieces, &mut [])
        })?;
        results.iter().try_for_each(|(cqe, _)| check(C, cqe))
    }

    /// Flush: commits the namespace's volatile write cache.
    pub fn flush(&self, nsid: u32) -> Result<(), InitiatorError> {
        self.io_simple("Flush", true, vec![cmd::flush(nsid)])
    }

    /// Write Zeroes over `nlb` blocks from `slba` (several commands beyond 65536 blocks).
    pub fn write_zeroes(&self, nsid: u32, slba: u64, nlb: u64) -> Result<(), InitiatorError> {
        let cmds = cmd::split_blocks(slba, nlb, 1, MAX_NLB as usize).into_iter().map(|(s, n, _)| cmd::rw(opcode::WRITE_ZEROES, nsid, s, n)).collect();
        self.io_simple("Write Zeroes", false, cmds)
    }

    fn io_simple(&self, command: &'static str, retryable: bool, cmds: Vec<Command>) -> Result<(), InitiatorError> {
        self.require_io(command)?;
        let results = self.run(command, retryable, |a| {
            let pieces = cmds.iter().map(|&c| Piece { cmd: c, out: &[], in_at: 0, in_len: 0 }).collect();
            pipeline(self.pick(a), pieces, &mut [])
        })?;
        results.iter().try_for_each(|(cqe, _)| check(command, cqe))
    }

    /// Dataset Management with Deallocate (trim) over `(slba, nlb)` ranges, 256 per command.
    pub fn deallocate(&self, nsid: u32, ranges: &[(u64, u32)]) -> Result<(), InitiatorError> {
        const C: &str = "Dataset Management";
        self.require_io(C)?;
        let chunks: Vec<Vec<u8>> = ranges.chunks(MAX_DSM_RANGES).map(cmd::dsm_ranges).collect();
        let results = self.run(C, false, |a| {
            let pieces = chunks.iter().map(|d| Piece { cmd: cmd::deallocate(nsid, d.len() / 16), out: d, in_at: 0, in_len: 0 }).collect();
            pipeline(self.pick(a), pieces, &mut [])
        })?;
        results.iter().try_for_each(|(cqe, _)| check(C, cqe))
    }

    /// EXEC (vendor opcode 99h) with `descriptor` as its data, host to controller. Returns
    /// the completion (DW0 carries the result length); an error status is an
    /// [`InitiatorError::Status`]. Not retried if the connection fails in flight (use
    /// [`Session::exec_idempotent`] for descriptors that only read).
    pub fn exec(&self, nsid: u32, descriptor: &[u8]) -> Result<Completion, InitiatorError> {
        self.exec_with(nsid, descriptor, false)
    }

    /// [`Session::exec`] for a descriptor without side effects: retried on a new
    /// connection if the connection fails while it is in flight.
    pub fn exec_idempotent(&self, nsid: u32, descriptor: &[u8]) -> Result<Completion, InitiatorError> {
        self.exec_with(nsid, descriptor, true)
    }

    fn exec_with(&self, nsid: u32, descriptor: &[u8], retryable: bool) -> Result<Completion, InitiatorError> {
        const C: &str = "Exec";
        self.check_transfer(C, descriptor.len())?;
        self.require_io(C)?;
        let mut c = Command::zeroed();
        c.set_opcode(opcode::EXEC).set_nsid(nsid);
        let (cqe, _, _) = self.run(C, retryable, |a| run_one(self.pick(a), c, descriptor, 0, false))?;
        check(C, &cqe)?;
        Ok(cqe)
    }

    fn check_transfer(&self, command: &'static str, len: usize) -> Result<(), InitiatorError> {
        let max = self.max_transfer();
        if len > max {
            return Err(InitiatorError::InvalidArgument {
                command,
                detail: format!("{len} bytes of data exceed the controller's maximum transfer of {max} bytes per command"),
            });
        }
        Ok(())
    }

    /// Passthrough: sends `cmd` (its CID and data pointer are set by the transport) on an
    /// I/O queue with `data_out` or expecting `data_in_len` bytes. Returns the completion,
    /// whatever its status, and the data received. Not retried after a connection failure.
    pub fn submit(&self, cmd: Command, data_out: Option<&[u8]>, data_in_len: usize) -> Result<(Completion, Vec<u8>), InitiatorError> {
        self.require_io(PASSTHROUGH)?;
        self.submit_on(false, cmd, data_out, data_in_len)
    }

    /// [`Session::submit`] for several commands that carry data to the controller (or
    /// none): sent back to back on one I/O queue, in this order, with as many in flight as
    /// the queue has identifiers. Returns every completion, whatever its status, in order.
    /// Not retried after a connection failure.
    pub fn submit_batch(&self, cmds: &[(Command, &[u8])]) -> Result<Vec<Completion>, InitiatorError> {
        self.require_io(PASSTHROUGH)?;
        for (_, d) in cmds {
            self.check_transfer(PASSTHROUGH, d.len())?;
        }
        let done = self.run(PASSTHROUGH, false, |a| {
            let pieces = cmds.iter().map(|(c, d)| Piece { cmd: *c, out: d, in_at: 0, in_len: 0 }).collect();
            pipeline(self.pick(a), pieces, &mut [])
        })?;
        Ok(done.into_iter().map(|(cqe, _)| cqe).collect())
    }

    /// [`Session::submit`] for several commands sent back to back on one I/O queue, in this
    /// order, each with its data out or the length of its data in (`(command, out, in)`; one
    /// of the two empty): a request and the command that fetches its answer travel together,
    /// in one round trip, and a target serving a queue in order answers the second once the
    /// first is done. Returns every completion, whatever its status, and the data each
    /// received (its data-in length), in order. Not retried after a connection failure.
    pub fn submit_pipelined(&self, cmds: &[Submission<'_>]) -> Result<Answers, InitiatorError> {
        self.check_pipelined(cmds)?;
        let mut inbuf = vec![0u8; cmds.iter().map(|c| c.2).sum()];
        let done = self.run(PASSTHROUGH, false, |a| pipeline(self.pick(a), pieces(cmds), &mut inbuf))?;
        Ok(split_answers(cmds, done, &inbuf))
    }

    /// What [`Session::submit_pipelined`] refuses before sending anything.
    fn check_pipelined(&self, cmds: &[Submission<'_>]) -> Result<(), InitiatorError> {
        self.require_io(PASSTHROUGH)?;
        for (_, out, len) in cmds {
            if !out.is_empty() && *len > 0 {
                return Err(InitiatorError::InvalidArgument {
                    command: PASSTHROUGH,
                    detail: "a command moves data in one direction only; give data out or a data-in length".into(),
                });
            }
            self.check_transfer(PASSTHROUGH, out.len().max(*len))?;
        }
        Ok(())
    }

    /// [`Session::submit`] on the admin queue.
    pub fn submit_admin(&self, cmd: Command, data_out: Option<&[u8]>, data_in_len: usize) -> Result<(Completion, Vec<u8>), InitiatorError> {
        self.submit_on(true, cmd, data_out, data_in_len)
    }

    fn submit_on(&self, admin: bool, c: Command, data_out: Option<&[u8]>, data_in_len: usize) -> Result<(Completion, Vec<u8>), InitiatorError> {
        let out = data_out.unwrap_or(&[]);
        if !out.is_empty() && data_in_len > 0 {
            return Err(InitiatorError::InvalidArgument {
                command: PASSTHROUGH,
                detail: "a command moves data in one direction only; give data_out or data_in_len".into(),
            });
        }
        self.check_transfer(PASSTHROUGH, out.len().max(data_in_len))?;
        let (cqe, data, _) = self.run(PASSTHROUGH, false, |a| run_one(if admin { &a.admin } else { self.pick(a) }, c, out, data_in_len, false))?;
        Ok((cqe, data))
    }
}

/// One command of a pipelined submission: the command, its data out, and the length of its
/// data in (one of the two empty).
pub type Submission<'a> = (Command, &'a [u8], usize);

/// Every completion of a pipelined submission, whatever its status, with its data in.
pub type Answers = Vec<(Completion, Vec<u8>)>;

/// What passthrough commands are called in errors.
const PASSTHROUGH: &str = "Passthrough";

/// The pieces of a pipelined submission: each command's data in placed after the last's.
fn pieces<'a>(cmds: &[Submission<'a>]) -> Vec<Piece<'a>> {
    let mut at = 0;
    cmds.iter()
        .map(|&(cmd, out, in_len)| {
            at += in_len;
            Piece { cmd, out, in_at: at - in_len, in_len }
        })
        .collect()
}

/// Each completion with its own part of the data received.
fn split_answers(cmds: &[Submission<'_>], done: Vec<(Completion, usize)>, inbuf: &[u8]) -> Answers {
    let mut at = 0;
    done.into_iter()
        .zip(cmds)
        .map(|((cqe, _), c)| {
            at += c.2;
            (cqe, inbuf[at - c.2..at].to_vec())
        })
        .collect()
}

/// [`Session::submit_pipelined`] on several sessions at once, from the calling thread:
/// every job's commands are sent first, then each job's completions are read in turn, so
/// the controllers work on all of them together and no thread is started or woken per
/// session (the thread that waits reads its own socket). The results are in job order,
/// each as `submit_pipelined` would return it. A job whose session must first reconnect
/// runs through `submit_pipelined` after the others are sent.
pub fn submit_pipelined_all(jobs: &[(&Session, &[Submission<'_>])]) -> Vec<Result<Answers, InitiatorError>> {
    let checked: Vec<Result<(), InitiatorError>> = jobs.iter().map(|(s, cmds)| s.check_pipelined(cmds)).collect();
    let assocs: Vec<Option<Arc<Association>>> = jobs.iter().zip(&checked).map(|((s, _), ok)| ok.as_ref().ok().and_then(|_| s.whole_association())).collect();
    let mut inbufs: Vec<Vec<u8>> = jobs.iter().map(|(_, cmds)| vec![0u8; cmds.iter().map(|c| c.2).sum()]).collect();
    // Sent: Some(started), or None for a job left to `submit_pipelined` (nothing sent).
    let mut sent = Vec::with_capacity(jobs.len());
    for (((s, cmds), a), buf) in jobs.iter().zip(&assocs).zip(inbufs.iter_mut()) {
        sent.push(match a {
            None => None,
            Some(a) => match start_pipeline(s.pick(a), pieces(cmds), buf) {
                Err(QError::NotSent(_)) => None,
                other => Some(other),
            },
        });
    }
    let finished: Vec<_> = sent.into_iter().map(|j| j.map(|r| r.and_then(Started::finish))).collect();
    jobs.iter()
        .zip(checked)
        .zip(finished)
        .zip(&inbufs)
        .map(|((((s, cmds), ok), done), inbuf)| {
            ok?;
            match done {
                None => s.submit_pipelined(cmds),
                Some(Ok(done)) => Ok(split_answers(cmds, done, inbuf)),
                Some(Err(e)) => Err(s.failure(PASSTHROUGH, e)),
            }
        })
        .collect()
}

/// Blocks in `len` bytes, which must be a positive multiple of `lba`.
fn blocks(command: &'static str, len: usize, lba: u32) -> Result<u64, InitiatorError> {
    if len == 0 || !len.is_multiple_of(lba as usize) {
        return Err(InitiatorError::InvalidArgument {
            command,
            detail: format!("{len} bytes is not a positive multiple of the namespace's {lba}-byte block size"),
        });
    }
    Ok((len / lba as usize) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_counts() {
        assert_eq!(blocks("Read", 4096, 512).unwrap(), 8);
        assert!(matches!(blocks("Read", 100, 512), Err(InitiatorError::InvalidArgument { .. })));
        assert!(blocks("Write", 0, 512).is_err());
    }
}
