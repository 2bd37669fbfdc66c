// SPDX-License-Identifier: Apache-2.0
//! One NVMe/TCP queue: a TCP connection, a shared writer, a pool of command identifiers,
//! and PDUs routed to waiting commands by CID by whichever waiting thread leads.
//!
//! A command is started with [`Queue::start`], which lends the caller's buffers to the
//! queue for the command's life and returns a [`Ticket`]; the caller's thread then waits on
//! the ticket. There is no reader thread: the queue's socket is read by one of the threads
//! waiting on it (the leader, as in a leader/follower pool), which places C2HData straight
//! into the buffer of whichever command it belongs to and posts completions to their
//! tickets. When its own command completes, the leader hands the socket to another waiting
//! thread. A caller that keeps a pipeline of commands in flight on a queue of its own thus
//! reads its own completions and never waits for another thread to wake it, which is most
//! of what a command cost on small machines. A sender thread answers R2Ts with H2CData
//! sent straight from the caller's data, so every command of a pipeline gets its data as
//! soon as the controller asks, and the leader never writes, so a full socket in one
//! direction cannot stall the other. Any decode error, unexpected PDU or C2HTermReq closes
//! the queue and fails every outstanding command.

use crate::cid::CidPool;
use crate::InitiatorError;
use insitu_fabric::{check_data_digest, Command, CommonHeader, Completion, Digests, Pdu, SGL_DATA_BLOCK_OFFSET, SGL_TRANSPORT_DATA_BLOCK};
use std::io::{BufReader, Read, Write};
use std::marker::PhantomData;
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes moved on the wire, all queues together.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub sent: AtomicU64,
    pub received: AtomicU64,
}

/// Why a command did not complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum QError {
    /// The queue was already closed: nothing was sent.
    NotSent(String),
    /// The queue closed with the command in flight.
    Lost(String),
    /// No completion within the timeout (the queue has been closed).
    Timeout,
}

/// Receive buffer: large enough to take several small PDUs in one system call, small
/// enough that data is read mostly straight into the caller's buffer (reads at least this
/// long bypass it).
const RECV_BUFFER: usize = 4096;

enum Event {
    /// The completion, and the data bytes placed in the command's buffer.
    Done(Completion, usize),
    Failed(String),
    /// The leader has let go of the socket: the waiting thread should try to take it.
    Lead,
}

/// A caller's buffer lent to the queue's threads for one command: the reader thread fills
/// an input buffer from C2HData, the sender thread sends an output buffer's data in
/// H2CData. The [`Ticket`] that lent it calls [`Lease::revoke`] before it lets its caller
/// have the buffer back; revoking waits for a thread that is using it.
struct Lease {
    region: Mutex<Option<Region>>,
}

#[derive(Clone, Copy)]
struct Region {
    ptr: *mut u8,
    len: usize,
    /// Lent by `&mut` (an input buffer): it may be written.
    writable: bool,
}

// SAFETY: a Region is only dereferenced under its Lease's lock, while the Ticket that
// borrows the memory for its lifetime has not revoked it (see `Lease`).
unsafe impl Send for Region {}

impl Lease {
    /// Lends a buffer the caller may write to the queue (C2HData lands in it).
    fn writable(buf: &mut [u8]) -> Arc<Lease> {
        Lease::new(Region { ptr: buf.as_mut_ptr(), len: buf.len(), writable: true })
    }

    /// Lends a buffer the queue only reads (H2CData is sent from it).
    fn readable(buf: &[u8]) -> Arc<Lease> {
        Lease::new(Region { ptr: buf.as_ptr().cast_mut(), len: buf.len(), writable: false })
    }

    fn new(r: Region) -> Arc<Lease> {
        Arc::new(Lease { region: Mutex::new((r.len > 0).then_some(r)) })
    }

