// SPDX-License-Identifier: Apache-2.0
//! One NVMe/TCP connection (one queue): the PDU loop and the queue's state machine.
//!
//! A connection starts in `AwaitIcReq`; ICReq/ICResp fix digests and alignment
//! (`AwaitConnect`); the Fabrics Connect command makes it the admin queue of a new controller
//! or an I/O queue of an existing one. Anything out of order, malformed, or beyond a limit
//! ends the connection with a C2HTermReq and a logged reason; it never touches data.

use crate::controller::{self, Controller, Reply, CONNECT_INVALID_HOST, CONNECT_INVALID_PARAMETERS, CONTROLLER_BUSY, INVALID_FIELD, SEQUENCE_ERROR};
use crate::io;
use crate::jobs::{queue, Sender};
pub(crate) use crate::sink::Sink;
use crate::subsystem::Subsystem;
use crate::{IoContext, Placement, Shared};
use insitu_fabric::{
    check_data_digest, fabrics, opcode, pdu_type, Command, CommonHeader, Digests, Pdu, PduError, SGL_DATA_BLOCK_OFFSET, SGL_TRANSPORT_DATA_BLOCK,
};
use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Time allowed between accepting a connection and its Connect (and within any PDU).
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);

/// Receive buffer: large enough to take several small PDUs in one system call, small
/// enough that data PDUs are read mostly straight into their destination (reads at least
/// this long bypass it).
const RECV_BUFFER: usize = 4096;

/// The queue's protocol state.
enum State {
    /// Fresh connection: only ICReq is valid.
    AwaitIcReq,
    /// Initialized: only a Fabrics Connect is valid.
    AwaitConnect,
    /// Admin queue of a controller.
    Admin(Arc<Controller>),
    /// I/O queue `qid` of a controller of an NVM subsystem, with the channel to its workers.
    Io { ctrl: Arc<Controller>, jobs: Sender<io::Job> },
}

/// A write-direction command waiting for its data (R2T sent, H2CData arriving).
struct Pending {
    cmd: Command,
    sqhd: u16,
    ttag: u16,
    buf: io::HostData,
    received: usize,
}

/// Why a connection ends.
#[derive(Debug)]
enum End {
    /// The peer closed or the socket failed.
    Closed(std::io::Error),
    /// A protocol violation; `fes` goes into the C2HTermReq.
    Fatal { fes: u16, reason: String },
}

impl From<std::io::Error> for End {
    fn from(e: std::io::Error) -> Self {
        End::Closed(e)
    }
}

impl From<PduError> for End {
    fn from(e: PduError) -> Self {
        End::Fatal { fes: e.fes(), reason: e.to_string() }
    }
}

/// The receiving side of what a connection runs over: a TCP socket in service, bytes in
/// memory under a fuzzer. The sending side is any `Write`.
pub(crate) trait Transport: Read + Send {
    /// Bounds how long one read may wait (`None`: forever).
    fn set_read_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()>;
    /// Ends the connection in both directions.
    fn shutdown(&self);
    /// Whether bytes are waiting to be read now (a read would not block). Transports that
    /// cannot tell say no, which only forgoes merging reads.
    fn has_pending_bytes(&self) -> bool {
        false
    }
}

impl Transport for TcpStream {
    fn set_read_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        TcpStream::set_read_timeout(self, timeout)
    }

    fn shutdown(&self) {
        let _ = TcpStream::shutdown(self, std::net::Shutdown::Both);
    }

    fn has_pending_bytes(&self) -> bool {
        use std::os::fd::AsRawFd;
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int for the connection's own open socket.
        unsafe { libc::ioctl(self.as_raw_fd(), libc::FIONREAD, &mut n) == 0 && n > 0 }
    }
}

