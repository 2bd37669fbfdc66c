// SPDX-License-Identifier: Apache-2.0
//! Host/container locks (DockerSSD's inode lock): while a container holds a path of a
//! sharable namespace, host writes to that path's blocks are refused.
//!
//! The host names the path and its extents (from FIEMAP on its mount) in a LOCK command;
//! the target keeps them as write fences in memory only: a restarted target has none, and
//! the file system is consistent because nothing was changed on its behalf. A
//! [`LockListener`] hears of every lock and release, so the container runtime can drop its
//! cached view of the namespace and see the host's latest data.
//!
//! Fenced are Write, Write Zeroes, Dataset Management (deallocate) and the output objects
//! of EXEC: every path by which a host changes a namespace's blocks. Reads are never
//! fenced.
//!
//! LOCK payload (little-endian), `docs/lock-commands.md`:
//! `"ISLK"`, version u16 = 1, path length u16, extent count u32, the path (UTF-8), then
//! per extent: byte offset u64, byte length u64 (both multiples of 512, length non-zero).
//! Bytes after the last extent are ignored (a passthrough may pad its transfer).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use insitu_proto::Status;

use crate::CommandError;

pub use insitu_proto::lock::{LockPayloadError, LockRequest, LOCK_HEADER, LOCK_MAGIC, LOCK_VERSION, MAX_EXTENTS, MAX_PATH};

/// Told of every lock taken and released, after the fact. Called on the I/O thread that
/// ran the LOCK or UNLOCK command, outside the fence table's lock: an implementation may
/// take its time (the command's completion waits for it) but must not call back into the
/// target's lock API.
pub trait LockListener: Send + Sync {
    /// A lock on `path` (relative to the file system's root) of namespace `nsid` was
    /// taken: host writes to its blocks are now refused.
    fn locked(&self, nsid: u32, path: &str);
    /// The lock on `path` of namespace `nsid` was released: the host may have changed it
    /// since, so a cached view of the namespace should be dropped.
    fn unlocked(&self, nsid: u32, path: &str);
}

/// One held lock: its ranges sorted and merged, as half-open `[start, end)` byte ranges.
#[derive(Debug)]
struct Lock {
    nsid: u32,
    path: String,
    ranges: Vec<(u64, u64)>,
}

impl Lock {
    /// The first locked range that overlaps `[off, end)`, if any.
    fn overlap(&self, off: u64, end: u64) -> Option<(u64, u64)> {
        // Ranges are sorted and disjoint: the first one ending after `off` is the only
        // candidate.
        let i = self.ranges.partition_point(|&(_, e)| e <= off);
        self.ranges.get(i).copied().filter(|&(s, _)| s < end)
    }
}