    /// Runs `f` on `len` bytes at `offset` of a writable buffer, or on `None` once revoked
    /// (or for a read-only one).
    fn fill<R>(&self, offset: usize, len: usize, f: impl FnOnce(Option<&mut [u8]>) -> R) -> R {
        let guard = lock(&self.region);
        match *guard {
            Some(r) if r.writable && offset.checked_add(len).is_some_and(|end| end <= r.len) => {
                // SAFETY: the region is the live buffer a ticket borrowed mutably and has not
                // revoked (revoking takes this lock), the range is inside it, and only the
                // thread holding the lock touches it.
                f(Some(unsafe { std::slice::from_raw_parts_mut(r.ptr.add(offset), len) }))
            }
            _ => f(None),
        }
    }

    /// Runs `f` on `len` bytes at `offset` of the buffer, or on `None` once revoked.
    fn read<R>(&self, offset: usize, len: usize, f: impl FnOnce(Option<&[u8]>) -> R) -> R {
        let guard = lock(&self.region);
        match *guard {
            Some(r) if offset.checked_add(len).is_some_and(|end| end <= r.len) => {
                // SAFETY: the region is the live buffer of a ticket that has not revoked it
                // (revoking takes this lock) and the range is inside it; it is only read.
                f(Some(unsafe { std::slice::from_raw_parts(r.ptr.add(offset).cast_const(), len) }))
            }
            _ => f(None),
        }
    }

    fn revoke(&self) {
        *lock(&self.region) = None;
    }
}

/// An R2T for the sender thread to answer.
struct R2tJob {
    cid: u16,
    ttag: u16,
    offset: usize,
    len: usize,
    data: Arc<Lease>,
}

struct Slot {
    tx: Sender<Event>,
    /// A thread waits on the command's ticket (and may be asked to lead).
    waiting: bool,
    /// Data bytes placed so far; reported with the completion, so that the waiting thread
    /// is woken once per command.
    received: usize,
    data_in: Arc<Lease>,
    in_len: usize,
    data_out: Arc<Lease>,
    out_len: usize,
}

struct Slots {
    dead: Option<String>,
    map: Vec<Option<Slot>>,
}

/// The socket's receiving side, held by the leading thread.
struct ReadSide {
    rd: BufReader<TcpStream>,
    head: Vec<u8>,
}

