// SPDX-License-Identifier: Apache-2.0
//! [`Session`]: the public face of an association, with keep-alive and reconnect.

use crate::assoc::{pipeline, run_one, Association, Piece};
use crate::cmd::{self, DISCOVERY_NQN};
use crate::info::{self, CommandSet, ControllerInfo, DiscoveryEntry, KvNamespaceInfo, NamespaceInfo};
use crate::queue::{Counters, QError, Queue};
use crate::{ConnectOptions, InitiatorError};
use insitu_fabric::{Command, Completion, Digests};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, RwLock, Weak};
use std::time::Duration;

/// Bytes moved on the wire by a session, over all its queues and reconnections: PDU
/// headers, digests, padding and data included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Bytes written to the target's sockets.
    pub bytes_sent: u64,
    /// Bytes read from the target's sockets.
    pub bytes_received: u64,
    /// Times the association was re-established.
    pub reconnects: u64,
}

struct Inner {
    opts: ConnectOptions,
    assoc: RwLock<Arc<Association>>,
    reconnecting: Mutex<()>,
    counters: Arc<Counters>,
    reconnects: AtomicU64,
    rr: AtomicUsize,
    closed: AtomicBool,
    lba_sizes: Mutex<HashMap<u32, u32>>,
    ka_stop: Arc<(Mutex<bool>, Condvar)>,
}

impl Inner {
    fn current(&self) -> Arc<Association> {
        self.assoc.read().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        *self.ka_stop.0.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.ka_stop.1.notify_all();
    }
}

fn keep_alive_loop(weak: Weak<Inner>, stop: Arc<(Mutex<bool>, Condvar)>, period: Duration) {
    loop {
        let g = stop.0.lock().unwrap_or_else(PoisonError::into_inner);
        let (g, _) = stop.1.wait_timeout_while(g, period, |stopped| !*stopped).unwrap_or_else(PoisonError::into_inner);
        if *g {
            return;
        }
        drop(g);
        let Some(inner) = weak.upgrade() else { return };
        let a = inner.current();
        drop(inner);
        if !a.admin.is_closed() {
            // A failure closes the admin queue; the next command reconnects.
            let _ = run_one(&a.admin, cmd::keep_alive(), &[], 0, false);
        }
    }
}

/// A connection to one NVMe/TCP controller: an admin queue and `io_queues` I/O queues.
///
/// `Session` is `Send + Sync`; share it (e.g. in an `Arc`) and issue commands from many
/// threads at once. Each call picks an I/O queue round-robin; a call larger than the
/// controller's maximum transfer is split into several commands kept in flight together.
pub struct Session {
    inner: Arc<Inner>,
}

impl Session {
    /// Connects the admin queue, enables the controller, identifies it, and connects the
    /// I/O queues (none for the discovery NQN); starts keep-alive.
    pub fn connect(opts: ConnectOptions) -> Result<Session, InitiatorError> {
        let counters = Arc::new(Counters::default());
        let a = Association::establish(&opts, &counters, 0)?;
        let kato = opts.kato_ms;
        let inner = Arc::new(Inner {
            opts,
            assoc: RwLock::new(Arc::new(a)),
            reconnecting: Mutex::new(()),
            counters,
            reconnects: AtomicU64::new(0),
            rr: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            lba_sizes: Mutex::new(HashMap::new()),
            ka_stop: Arc::new((Mutex::new(false), Condvar::new())),
        });
        if kato > 0 {
            let (weak, stop) = (Arc::downgrade(&inner), inner.ka_stop.clone());
            let period = Duration::from_millis(u64::from(kato) / 2).max(Duration::from_millis(100));
            std::thread::Builder::new()
                .name("nvmf-keepalive".into())
                .spawn(move || keep_alive_loop(weak, stop, period))
                .map_err(|e| InitiatorError::Protocol { command: "Keep Alive", detail: format!("cannot start the keep-alive thread: {e}") })?;
        }
        Ok(Session { inner })
    }

    /// The options this session connects with.
    pub fn options(&self) -> &ConnectOptions {
        &self.inner.opts
    }

    /// The Identify Controller data read when the association was established.
    pub fn controller(&self) -> ControllerInfo {
        self.inner.current().ctrl.clone()
    }

    /// The controller ID of the current association (it changes on reconnect).
    pub fn cntlid(&self) -> u16 {
        self.inner.current().cntlid
    }

    /// The digests negotiated on the admin queue.
    pub fn digests(&self) -> Digests {
        self.inner.current().admin.digests
    }

    /// The controller's NVMe version (VS property: major in bits 31:16, minor in 15:8).
    pub fn version(&self) -> u32 {
        self.inner.current().vs
    }