/// Sorts `(offset, length)` extents into disjoint, merged `[start, end)` ranges.
fn merge(extents: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut r: Vec<(u64, u64)> = extents.iter().map(|&(o, l)| (o, o.saturating_add(l))).collect();
    r.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(r.len());
    for (s, e) in r {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// A lock as [`Fences::held`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockInfo {
    /// The lock id.
    pub id: u64,
    /// Its namespace.
    pub nsid: u32,
    /// The locked path, relative to the namespace's file-system root.
    pub path: String,
    /// Bytes fenced.
    pub bytes: u64,
}

/// The write fences of a target, in memory only.
///
/// Lock ids carry a per-instance epoch in their high 32 bits (drawn from the clock and the
/// process id when the fences are made) and a counter in the low 32: an id from before a
/// target restart is unknown afterwards instead of naming somebody else's new lock.
pub struct Fences {
    epoch: u32,
    next: AtomicU32,
    locks: RwLock<BTreeMap<u64, Lock>>,
    listener: Mutex<Option<Arc<dyn LockListener>>>,
}

impl Default for Fences {
    fn default() -> Self {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let mixed = (nanos as u64 ^ (u64::from(std::process::id()) << 17)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        // Never 0, so no id is 0.
        let epoch = ((mixed >> 32) as u32).max(1);
        Fences { epoch, next: AtomicU32::new(0), locks: RwLock::default(), listener: Mutex::default() }
    }
}

impl Fences {
    /// Takes a lock; the caller has checked the extents against the namespace.
    pub(crate) fn lock(&self, nsid: u32, req: LockRequest) -> u64 {
        let id = (u64::from(self.epoch) << 32) | u64::from(self.next.fetch_add(1, Ordering::Relaxed).wrapping_add(1));
        let lock = Lock { nsid, path: req.path.clone(), ranges: merge(&req.extents) };
        self.locks.write().unwrap_or_else(PoisonError::into_inner).insert(id, lock);
        if let Some(l) = self.listener() {
            l.locked(nsid, &req.path);
        }
        id
    }

    /// Releases lock `id` of namespace `nsid`.
    pub(crate) fn unlock(&self, nsid: u32, id: u64) -> Result<(), CommandError> {
        let lock = {
            let mut locks = self.locks.write().unwrap_or_else(PoisonError::into_inner);
            match locks.get(&id) {
                None => {
                    return Err(CommandError::new(
                        Status::INVALID_FIELD,
                        format!("no lock {id:#x} on this target (it was released, or the target restarted: a restart drops every lock)"),
                    ))
                }
                Some(l) if l.nsid != nsid => {
                    return Err(CommandError::new(Status::INVALID_FIELD, format!("lock {id:#x} is on namespace {}, not {nsid}", l.nsid)))
                }
                Some(_) => locks.remove(&id).expect("present"),
            }
        };
        if let Some(l) = self.listener() {
            l.unlocked(lock.nsid, &lock.path);
        }
        Ok(())
    }

    /// Refuses a write of `len` bytes at namespace byte `off` that touches a locked range,
    /// naming the path and the lock.
    pub(crate) fn check(&self, nsid: u32, off: u64, len: u64) -> Result<(), CommandError> {
        if len == 0 {
            return Ok(());
        }
        let end = off.saturating_add(len);
        let locks = self.locks.read().unwrap_or_else(PoisonError::into_inner);
        for (id, l) in locks.iter().filter(|(_, l)| l.nsid == nsid) {
            if let Some((s, e)) = l.overlap(off, end) {
                return Err(CommandError::new(
                    Status::LBA_LOCKED,
                    format!(
                        "bytes {}..{} of namespace {nsid} belong to {:?}, locked by a container (lock {id:#x}); the write is refused until `insitu unlock` releases it",
                        off.max(s),
                        end.min(e),
                        l.path
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Sets the listener, replacing any earlier one.
    pub(crate) fn set_listener(&self, l: Arc<dyn LockListener>) {
        *self.listener.lock().unwrap_or_else(PoisonError::into_inner) = Some(l);
    }

    fn listener(&self) -> Option<Arc<dyn LockListener>> {
        self.listener.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// How many locks are held.
    pub fn count(&self) -> usize {
        self.locks.read().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// The locks held, by id.
    pub fn held(&self) -> Vec<LockInfo> {
        let locks = self.locks.read().unwrap_or_else(PoisonError::into_inner);
        locks.iter().map(|(&id, l)| LockInfo { id, nsid: l.nsid, path: l.path.clone(), bytes: l.ranges.iter().map(|(s, e)| e - s).sum() }).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Engine, NamespaceConfig, Visibility};
    use proptest::prelude::*;

    fn req(path: &str, extents: &[(u64, u64)]) -> LockRequest {
        LockRequest { path: path.into(), extents: extents.to_vec() }
    }

    #[test]
    fn payloads_round_trip_and_bad_ones_are_refused() {
        let r = req("data/a.csv", &[(4096, 8192), (1 << 20, 512)]);
        assert_eq!(LockRequest::parse(&r.encode()).unwrap(), r);
        // Padding after the last extent is ignored.
        let mut padded = r.encode();
        padded.resize(4096, 0);
        assert_eq!(LockRequest::parse(&padded).unwrap(), r);
        let mut b = r.encode();
        b[0] = b'X';
        assert_eq!(LockRequest::parse(&b), Err(LockPayloadError::NoHeader(b.len())));
        let mut b = r.encode();
        b[4] = 2;
        assert_eq!(LockRequest::parse(&b), Err(LockPayloadError::Version(2)));
        assert!(matches!(LockRequest::parse(&req("x", &[(100, 512)]).encode()), Err(LockPayloadError::BadExtent { index: 0, .. })));
        assert!(matches!(LockRequest::parse(&req("x", &[(0, 512), (512, 0)]).encode()), Err(LockPayloadError::BadExtent { index: 1, .. })));
        assert!(matches!(LockRequest::parse(&req("x", &[(u64::MAX - 511, 1024)]).encode()), Err(LockPayloadError::BadExtent { .. })));
        assert_eq!(LockRequest::parse(&req("", &[(0, 512)]).encode()), Err(LockPayloadError::PathLength(0)));
        let long = "a".repeat(MAX_PATH + 1);
        assert_eq!(LockRequest::parse(&req(&long, &[(0, 512)]).encode()), Err(LockPayloadError::PathLength(MAX_PATH + 1)));
        let e = r.encode();
        assert!(matches!(LockRequest::parse(&e[..e.len() - 1]), Err(LockPayloadError::Truncated { .. })));
        let mut b = r.encode();
        b[8..12].copy_from_slice(&(MAX_EXTENTS as u32 + 1).to_le_bytes());
        assert_eq!(LockRequest::parse(&b), Err(LockPayloadError::ExtentCount(MAX_EXTENTS + 1)));
        let mut b = req("ab", &[(0, 512)]).encode();
        b[12] = 0xFF;
        assert_eq!(LockRequest::parse(&b), Err(LockPayloadError::PathNotUtf8));
        // An empty extent list is a lock of a file without blocks.
        assert_eq!(LockRequest::parse(&req("empty", &[]).encode()).unwrap().extents, vec![]);
    }

    #[test]
    fn the_documented_test_vector_encodes() {
        // docs/lock-commands.md, "Test vector".
        let hex = "49534c4b01000e0002000000646174612f696e7075742e637376\
                   0010000000000000002000000000000000001000000000000002000000000000";
        let want: Vec<u8> = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
        let r = req("data/input.csv", &[(4096, 8192), (1 << 20, 512)]);
        assert_eq!(r.encode(), want);
        assert_eq!(LockRequest::parse(&want).unwrap(), r);
    }

    #[test]
    fn fences_refuse_only_overlapping_writes() {
        let f = Fences::default();
        let id = f.lock(1, req("f", &[(8192, 4096)]));
        assert!(f.check(1, 8192 + 4096, 512).is_ok());
        assert!(f.check(1, 0, 8192).is_ok());
        let e = f.check(1, 8192 + 4096 - 512, 512).unwrap_err();
        assert_eq!(e.status, Status::LBA_LOCKED);
        assert!(e.message.contains("\"f\"") && e.message.contains("insitu unlock"), "{}", e.message);
        assert!(f.check(2, 8192, 512).is_ok(), "another namespace");
        assert!(f.unlock(2, id).is_err(), "another namespace's id");
        f.unlock(1, id).unwrap();
        assert!(f.check(1, 8192, 512).is_ok());
        assert!(f.unlock(1, id).unwrap_err().message.contains("restart"));
    }

    #[test]
    fn ids_differ_across_restarts() {
        let (a, b) = (Fences::default(), Fences::default());
        let (x, y) = (a.lock(1, req("p", &[])), b.lock(1, req("p", &[])));
        assert_ne!(x, 0);
        // Two instances made in the same process differ by clock; in practice restarts
        // differ by pid and clock. Equal epochs would need equal nanosecond stamps.
        assert!(x != y || a.epoch == b.epoch);
        assert!(b.unlock(1, x).is_err() || x == y);
    }

    struct Heard(Mutex<Vec<String>>);

    impl LockListener for Heard {
        fn locked(&self, nsid: u32, path: &str) {
            self.0.lock().unwrap().push(format!("lock {nsid} {path}"));
        }
        fn unlocked(&self, nsid: u32, path: &str) {
            self.0.lock().unwrap().push(format!("unlock {nsid} {path}"));
        }
    }

    fn target(visibility: Visibility) -> (tempfile::TempDir, Engine) {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("ns.img");
        std::fs::write(&img, vec![0x11u8; 1 << 20]).unwrap();
        let mut t = Engine::new();
        t.add_namespace(&img, NamespaceConfig { visibility, ..Default::default() }).unwrap();
        (dir, t)
    }

    #[test]
    fn target_refuses_writes_in_locked_ranges_until_unlocked() {
        let (_d, t) = target(Visibility::Sharable);
        let heard = Arc::new(Heard(Mutex::default()));
        t.set_lock_listener(heard.clone());
        let id = t.lock(1, req("dir/f.csv", &[(4096, 4096), (65536, 512)])).unwrap();
        assert_eq!(t.lock_count(), 1);
        // Refused: Write, Write Zeroes (and so DSM deallocate) touching the ranges.
        assert_eq!(t.write(1, 8, &[0u8; 512]).unwrap_err().status, Status::LBA_LOCKED);
        assert_eq!(t.write(1, 0, &[0u8; 8192]).unwrap_err().status, Status::LBA_LOCKED);
        assert_eq!(t.write_zeroes(1, 128, 1).unwrap_err().status, Status::LBA_LOCKED);
        let mut buf = [0u8; 512];
        t.read(1, 8, &mut buf).unwrap();
        assert_eq!(buf, [0x11; 512], "a refused write changed nothing; reads are not fenced");
        // Accepted around them.
        t.write(1, 0, &[0x22u8; 4096]).unwrap();
        t.write(1, 16, &[0x22u8; 512]).unwrap();
        t.write_zeroes(1, 129, 10).unwrap();
        t.unlock(1, id).unwrap();
        t.write(1, 8, &[0x33u8; 512]).unwrap();
        t.read(1, 8, &mut buf).unwrap();
        assert_eq!(buf, [0x33; 512]);
        assert_eq!(*heard.0.lock().unwrap(), ["lock 1 dir/f.csv", "unlock 1 dir/f.csv"]);
        assert_eq!(t.unlock(1, id).unwrap_err().status, Status::INVALID_FIELD, "unknown id");
    }

    #[test]
    fn lock_past_the_namespace_or_on_a_private_one_is_refused_and_changes_nothing() {
        let (_d, t) = target(Visibility::Sharable);
        let heard = Arc::new(Heard(Mutex::default()));
        t.set_lock_listener(heard.clone());
        let e = t.lock(1, req("f", &[(0, 512), ((1 << 20) - 512, 1024)])).unwrap_err();
        assert_eq!(e.status, Status::LBA_OUT_OF_RANGE);
        assert_eq!(t.lock(2, req("f", &[(0, 512)])).unwrap_err().status, Status::INVALID_NAMESPACE);
        assert_eq!(t.lock_count(), 0);
        assert!(heard.0.lock().unwrap().is_empty());
        t.write(1, 0, &[0u8; 512]).unwrap();
        let (_p, private) = target(Visibility::Private);
        assert_eq!(private.lock(1, req("f", &[(0, 512)])).unwrap_err().status, Status::INVALID_NAMESPACE);
        assert_eq!(private.lock_count(), 0);
    }

    proptest! {
        #[test]
        fn random_payloads_never_panic(b in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = LockRequest::parse(&b);
        }

        #[test]
        fn mutated_payloads_never_panic_and_refused_ones_store_nothing(
            extents in proptest::collection::vec((0u64..4096, 1u64..64), 0..8),
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
            cut in any::<usize>(),
        ) {
            let (_d, t) = target(Visibility::Sharable);
            let r = req("some/path", &extents.iter().map(|&(o, l)| (o * 512, l * 512)).collect::<Vec<_>>());
            let mut b = r.encode();
            for (at, v) in flips {
                let n = b.len();
                b[at % n] ^= v;
            }
            b.truncate(cut % (b.len() + 1));
            let before = t.lock_count();
            if let Ok(parsed) = LockRequest::parse(&b) {
                let fits = parsed.extents.iter().all(|&(o, l)| o + l <= 1 << 20);
                prop_assert_eq!(t.lock(1, parsed).is_ok(), fits);
                prop_assert_eq!(t.lock_count(), before + usize::from(fits));
            } else {
                prop_assert_eq!(t.lock_count(), before);
            }
        }

        #[test]
        fn check_matches_interval_overlap(
            locked in proptest::collection::vec((0u64..128, 1u64..16), 0..6),
            w in 0u64..160,
            wl in 1u64..16,
        ) {
            let f = Fences::default();
            f.lock(1, req("p", &locked.iter().map(|&(o, n)| (o * 512, n * 512)).collect::<Vec<_>>()));
            let overlaps = locked.iter().any(|&(o, n)| w < o + n && o < w + wl);
            prop_assert_eq!(f.check(1, w * 512, wl * 512).is_err(), overlaps);
        }
    }
}