struct Shared {
    qid: u16,
    sock: TcpStream,
    writer: Mutex<TcpStream>,
    slots: Mutex<Slots>,
    read_side: Mutex<ReadSide>,
    /// R2Ts for the sender thread; dropped when the queue closes, which ends that thread.
    r2t: Mutex<Option<Sender<R2tJob>>>,
    timeout: Duration,
    stats: Arc<Counters>,
    digests: Digests,
    max_plen: AtomicU32,
    /// Set once the queue is closed (mirrors `slots.dead`, readable without the lock).
    closed: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    /// Sends `pdu` carrying `data` (vectored: the data goes out from where it lies).
    fn send(&self, pdu: &Pdu, data: &[u8], pda: u8) -> std::io::Result<()> {
        let n = pdu.write_with_data(data, self.digests, pda, &mut *lock(&self.writer))?;
        self.stats.sent.fetch_add(n as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Marks the queue dead (the first reason sticks), fails every outstanding command and
    /// shuts the socket down, which also ends the reader thread.
    fn close(&self, reason: &str) {
        let mut s = lock(&self.slots);
        let reason = s.dead.get_or_insert_with(|| reason.to_string()).clone();
        self.closed.store(true, Ordering::SeqCst);
        for slot in s.map.iter_mut().filter_map(Option::take) {
            let _ = slot.tx.send(Event::Failed(reason.clone()));
        }
        drop(s);
        lock(&self.r2t).take();
        let _ = self.sock.shutdown(Shutdown::Both);
    }

    /// Waits for command `cid`'s event on `rx`, leading (reading the socket for every
    /// command) whenever no other thread does.
    fn wait_for(&self, cid: u16, rx: &Receiver<Event>, deadline: Instant) -> Result<(Completion, usize), QError> {
        if let Some(Some(slot)) = lock(&self.slots).map.get_mut(usize::from(cid)) {
            slot.waiting = true;
        }
        // Whether this thread was asked to lead: if it finishes without leading, it must
        // ask another thread, or a waiting one could be left with nobody reading for it.
        let mut asked = false;
        let done = loop {
            let event = match rx.try_recv() {
                Ok(event) => Some(event),
                Err(mpsc::TryRecvError::Empty) => None,
                Err(mpsc::TryRecvError::Disconnected) => break Err(QError::Lost("the queue dropped the command".into())),
            };
            match event.map(finished) {
                Some(Some(done)) => break done,
                Some(None) => asked = true,
                None => {}
            }
            if let Ok(mut side) = self.read_side.try_lock() {
                let done = self.lead(&mut side, rx, cid, deadline);
                drop(side);
                self.pass_lead();
                return done;
            }
            // Another thread leads; it posts this command's completion or, when it lets go
            // of the socket, asks a waiting thread to lead.
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(event) => match finished(event) {
                    Some(done) => break done,
                    None => asked = true,
                },
                Err(RecvTimeoutError::Timeout) => break Err(self.timed_out(cid)),
                Err(RecvTimeoutError::Disconnected) => break Err(QError::Lost("the queue dropped the command".into())),
            }
        };
        if asked {
            self.pass_lead();
        }
        done
    }

    /// Reads PDUs for every command until `cid`'s event arrives.
    fn lead(&self, side: &mut ReadSide, rx: &Receiver<Event>, cid: u16, deadline: Instant) -> Result<(Completion, usize), QError> {
        loop {
            // Requests to lead may have queued up ahead of the completion: skip them all.
            while let Ok(event) = rx.try_recv() {
                if let Some(done) = finished(event) {
                    return done;
                }
            }
            if Instant::now() >= deadline {
                return Err(self.timed_out(cid));
            }
            if let Err(reason) = receive(self, side) {
                // The socket's own timeout is the queue's command timeout: nothing arrived
                // for that long while this command was outstanding.
                if reason.timed_out {
                    return Err(self.timed_out(cid));
                }
                self.close(&reason.text);
            }
        }
    }

    fn timed_out(&self, cid: u16) -> QError {
        self.close(&format!("command {cid} on queue {} timed out after {:?}", self.qid, self.timeout));
        QError::Timeout
    }

    /// Finds out, without blocking, whether the target closed an idle connection: with no
    /// thread reading the socket, nobody else would notice before the next command.
    fn probe(&self) {
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        let Ok(side) = self.read_side.try_lock() else { return };
        let mut byte = 0u8;
        let n = if side.rd.buffer().is_empty() {
            // SAFETY: recv on the queue's own open socket into one valid byte; MSG_PEEK
            // leaves whatever is there for the next leader.
            unsafe { libc::recv(self.sock.as_raw_fd(), (&raw mut byte).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) }
        } else {
            1 // data already received and not yet read: open
        };
        let err = std::io::Error::last_os_error();
        drop(side);
        // A thread that found the socket taken by this probe is waiting to be asked.
        self.pass_lead();
        if n == 0 {
            self.close("the target closed the connection");
        } else if n < 0 && !matches!(err.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) {
            self.close(&format!("receive failed: {err}"));
        }
    }

    /// Asks one waiting thread, if any, to take the socket.
    fn pass_lead(&self) {
        let s = lock(&self.slots);
        if let Some(slot) = s.map.iter().flatten().find(|slot| slot.waiting) {
            let _ = slot.tx.send(Event::Lead);
        }
    }

    /// Checks a C2HData header against its command and returns the buffer its data goes to.
    fn c2h_target(&self, cccid: u16, datao: usize, len: usize, last: bool, success: bool) -> Result<Arc<Lease>, String> {
        let guard = lock(&self.slots);
        let Some(Some(s)) = guard.map.get(usize::from(cccid)) else {
            return Err(format!("C2HData for CID {cccid}, which has no command outstanding"));
        };
        if datao + len > s.in_len {
            return Err(format!("C2HData for CID {cccid} at offset {datao} with {len} bytes overruns the command's {}-byte transfer", s.in_len));
        }
        if success && !last {
            return Err(format!("C2HData for CID {cccid} has SUCCESS without LAST_PDU"));
        }
        Ok(s.data_in.clone())
    }

    /// `len` bytes of C2HData have been placed; with SUCCESS the command is complete.
    fn c2h_placed(&self, cccid: u16, len: usize, success: bool) {
        let mut guard = lock(&self.slots);
        let Some(e) = guard.map.get_mut(usize::from(cccid)) else { return };
        if let Some(s) = e.as_mut() {
            s.received += len;
        }
        if success {
            if let Some(s) = e.take() {
                let _ = s.tx.send(Event::Done(Completion { cid: cccid, sqid: self.qid, ..Completion::default() }, s.received));
            }
        }
    }

    /// Routes one PDU without data from the controller; an error is fatal to the queue.
    fn dispatch(&self, pdu: Pdu) -> Result<(), String> {
        fn slot<'a>(map: &'a mut [Option<Slot>], cid: u16, what: &str) -> Result<&'a mut Option<Slot>, String> {
            match map.get_mut(usize::from(cid)) {
                Some(e @ Some(_)) => Ok(e),
                _ => Err(format!("{what} for CID {cid}, which has no command outstanding")),
            }
        }
        let mut guard = lock(&self.slots);
        let map = &mut guard.map;
        match pdu {
            Pdu::CapsuleResp { cqe } => {
                let e = slot(map, cqe.cid, "response capsule")?.take().expect("checked");
                let _ = e.tx.send(Event::Done(cqe, e.received));
            }
            Pdu::R2T { cccid, ttag, r2to, r2tl } => {
                let s = slot(map, cccid, "R2T")?.as_ref().expect("checked");
                let (offset, len) = (r2to as usize, r2tl as usize);
                if len == 0 || offset + len > s.out_len {
                    return Err(format!("R2T for CID {cccid} asks for {len} bytes at offset {offset} of a {}-byte transfer", s.out_len));
                }
                if let Some(r2t) = lock(&self.r2t).as_ref() {
                    let _ = r2t.send(R2tJob { cid: cccid, ttag, offset, len, data: s.data_out.clone() });
                }
            }
            Pdu::TermReq { fes, fei, .. } => {
                return Err(format!("the target terminated the connection (C2HTermReq: {}, FEI {fei:#x})", fes_name(fes)));
            }
            other => return Err(format!("unexpected PDU from the controller: {other:?}")),
        }
        Ok(())
    }
}

