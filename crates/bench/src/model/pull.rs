// SPDX-License-Identifier: Apache-2.0
//! The two ways a host gets an answer from an emulated drive over the network:
//!
//! * [`pull`]: conventional. A reader thread stands for the target side: it reads each
//!   object's blocks with `Engine::read` on the drive's host view (paced by the flash model)
//!   and puts each piece on the link as soon as it has it. The host consumes the pieces in
//!   order, each when the link delivers it, at most [`QUEUE_DEPTH`] pieces behind the
//!   reader.
//! * [`exec_remote`]: offloaded. The descriptor crosses the link, the drive runs EXEC on its
//!   engine view, and only the encoded result crosses back.
//!
//! Both count every byte on the link, NVMe/TCP headers included.

use super::emu::{Network, COMMAND_BYTES, COMPLETION_BYTES, DATA_PDU_BYTES};
use super::rig::{Drive, ENGINE_NS, HOST_NS};
use insitu_engine::ExecOutcome;
use insitu_offload::InputStream;
use insitu_proto::{ExtentKind, VirtualObject, SECTOR};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{sync_channel as bounded, Receiver, SyncSender as Sender};
use std::time::Instant;

/// Reads a host has outstanding per drive.
pub(crate) const QUEUE_DEPTH: usize = 4;
/// Bytes per host read (a multiple of the 512-byte block).
pub(crate) const IO_BYTES: usize = 1 << 20;

enum Piece {
    Data { obj: usize, buf: Vec<u8>, len: usize, arrives: Instant },
    End,
    Failed(String),
}

/// Time the host waited for pieces the target had not read yet, ns (the media's share of a
/// conventional read; the link's share is the network's waited time).
#[derive(Debug, Default)]
pub(crate) struct PullStats {
    pub(crate) media_wait_ns: AtomicU64,
}

/// The host side of a [`pull`]: hands out the objects in order as input streams.
pub(crate) struct Pulled<'a> {
    rx: Receiver<Piece>,
    recycle: Sender<Vec<u8>>,
    net: &'a Network,
    stats: &'a PullStats,
    next_obj: usize,
    pending: Option<Piece>,
}

impl<'a> Pulled<'a> {
    /// The next object's bytes as a stream (objects must be taken in order, each to its end).
    pub(crate) fn next_object(&mut self, len: u64) -> PulledObject<'_, 'a> {
        let index = self.next_obj;
        self.next_obj += 1;
        PulledObject { pull: self, index, len, current: None, done: len == 0 }
    }

    fn recv(&mut self) -> io::Result<Piece> {
        if let Some(p) = self.pending.take() {
            return Ok(p);
        }
        let t = Instant::now();
        let piece = self.rx.recv().map_err(|_| io::Error::other("the target's reader stopped"))?;
        self.stats.media_wait_ns.fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
        Ok(piece)
    }
}

/// One object of a [`Pulled`], as a kernel input.
pub(crate) struct PulledObject<'p, 'a> {
    pull: &'p mut Pulled<'a>,
    index: usize,
    len: u64,
    current: Option<(Vec<u8>, usize)>,
    done: bool,
}

impl InputStream for PulledObject<'_, '_> {
    fn len(&self) -> u64 {
        self.len
    }

    fn next_chunk(&mut self) -> io::Result<Option<&[u8]>> {
        if let Some((buf, _)) = self.current.take() {
            let _ = self.pull.recycle.send(buf);
        }
        if self.done {
            return Ok(None);
        }
        match self.pull.recv()? {
            Piece::Data { obj, buf, len, arrives } if obj == self.index => {
                self.pull.net.wait(arrives);
                self.current = Some((buf, len));
            }
            Piece::Failed(e) => return Err(io::Error::other(e)),
            other => {
                // The object ended early (or a later one began): leave the piece for it.
                self.pull.pending = Some(other);
                self.done = true;
            }
        }
        Ok(self.current.as_ref().map(|(b, n)| &b[..*n]))
    }
}

