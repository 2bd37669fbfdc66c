// SPDX-License-Identifier: Apache-2.0
//! An association: the admin queue and I/O queues of one controller, and the steps that
//! bring it up (Connect, CC.EN, Identify, Number of Queues, I/O queue Connects).

use crate::cmd::{self, property, DISCOVERY_NQN};
use crate::info::ControllerInfo;
use crate::queue::{Counters, QError, Queue, Ticket};
use crate::{ConnectOptions, InitiatorError};
use insitu_fabric::{Command, Completion};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Admin queue entries (SQSIZE 31).
pub(crate) const ADMIN_DEPTH: u16 = 32;
/// In-capsule data on the admin queue: the NVMe/TCP binding fixes the admin command
/// capsule at 8 KiB, of which the SQE takes 64 bytes.
pub(crate) const ADMIN_IN_CAPSULE: usize = 8192 - 64;

/// One controller's queues.
pub(crate) struct Association {
    /// Generation: 0 for the first association, +1 per reconnect.
    pub gen: u64,
    pub admin: Queue,
    pub io: Vec<Queue>,
    pub ctrl: ControllerInfo,
    /// Controller ID from the admin Connect.
    pub cntlid: u16,
    /// CAP property.
    pub cap: u64,
    /// VS property.
    pub vs: u32,
    /// Bytes one command may move (MDTS, capped when unlimited).
    pub max_transfer: usize,
    /// Bytes a Read or Write command moves at most: `max_transfer`, or less when
    /// [`ConnectOptions::max_io_bytes`] asks.
    pub split_at: usize,
}

/// Maps a queue failure during setup to an error naming the step.
fn setup_err(command: &'static str, e: QError, timeout: Duration) -> InitiatorError {
    match e {
        QError::NotSent(detail) | QError::Lost(detail) => InitiatorError::ConnectionLost { command, detail },
        QError::Timeout => InitiatorError::Timeout { command, timeout },
    }
}

/// Runs one command on `q` and returns its completion (whatever the status) and data.
pub(crate) fn run_one(q: &Queue, c: Command, out: &[u8], data_in: usize, force_inline: bool) -> Result<(Completion, Vec<u8>, usize), QError> {
    let mut buf = vec![0u8; data_in];
    let cid = q.reserve(true)?.expect("a blocking reserve always returns an identifier");
    let t = q.start(cid, c, out, &mut buf, force_inline)?;
    let (cqe, n) = t.wait()?;
    Ok((cqe, buf, n))
}

/// One command of a [`pipeline`]: the command, its data out, and the range of the input
/// buffer its data in fills (pieces' ranges ascend and do not overlap).
pub(crate) struct Piece<'a> {
    pub cmd: Command,
    pub out: &'a [u8],
    pub in_at: usize,
    pub in_len: usize,
}

/// Runs several commands on `q` with as many in flight as free CIDs allow (never waiting
/// for a CID while holding one, so concurrent pipelines cannot deadlock). Returns each
/// completion and its received byte count, in order. A queue failure after a command was
/// sent is reported as [`QError::Lost`].
pub(crate) fn pipeline<'a>(q: &'a Queue, pieces: Vec<Piece<'a>>, inbuf: &'a mut [u8]) -> Result<Vec<(Completion, usize)>, QError> {
    start_pipeline(q, pieces, inbuf)?.finish()
}

/// A [`pipeline`] whose commands have all been sent (or completed, when CIDs ran short):
/// [`Started::finish`] waits for the rest. Several, on several queues, are started from
/// one thread and then finished in turn, so the controllers work on all of them at once
/// without a thread per queue.
pub(crate) struct Started<'a> {
    inflight: VecDeque<Ticket<'a>>,
    done: Vec<(Completion, usize)>,
}

impl Started<'_> {
    /// Waits for every command still in flight; completions in order.
    pub(crate) fn finish(mut self) -> Result<Vec<(Completion, usize)>, QError> {
        while let Some(t) = self.inflight.pop_front() {
            self.done.push(t.wait()?);
        }
        Ok(self.done)
    }
}