/// Serves one TCP connection until it ends.
pub(crate) fn serve(shared: Arc<Shared>, stream: TcpStream, peer: std::net::SocketAddr) {
    // The address accept() returned: asking the socket fails once the client has reset it.
    let peer = peer.to_string();
    let _ = stream.set_nodelay(true);
    let writer = match stream.try_clone() {
        Ok(w) => w,
        Err(e) => return log(&peer, &format!("cannot clone socket: {e}")),
    };
    let socket = match writer.try_clone() {
        Ok(s) => Arc::new(s),
        Err(e) => return log(&peer, &format!("cannot clone socket: {e}")),
    };
    serve_with(shared, Box::new(stream), Box::new(writer), Some(socket), peer);
}

/// Serves one connection over any transport until it ends.
#[cfg(feature = "fuzzing")]
pub(crate) fn serve_on(shared: Arc<Shared>, reader: Box<dyn Transport>, writer: Box<dyn Write + Send>, peer: String) {
    serve_with(shared, reader, writer, None, peer);
}

/// Serves one connection; `socket` is the TCP socket under `writer`, when there is one.
fn serve_with(shared: Arc<Shared>, reader: Box<dyn Transport>, writer: Box<dyn Write + Send>, socket: Option<Arc<TcpStream>>, peer: String) {
    // A peer must finish ICReq and Connect promptly; a silent or half-sent PDU must not hold
    // a thread forever. Connect replaces this (KATO on the admin queue, none on I/O queues).
    let _ = reader.set_read_timeout(Some(SETUP_TIMEOUT));
    let link = shared.cfg.links.as_ref().map(|l| l.to_host.clone());
    let sink = Sink { stream: Arc::new(Mutex::new(writer)), link, digests: Digests::default(), hpda: 0, sqid: 0, metrics: shared.metrics.clone(), socket };
    let reader = BufReader::with_capacity(RECV_BUFFER, reader);
    let mut conn = Conn {
        shared,
        reader,
        head: Vec::new(),
        sink,
        state: State::AwaitIcReq,
        sqhd: 0,
        sqsize: 1,
        pending: HashMap::new(),
        next_ttag: 0,
        peer,
        reads: io::ReadRun::default(),
    };
    let end = conn.run();
    match &conn.state {
        State::Admin(ctrl) => ctrl.subsys.remove_controller(ctrl.cntlid),
        State::Io { ctrl, .. } => ctrl.release_queue(conn.sink.sqid),
        _ => {}
    }
    match end {
        End::Closed(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {}
        End::Closed(e) => log(&conn.peer, &format!("connection closed: {e}")),
        End::Fatal { fes, reason } => {
            log(&conn.peer, &format!("terminating connection: {reason}"));
            conn.shared.metrics.add_protocol_error();
            let _ = conn.sink.send(&[Pdu::TermReq { from_host: false, fes, fei: 0, data: Vec::new() }]);
        }
    }
    conn.reader.get_ref().shutdown();
}

fn log(peer: &str, msg: &str) {
    tracing::info!("{peer}: {msg}");
}

struct Conn {
    shared: Arc<Shared>,
    reader: BufReader<Box<dyn Transport>>,
    /// The head of the PDU being received (reused).
    head: Vec<u8>,
    sink: Sink,
    state: State,
    sqhd: u16,
    sqsize: u16,
    pending: HashMap<u16, Pending>,
    next_ttag: u16,
    peer: String,
    /// Reads received back to back for consecutive blocks, not yet handed to a worker.
    reads: io::ReadRun,
}

impl Conn {
    fn max_plen(&self) -> u32 {
        let cfg = &self.shared.cfg;
        // The largest PDU a host may send: an H2CData of MAXH2CDATA or a capsule with
        // in-capsule data, plus digests and alignment padding.
        (cfg.max_transfer() as u32).max(cfg.inline_data) + 256
    }

    /// Receives one PDU. H2CData is read straight into the buffer of the command waiting
    /// for it and handled here (`None`); every other PDU is returned with its data.
    fn read_pdu(&mut self) -> Result<Option<Pdu>, End> {
        let mut ch = [0u8; 8];
        self.reader.read_exact(&mut ch)?;
        let header = CommonHeader::parse(&ch, self.max_plen())?;
        let layout = header.layout(self.sink.digests)?;
        self.head.resize(layout.head, 0);
        self.reader.read_exact(&mut self.head)?;
        self.shared.metrics.add_wire_in(u64::from(header.plen));
        // The PDU's bytes on the modelled link, booked from its arrival and waited for once
        // they are read: the real transfer overlaps the modelled one.
        let modelled = self.shared.cfg.links.as_ref().map(|l| (&l.to_target, l.to_target.book(u64::from(header.plen), Instant::now())));
        let mut pdu = Pdu::decode_head(&header, &self.head, &layout)?;
        let mut digest = [0u8; 4];
        let digest = &mut digest[..layout.digest];
        if header.ty == pdu_type::H2C_DATA && !matches!(self.state, State::AwaitIcReq) {
            let Pdu::H2CData { cccid, ttag, datao, last, .. } = pdu else { unreachable!("decoded from an H2CData header") };
            let dst = Self::h2c_destination(&mut self.pending, cccid, ttag, datao, layout.data)?;
            self.reader.read_exact(dst)?;
            self.reader.read_exact(digest)?;
            if !digest.is_empty() {
                check_data_digest(dst, digest)?;
            }
            if let Some((link, deadline)) = modelled {
                link.wait_until(deadline);
            }
            self.h2c_received(cccid, layout.data, last)?;
            return Ok(None);
        }
        let mut data = vec![0u8; layout.data];
        self.reader.read_exact(&mut data)?;
        self.reader.read_exact(digest)?;
        if !digest.is_empty() {
            check_data_digest(&data, digest)?;
        }
        if let Some(d) = pdu.data_mut() {
            *d = data;
        }
        if let Some((link, deadline)) = modelled {
            link.wait_until(deadline);
        }
        Ok(Some(pdu))
    }

    fn run(&mut self) -> End {
        loop {
            if self.shared.stopping() {
                return End::Closed(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "target stopping"));
            }
            let pdu = match self.read_pdu() {
                Ok(Some(p)) => p,
                Ok(None) => continue,
                Err(e) => return e,
            };
            if let Err(e) = self.step(pdu) {
                return e;
            }
            // Reads are held back only while more commands are already here to join them.
            if !self.reads.is_empty() && self.reader.buffer().is_empty() && !self.reader.get_ref().has_pending_bytes() {
                self.dispatch_reads();
            }
        }
    }

    /// Hands the held reads to the queue's workers, as one job.
    fn dispatch_reads(&mut self) {
        if let (Some(job), State::Io { jobs, .. }) = (self.reads.take(), &self.state) {
            jobs.send(job);
        }
    }

    /// One transition of the queue state machine.
    fn step(&mut self, pdu: Pdu) -> Result<(), End> {
        match (&self.state, pdu) {
            // Connection setup: grant what the host asked for (both digests are supported).
            (State::AwaitIcReq, Pdu::IcReq { hpda, digests, .. }) => {
                let maxh2cdata = self.shared.cfg.max_transfer() as u32;
                self.sink.send(&[Pdu::IcResp { pfv: 0, cpda: 0, digests, maxh2cdata }])?;
                self.sink.digests = digests;
                self.sink.hpda = hpda;
                self.state = State::AwaitConnect;
                Ok(())
            }
            (State::AwaitIcReq, other) => Err(sequence(&other, "expected ICReq first")),
            // The host ends the connection.
            (_, Pdu::TermReq { fes, .. }) => {
                Err(End::Closed(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, format!("host terminated (FES {fes:#x})"))))
            }
            (_, Pdu::CapsuleCmd { sqe, data }) => {
                self.sqhd = (self.sqhd + 1) % self.sqsize.max(1);
                self.command(sqe, data)
            }
            // ICReq twice, or a PDU only a controller sends.
            (_, other) => Err(sequence(&other, "unexpected PDU")),
        }
    }

    fn command(&mut self, cmd: Command, data: Vec<u8>) -> Result<(), End> {
        let (sqhd, cid) = (self.sqhd, cmd.cid());
        if cmd.opcode() == opcode::FABRICS {
            let reply = self.fabrics(&cmd, &data);
            return Ok(self.sink.complete(cid, sqhd, reply.status, reply.dw0, reply.dw1, &reply.data)?);
        }
        match &self.state {
            State::AwaitIcReq | State::AwaitConnect => Ok(self.sink.complete(cid, sqhd, SEQUENCE_ERROR, 0, 0, &[])?),
            State::Admin(ctrl) => {
                if !ctrl.ready() && cmd.opcode() != opcode::KEEP_ALIVE {
                    return Ok(self.sink.complete(cid, sqhd, SEQUENCE_ERROR, 0, 0, &[])?);
                }
                let shared = self.shared.clone();
                let page = move |host: &str| controller::discovery_page(&shared.subsystems, &shared.cfg, host);
                let reply = ctrl.admin(&self.shared.cfg, &cmd, &page);
                if reply.held {
                    return Ok(()); // Asynchronous Event Request: answered when an event occurs.
                }
                Ok(self.sink.complete(cid, sqhd, reply.status, reply.dw0, 0, &reply.data)?)
            }
            State::Io { ctrl, .. } if !ctrl.ready() => Ok(self.sink.complete(cid, sqhd, SEQUENCE_ERROR, 0, 0, &[])?),
            State::Io { ctrl, jobs } => {
                let nvm = ctrl.subsys.nvm().expect("I/O queues exist only on NVM subsystems");
                if let Some((handler, Placement::Connection)) = nvm.handlers.get(cmd.opcode()) {
                    // Run here when the data is in hand; data still to come by R2T, or a
                    // malformed SGL, takes the usual way.
                    if let Some(data) = data_in_hand(&cmd, &data) {
                        let started = std::time::Instant::now();
                        let ctx = IoContext { ctrl, sink: &self.sink, cid, sqhd, max_transfer: self.shared.cfg.max_transfer() };
                        if let Some(out) = handler.execute_here(&ctx, &cmd, data) {
                            if out.deferred {
                                return Ok(());
                            }
                            io::record_handled(&self.shared, nvm, &cmd, started, data.len(), &out);
                            return Ok(self.sink.complete(cid, sqhd, out.status, out.dw0, out.dw1, &out.data)?);
                        }
                    }
                }
                let blocks = nvm.blocks.as_ref();
                // A read of memory with no model to wait for costs less than a hand-off to a
                // worker (a wake-up on another core): it runs here.
                if cmd.opcode() == opcode::READ && blocks.namespace(cmd.nsid()).is_some_and(|ns| ns.media.is_in_memory() && !ns.media.is_paced()) {
                    io::run(&self.shared, nvm, ctrl, &self.sink, io::Job { cmd, data: io::HostData::Owned(Vec::new()), sqhd, more: Vec::new() });
                    return Ok(());
                }
                // Consecutive reads of a disk read directly go to the media as one larger
                // read (the kernel reads ahead of those sent from the page cache).
                if cmd.opcode() == opcode::READ && blocks.namespace(cmd.nsid()).is_some_and(|ns| !ns.media.is_paced() && !self.sink.can_send_from(ns.media)) {
                    let job = io::Job { cmd, data: io::HostData::Owned(Vec::new()), sqhd, more: Vec::new() };
                    if let Some(held) = self.reads.push(job, nvm) {
                        jobs.send(held);
                    }
                    return Ok(());
                }
                let jobs = jobs.clone();
                if let Some(held) = self.reads.take() {
                    jobs.send(held);
                }
                // Opcode bits 1:0 = 01: data flows host to controller.
                if cmd.opcode() & 3 != 1 {
                    jobs.send(io::Job { cmd, data: io::HostData::Owned(Vec::new()), sqhd, more: Vec::new() });
                    return Ok(());
                }
                self.write_direction(cmd, data, sqhd, jobs)
            }
        }
    }

    /// A command carrying data to the target: in the capsule, or fetched with an R2T.
    fn write_direction(&mut self, cmd: Command, data: Vec<u8>, sqhd: u16, jobs: Sender<io::Job>) -> Result<(), End> {
        let (addr, len, ty) = cmd.sgl();
        let len = len as usize;
        if len > self.shared.cfg.max_transfer() {
            return Ok(self.sink.complete(cmd.cid(), sqhd, INVALID_FIELD, 0, 0, &[])?);
        }
        match ty {
            SGL_DATA_BLOCK_OFFSET => {
                let start = addr as usize;
                if addr > data.len() as u64 || start + len > data.len() {
                    return Err(End::Fatal { fes: 0x04, reason: format!("in-capsule data: SGL offset {addr} + {len} exceeds {} bytes", data.len()) });
                }
                jobs.send(io::Job { cmd, data: io::HostData::Owned(data[start..start + len].to_vec()), sqhd, more: Vec::new() });
                Ok(())
            }
            SGL_TRANSPORT_DATA_BLOCK if len == 0 => {
                jobs.send(io::Job { cmd, data: io::HostData::Owned(Vec::new()), sqhd, more: Vec::new() });
                Ok(())
            }
            SGL_TRANSPORT_DATA_BLOCK => {
                if self.pending.contains_key(&cmd.cid()) {
                    return Err(End::Fatal { fes: 0x02, reason: format!("command ID {} reused while its data is outstanding", cmd.cid()) });
                }
                let ttag = self.next_ttag;
                self.next_ttag = self.next_ttag.wrapping_add(1);
                self.sink.send(&[Pdu::R2T { cccid: cmd.cid(), ttag, r2to: 0, r2tl: len as u32 }])?;
                let blocks = match &self.state {
                    State::Io { ctrl, .. } => ctrl.subsys.nvm().map(|n| n.blocks.clone()),
                    _ => None,
                };
                let buf = io::HostData::for_transfer(blocks.as_deref(), cmd.nsid(), len);
                self.pending.insert(cmd.cid(), Pending { cmd, sqhd, ttag, buf, received: 0 });
                Ok(())
            }
            other => Ok(self.sink.complete(cmd.cid(), sqhd, controller::status(0, 0x11), 0, 0, &[]).map(|_| {
                log(&self.peer, &format!("SGL descriptor type {other:#04x} is not supported"));
            })?),
        }
    }

    /// Where the data of an H2CData PDU goes: the next bytes of the command waiting for it.
    fn h2c_destination(pending: &mut HashMap<u16, Pending>, cccid: u16, ttag: u16, datao: u32, len: usize) -> Result<&mut [u8], End> {
        let Some(p) = pending.get_mut(&cccid) else {
            return Err(End::Fatal { fes: 0x02, reason: format!("H2CData for command {cccid}, which awaits no data") });
        };
        let off = datao as usize;
        if p.ttag != ttag || off != p.received || off + len > p.buf.len() {
            return Err(End::Fatal {
                fes: 0x04,
                reason: format!("H2CData for command {cccid}: tag {ttag}, offset {off} + {len} outside the {} bytes requested", p.buf.len()),
            });
        }
        Ok(&mut p.buf[off..off + len])
    }

    /// Accounts `len` bytes that arrived for command `cccid`; the last of them sends it to
    /// the queue's workers.
    fn h2c_received(&mut self, cccid: u16, len: usize, last: bool) -> Result<(), End> {
        let p = self.pending.get_mut(&cccid).expect("checked by h2c_destination");
        p.received += len;
        if p.received == p.buf.len() {
            if !last {
                return Err(End::Fatal { fes: 0x02, reason: format!("H2CData for command {cccid} completed the transfer without LAST_PDU") });
            }
            let p = self.pending.remove(&cccid).expect("present");
            if let State::Io { jobs, .. } = &self.state {
                jobs.send(io::Job { cmd: p.cmd, data: p.buf, sqhd: p.sqhd, more: Vec::new() });
            }
        } else if last {
            return Err(End::Fatal { fes: 0x02, reason: format!("H2CData for command {cccid} ended early") });
        }
        Ok(())
    }

    /// Fabrics commands: Connect on a fresh queue; Property Get/Set on the admin queue.
    fn fabrics(&mut self, cmd: &Command, data: &[u8]) -> Reply {
        let b = &cmd.0;
        match (cmd.fctype(), &self.state) {
            (fabrics::CONNECT, State::AwaitConnect) => self.connect(cmd, data),
            (fabrics::CONNECT, _) => Reply::err(SEQUENCE_ERROR),
            (fabrics::PROPERTY_GET, State::Admin(ctrl)) => {
                let offset = u32::from_le_bytes([b[44], b[45], b[46], b[47]]);
                match ctrl.property_get(&self.shared.cfg, offset) {
                    // An 8-byte property's upper half goes in dword 1.
                    Some(v) => Reply { dw1: (v >> 32) as u32, ..Reply::ok(v as u32) },
                    None => Reply::err(INVALID_FIELD),
                }
            }
            (fabrics::PROPERTY_SET, State::Admin(ctrl)) => {
                let offset = u32::from_le_bytes([b[44], b[45], b[46], b[47]]);
                let value = u64::from_le_bytes(b[48..56].try_into().expect("8 bytes"));
                if ctrl.property_set(offset, value) {
                    Reply::ok(0)
                } else {
                    Reply::err(INVALID_FIELD)
                }
            }
            _ => Reply::err(controller::INVALID_OPCODE),
        }
    }

    fn connect(&mut self, cmd: &Command, data: &[u8]) -> Reply {
        let b = &cmd.0;
        let recfmt = u16::from_le_bytes([b[40], b[41]]);
        let qid = u16::from_le_bytes([b[42], b[43]]);
        let sqsize = u16::from_le_bytes([b[44], b[45]]);
        let kato = u32::from_le_bytes([b[48], b[49], b[50], b[51]]);
        // dword 0 of a Connect error names the bad parameter: its byte offset (IPO) in bits
        // 15:0, and in bit 16 (IATTR) whether that offset is in the data (1) or command (0).
        let invalid = |in_data: bool, offset: u16| Reply { status: CONNECT_INVALID_PARAMETERS, ..Reply::ok(u32::from(offset) | (u32::from(in_data) << 16)) };
        if recfmt != 0 {
            return Reply::err(controller::status(1, 0x80));
        }
        if data.len() < 1024 {
            return invalid(true, 0);
        }
        let text = |r: std::ops::Range<usize>| {
            let f = &data[r];
            String::from_utf8_lossy(&f[..f.iter().position(|c| *c == 0).unwrap_or(f.len())]).into_owned()
        };
        let mut hostid = [0u8; 16];
        hostid.copy_from_slice(&data[..16]);
        let cntlid = u16::from_le_bytes([data[16], data[17]]);
        let (subnqn, hostnqn) = (text(256..512), text(512..768));
        let Some(subsys) = self.shared.subsystem(&subnqn) else {
            log(&self.peer, &format!("connect to unknown subsystem {subnqn:?}"));
            return invalid(true, 256);
        };
        if !subsys.admits(&hostnqn) {
            log(&self.peer, &format!("host {hostnqn:?} is not admitted to {subnqn}"));
            return Reply::err(CONNECT_INVALID_HOST);
        }
        let depth = self.shared.cfg.queue_depth;
        if sqsize == 0 || sqsize >= depth {
            return invalid(false, 44);
        }
        self.sqsize = sqsize + 1;
        if qid == 0 {
            if cntlid != 0xFFFF && cntlid != 0xFFFE {
                return invalid(true, 16);
            }
            let Some(ctrl) = subsys.add_controller(&hostnqn, hostid, kato) else { return Reply::err(CONTROLLER_BUSY) };
            // Keep Alive Timeout: the host must send a command at least this often.
            let timeout = (kato > 0).then(|| Duration::from_millis(u64::from(kato) * 2));
            let _ = self.reader.get_ref().set_read_timeout(timeout);
            let id = ctrl.cntlid;
            self.state = State::Admin(ctrl);
            return Reply::ok(u32::from(id));
        }
        let Some(ctrl) = subsys.controller(cntlid).filter(|c| c.hostnqn == hostnqn && c.hostid == hostid) else {
            return invalid(true, 16);
        };
        if !ctrl.ready() || qid > ctrl.regs().io_queues.max(1) || subsys.nvm().is_none() || !ctrl.claim_queue(qid) {
            return invalid(false, 42);
        }
        // The queue is ours now: no read timeout (I/O queues may idle), see `serve`.
        let _ = self.reader.get_ref().set_read_timeout(None);
        self.sink.sqid = qid;
        let jobs = spawn_workers(&self.shared, &ctrl, &self.sink, usize::from(self.sqsize));
        self.state = State::Io { ctrl, jobs };
        Reply::ok(0)
    }
}