/// Fatal Error Status of a terminate request, in words.
pub(crate) fn fes_name(fes: u16) -> String {
    let name = match fes {
        0x01 => "invalid PDU header field",
        0x02 => "PDU sequence error",
        0x03 => "header or data digest error",
        0x04 => "data transfer out of range",
        0x05 => "data transfer limit exceeded",
        0x06 => "unsupported parameter",
        _ => "unknown fatal error",
    };
    format!("FES {fes:#x} {name}")
}

/// What ended a receive: a reason to close the queue, or the socket's timeout.
struct RecvError {
    text: String,
    timed_out: bool,
}

impl From<String> for RecvError {
    fn from(text: String) -> RecvError {
        RecvError { text, timed_out: false }
    }
}

/// The outcome an event gives its waiting thread, or `None` for a request to lead.
fn finished(event: Event) -> Option<Result<(Completion, usize), QError>> {
    match event {
        Event::Done(cqe, received) => Some(Ok((cqe, received))),
        Event::Failed(reason) => Some(Err(QError::Lost(reason))),
        Event::Lead => None,
    }
}

/// Receives one PDU: C2HData straight into its command's buffer, anything else to
/// [`Shared::dispatch`].
fn receive(shared: &Shared, side: &mut ReadSide) -> Result<(), RecvError> {
    let ReadSide { rd, head } = side;
    let recv_err = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => RecvError::from("the target closed the connection".to_string()),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => RecvError { text: format!("receive failed: {e}"), timed_out: true },
        _ => RecvError::from(format!("receive failed: {e}")),
    };
    let mut h = [0u8; 8];
    rd.read_exact(&mut h).map_err(recv_err)?;
    let ch = CommonHeader::parse(&h, shared.max_plen.load(Ordering::Relaxed)).map_err(|e| format!("invalid PDU header from the controller: {e}"))?;
    let layout = ch.layout(shared.digests).map_err(|e| format!("invalid PDU from the controller: {e}"))?;
    head.resize(layout.head, 0);
    rd.read_exact(head).map_err(|e| format!("receive failed in the middle of a PDU: {e}"))?;
    let pdu = Pdu::decode_head(&ch, head, &layout).map_err(|e| format!("invalid PDU from the controller: {e}"))?;
    shared.stats.received.fetch_add(u64::from(ch.plen), Ordering::Relaxed);
    let mut digest = [0u8; 4];
    let digest = &mut digest[..layout.digest];
    let mid = |e: std::io::Error| format!("receive failed in the middle of a PDU: {e}");
    let bad_digest = |e: insitu_fabric::PduError| format!("invalid PDU from the controller: {e}");
    if let Pdu::C2HData { cccid, datao, last, success, .. } = pdu {
        let dest = shared.c2h_target(cccid, datao as usize, layout.data, last, success)?;
        dest.fill(datao as usize, layout.data, |buf| -> Result<(), String> {
            match buf {
                Some(buf) => {
                    rd.read_exact(buf).map_err(mid)?;
                    rd.read_exact(digest).map_err(mid)?;
                    if !digest.is_empty() {
                        check_data_digest(buf, digest).map_err(bad_digest)?;
                    }
                }
                // The command was given up (timeout, queue closing): skip its data.
                None => skip(rd, layout.data + layout.digest).map_err(mid)?,
            }
            Ok(())
        })?;
        shared.c2h_placed(cccid, layout.data, success);
        return Ok(());
    }
    // Only a terminate request carries data besides C2HData; it is read and dropped.
    skip(rd, layout.data + layout.digest).map_err(mid)?;
    Ok(shared.dispatch(pdu)?)
}