/// Sends the commands of a [`pipeline`] and returns without waiting for them (but for
/// those it must finish to free a CID). [`QError::NotSent`] means nothing was sent.
pub(crate) fn start_pipeline<'a>(q: &'a Queue, pieces: Vec<Piece<'a>>, inbuf: &'a mut [u8]) -> Result<Started<'a>, QError> {
    let mut inflight: VecDeque<Ticket<'a>> = VecDeque::new();
    let mut done = Vec::with_capacity(pieces.len());
    let mut started = false;
    let lost = |e: QError, started: bool| match e {
        QError::NotSent(d) if started => QError::Lost(d),
        e => e,
    };
    // Each command gets its own part of the input buffer, lent to the queue while it runs.
    let (mut rest, mut rest_at) = (inbuf, 0);
    for p in pieces {
        let mut part: &'a mut [u8] = &mut [];
        if p.in_len > 0 {
            let tail = std::mem::take(&mut rest);
            let (_, tail) = tail.split_at_mut(p.in_at - rest_at);
            let (mine, tail) = tail.split_at_mut(p.in_len);
            (part, rest, rest_at) = (mine, tail, p.in_at + p.in_len);
        }
        // Never wait for an identifier while holding one: finish the oldest command instead.
        let cid = loop {
            match q.reserve(inflight.is_empty()).map_err(|e| lost(e, started))? {
                Some(cid) => break cid,
                None => done.push(inflight.pop_front().expect("non-blocking reserve only with commands in flight").wait()?),
            }
        };
        inflight.push_back(q.start(cid, p.cmd, p.out, part, false).map_err(|e| lost(e, started))?);
        started = true;
    }
    Ok(Started { inflight, done })
}