fn sequence(pdu: &Pdu, what: &str) -> End {
    End::Fatal { fes: 0x02, reason: format!("{what}: got {}", pdu_name(pdu)) }
}

fn pdu_name(pdu: &Pdu) -> &'static str {
    match pdu {
        Pdu::IcReq { .. } => "ICReq",
        Pdu::IcResp { .. } => "ICResp",
        Pdu::TermReq { .. } => "TermReq",
        Pdu::CapsuleCmd { .. } => "CapsuleCmd",
        Pdu::CapsuleResp { .. } => "CapsuleResp",
        Pdu::H2CData { .. } => "H2CData",
        Pdu::C2HData { .. } => "C2HData",
        Pdu::R2T { .. } => "R2T",
        _ => "unknown PDU",
    }
}

/// Starts the worker threads of an I/O queue of `entries` entries (no more workers than
/// the commands it can hold); they stop when the queue's sender drops.
fn spawn_workers(shared: &Arc<Shared>, ctrl: &Arc<Controller>, sink: &Sink, entries: usize) -> Sender<io::Job> {
    let (tx, rx) = queue::<io::Job>();
    for _ in 0..shared.cfg.workers_per_queue.min(entries).max(1) {
        let (rx, sink, ctrl, shared) = (rx.clone(), sink.clone(), ctrl.clone(), shared.clone());
        let name = format!("nvmf-q{}-work", sink.sqid);
        let work = move || {
            let subsys: Arc<Subsystem> = ctrl.subsys.clone();
            let nvm = subsys.nvm().expect("I/O queues exist only on NVM subsystems");
            while let Some(job) = rx.recv() {
                io::run(&shared, nvm, &ctrl, &sink, job);
            }
        };
        std::thread::Builder::new().name(name).spawn(work).expect("cannot start an I/O queue worker thread");
    }
    tx
}

/// The data of a command whose data is already here: none (it moves none to the target),
/// or in the capsule; `None` when it is still to come by R2T or its SGL is malformed.
fn data_in_hand<'a>(cmd: &Command, capsule: &'a [u8]) -> Option<&'a [u8]> {
    // Opcode bits 1:0 = 01: data flows host to controller.
    if cmd.opcode() & 3 != 1 {
        return Some(&[]);
    }
    let (addr, len, ty) = cmd.sgl();
    if ty != SGL_DATA_BLOCK_OFFSET {
        return None;
    }
    capsule.get(usize::try_from(addr).ok()?..)?.get(..len as usize)
}
