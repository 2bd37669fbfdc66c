// SPDX-License-Identifier: Apache-2.0
//! One NVMe/TCP queue: a TCP connection, a reader thread that routes PDUs to waiting
//! commands by CID, a shared writer, and a pool of command identifiers.
//!
//! A command is started with [`Queue::start`], which lends the caller's buffers to the
//! queue for the command's life and returns a [`Ticket`]; the caller's thread then waits on
//! the ticket. The reader thread reads C2HData straight into the caller's buffer, and a
//! sender thread answers R2Ts with H2CData sent straight from the caller's data, so every
//! command of a pipeline gets its data as soon as the controller asks. The reader thread
//! never writes, so a full socket in one direction cannot stall the other. Any decode
//! error, unexpected PDU or C2HTermReq closes the queue and fails every outstanding command.

use crate::cid::CidPool;
use crate::InitiatorError;
use insitu_fabric::{check_data_digest, CommonHeader, Command, Completion, Digests, Pdu, SGL_DATA_BLOCK_OFFSET, SGL_TRANSPORT_DATA_BLOCK};
use std::io::{BufReader, Read, Write};
use std::marker::PhantomData;
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
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

struct Shared {
    qid: u16,
    sock: TcpStream,
    writer: Mutex<TcpStream>,
    slots: Mutex<Slots>,
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
        let _ = self.sock.shutdown(Shutdown::Both);
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
    fn dispatch(&self, pdu: Pdu, r2t: &Sender<R2tJob>) -> Result<(), String> {
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
                let _ = r2t.send(R2tJob { cid: cccid, ttag, offset, len, data: s.data_out.clone() });
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

fn reader_loop(shared: Arc<Shared>, mut rd: BufReader<TcpStream>, r2t: Sender<R2tJob>) {
    let mut head = Vec::new();
    let reason = loop {
        match receive(&shared, &mut rd, &mut head, &r2t) {
            Ok(()) => {}
            Err(reason) => break reason,
        }
    };
    shared.close(&reason);
}

/// Receives one PDU: C2HData straight into its command's buffer, anything else to
/// [`Shared::dispatch`].
fn receive(shared: &Shared, rd: &mut BufReader<TcpStream>, head: &mut Vec<u8>, r2t: &Sender<R2tJob>) -> Result<(), String> {
    let recv_err = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            "the target closed the connection".to_string()
        } else {
            format!("receive failed: {e}")
        }
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
    shared.dispatch(pdu, r2t)
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
    timeout: Duration,
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
        sock.set_read_timeout(None).map_err(io)?;
        let writer = sock.try_clone().map_err(io)?;
        let rd = BufReader::with_capacity(RECV_BUFFER, sock.try_clone().map_err(io)?);
        let shared = Arc::new(Shared {
            qid,
            sock,
            writer: Mutex::new(writer),
            slots: Mutex::new(Slots { dead: None, map: (0..depth).map(|_| None).collect() }),
            stats,
            digests,
            max_plen: AtomicU32::new(1 << 20),
            closed: AtomicBool::new(false),
        });
        // The reader owns the R2T channel: when it stops, the sender thread stops too.
        let (r2t_tx, r2t_rx) = mpsc::channel();
        let s2 = shared.clone();
        let reader = std::thread::Builder::new().name(format!("nvmf-q{qid}-rx")).spawn(move || reader_loop(s2, rd, r2t_tx)).map_err(io)?;
        let s3 = shared.clone();
        let sender = std::thread::Builder::new().name(format!("nvmf-q{qid}-tx")).spawn(move || sender_loop(s3, r2t_rx, maxh2cdata as usize, cpda));
        let sender = match sender {
            Ok(t) => t,
            Err(e) => {
                shared.close("cannot start the queue's sender thread");
                return Err(io(e));
            }
        };
        Ok(Queue {
            qid,
            digests,
            shared,
            cids: CidPool::new(depth),
            threads: Mutex::new(vec![reader, sender]),
            cpda,
            in_capsule: AtomicUsize::new(0),
            timeout,
        })
    }

    /// Sets the largest in-capsule write (bytes).
    pub fn set_in_capsule(&self, bytes: usize) {
        self.in_capsule.store(bytes, Ordering::Relaxed);
    }

    /// Sets the largest PDU accepted from the controller.
    pub fn set_max_plen(&self, bytes: u32) {
        self.shared.max_plen.store(bytes, Ordering::Relaxed);
    }

    /// Whether the queue has closed (without taking its lock).
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::SeqCst)
    }

    /// Closes the queue, failing outstanding commands with `reason`.
    pub fn close(&self, reason: &str) {
        self.shared.close(reason);
    }

    /// Takes a free command identifier for [`Queue::start`]. With `block` false, returns
    /// `Ok(None)` when none is free instead of waiting for one.
    pub fn reserve(&self, block: bool) -> Result<Option<Reserved>, QError> {
        let cid = if block { Some(self.cids.acquire(self.timeout).ok_or(QError::Timeout)?) } else { self.cids.try_acquire() };
        Ok(cid.map(Reserved))
    }

    /// Sends `cmd` under the reserved identifier with `data_out` (in-capsule when it fits
    /// or `force_inline`, else by R2T) or receiving into `data_in`. Both buffers are lent
    /// to the queue until the ticket completes.
    pub fn start<'a>(&'a self, reserved: Reserved, mut cmd: Command, data_out: &'a [u8], data_in: &'a mut [u8], force_inline: bool) -> Result<Ticket<'a>, QError> {
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
            s.map[usize::from(cid)] = Some(Slot { tx, received: 0, data_in: lent_in.clone(), in_len, data_out: lent_out.clone(), out_len: data_out.len() });
        }
        cmd.set_cid(cid);
        let capsule_data: &[u8] = if inline {
            cmd.set_sgl(0, data_out.len() as u32, SGL_DATA_BLOCK_OFFSET);
            data_out
        } else {
            cmd.set_sgl(0, data_out.len().max(in_len) as u32, SGL_TRANSPORT_DATA_BLOCK);
            &[]
        };
        let ticket = Ticket { q: self, cid, rx, leases: [lent_in, lent_out], finished: false, deadline: Instant::now() + self.timeout, _buffers: PhantomData };
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
        let result = match self.rx.recv_timeout(self.deadline.saturating_duration_since(Instant::now())) {
            Ok(Event::Done(cqe, received)) => Ok((cqe, received)),
            Ok(Event::Failed(reason)) => Err(QError::Lost(reason)),
            Err(RecvTimeoutError::Timeout) => {
                self.q.close(&format!("command {} on queue {} timed out after {:?}", self.cid, self.q.qid, self.q.timeout));
                Err(QError::Timeout)
            }
            Err(RecvTimeoutError::Disconnected) => Err(QError::Lost("the queue's reader stopped".into())),
        };
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
