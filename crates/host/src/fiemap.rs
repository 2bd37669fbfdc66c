// SPDX-License-Identifier: Apache-2.0
//! The FIEMAP ioctl: a file's logical-to-physical extent map, as the file system reports it.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// `_IOWR('f', 11, struct fiemap)`.
const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
/// Flush dirty data before mapping, so delayed allocations get real blocks.
const FIEMAP_FLAG_SYNC: u32 = 0x1;
/// Extents fetched per ioctl call.
const BATCH: usize = 256;

/// Extent flags from `linux/fiemap.h`.
pub mod flags {
    /// Last extent of the file.
    pub const LAST: u32 = 0x1;
    /// Location unknown.
    pub const UNKNOWN: u32 = 0x2;
    /// Delayed allocation: no blocks yet.
    pub const DELALLOC: u32 = 0x4;
    /// Data is encoded (compressed, ...).
    pub const ENCODED: u32 = 0x8;
    /// Data is encrypted.
    pub const DATA_ENCRYPTED: u32 = 0x80;
    /// Extent offsets may not be block aligned.
    pub const NOT_ALIGNED: u32 = 0x100;
    /// Data is stored inside the inode or metadata.
    pub const DATA_INLINE: u32 = 0x200;
    /// Data is packed into a block shared with other files.
    pub const DATA_TAIL: u32 = 0x400;
    /// Space is allocated but reads as zeros.
    pub const UNWRITTEN: u32 = 0x800;
    /// Shared with another file (reflink); safe to read.
    pub const SHARED: u32 = 0x2000;
}

/// One extent of the map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FiemapExtent {
    /// Byte offset in the file.
    pub logical: u64,
    /// Byte offset on the device.
    pub physical: u64,
    /// Length in bytes.
    pub length: u64,
    /// `flags::*` bits.
    pub flags: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawExtent {
    logical: u64,
    physical: u64,
    length: u64,
    reserved64: [u64; 2],
    flags: u32,
    reserved: [u32; 3],
}

#[repr(C)]
struct RawFiemap {
    start: u64,
    length: u64,
    flags: u32,
    mapped_extents: u32,
    extent_count: u32,
    reserved: u32,
    extents: [RawExtent; BATCH],
}

const _: () = assert!(std::mem::size_of::<RawExtent>() == 56);
const _: () = assert!(std::mem::size_of::<RawFiemap>() == 32 + 56 * BATCH);

/// Maps `[0, len)` of `file`, syncing it first. Extents come back in logical order.
pub fn fiemap(file: &File, len: u64) -> io::Result<Vec<FiemapExtent>> {
    let mut out = Vec::new();
    let mut start = 0u64;
    let mut req = Box::new(RawFiemap {
        start: 0,
        length: 0,
        flags: 0,
        mapped_extents: 0,
        extent_count: BATCH as u32,
        reserved: 0,
        extents: [RawExtent::default(); BATCH],
    });
    while start < len {
        req.start = start;
        req.length = len - start;
        req.flags = FIEMAP_FLAG_SYNC;
        req.mapped_extents = 0;
        req.extent_count = BATCH as u32;
        // SAFETY: `req` is a properly sized, initialised `struct fiemap` followed by room
        // for `extent_count` extents, as the ioctl requires; the fd is open for the call.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_FIEMAP as _, &mut *req as *mut RawFiemap) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = (req.mapped_extents as usize).min(BATCH);
        if n == 0 {
            break;
        }
        let mut last = false;
        for e in &req.extents[..n] {
            out.push(FiemapExtent { logical: e.logical, physical: e.physical, length: e.length, flags: e.flags });
            last |= e.flags & flags::LAST != 0;
        }
        let end = out.last().map(|e| e.logical + e.length).unwrap_or(len);
        if last || end <= start {
            break;
        }
        start = end;
    }
    Ok(out)
}