impl Drop for PulledObject<'_, '_> {
    fn drop(&mut self) {
        if let Some((buf, _)) = self.current.take() {
            let _ = self.pull.recycle.send(buf);
        }
    }
}

/// The target side: reads every object's data extents in [`IO_BYTES`] pieces from the host
/// view and books each piece on the link.
fn read_objects(drive: &Drive, net: &Network, objs: &[VirtualObject], tx: &Sender<Piece>, recycle: &Receiver<Vec<u8>>) {
    let mut fresh = QUEUE_DEPTH + 1;
    for (i, obj) in objs.iter().enumerate() {
        let mut left = obj.length;
        for e in &obj.extents {
            let mut pos = 0;
            let len = e.bytes().min(left);
            left -= len;
            while pos < len {
                let n = (len - pos).min(IO_BYTES as u64) as usize;
                let mut buf = if fresh > 0 {
                    fresh -= 1;
                    vec![0u8; IO_BYTES]
                } else {
                    match recycle.recv() {
                        Ok(b) => b,
                        Err(_) => return,
                    }
                };
                let blocks = (n as u64).div_ceil(SECTOR) as usize * SECTOR as usize;
                if e.kind == ExtentKind::Data {
                    net.reserve_to_target(COMMAND_BYTES);
                    if let Err(err) = drive.target.read(HOST_NS, e.start_sector + pos / SECTOR, &mut buf[..blocks]) {
                        let _ = tx.send(Piece::Failed(format!("read of object {i} from {}: {err}", drive.image.display())));
                        return;
                    }
                } else {
                    buf[..n].fill(0);
                }
                let arrives = net.reserve_to_host(n as u64 + DATA_PDU_BYTES + COMPLETION_BYTES);
                if tx.send(Piece::Data { obj: i, buf, len: n, arrives }).is_err() {
                    return;
                }
                pos += n as u64;
            }
        }
    }
    let _ = tx.send(Piece::End);
}

/// Pulls `objs` from `drive` over `net` while `consume` reads them (in order, with
/// [`Pulled::next_object`]); returns what `consume` returns.
pub(crate) fn pull<R>(drive: &Drive, net: &Network, objs: &[VirtualObject], stats: &PullStats, consume: impl FnOnce(&mut Pulled<'_>) -> R) -> R {
    let (tx, rx) = bounded(QUEUE_DEPTH);
    let (rtx, rrx) = bounded(QUEUE_DEPTH + 1);
    std::thread::scope(|s| {
        s.spawn(move || read_objects(drive, net, objs, &tx, &rrx));
        let mut pulled = Pulled { rx, recycle: rtx, net, stats, next_obj: 0, pending: None };
        consume(&mut pulled)
        // Dropping `pulled` hangs up, which stops the reader if the host quit early.
    })
}

/// Pulls `objs` whole into host memory.
pub(crate) fn pull_all(drive: &Drive, net: &Network, objs: &[VirtualObject], stats: &PullStats) -> io::Result<Vec<Vec<u8>>> {
    pull(drive, net, objs, stats, |p| {
        objs.iter()
            .map(|o| {
                let mut out = Vec::with_capacity(o.length as usize);
                let mut s = p.next_object(o.length);
                while let Some(c) = s.next_chunk()? {
                    out.extend_from_slice(c);
                }
                Ok(out)
            })
            .collect()
    })
}

/// Runs EXEC `descriptor` on `drive`'s engine view with the descriptor and the result
/// crossing `net`.
pub(crate) fn exec_remote(drive: &Drive, net: &Network, descriptor: &[u8]) -> Result<ExecOutcome, String> {
    net.to_target(COMMAND_BYTES + DATA_PDU_BYTES + descriptor.len() as u64);
    let out = drive.target.exec(ENGINE_NS, descriptor).map_err(|e| format!("EXEC on {}: {e}", drive.image.display()))?;
    net.to_host(out.result.len() as u64 + DATA_PDU_BYTES + COMPLETION_BYTES);
    Ok(out)
}