/// Reads and drops the next `n` bytes.
fn skip(rd: &mut BufReader<TcpStream>, n: usize) -> std::io::Result<()> {
    let got = std::io::copy(&mut rd.by_ref().take(n as u64), &mut std::io::sink())?;
    if got < n as u64 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// Answers R2Ts until the reader stops: sends the requested range of the command's data in
/// H2CData PDUs of at most `maxh2cdata` bytes, straight from the caller's buffer.
fn sender_loop(shared: Arc<Shared>, jobs: Receiver<R2tJob>, maxh2cdata: usize, cpda: u8) {
    for job in jobs {
        let sent = job.data.read(job.offset, job.len, |data| -> std::io::Result<()> {
            let Some(data) = data else { return Ok(()) }; // given up: nothing to send
            for (o, l) in crate::cmd::split_bytes(job.len, maxh2cdata) {
                let pdu = Pdu::H2CData { cccid: job.cid, ttag: job.ttag, datao: (job.offset + o) as u32, last: o + l == job.len, data: Vec::new() };
                shared.send(&pdu, &data[o..o + l], cpda)?;
            }
            Ok(())
        });
        if let Err(e) = sent {
            shared.close(&format!("send failed: {e}"));
        }
    }
}

/// An open queue.
pub(crate) struct Queue {
    /// Queue identifier (0 = admin).
    pub qid: u16,
    /// Digests negotiated in ICReq/ICResp.
    pub digests: Digests,
    shared: Arc<Shared>,
    cids: CidPool,
    threads: Mutex<Vec<JoinHandle<()>>>,
    cpda: u8,
    in_capsule: AtomicUsize,
}

fn dial(addr: &str, timeout: Duration) -> Result<TcpStream, InitiatorError> {
    let err = |source| InitiatorError::Connect { addr: addr.to_string(), source };
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "the address resolved to nothing");
    for sa in addr.to_socket_addrs().map_err(err)? {
        match TcpStream::connect_timeout(&sa, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(err(last))
}

impl Queue {
    /// Connects to `addr` and performs the ICReq/ICResp exchange (PFV 0, HPDA 0, MAXR2T 0,
    /// the requested digests). The queue holds `depth` command identifiers.
    pub fn open(addr: &str, qid: u16, want: Digests, depth: u16, timeout: Duration, stats: Arc<Counters>) -> Result<Queue, InitiatorError> {
        let sock = dial(addr, timeout)?;
        let hs = |detail: String| InitiatorError::Handshake { addr: addr.to_string(), qid, detail };
        let io = |e: std::io::Error| hs(format!("socket error: {e}"));
        sock.set_nodelay(true).map_err(io)?;
        sock.set_read_timeout(Some(timeout)).map_err(io)?;
        let mut buf = Vec::new();
        Pdu::IcReq { pfv: 0, hpda: 0, digests: want, maxr2t: 0 }.encode(Digests::default(), 0, &mut buf);
        (&sock).write_all(&buf).map_err(io)?;
        stats.sent.fetch_add(buf.len() as u64, Ordering::Relaxed);
        let mut h = [0u8; 8];
        (&sock).read_exact(&mut h).map_err(io)?;
        let ch = CommonHeader::parse(&h, 4096).map_err(|e| hs(format!("invalid ICResp header: {e}")))?;
        let mut rest = vec![0u8; ch.plen as usize - 8];
        (&sock).read_exact(&mut rest).map_err(io)?;
        stats.received.fetch_add(u64::from(ch.plen), Ordering::Relaxed);
        let (cpda, digests, maxh2cdata) = match Pdu::decode(&ch, &rest, Digests::default()).map_err(|e| hs(format!("invalid ICResp: {e}")))? {
            Pdu::IcResp { cpda, digests, maxh2cdata, .. } => (cpda, digests, maxh2cdata),
            Pdu::TermReq { fes, .. } => return Err(hs(format!("the controller refused the connection ({})", fes_name(fes)))),
            other => return Err(hs(format!("expected ICResp, got {other:?}"))),
        };
        if (digests.header && !want.header) || (digests.data && !want.data) {
            return Err(hs(format!("the controller enabled digests {digests:?} that were not requested ({want:?})")));
        }
        if maxh2cdata < 4096 || maxh2cdata % 4 != 0 {
            return Err(hs(format!("MAXH2CDATA {maxh2cdata} is invalid (at least 4096, a multiple of 4)")));
        }
        if cpda > 31 {
            return Err(hs(format!("CPDA {cpda} exceeds 31")));
        }
        let writer = sock.try_clone().map_err(io)?;
        let rd = BufReader::with_capacity(RECV_BUFFER, sock.try_clone().map_err(io)?);
        // Queue::close drops the R2T channel's sender, which ends the sender thread.
        let (r2t_tx, r2t_rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            qid,
            sock,
            writer: Mutex::new(writer),
            slots: Mutex::new(Slots { dead: None, map: (0..depth).map(|_| None).collect() }),
            read_side: Mutex::new(ReadSide { rd, head: Vec::new() }),
            r2t: Mutex::new(Some(r2t_tx)),
            timeout,
            stats,
            digests,
            max_plen: AtomicU32::new(1 << 20),
            closed: AtomicBool::new(false),
        });
        let s3 = shared.clone();
        let sender = std::thread::Builder::new().name(format!("nvmf-q{qid}-tx")).spawn(move || sender_loop(s3, r2t_rx, maxh2cdata as usize, cpda));
        let sender = match sender {
            Ok(t) => t,
            Err(e) => {
                shared.close("cannot start the queue's sender thread");
                return Err(io(e));
            }
        };
        Ok(Queue { qid, digests, shared, cids: CidPool::new(depth), threads: Mutex::new(vec![sender]), cpda, in_capsule: AtomicUsize::new(0) })
    }

    /// Sets the largest in-capsule write (bytes).
    pub fn set_in_capsule(&self, bytes: usize) {
        self.in_capsule.store(bytes, Ordering::Relaxed);
    }

    /// Sets the largest PDU accepted from the controller.
    pub fn set_max_plen(&self, bytes: u32) {
        self.shared.max_plen.store(bytes, Ordering::Relaxed);
    }

    /// Whether the queue has closed, checking (without blocking) an idle connection.
    pub fn is_closed(&self) -> bool {
        self.shared.probe();
        self.shared.closed.load(Ordering::SeqCst)
    }

    /// Closes the queue, failing outstanding commands with `reason`.
    pub fn close(&self, reason: &str) {
        self.shared.close(reason);
    }

    /// Takes a free command identifier for [`Queue::start`]. With `block` false, returns
    /// `Ok(None)` when none is free instead of waiting for one.
    pub fn reserve(&self, block: bool) -> Result<Option<Reserved>, QError> {
        let cid = if block { Some(self.cids.acquire(self.shared.timeout).ok_or(QError::Timeout)?) } else { self.cids.try_acquire() };
        Ok(cid.map(Reserved))
    }

    /// Sends `cmd` under the reserved identifier with `data_out` (in-capsule when it fits
    /// or `force_inline`, else by R2T) or receiving into `data_in`. Both buffers are lent
    /// to the queue until the ticket completes.
    pub fn start<'a>(
        &'a self,
        reserved: Reserved,
        mut cmd: Command,
        data_out: &'a [u8],
        data_in: &'a mut [u8],
        force_inline: bool,
    ) -> Result<Ticket<'a>, QError> {
        let cid = reserved.0;
        let (tx, rx) = mpsc::channel();
        let inline = !data_out.is_empty() && (force_inline || data_out.len() <= self.in_capsule.load(Ordering::Relaxed));
        // In-capsule data goes out now; only data sent by R2T is lent.
        let lent_out = Lease::readable(if inline { &[] } else { data_out });
        let lent_in = Lease::writable(data_in);
        let in_len = data_in.len();
        {
            let mut s = lock(&self.shared.slots);
            if let Some(r) = &s.dead {
                let r = r.clone();
                drop(s);
                self.cids.release(cid);
                return Err(QError::NotSent(r));
            }
            s.map[usize::from(cid)] =
                Some(Slot { tx, waiting: false, received: 0, data_in: lent_in.clone(), in_len, data_out: lent_out.clone(), out_len: data_out.len() });
        }
        cmd.set_cid(cid);
        let capsule_data: &[u8] = if inline {
            cmd.set_sgl(0, data_out.len() as u32, SGL_DATA_BLOCK_OFFSET);
            data_out
        } else {
            cmd.set_sgl(0, data_out.len().max(in_len) as u32, SGL_TRANSPORT_DATA_BLOCK);
            &[]
        };
        let ticket =
            Ticket { q: self, cid, rx, leases: [lent_in, lent_out], finished: false, deadline: Instant::now() + self.shared.timeout, _buffers: PhantomData };
        if let Err(e) = self.shared.send(&Pdu::CapsuleCmd { sqe: cmd, data: Vec::new() }, capsule_data, self.cpda) {
            // The command fails through its slot when the queue closes.
            self.close(&format!("send failed: {e}"));
        }
        Ok(ticket)
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        self.close("the queue was closed by the host");
        for h in lock(&self.threads).drain(..) {
            let _ = h.join();
        }
    }
}

