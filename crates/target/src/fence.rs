// SPDX-License-Identifier: Apache-2.0
//! Host/container locks (DockerSSD's inode lock): while a container holds a path of a
//! sharable namespace, host writes to that path's blocks are refused.
//!
//! The host names the path and its extents (from FIEMAP on its mount) in a LOCK command;
//! the target keeps them as write fences in memory only: a restarted target has none, and
//! the file system is consistent because nothing was changed on its behalf. A listener
//! hears of every lock and release, so the container runtime can drop its cached view
//! of the namespace and see the host's latest data.
//!
//! LOCK payload (little-endian), `docs/lock-commands.md`:
//! `"ISLK"`, version u16 = 1, path length u16, extent count u32, the path (UTF-8), then
//! per extent: byte offset u64, byte length u64 (both multiples of 512).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use insitu_wire::Status;

use crate::CommandError;

/// Payload magic.
pub const LOCK_MAGIC: &[u8; 4] = b"ISLK";
/// Payload version.
pub const LOCK_VERSION: u16 = 1;
/// Longest path.
pub const MAX_PATH: usize = 4096;
/// Most extents in one lock.
pub const MAX_EXTENTS: usize = 65_536;

/// Told of every lock taken and released.
pub trait LockListener: Send + Sync {
    /// A lock on `path` of namespace `nsid` was taken.
    fn locked(&self, nsid: u32, path: &str);
    /// The lock on `path` of namespace `nsid` was released.
    fn unlocked(&self, nsid: u32, path: &str);
}

/// A parsed LOCK request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockRequest {
    /// Path in the namespace's file system (for messages and the listener).
    pub path: String,
    /// (byte offset, byte length) ranges of the namespace.
    pub extents: Vec<(u64, u64)>,
}

impl LockRequest {
    /// Encodes the payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(12 + self.path.len() + 16 * self.extents.len());
        v.extend_from_slice(LOCK_MAGIC);
        v.extend_from_slice(&LOCK_VERSION.to_le_bytes());
        v.extend_from_slice(&(self.path.len() as u16).to_le_bytes());
        v.extend_from_slice(&(self.extents.len() as u32).to_le_bytes());
        v.extend_from_slice(self.path.as_bytes());
        for (o, l) in &self.extents {
            v.extend_from_slice(&o.to_le_bytes());
            v.extend_from_slice(&l.to_le_bytes());
        }
        v
    }

    /// Parses a payload, checking every field.
    pub fn parse(b: &[u8]) -> Result<LockRequest, String> {
        if b.len() < 12 || &b[..4] != LOCK_MAGIC {
            return Err("not a lock request (no ISLK header)".into());
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != LOCK_VERSION {
            return Err(format!("lock request version {version}; this target speaks {LOCK_VERSION}"));
        }
        let plen = usize::from(u16::from_le_bytes([b[6], b[7]]));
        let count = u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize;
        if plen == 0 || plen > MAX_PATH {
            return Err(format!("path of {plen} bytes (1 to {MAX_PATH})"));
        }
        if count == 0 || count > MAX_EXTENTS {
            return Err(format!("{count} extents (1 to {MAX_EXTENTS})"));
        }
        let need = 12 + plen + 16 * count;
        if b.len() < need {
            return Err(format!("lock request of {} bytes, {need} announced", b.len()));
        }
        let path = std::str::from_utf8(&b[12..12 + plen]).map_err(|_| "the path is not UTF-8".to_string())?.to_string();
        let mut extents = Vec::with_capacity(count);
        for c in b[12 + plen..need].chunks_exact(16) {
            let o = u64::from_le_bytes(c[..8].try_into().expect("8 bytes"));
            let l = u64::from_le_bytes(c[8..].try_into().expect("8 bytes"));
            if l == 0 || o % 512 != 0 || l % 512 != 0 || o.checked_add(l).is_none() {
                return Err(format!("extent at byte {o} of {l} bytes: offsets and lengths are non-zero multiples of 512"));
            }
            extents.push((o, l));
        }
        Ok(LockRequest { path, extents })
    }
}

#[derive(Debug)]
struct Lock {
    nsid: u32,
    path: String,
    extents: Vec<(u64, u64)>,
}

