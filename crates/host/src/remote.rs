// SPDX-License-Identifier: Apache-2.0
//! EXEC across the fabric, for files on a namespace attached with `insitu attach`.
//!
//! The vendor command carries the descriptor to the target only, so the result comes back
//! through a *result object*: a pool file on the same file system, named in the descriptor,
//! written by the target, then read by the host with NVMe Reads straight from the target
//! (no host cache can hold a stale copy). Byte counts are the initiator's wire counters, so
//! `bytes_to_host` is what actually crossed the network.

use crate::device::{self, DeviceMap};
use crate::pool::OutputPool;
use crate::{virtual_object, OasError, Stats};
use insitu_attach::Attachment;
use insitu_initiator::{InitiatorError, Session};
use insitu_proto::{CommandError, Descriptor, ExtentKind, Status, SECTOR};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

/// Result-object sizes tried in turn: most results are tiny; a long match list is not.
const RESULT_CAPACITIES: [u64; 2] = [1 << 20, 64 << 20];

/// Idle sessions per target URL. A command takes one for itself, so the wire counters it
/// reads before and after belong to that command alone.
#[derive(Default)]
pub(crate) struct Sessions {
    idle: Mutex<HashMap<String, Vec<Session>>>,
}

impl Sessions {
    fn take(&self, att: &Attachment) -> Result<Session, OasError> {
        if let Some(s) = self.idle.lock().unwrap_or_else(|e| e.into_inner()).get_mut(&att.url).and_then(Vec::pop) {
            return Ok(s);
        }
        let opts = att.connect_options().map_err(|e| OasError::BadRequest(e.to_string()))?;
        Session::connect(opts).map_err(|e| OasError::BadRequest(format!("{}: cannot reach the target: {e}", att.url)))
    }

    fn give_back(&self, url: &str, s: Session) {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).entry(url.to_owned()).or_default().push(s);
    }
}

/// What one remote EXEC returned.
pub(crate) struct RemoteOutcome {
    pub(crate) result: Vec<u8>,
    pub(crate) stats: Stats,
}

/// Runs `d` on the target behind `att`; `path` is the input file (for messages and to find
/// the pool), `map` its device.
pub(crate) fn exec(sessions: &Sessions, att: &Attachment, map: &DeviceMap, path: &Path, mut d: Descriptor) -> Result<RemoteOutcome, OasError> {
    let io = |e| OasError::Io { path: path.to_owned(), source: e };
    let root = device::mount_root(path).map_err(io)?;
    let pool = OutputPool::at(&root).map_err(io)?;
    let session = sessions.take(att)?;
    let outcome = run(&session, att, map, path, &pool, &mut d);
    sessions.give_back(&att.url, session);
    outcome
}

fn run(s: &Session, att: &Attachment, map: &DeviceMap, path: &Path, pool: &OutputPool, d: &mut Descriptor) -> Result<RemoteOutcome, OasError> {
    let before = s.stats();
    let read_only = d.outputs.is_empty();
    for (i, cap) in RESULT_CAPACITIES.iter().enumerate() {
        let slot = pool.acquire(*cap).map_err(|e| OasError::Io { path: pool.dir().to_owned(), source: e })?;
        let obj = match virtual_object(&slot.file, &slot.path, map) {
            Ok(o) if o.extents.iter().all(|e| e.kind == ExtentKind::Data) => o,
            other => {
                let _ = slot.release();
                other?;
                return Err(OasError::NotOffloadable { path: pool.dir().to_owned(), offset: 0, reason: "of a pool file is not allocated".into() });
            }
        };
        d.result = Some(obj.clone());
        let bytes = d.encode();
        let sent = if read_only { s.exec_idempotent(att.nsid, &bytes) } else { s.exec(att.nsid, &bytes) };
        let cqe = match sent {
            Ok(c) => c,
            Err(InitiatorError::Status { sct: 7, sc: 0xC5, .. }) if i + 1 < RESULT_CAPACITIES.len() => {
                let _ = slot.release();
                continue;
            }
            Err(e) => {
                let _ = slot.release();
                return Err(target_error(path, e));
            }
        };
        let result = read_object(s, att, &obj, u64::from(cqe.dw0)).map_err(|e| target_error(path, e));
        let _ = slot.release();
        let result = result?;
        let after = s.stats();
        let stats = Stats {
            bytes_to_host: after.bytes_received - before.bytes_received,
            bytes_from_host: after.bytes_sent - before.bytes_sent,
            media_bytes: u64::from(cqe.dw1) << 10,
            seconds: 0.0,
            commands: 1,
        };
        return Ok(RemoteOutcome { result, stats });
    }
    unreachable!("the last capacity returns or fails")
}

/// Reads the first `len` bytes of an object from the target.
fn read_object(s: &Session, att: &Attachment, obj: &insitu_proto::VirtualObject, len: u64) -> Result<Vec<u8>, InitiatorError> {
    let lba = u64::from(att.lba_size);
    let mut out = Vec::with_capacity(len as usize);
    for e in &obj.extents {
        if out.len() as u64 >= len {
            break;
        }
        let start = e.start_sector * SECTOR;
        let want = (len - out.len() as u64).min(e.bytes());
        let first = start / lba;
        let last = (start + want).div_ceil(lba);
        let data = s.read(att.nsid, first, (last - first) as u32)?;
        let skip = (start - first * lba) as usize;
        out.extend_from_slice(&data[skip..skip + want as usize]);
    }
    Ok(out)
}

fn target_error(path: &Path, e: InitiatorError) -> OasError {
    let source = match e {
        InitiatorError::Status { sct, sc, .. } => {
            let status = Status { sct, sc };
            CommandError::new(status, format!("the target answered {status} (its log has the details)"))
        }
        other => CommandError::new(Status::DATA_TRANSFER_ERROR, other.to_string()),
    };
    OasError::Target { path: path.to_owned(), source }
}