/// [`pipeline`] over every queue of `queues` at once, starting at queue `first`: the
/// pieces (ascending, each filling its own range of `inbuf`) dealt out in contiguous
/// shares, one per queue, each share driven by a thread of its own (the caller's for the
/// first), so that the controller serves them on as many connections as the host has
/// queues. Returns every completion in piece order; the first failure, in share order,
/// is the one returned.
pub(crate) fn pipeline_spread<'a>(queues: &'a [Queue], first: usize, pieces: Vec<Piece<'a>>, inbuf: &'a mut [u8]) -> Result<Vec<(Completion, usize)>, QError> {
    let count = queues.len().min(pieces.len()).max(1);
    let queue = |i: usize| &queues[(first + i) % queues.len()];
    if count == 1 {
        return pipeline(queue(0), pieces, inbuf);
    }
    // Contiguous shares: each share's data in lands in one slice of the buffer.
    let per = pieces.len().div_ceil(count);
    let mut shares: Vec<(Vec<Piece<'a>>, &'a mut [u8])> = Vec::with_capacity(count);
    let (mut rest, mut rest_at) = (inbuf, 0usize);
    let mut pieces = pieces.into_iter().peekable();
    while pieces.peek().is_some() {
        let mut share: Vec<Piece<'a>> = pieces.by_ref().take(per).collect();
        let end = share.iter().map(|p| p.in_at + p.in_len).max().unwrap_or(rest_at);
        let (mine, tail) = std::mem::take(&mut rest).split_at_mut(end - rest_at);
        share.iter_mut().for_each(|p| p.in_at -= rest_at);
        shares.push((share, mine));
        (rest, rest_at) = (tail, end);
    }
    std::thread::scope(|s| {
        let mut shares = shares.into_iter().enumerate();
        let (_, (own, own_buf)) = shares.next().expect("two shares or more");
        let others: Vec<_> = shares.map(|(i, (share, buf))| s.spawn(move || pipeline(queue(i), share, buf))).collect();
        let mut done = pipeline(queue(0), own, own_buf);
        for h in others {
            let theirs = h.join().unwrap_or_else(|_| Err(QError::Lost("a thread driving a queue panicked".into())));
            done = match (done, theirs) {
                (Ok(mut all), Ok(more)) => {
                    all.extend(more);
                    Ok(all)
                }
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
        }
        done
    })
}

fn check(command: &'static str, cqe: &Completion) -> Result<(), InitiatorError> {
    InitiatorError::from_status(command, cqe.status).map_or(Ok(()), Err)
}

/// Runs a setup command on the admin queue and checks its status.
fn admin(q: &Queue, command: &'static str, c: Command, data_in: usize, timeout: Duration) -> Result<(Completion, Vec<u8>), InitiatorError> {
    let (cqe, data, _) = run_one(q, c, &[], data_in, false).map_err(|e| setup_err(command, e, timeout))?;
    check(command, &cqe)?;
    Ok((cqe, data))
}

/// Property Get of a 4- or 8-byte property on the admin queue.
pub(crate) fn property_get(q: &Queue, offset: u32, size8: bool, timeout: Duration) -> Result<u64, InitiatorError> {
    let (cqe, _) = admin(q, "Property Get", cmd::property_get(offset, size8), 0, timeout)?;
    Ok(if size8 { u64::from(cqe.dw0) | u64::from(cqe.dw1) << 32 } else { u64::from(cqe.dw0) })
}

/// Property Set of a 4-byte property on the admin queue.
pub(crate) fn property_set(q: &Queue, offset: u32, value: u32, timeout: Duration) -> Result<(), InitiatorError> {
    admin(q, "Property Set", cmd::property_set(offset, false, u64::from(value)), 0, timeout).map(drop)
}

/// Explains a refused Connect.
fn connect_refused(opts: &ConnectOptions, qid: u16, cqe: &Completion) -> InitiatorError {
    let (sct, sc) = crate::error::split_status(cqe.status);
    let hint = match (sct, sc) {
        (1, 0x84) => format!("the subsystem does not allow host {}; add it to the subsystem's allowed hosts", opts.hostnqn),
        (1, 0x82) => {
            let (ipo, in_data) = (cqe.dw0 & 0xFFFF, (cqe.dw0 >> 16) & 1 == 1);
            let field = match (in_data, ipo) {
                (true, 0) => format!("host identifier {}", crate::options::format_uuid(&opts.hostid)),
                (true, 16) => "controller ID".to_string(),
                (true, 256) => format!("subsystem NQN {} (is that subsystem on this target? the discovery log lists them)", opts.subnqn),
                (true, 512) => format!("host NQN {}", opts.hostnqn),
                (false, 42) => format!("queue ID {qid}"),
                (false, 44) => "queue size (lower ConnectOptions::queue_depth)".to_string(),
                (false, 48) => format!("keep-alive timeout {} ms", opts.kato_ms),
                (d, o) => format!("field at byte {o} of the Connect {}", if d { "data" } else { "command" }),
            };
            format!("the controller rejected the {field}")
        }
        (1, 0x80) => "the controller does not support Connect record format 0".to_string(),
        (1, 0x81) => "the controller is busy; retry later".to_string(),
        (1, 0x83) => "the discovery information changed; read the discovery log again".to_string(),
        _ => "see the target's log".to_string(),
    };
    InitiatorError::ConnectRefused { subnqn: opts.subnqn.clone(), qid, sct, sc, reason: crate::error::status_name("Connect", sct, sc).to_string(), hint }
}

/// Sends Fabrics Connect for queue `qid` with in-capsule Connect data; returns the
/// controller ID from CQE DW0.
pub(crate) fn connect_queue(q: &Queue, opts: &ConnectOptions, sqsize: u16, kato: u32, cntlid: u16) -> Result<u16, InitiatorError> {
    let data = cmd::connect_data(&opts.hostid, cntlid, &opts.subnqn, &opts.hostnqn);
    let (cqe, _, _) = run_one(q, cmd::connect(q.qid, sqsize, kato), &data, 0, true).map_err(|e| setup_err("Connect", e, opts.timeout))?;
    if cqe.status != 0 {
        return Err(connect_refused(opts, q.qid, &cqe));
    }
    Ok(cqe.dw0 as u16)
}

fn wait_ready(q: &Queue, opts: &ConnectOptions, cap: u64) -> Result<(), InitiatorError> {
    let to = Duration::from_millis(500 * ((cap >> 24) & 0xFF)).max(Duration::from_secs(1));
    let deadline = Instant::now() + to;
    loop {
        let csts = property_get(q, property::CSTS, false, opts.timeout)?;
        if csts & 2 != 0 {
            return Err(InitiatorError::NotReady {
                subnqn: opts.subnqn.clone(),
                detail: format!("CSTS {csts:#x} reports Controller Fatal Status; reset the target"),
            });
        }
        if csts & 1 != 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(InitiatorError::NotReady { subnqn: opts.subnqn.clone(), detail: format!("CSTS.RDY still 0 {to:?} after CC.EN=1 (CSTS {csts:#x})") });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

impl Association {
    /// Brings up a new association with `opts`.
    pub fn establish(opts: &ConnectOptions, stats: &Arc<Counters>, gen: u64) -> Result<Association, InitiatorError> {
        let t = opts.timeout;
        let admin_q = Queue::open(&opts.addr, 0, opts.digests, ADMIN_DEPTH, t, stats.clone())?;
        admin_q.set_in_capsule(ADMIN_IN_CAPSULE);
        let cntlid = connect_queue(&admin_q, opts, ADMIN_DEPTH - 1, opts.kato_ms, 0xFFFF)?;
        let cap = property_get(&admin_q, property::CAP, true, t)?;
        let vs = property_get(&admin_q, property::VS, false, t)? as u32;
        property_set(&admin_q, property::CC, cmd::CC_ENABLE, t)?;
        wait_ready(&admin_q, opts, cap)?;
        let min_page = 4096u64 << ((cap >> 48) & 0xF);
        let (_, raw) = admin(&admin_q, "Identify", cmd::identify(1, 0), 4096, t)?;
        let ctrl = ControllerInfo::parse(&raw, min_page).expect("4096 bytes");
        let max_transfer = cmd::max_transfer(ctrl.mdts_bytes);
        let max_plen = u32::try_from(max_transfer.max(ADMIN_IN_CAPSULE) + 4096).unwrap_or(u32::MAX);
        admin_q.set_max_plen(max_plen);
        let mut io = Vec::new();
        if opts.subnqn != DISCOVERY_NQN && opts.io_queues > 0 {
            let (cqe, _) = admin(&admin_q, "Set Features (Number of Queues)", cmd::set_num_queues(opts.io_queues), 0, t)?;
            let granted = (cqe.dw0 & 0xFFFF).min(cqe.dw0 >> 16) + 1;
            let n = u32::from(opts.io_queues).min(granted) as u16;
            let mut depth = opts.queue_depth.max(1).min((cap & 0xFFFF) as u16 + 1);
            if ctrl.maxcmd != 0 {
                depth = depth.min(ctrl.maxcmd);
            }
            for qid in 1..=n {
                let q = Queue::open(&opts.addr, qid, opts.digests, depth, t, stats.clone())?;
                q.set_in_capsule(ctrl.in_capsule_bytes());
                q.set_max_plen(max_plen);
                connect_queue(&q, opts, depth - 1, 0, cntlid)?;
                io.push(q);
            }
        }
        let split_at = opts.max_io_bytes.map_or(max_transfer, |b| b.clamp(1, max_transfer));
        Ok(Association { gen, admin: admin_q, io, ctrl, cntlid, cap, vs, max_transfer, split_at })
    }

    /// Whether any queue has closed: the association is then unusable as a whole (a
    /// controller whose admin queue is gone is gone) and is replaced before the next
    /// command rather than risking a command on a dying connection.
    pub fn broken(&self) -> bool {
        self.admin.is_closed() || self.io.iter().any(Queue::is_closed)
    }

    /// Normal shutdown: CC.SHN = 01b, then waits (up to 2 s) for CSTS.SHST = 10b.
    pub fn shutdown(&self, timeout: Duration) -> Result<(), InitiatorError> {
        let cc = property_get(&self.admin, property::CC, false, timeout)? as u32;
        property_set(&self.admin, property::CC, (cc & !(3 << 14)) | cmd::CC_SHN_NORMAL, timeout)?;
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if (property_get(&self.admin, property::CSTS, false, timeout)? >> 2) & 3 == 2 {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }
}
