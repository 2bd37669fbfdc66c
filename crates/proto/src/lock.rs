// SPDX-License-Identifier: Apache-2.0
//! The LOCK command's payload (`docs/lock-commands.md`), little-endian:
//! `"ISLK"`, version u16 = 1, path length u16, extent count u32, the path (UTF-8), then
//! per extent: byte offset u64, byte length u64 (both multiples of 512, length non-zero).
//! Bytes after the last extent are ignored (a passthrough may pad its transfer). UNLOCK
//! carries no data: the lock id is in CDW10/CDW11.

/// Payload magic.
pub const LOCK_MAGIC: &[u8; 4] = b"ISLK";
/// Payload version.
pub const LOCK_VERSION: u16 = 1;
/// Payload header bytes (before the path).
pub const LOCK_HEADER: usize = 12;
/// Longest path, in bytes.
pub const MAX_PATH: usize = 4096;
/// Most extents in one lock.
pub const MAX_EXTENTS: usize = 65_536;

/// Why a LOCK payload was refused. Nothing is stored for a refused payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LockPayloadError {
    /// Shorter than the header, or the magic is wrong.
    #[error("not a lock request: {0} bytes without the ISLK header (docs/lock-commands.md)")]
    NoHeader(usize),
    /// A version this target does not speak.
    #[error("lock request version {0}; this target speaks version {LOCK_VERSION}")]
    Version(u16),
    /// The path length is 0 or over [`MAX_PATH`].
    #[error("path of {0} bytes; a lock names a path of 1 to {MAX_PATH} bytes")]
    PathLength(usize),
    /// More than [`MAX_EXTENTS`] extents.
    #[error("{0} extents; a lock holds at most {MAX_EXTENTS} (lock a directory's files in several locks)")]
    ExtentCount(usize),
    /// The payload ends before the announced path and extents.
    #[error("lock request of {got} bytes, its header announces {need}")]
    Truncated {
        /// Bytes received.
        got: usize,
        /// Bytes the header announces.
        need: usize,
    },
    /// The path is not UTF-8.
    #[error("the path is not UTF-8")]
    PathNotUtf8,
    /// An extent is empty, unaligned, or wraps around.
    #[error("extent {index} (byte {offset}, {length} bytes): offsets and lengths must be multiples of 512 and lengths non-zero")]
    BadExtent {
        /// Its index in the payload.
        index: usize,
        /// Byte offset.
        offset: u64,
        /// Byte length.
        length: u64,
    },
}

/// A parsed LOCK request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockRequest {
    /// Path in the namespace's file system (for messages and the listener).
    pub path: String,
    /// (byte offset, byte length) ranges of the namespace. May be empty: a file with no
    /// blocks yet is locked on the host side only, and the listener still hears of it.
    pub extents: Vec<(u64, u64)>,
}

impl LockRequest {
    /// Encodes the payload. The caller keeps the path within [`MAX_PATH`] bytes and the
    /// extents within [`MAX_EXTENTS`]; [`LockRequest::parse`] refuses anything else.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(LOCK_HEADER + self.path.len() + 16 * self.extents.len());
        v.extend_from_slice(LOCK_MAGIC);
        v.extend_from_slice(&LOCK_VERSION.to_le_bytes());
        v.extend_from_slice(&u16::try_from(self.path.len()).unwrap_or(u16::MAX).to_le_bytes());
        v.extend_from_slice(&u32::try_from(self.extents.len()).unwrap_or(u32::MAX).to_le_bytes());
        v.extend_from_slice(self.path.as_bytes());
        for (o, l) in &self.extents {
            v.extend_from_slice(&o.to_le_bytes());
            v.extend_from_slice(&l.to_le_bytes());
        }
        v
    }

    /// Parses a payload, checking every field; bytes after the last extent are ignored.
    pub fn parse(b: &[u8]) -> Result<LockRequest, LockPayloadError> {
        if b.len() < LOCK_HEADER || &b[..4] != LOCK_MAGIC {
            return Err(LockPayloadError::NoHeader(b.len()));
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != LOCK_VERSION {
            return Err(LockPayloadError::Version(version));
        }
        let plen = usize::from(u16::from_le_bytes([b[6], b[7]]));
        let count = u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize;
        if plen == 0 || plen > MAX_PATH {
            return Err(LockPayloadError::PathLength(plen));
        }
        if count > MAX_EXTENTS {
            return Err(LockPayloadError::ExtentCount(count));
        }
        // Bounded by the checks above: at most 12 + 4096 + 16 * 65536 bytes.
        let need = LOCK_HEADER + plen + 16 * count;
        if b.len() < need {
            return Err(LockPayloadError::Truncated { got: b.len(), need });
        }
        let path = std::str::from_utf8(&b[LOCK_HEADER..LOCK_HEADER + plen]).map_err(|_| LockPayloadError::PathNotUtf8)?.to_string();
        let mut extents = Vec::with_capacity(count);
        for (index, c) in b[LOCK_HEADER + plen..need].chunks_exact(16).enumerate() {
            let (o, l) = c.split_at(8);
            let offset = u64::from_le_bytes(o.try_into().expect("8 bytes"));
            let length = u64::from_le_bytes(l.try_into().expect("8 bytes"));
            if length == 0 || offset % 512 != 0 || length % 512 != 0 || offset.checked_add(length).is_none() {
                return Err(LockPayloadError::BadExtent { index, offset, length });
            }
            extents.push((offset, length));
        }
        Ok(LockRequest { path, extents })
    }
}