/// The write fences of a target.
#[derive(Default)]
pub struct Fences {
    next: AtomicU64,
    locks: RwLock<BTreeMap<u64, Lock>>,
    listener: Mutex<Option<Arc<dyn LockListener>>>,
}

impl Fences {
    /// Takes a lock; the caller has checked the extents against the namespace.
    pub(crate) fn lock(&self, nsid: u32, req: LockRequest) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let path = req.path.clone();
        self.locks.write().unwrap_or_else(|e| e.into_inner()).insert(id, Lock { nsid, path: req.path, extents: req.extents });
        if let Some(l) = self.listener() {
            l.locked(nsid, &path);
        }
        id
    }

    /// Releases lock `id`.
    pub(crate) fn unlock(&self, id: u64) -> Result<(), CommandError> {
        let lock = self.locks.write().unwrap_or_else(|e| e.into_inner()).remove(&id);
        let lock = lock.ok_or_else(|| CommandError::new(Status::INVALID_FIELD, format!("no lock {id} on this target (a restart drops every lock)")))?;
        if let Some(l) = self.listener() {
            l.unlocked(lock.nsid, &lock.path);
        }
        Ok(())
    }

    /// Refuses a write of `len` bytes at namespace byte `off` that touches a locked extent.
    pub(crate) fn check(&self, nsid: u32, off: u64, len: u64) -> Result<(), CommandError> {
        let locks = self.locks.read().unwrap_or_else(|e| e.into_inner());
        for (id, l) in locks.iter().filter(|(_, l)| l.nsid == nsid) {
            if l.extents.iter().any(|&(o, n)| off < o + n && o < off + len) {
                return Err(CommandError::new(
                    Status::LBA_LOCKED,
                    format!("bytes {off}..{} of namespace {nsid} belong to {:?}, locked by a container (lock {id}); release it with `insitu unlock`", off + len, l.path),
                ));
            }
        }
        Ok(())
    }

    /// Sets the listener.
    pub(crate) fn set_listener(&self, l: Arc<dyn LockListener>) {
        *self.listener.lock().unwrap_or_else(|e| e.into_inner()) = Some(l);
    }

    fn listener(&self) -> Option<Arc<dyn LockListener>> {
        self.listener.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// How many locks are held.
    pub fn count(&self) -> usize {
        self.locks.read().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip_and_bad_ones_are_refused() {
        let r = LockRequest { path: "data/a.csv".into(), extents: vec![(4096, 8192), (1 << 20, 512)] };
        assert_eq!(LockRequest::parse(&r.encode()).unwrap(), r);
        let mut b = r.encode();
        b[0] = b'X';
        assert!(LockRequest::parse(&b).is_err());
        let bad = LockRequest { path: "x".into(), extents: vec![(100, 512)] };
        assert!(LockRequest::parse(&bad.encode()).unwrap_err().contains("multiples of 512"));
        let e = r.encode();
        assert!(LockRequest::parse(&e[..e.len() - 1]).is_err());
    }

    #[test]
    fn fences_refuse_only_overlapping_writes() {
        let f = Fences::default();
        let id = f.lock(1, LockRequest { path: "f".into(), extents: vec![(8192, 4096)] });
        assert!(f.check(1, 8192 + 4096, 512).is_ok());
        assert!(f.check(1, 0, 8192).is_ok());
        assert_eq!(f.check(1, 8192 + 4095 - 511, 512).unwrap_err().status, Status::LBA_LOCKED);
        assert!(f.check(2, 8192, 512).is_ok());
        f.unlock(id).unwrap();
        assert!(f.check(1, 8192, 512).is_ok());
        assert!(f.unlock(id).is_err());
    }

    proptest::proptest! {
        #[test]
        fn random_payloads_never_panic(b in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let _ = LockRequest::parse(&b);
        }

        #[test]
        fn check_matches_interval_overlap(o in 0u64..64, n in 1u64..16, w in 0u64..64, wl in 1u64..16) {
            let f = Fences::default();
            f.lock(1, LockRequest { path: "p".into(), extents: vec![(o * 512, n * 512)] });
            let overlaps = w < o + n && o < w + wl;
            proptest::prop_assert_eq!(f.check(1, w * 512, wl * 512).is_err(), overlaps);
        }
    }
}