    /// Whether every queue of the current association is open. A closed one is reopened
    /// (the whole association, in fact) by the next command.
    pub fn connected(&self) -> bool {
        let a = self.inner.current();
        !self.inner.closed.load(Ordering::SeqCst) && !a.broken()
    }

    /// Number of I/O queues connected.
    pub fn io_queue_count(&self) -> usize {
        self.inner.current().io.len()
    }

    /// Largest data transfer of one command, in bytes.
    pub fn max_transfer(&self) -> usize {
        self.inner.current().max_transfer
    }

    /// Bytes sent and received on the wire so far, and reconnections.
    pub fn stats(&self) -> Stats {
        let c = &self.inner.counters;
        Stats {
            bytes_sent: c.sent.load(Ordering::Relaxed),
            bytes_received: c.received.load(Ordering::Relaxed),
            reconnects: self.inner.reconnects.load(Ordering::Relaxed),
        }
    }

    /// Replaces the association `seen` with a new one, unless another thread already did.
    fn reconnect(&self, seen: u64, command: &'static str) -> Result<Arc<Association>, InitiatorError> {
        let _g = self.inner.reconnecting.lock().unwrap_or_else(PoisonError::into_inner);
        let cur = self.inner.current();
        if cur.gen != seen {
            return Ok(cur);
        }
        if self.inner.closed.load(Ordering::SeqCst) {
            return Err(InitiatorError::Disconnected { command });
        }
        // The old association's queues close when the last command using them finishes.
        let new = Arc::new(Association::establish(&self.inner.opts, &self.inner.counters, seen + 1)?);
        *self.inner.assoc.write().unwrap_or_else(PoisonError::into_inner) = new.clone();
        self.inner.reconnects.fetch_add(1, Ordering::Relaxed);
        Ok(new)
    }

    /// Runs `f` on the current association. If a connection is found closed (before or
    /// when sending), reconnects once and runs `f` there; if it closes with the command in flight, does the same when
    /// `retryable`, and otherwise reports that the outcome is unknown.
    pub(crate) fn run<T>(&self, command: &'static str, retryable: bool, mut f: impl FnMut(&Association) -> Result<T, QError>) -> Result<T, InitiatorError> {
        let closed = || self.inner.closed.load(Ordering::SeqCst);
        if closed() {
            return Err(InitiatorError::Disconnected { command });
        }
        let mut a = self.inner.current();
        let mut reconnected = false;
        if a.broken() {
            a = self.reconnect(a.gen, command)?;
            reconnected = true;
        }
        loop {
            let err = match f(&a) {
                Ok(v) => return Ok(v),
                Err(e) if closed() => {
                    return Err(match e {
                        QError::Lost(detail) if !retryable => lost(command, detail),
                        _ => InitiatorError::Disconnected { command },
                    })
                }
                Err(e) => e,
            };
            match err {
                QError::Timeout => return Err(InitiatorError::Timeout { command, timeout: self.inner.opts.timeout }),
                QError::NotSent(_) if !reconnected => {}
                QError::Lost(_) if retryable && !reconnected => {}
                QError::NotSent(detail) => return Err(InitiatorError::ConnectionLost { command, detail }),
                QError::Lost(detail) if !retryable => return Err(lost(command, detail)),
                QError::Lost(detail) => return Err(InitiatorError::ConnectionLost { command, detail }),
            }
            a = self.reconnect(a.gen, command)?;
            reconnected = true;
        }
    }

    /// The current association when it is whole and the session open: what a caller
    /// driving queues itself (see [`submit_pipelined_all`](crate::submit_pipelined_all))
    /// may start commands on; None when only [`Session::run`] can go on (it reconnects).
    pub(crate) fn whole_association(&self) -> Option<Arc<Association>> {
        let a = self.inner.current();
        (!self.inner.closed.load(Ordering::SeqCst) && !a.broken()).then_some(a)
    }

    /// How [`Session::run`] reports a queue failure of a command it does not retry.
    pub(crate) fn failure(&self, command: &'static str, e: QError) -> InitiatorError {
        match e {
            QError::Timeout => InitiatorError::Timeout { command, timeout: self.inner.opts.timeout },
            QError::NotSent(detail) => InitiatorError::ConnectionLost { command, detail },
            QError::Lost(_) if self.inner.closed.load(Ordering::SeqCst) => InitiatorError::Disconnected { command },
            QError::Lost(detail) => lost(command, detail),
        }
    }

    /// Checks that this session has I/O queues before a `run` (so that `run`'s closure can
    /// pick one without failing).
    pub(crate) fn require_io(&self, command: &'static str) -> Result<(), InitiatorError> {
        if self.inner.current().io.is_empty() {
            let why = if self.inner.opts.subnqn == DISCOVERY_NQN {
                "a discovery session has no I/O queues"
            } else {
                "the session has no I/O queues (ConnectOptions::io_queues is 0)"
            };
            return Err(InitiatorError::InvalidArgument { command, detail: why.to_string() });
        }
        Ok(())
    }

