// SPDX-License-Identifier: Apache-2.0
//! One NVMe/TCP queue: a TCP connection, a reader thread that routes PDUs to waiting
//! commands by CID, a shared writer, and a pool of command identifiers.
//!
//! A command is started with [`Queue::start`], which returns a [`Ticket`]; the caller's
//! thread then waits on the ticket, copying C2HData into its buffer and answering R2Ts from
//! its data with H2CData PDUs. The reader thread never writes, so a full socket in one
//! direction cannot stall the other. Any decode error, unexpected PDU or C2HTermReq closes
//! the queue and fails every outstanding command.

use crate::cid::CidPool;
use crate::InitiatorError;
use insitu_fabric::{CommonHeader, Command, Completion, Digests, Pdu, SGL_DATA_BLOCK_OFFSET, SGL_TRANSPORT_DATA_BLOCK};
use std::io::{BufReader, Read, Write};
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

enum Event {
    Data { datao: usize, data: Vec<u8> },
    R2T { ttag: u16, offset: usize, len: usize },
    Done(Completion),
    Failed(String),
}

struct Slot {
    tx: Sender<Event>,
    data_in: usize,
    data_out: usize,
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
    fn send(&self, pdu: &Pdu, pda: u8) -> std::io::Result<()> {
        let mut buf = Vec::new();
        pdu.encode(self.digests, pda, &mut buf);
        lock(&self.writer).write_all(&buf)?;
        self.stats.sent.fetch_add(buf.len() as u64, Ordering::Relaxed);
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

    /// Routes one PDU from the controller; an error is fatal to the queue.
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
                let _ = e.tx.send(Event::Done(cqe));
            }
            Pdu::C2HData { cccid, datao, last, success, data } => {
                let e = slot(map, cccid, "C2HData")?;
                let s = e.as_ref().expect("checked");
                let end = datao as usize + data.len();
                if end > s.data_in {
                    return Err(format!("C2HData for CID {cccid} at offset {datao} with {} bytes overruns the command's {}-byte transfer", data.len(), s.data_in));
                }
                if success && !last {
                    return Err(format!("C2HData for CID {cccid} has SUCCESS without LAST_PDU"));
                }
                let _ = s.tx.send(Event::Data { datao: datao as usize, data });
                if success {
                    let s = e.take().expect("checked");
                    let _ = s.tx.send(Event::Done(Completion { cid: cccid, sqid: self.qid, ..Completion::default() }));
                }
            }
            Pdu::R2T { cccid, ttag, r2to, r2tl } => {
                let s = slot(map, cccid, "R2T")?.as_ref().expect("checked");
                let (offset, len) = (r2to as usize, r2tl as usize);
                if len == 0 || offset + len > s.data_out {
                    return Err(format!("R2T for CID {cccid} asks for {len} bytes at offset {offset} of a {}-byte transfer", s.data_out));
                }
                let _ = s.tx.send(Event::R2T { ttag, offset, len });
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

fn reader_loop(shared: Arc<Shared>, mut rd: BufReader<TcpStream>) {
    let reason = loop {
        let mut h = [0u8; 8];
        if let Err(e) = rd.read_exact(&mut h) {
            break if e.kind() == std::io::ErrorKind::UnexpectedEof { "the target closed the connection".to_string() } else { format!("receive failed: {e}") };
        }
        let ch = match CommonHeader::parse(&h, shared.max_plen.load(Ordering::Relaxed)) {
            Ok(ch) => ch,
            Err(e) => break format!("invalid PDU header from the controller: {e}"),
        };
        let mut rest = vec![0u8; ch.plen as usize - 8];
        if let Err(e) = rd.read_exact(&mut rest) {
            break format!("receive failed in the middle of a PDU: {e}");
        }
        shared.stats.received.fetch_add(u64::from(ch.plen), Ordering::Relaxed);
        let pdu = match Pdu::decode(&ch, &rest, shared.digests) {
            Ok(p) => p,
            Err(e) => break format!("invalid PDU from the controller: {e}"),
        };
        if let Err(reason) = shared.dispatch(pdu) {
            break reason;
        }
    };
    shared.close(&reason);
}

/// An open queue.
pub(crate) struct Queue {
    /// Queue identifier (0 = admin).
    pub qid: u16,
    /// Digests negotiated in ICReq/ICResp.
    pub digests: Digests,
    shared: Arc<Shared>,
    cids: CidPool,
    reader: Mutex<Option<JoinHandle<()>>>,
    cpda: u8,
    maxh2cdata: usize,
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
        let rd = BufReader::with_capacity(256 << 10, sock.try_clone().map_err(io)?);
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
        let s2 = shared.clone();
        let reader = std::thread::Builder::new().name(format!("nvmf-q{qid}-rx")).spawn(move || reader_loop(s2, rd)).map_err(io)?;
        Ok(Queue {
            qid,
            digests,
            shared,
            cids: CidPool::new(depth),
            reader: Mutex::new(Some(reader)),
            cpda,
            maxh2cdata: maxh2cdata as usize,
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

    /// Sends `cmd` with `data_out` (in-capsule when it fits or `force_inline`, else by
    /// R2T) or expecting `data_in` bytes. With `block` false, returns `Ok(None)` when no
    /// command identifier is free instead of waiting for one.
    pub fn start<'a>(&'a self, mut cmd: Command, data_out: &'a [u8], data_in: usize, force_inline: bool, block: bool) -> Result<Option<Ticket<'a>>, QError> {
        let cid = if block {
            self.cids.acquire(self.timeout).ok_or(QError::Timeout)?
        } else {
            match self.cids.try_acquire() {
                Some(c) => c,
                None => return Ok(None),
            }
        };
        let (tx, rx) = mpsc::channel();
        {
            let mut s = lock(&self.shared.slots);
            if let Some(r) = &s.dead {
                let r = r.clone();
                drop(s);
                self.cids.release(cid);
                return Err(QError::NotSent(r));
            }
            s.map[usize::from(cid)] = Some(Slot { tx, data_in, data_out: data_out.len() });
        }
        cmd.set_cid(cid);
        let inline = !data_out.is_empty() && (force_inline || data_out.len() <= self.in_capsule.load(Ordering::Relaxed));
        let data = if inline {
            cmd.set_sgl(0, data_out.len() as u32, SGL_DATA_BLOCK_OFFSET);
            data_out.to_vec()
        } else {
            cmd.set_sgl(0, data_out.len().max(data_in) as u32, SGL_TRANSPORT_DATA_BLOCK);
            Vec::new()
        };
        let ticket = Ticket { q: self, cid, rx, data_out, finished: false, deadline: Instant::now() + self.timeout, received: 0 };
        if let Err(e) = self.shared.send(&Pdu::CapsuleCmd { sqe: cmd, data }, self.cpda) {
            // The command fails through its slot when the queue closes.
            self.close(&format!("send failed: {e}"));
        }
        Ok(Some(ticket))
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        self.close("the queue was closed by the host");
        if let Some(h) = lock(&self.reader).take() {
            let _ = h.join();
        }
    }
}

/// A command in flight.
pub(crate) struct Ticket<'a> {
    q: &'a Queue,
    cid: u16,
    rx: Receiver<Event>,
    data_out: &'a [u8],
    finished: bool,
    deadline: Instant,
    received: usize,
}

impl Ticket<'_> {
    /// Waits for the completion, copying controller data into `buf` (whose length is the
    /// command's transfer length) and answering R2Ts. Returns the completion and the number
    /// of data bytes received.
    pub fn wait(mut self, buf: &mut [u8]) -> Result<(Completion, usize), QError> {
        self.drive(buf)
    }

    fn drive(&mut self, buf: &mut [u8]) -> Result<(Completion, usize), QError> {
        let result = loop {
            let ev = match self.rx.recv_timeout(self.deadline.saturating_duration_since(Instant::now())) {
                Ok(ev) => ev,
                Err(RecvTimeoutError::Timeout) => {
                    self.q.close(&format!("command {} on queue {} timed out after {:?}", self.cid, self.q.qid, self.q.timeout));
                    break Err(QError::Timeout);
                }
                Err(RecvTimeoutError::Disconnected) => break Err(QError::Lost("the queue's reader stopped".into())),
            };
            match ev {
                Event::Data { datao, data } => {
                    if let Some(dst) = buf.get_mut(datao..datao + data.len()) {
                        dst.copy_from_slice(&data);
                    }
                    self.received += data.len();
                }
                Event::R2T { ttag, offset, len } => self.answer_r2t(ttag, offset, len),
                Event::Done(cqe) => break Ok((cqe, self.received)),
                Event::Failed(reason) => break Err(QError::Lost(reason)),
            }
        };
        self.finished = true;
        self.q.cids.release(self.cid);
        result
    }

    /// Sends `data_out[offset..offset+len]` in H2CData PDUs of at most MAXH2CDATA bytes.
    fn answer_r2t(&self, ttag: u16, offset: usize, len: usize) {
        for (o, l) in crate::cmd::split_bytes(len, self.q.maxh2cdata) {
            let data = self.data_out[offset + o..offset + o + l].to_vec();
            let pdu = Pdu::H2CData { cccid: self.cid, ttag, datao: (offset + o) as u32, last: o + l == len, data };
            if let Err(e) = self.q.shared.send(&pdu, self.q.cpda) {
                self.q.close(&format!("send failed: {e}"));
                return;
            }
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if !self.finished {
            // Abandoned (the caller failed on an earlier command): let it complete so that
            // its CID is not reused while the controller still owns it.
            let _ = self.drive(&mut []);
        }
    }
}