/// A command identifier taken by [`Queue::reserve`], to be used by [`Queue::start`].
pub(crate) struct Reserved(u16);

/// A command in flight. It holds the buffers lent in [`Queue::start`] for as long as it
/// lives and revokes the queue's access to them before it ends; it must not be leaked
/// (`mem::forget`), which nothing in this crate does.
pub(crate) struct Ticket<'a> {
    q: &'a Queue,
    cid: u16,
    rx: Receiver<Event>,
    /// The input and output buffers the queue's threads may use until revoked.
    leases: [Arc<Lease>; 2],
    finished: bool,
    deadline: Instant,
    _buffers: PhantomData<(&'a mut [u8], &'a [u8])>,
}

impl Ticket<'_> {
    /// Waits for the completion. Returns it and the number of data bytes received into
    /// the input buffer.
    pub fn wait(mut self) -> Result<(Completion, usize), QError> {
        self.drive()
    }

    fn drive(&mut self) -> Result<(Completion, usize), QError> {
        let result = self.q.shared.wait_for(self.cid, &self.rx, self.deadline);
        // Wait out any thread still using the buffers, and keep them away from now on.
        for lease in &self.leases {
            lease.revoke();
        }
        self.finished = true;
        self.q.cids.release(self.cid);
        result
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if !self.finished {
            // Abandoned (the caller failed on an earlier command): let it complete so that
            // its CID is not reused while the controller still owns it.
            let _ = self.drive();
        }
    }
}