    /// The index of the next I/O queue in turn: commands rotate over every queue.
    pub(crate) fn pick_index(&self, a: &Association) -> usize {
        self.inner.rr.fetch_add(1, Ordering::Relaxed) % a.io.len().max(1)
    }

    /// The next I/O queue in turn.
    pub(crate) fn pick<'a>(&self, a: &'a Association) -> &'a Queue {
        &a.io[self.pick_index(a)]
    }

    /// Runs one admin command (read-only, retried after a reconnect) and checks its status.
    fn admin_read(&self, command: &'static str, c: Command, len: usize) -> Result<Vec<u8>, InitiatorError> {
        let (cqe, data, _) = self.run(command, true, |a| run_one(&a.admin, c, &[], len, false))?;
        check(command, &cqe)?;
        Ok(data)
    }

    /// Identify Controller (CNS 01h), read afresh.
    pub fn identify_controller(&self) -> Result<ControllerInfo, InitiatorError> {
        let raw = self.admin_read("Identify", cmd::identify(1, 0), 4096)?;
        let min_page = 4096u64 << ((self.inner.current().cap >> 48) & 0xF);
        Ok(ControllerInfo::parse(&raw, min_page).expect("4096 bytes"))
    }

    /// Identify Namespace (CNS 00h); fails with [`InitiatorError::NoNamespace`] for an
    /// inactive namespace.
    pub fn identify_namespace(&self, nsid: u32) -> Result<NamespaceInfo, InitiatorError> {
        let raw = match self.admin_read("Identify", cmd::identify(0, nsid), 4096) {
            Ok(raw) => raw,
            Err(InitiatorError::Status { sct: 0, sc: 0x0B, .. }) => return Err(self.no_namespace(nsid)),
            Err(e) => return Err(e),
        };
        let Some(ns) = NamespaceInfo::parse(nsid, &raw) else {
            // All zeros: inactive, or a namespace of another command set.
            if let Ok(CommandSet::KeyValue) = self.namespace_command_set(nsid) {
                let detail = format!(
                    "namespace {nsid} of {} is a key-value namespace, without logical blocks: use the KV commands (insitu kv ..., insitu.kv(URL))",
                    self.inner.opts.subnqn
                );
                return Err(InitiatorError::InvalidArgument { command: "Identify", detail });
            }
            return Err(self.no_namespace(nsid));
        };
        self.inner.lba_sizes.lock().unwrap_or_else(PoisonError::into_inner).insert(nsid, ns.lba_size);
        Ok(ns)
    }

    fn no_namespace(&self, nsid: u32) -> InitiatorError {
        InitiatorError::NoNamespace { nsid, subnqn: self.inner.opts.subnqn.clone(), addr: self.inner.opts.addr.clone() }
    }

    /// The command set of an active namespace, from its Namespace Identification
    /// Descriptors (Identify CNS 03h).
    pub fn namespace_command_set(&self, nsid: u32) -> Result<CommandSet, InitiatorError> {
        match self.admin_read("Identify", cmd::identify(3, nsid), 4096) {
            Ok(list) => Ok(CommandSet::of_descriptors(&list)),
            Err(InitiatorError::Status { sct: 0, sc: 0x0B, .. }) => Err(self.no_namespace(nsid)),
            Err(e) => Err(e),
        }
    }

    /// The Key Value command set's Identify Namespace structure (CNS 05h, CSI 01h) of a
    /// key-value namespace; [`InitiatorError::NoNamespace`] when `nsid` is not one.
    pub fn identify_kv_namespace(&self, nsid: u32) -> Result<KvNamespaceInfo, InitiatorError> {
        let mut c = cmd::identify(5, nsid);
        c.set_cdw(11, 1 << 24);
        let no = || self.no_namespace(nsid);
        match self.admin_read("Identify", c, 4096) {
            Ok(raw) => KvNamespaceInfo::parse(nsid, &raw).ok_or_else(no),
            Err(InitiatorError::Status { sct: 0, sc: 0x0B | 0x02, .. }) => Err(no()),
            Err(e) => Err(e),
        }
    }

    /// The active namespace IDs (Identify CNS 02h, following the list past 1024 entries).
    pub fn active_namespaces(&self) -> Result<Vec<u32>, InitiatorError> {
        let mut all = Vec::new();
        loop {
            let start = all.last().copied().unwrap_or(0);
            let page = info::parse_ns_list(&self.admin_read("Identify", cmd::identify(2, start), 4096)?);
            let full = page.len() == 1024;
            all.extend(page);
            if !full || start == u32::MAX {
                return Ok(all);
            }
        }
    }

    /// Get Log Page `lid` (controller scope, NSID FFFFFFFFh): `len` bytes from offset 0,
    /// in several commands when longer than the maximum transfer.
    pub fn get_log_page(&self, lid: u8, len: usize) -> Result<Vec<u8>, InitiatorError> {
        const C: &str = "Get Log Page";
        let padded = len.next_multiple_of(4);
        let mut buf = vec![0u8; padded];
        let results = self.run(C, true, |a| {
            let per = (a.max_transfer / 4 * 4).max(4);
            let pieces = cmd::split_bytes(padded, per)
                .into_iter()
                .map(|(off, n)| Piece { cmd: cmd::get_log_page(0xFFFF_FFFF, lid, off as u64, n), out: &[], in_at: off, in_len: n })
                .collect();
            pipeline(&a.admin, pieces, &mut buf)
        })?;
        for (cqe, _) in &results {
            check(C, cqe)?;
        }
        buf.truncate(len);
        Ok(buf)
    }

    /// The discovery log page (70h), read consistently (the generation counter must not
    /// change between the header and the entries).
    pub fn discovery_log(&self) -> Result<Vec<DiscoveryEntry>, InitiatorError> {
        for _ in 0..4 {
            let head = self.get_log_page(0x70, info::DISCOVERY_RECORD)?;
            let (gen, numrec) = info::discovery_header(&head).expect("1024 bytes");
            if numrec > 4096 {
                return Err(InitiatorError::Protocol { command: "Get Log Page", detail: format!("the discovery log claims {numrec} records") });
            }
            let page = self.get_log_page(0x70, info::DISCOVERY_RECORD * (1 + numrec as usize))?;
            if info::discovery_header(&page).map(|h| h.0) == Some(gen) {
                return Ok(info::parse_discovery_log(&page));
            }
        }
        Err(InitiatorError::Protocol { command: "Get Log Page", detail: "the discovery log kept changing while it was read; retry".into() })
    }

    /// Reads a 4- or 8-byte controller property (CAP 0x0, VS 0x8, CC 0x14, CSTS 0x1C).
    pub fn property_get(&self, offset: u32, size: u8) -> Result<u64, InitiatorError> {
        if size != 4 && size != 8 {
            return Err(InitiatorError::InvalidArgument { command: "Property Get", detail: format!("size {size} is not 4 or 8") });
        }
        let (cqe, _, _) = self.run("Property Get", true, |a| run_one(&a.admin, cmd::property_get(offset, size == 8), &[], 0, false))?;
        check("Property Get", &cqe)?;
        Ok(if size == 8 { u64::from(cqe.dw0) | u64::from(cqe.dw1) << 32 } else { u64::from(cqe.dw0) })
    }

    /// The logical block size of namespace `nsid`, in bytes (asked once, then remembered).
    pub fn lba_size(&self, nsid: u32) -> Result<u32, InitiatorError> {
        if let Some(&s) = self.inner.lba_sizes.lock().unwrap_or_else(PoisonError::into_inner).get(&nsid) {
            return Ok(s);
        }
        Ok(self.identify_namespace(nsid)?.lba_size)
    }

    /// Shuts the controller down (CC.SHN = 01b, waiting briefly for CSTS.SHST) and closes
    /// every queue. Later commands fail with [`InitiatorError::Disconnected`].
    pub fn disconnect(&self) -> Result<(), InitiatorError> {
        let a = self.inner.current();
        let r = if !a.admin.is_closed() { a.shutdown(self.inner.opts.timeout) } else { Ok(()) };
        self.inner.closed.store(true, Ordering::SeqCst);
        *self.inner.ka_stop.0.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.inner.ka_stop.1.notify_all();
        a.io.iter().chain([&a.admin]).for_each(|q| q.close("the host disconnected"));
        r
    }

    /// Closes the connection of queue `qid` (0 = admin) abruptly, as a network failure
    /// would. For tests of reconnection.
    #[doc(hidden)]
    pub fn break_queue(&self, qid: u16) {
        let a = self.inner.current();
        if let Some(q) = a.io.iter().chain([&a.admin]).find(|q| q.qid == qid) {
            q.close("broken on purpose");
        };
    }
}

/// A command that changes data was in flight when the connection failed.
fn lost(command: &'static str, detail: String) -> InitiatorError {
    InitiatorError::OutcomeUnknown { command, detail }
}

pub(crate) fn check(command: &'static str, cqe: &Completion) -> Result<(), InitiatorError> {
    InitiatorError::from_status(command, cqe.status).map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_is_send_and_sync() {
        fn is<T: Send + Sync>() {}
        is::<Session>();
        is::<Stats>();
    }

    #[test]
    fn lost_writes_have_unknown_outcome() {
        let e = lost("Write", "reset".into());
        assert!(e.to_string().starts_with("Write outcome unknown"), "{e}");
    }
}
