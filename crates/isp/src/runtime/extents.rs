// SPDX-License-Identifier: Apache-2.0
//! Where a file of the sharable namespace keeps its bytes on the namespace, from FIEMAP,
//! and whether those bytes may be written in place.
//!
//! A container may write a file the host pre-allocated without the target touching the
//! file system's metadata (the host owns it): its reads and writes go to the namespace
//! bytes that FIEMAP reports. That is only sound when every byte of the file lives in a
//! plain, written extent of its own. A hole would need an allocation; an unwritten
//! extent (`fallocate`) reads as zeros whatever its blocks hold until the file system
//! converts it; delayed allocation has no blocks yet; inline, tail-packed, encoded or
//! encrypted data is not the file's bytes as they are; and a shared extent (reflink,
//! snapshot) belongs to another file too. [`ExtentMap::new`] refuses each of them, naming
//! the bytes and the fix.

use std::fs::File;
use std::os::fd::AsRawFd;

/// `FIEMAP_EXTENT_LAST`: the file's last extent.
const LAST: u32 = 0x0001;
/// `FIEMAP_EXTENT_UNKNOWN`: the data's location is not known.
const UNKNOWN: u32 = 0x0002;
/// `FIEMAP_EXTENT_DELALLOC`: not allocated yet (implies UNKNOWN).
const DELALLOC: u32 = 0x0004;
/// `FIEMAP_EXTENT_ENCODED`: compressed or otherwise encoded.
const ENCODED: u32 = 0x0008;
/// `FIEMAP_EXTENT_DATA_ENCRYPTED`.
const ENCRYPTED: u32 = 0x0080;
/// `FIEMAP_EXTENT_NOT_ALIGNED`: not block aligned.
const NOT_ALIGNED: u32 = 0x0100;
/// `FIEMAP_EXTENT_DATA_INLINE`: kept in the inode or a metadata block.
const INLINE: u32 = 0x0200;
/// `FIEMAP_EXTENT_DATA_TAIL`: packed with other files' tails.
const TAIL: u32 = 0x0400;
/// `FIEMAP_EXTENT_UNWRITTEN`: allocated, reads as zeros.
const UNWRITTEN: u32 = 0x0800;
/// `FIEMAP_EXTENT_SHARED`: its blocks belong to other files too.
const SHARED: u32 = 0x2000;

/// `FS_IOC_FIEMAP`.
const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
/// Extents asked for per FIEMAP call.
const BATCH: usize = 256;
/// Most extents a writable file may have (a bound on the work and memory of one file).
pub const MAX_EXTENTS: usize = 65_536;

/// One extent as FIEMAP reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawExtent {
    /// Byte offset in the file.
    pub logical: u64,
    /// Byte offset on the device (the namespace).
    pub physical: u64,
    /// Bytes.
    pub length: u64,
    /// `FIEMAP_EXTENT_*` flags.
    pub flags: u32,
}

/// Why a file cannot be written in place. The messages say what to do on the host.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Unfit {
    /// Size 0: there is nothing to write into.
    #[error("it is empty: pre-allocate it on the host, e.g. `dd if=/dev/zero of=FILE bs=1M count=N conv=fsync` and `sync`")]
    Empty,
    /// A range of the file has no blocks (a sparse file).
    #[error("bytes {start}..{end} have no blocks (a sparse file): fill it on the host (e.g. with zeros from dd, not truncate) and `sync`")]
    Hole {
        /// First byte of the hole.
        start: u64,
        /// End of the hole (exclusive).
        end: u64,
    },
    /// An extent is allocated but unwritten (`fallocate`).
    #[error("bytes {start}..{end} are allocated but unwritten (fallocate): write them on the host (e.g. zeros with dd) and `sync`")]
    Unwritten {
        /// First byte.
        start: u64,
        /// End (exclusive).
        end: u64,
    },
    /// An extent is not on the media yet (delayed allocation).
    #[error("bytes {start}..{end} are not on the media yet (delayed allocation): `sync` on the host first")]
    NotOnMedia {
        /// First byte.
        start: u64,
        /// End (exclusive).
        end: u64,
    },
    /// An extent's bytes are not stored as they are (inline, tail-packed, encoded, encrypted, unaligned).
    #[error(
        "bytes {start}..{end} are stored {how}, not as plain blocks: use a larger file (a few KiB at least) on a file system without compression or encryption"
    )]
    NotPlain {
        /// First byte.
        start: u64,
        /// End (exclusive).
        end: u64,
        /// How they are stored.
        how: &'static str,
    },
    /// An extent's blocks belong to other files too (reflink, snapshot).
    #[error("bytes {start}..{end} share their blocks with another file (reflink or snapshot): writing them would change that file too; copy it with `cp --reflink=never`")]
    Shared {
        /// First byte.
        start: u64,
        /// End (exclusive).
        end: u64,
    },
    /// An extent lies outside the namespace, overlaps another, or is not 512-byte aligned.
    #[error("extent at file byte {logical} (namespace byte {physical}, {length} bytes) does not fit the namespace of {device} bytes: the file system's metadata is inconsistent (run fsck on the host)")]
    Corrupt {
        /// File offset.
        logical: u64,
        /// Namespace offset.
        physical: u64,
        /// Bytes.
        length: u64,
        /// The namespace's size.
        device: u64,
    },
    /// More extents than [`MAX_EXTENTS`].
    #[error("it has more than {MAX_EXTENTS} extents: pre-allocate it in one go (dd with a large bs) on a less fragmented file system")]
    TooFragmented,
}

/// One contiguous run of a file on the namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    logical: u64,
    physical: u64,
    length: u64,
}

/// A file's bytes `[0, size)` laid out on the namespace: contiguous pieces, in file order,
/// covering every byte exactly once, all inside the namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtentMap {
    size: u64,
    pieces: Vec<Piece>,
}

impl ExtentMap {
    /// The map of a file of `size` bytes whose FIEMAP extents are `raw`, on a namespace of
    /// `device` bytes; refuses anything that cannot be written in place (see [`Unfit`]).
    /// Extents past the end of the file (pre-allocated beyond it) are ignored: nothing is
    /// ever written there.
    pub fn new(size: u64, raw: &[RawExtent], device: u64) -> Result<ExtentMap, Unfit> {
        if size == 0 {
            return Err(Unfit::Empty);
        }
        if raw.len() > MAX_EXTENTS {
            return Err(Unfit::TooFragmented);
        }
        let mut sorted: Vec<RawExtent> = raw.iter().copied().filter(|e| e.logical < size && e.length > 0).collect();
        sorted.sort_by_key(|e| e.logical);
        let mut pieces = Vec::with_capacity(sorted.len());
        let mut cursor = 0u64;
        for e in sorted {
            let corrupt = Unfit::Corrupt { logical: e.logical, physical: e.physical, length: e.length, device };
            if e.logical > cursor {
                return Err(Unfit::Hole { start: cursor, end: e.logical });
            }
            if e.logical < cursor {
                return Err(corrupt);
            }
            let end = e.logical.saturating_add(e.length).min(size);
            let (start, f) = (e.logical, e.flags);
            if f & UNWRITTEN != 0 {
                return Err(Unfit::Unwritten { start, end });
            }
            if f & (DELALLOC | UNKNOWN) != 0 {
                return Err(Unfit::NotOnMedia { start, end });
            }
            if f & SHARED != 0 {
                return Err(Unfit::Shared { start, end });
            }
            let how = match f {
                f if f & INLINE != 0 => Some("inline in the inode"),
                f if f & TAIL != 0 => Some("tail-packed"),
                f if f & ENCODED != 0 => Some("encoded (compressed)"),
                f if f & ENCRYPTED != 0 => Some("encrypted"),
                f if f & NOT_ALIGNED != 0 => Some("unaligned"),
                _ => None,
            };
            if let Some(how) = how {
                return Err(Unfit::NotPlain { start, end, how });
            }
            let length = end - start;
            // The whole extent, not only the part below the file's end, must be on the
            // namespace: a map that lies about one is not to be trusted for any of it.
            let fits = e.physical % 512 == 0 && e.logical % 512 == 0 && e.length % 512 == 0 && e.physical.checked_add(e.length).is_some_and(|x| x <= device);
            if !fits {
                return Err(corrupt);
            }
            pieces.push(Piece { logical: start, physical: e.physical, length });
            cursor = end;
        }
        if cursor < size {
            return Err(Unfit::Hole { start: cursor, end: size });
        }
        Ok(ExtentMap { size, pieces })
    }

    /// The file's size, which never changes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The namespace byte ranges, (offset, length) in file order, that hold file bytes
    /// `[offset, offset + len)` cut at the file's end.
    pub fn ranges(&self, offset: u64, len: u64) -> Vec<(u64, u64)> {
        let end = offset.saturating_add(len).min(self.size);
        if offset >= end {
            return Vec::new();
        }
        let first = self.pieces.partition_point(|p| p.logical + p.length <= offset);
        let mut out = Vec::new();
        for p in &self.pieces[first..] {
            if p.logical >= end {
                break;
            }
            let s = offset.max(p.logical);
            let e = end.min(p.logical + p.length);
            out.push((p.physical + (s - p.logical), e - s));
        }
        out
    }

    /// The namespace byte ranges of the whole file, each rounded out to 512 bytes (for a
    /// write fence, whose ranges are in sectors).
    pub fn fence(&self) -> Vec<(u64, u64)> {
        self.pieces.iter().map(|p| (p.physical, p.length.div_ceil(512) * 512)).collect()
    }

    /// Whether any byte of this file shares a sector with one of `other`.
    pub fn overlaps(&self, other: &ExtentMap) -> bool {
        let ours = self.fence();
        other.fence().iter().any(|&(o, l)| ours.iter().any(|&(s, n)| o < s + n && s < o + l))
    }
}

/// The extents of an open file, from `FS_IOC_FIEMAP` (without FIEMAP_FLAG_SYNC: the
/// target's view is read-only, and what it reports is what the media holds).
pub fn fiemap(file: &File) -> std::io::Result<Vec<RawExtent>> {
    // struct fiemap (32 bytes) followed by BATCH struct fiemap_extent (56 bytes each),
    // as u64 words so that the buffer is aligned for the kernel's u64 fields.
    const WORDS: usize = (32 + 56 * BATCH) / 8;
    let mut out = Vec::new();
    let mut start = 0u64;
    loop {
        let mut buf = [0u64; WORDS];
        buf[0] = start;
        buf[1] = u64::MAX - start;
        // fm_flags = 0, fm_mapped_extents = 0 (word 2); fm_extent_count (low half of word 3).
        buf[3] = BATCH as u64;
        // SAFETY: FS_IOC_FIEMAP reads the header and writes at most fm_extent_count
        // (BATCH) extents after it; `buf` holds exactly that many and lives across the call.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_FIEMAP as _, buf.as_mut_ptr()) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mapped = (buf[2] >> 32) as usize;
        if mapped == 0 {
            return Ok(out);
        }
        let mut last = false;
        for i in 0..mapped.min(BATCH) {
            let w = 4 + i * 7;
            let e = RawExtent { logical: buf[w], physical: buf[w + 1], length: buf[w + 2], flags: (buf[w + 5] & 0xFFFF_FFFF) as u32 };
            last |= e.flags & LAST != 0;
            start = e.logical.saturating_add(e.length);
            out.push(e);
        }
        if last || out.len() > MAX_EXTENTS {
            return Ok(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ext(logical: u64, physical: u64, length: u64, flags: u32) -> RawExtent {
        RawExtent { logical, physical, length, flags }
    }

    const DEV: u64 = 1 << 30;

    #[test]
    fn a_written_file_maps_and_cuts_at_its_end() {
        let m = ExtentMap::new(10_000, &[ext(8192, 1 << 20, 4096, LAST), ext(0, 40960, 8192, 0)], DEV).unwrap();
        assert_eq!(m.size(), 10_000);
        assert_eq!(m.ranges(0, 100), vec![(40960, 100)]);
        assert_eq!(m.ranges(8000, 400), vec![(40960 + 8000, 192), (1 << 20, 208)]);
        assert_eq!(m.ranges(9_990, 100), vec![((1 << 20) + 1798, 10)], "cut at the file's end");
        assert!(m.ranges(10_000, 1).is_empty());
        assert_eq!(m.fence(), vec![(40960, 8192), (1 << 20, 2048)]);
    }

    #[test]
    fn unsafe_layouts_are_refused_with_the_bytes_named() {
        assert_eq!(ExtentMap::new(0, &[], DEV), Err(Unfit::Empty));
        assert_eq!(ExtentMap::new(8192, &[], DEV), Err(Unfit::Hole { start: 0, end: 8192 }));
        assert_eq!(ExtentMap::new(8192, &[ext(4096, 0, 4096, LAST)], DEV), Err(Unfit::Hole { start: 0, end: 4096 }));
        assert_eq!(ExtentMap::new(8192, &[ext(0, 0, 4096, LAST)], DEV), Err(Unfit::Hole { start: 4096, end: 8192 }));
        assert_eq!(ExtentMap::new(4096, &[ext(0, 0, 4096, UNWRITTEN | LAST)], DEV), Err(Unfit::Unwritten { start: 0, end: 4096 }));
        assert_eq!(ExtentMap::new(4096, &[ext(0, 0, 4096, DELALLOC | UNKNOWN)], DEV), Err(Unfit::NotOnMedia { start: 0, end: 4096 }));
        assert_eq!(ExtentMap::new(4096, &[ext(0, 0, 4096, SHARED)], DEV), Err(Unfit::Shared { start: 0, end: 4096 }));
        assert!(matches!(ExtentMap::new(60, &[ext(0, 0, 60, INLINE | NOT_ALIGNED | LAST)], DEV), Err(Unfit::NotPlain { how: "inline in the inode", .. })));
        assert!(matches!(ExtentMap::new(4096, &[ext(0, DEV - 2048, 4096, 0)], DEV), Err(Unfit::Corrupt { .. })), "past the namespace");
        assert!(matches!(ExtentMap::new(4096, &[ext(0, 100, 4096, 0)], DEV), Err(Unfit::Corrupt { .. })), "unaligned");
        assert!(matches!(ExtentMap::new(8192, &[ext(0, 0, 8192, 0), ext(4096, 1 << 20, 4096, 0)], DEV), Err(Unfit::Corrupt { .. })), "overlap");
        assert!(matches!(ExtentMap::new(4096, &[ext(0, u64::MAX - 511, 4096, 0)], u64::MAX), Err(Unfit::Corrupt { .. })), "wraps");
        // Allocation beyond the end of the file (fallocate --keep-size) is never written: fine.
        assert!(ExtentMap::new(4096, &[ext(0, 0, 4096, 0), ext(4096, 8192, 4096, UNWRITTEN | LAST)], DEV).is_ok());
    }

    #[test]
    fn overlapping_files_are_told_apart() {
        let a = ExtentMap::new(4096, &[ext(0, 8192, 4096, 0)], DEV).unwrap();
        let b = ExtentMap::new(100, &[ext(0, 12288 - 512, 512, 0)], DEV).unwrap();
        let c = ExtentMap::new(100, &[ext(0, 12288, 512, 0)], DEV).unwrap();
        assert!(a.overlaps(&b) && b.overlaps(&a));
        assert!(!a.overlaps(&c));
    }

    /// A random valid layout: `n` extents of whole 512-byte sectors at distinct places, and
    /// a size that ends inside the last one.
    fn layout() -> impl Strategy<Value = (u64, Vec<RawExtent>)> {
        prop::collection::vec((1u64..64, 0u64..512), 1..12)
            .prop_flat_map(|parts| {
                let total: u64 = parts.iter().map(|p| p.0 * 512).sum();
                let last = parts.last().map_or(512, |p| p.0 * 512);
                (Just(parts), (total - last + 1)..=total)
            })
            .prop_map(|(parts, size)| {
                let mut logical = 0;
                let mut v = Vec::new();
                for (i, (sectors, slot)) in parts.iter().enumerate() {
                    // Distinct 64-sector slots keep extents apart on the device.
                    let physical = (slot * 16 + i as u64) * 64 * 512;
                    v.push(ext(logical, physical, sectors * 512, 0));
                    logical += sectors * 512;
                }
                (size, v)
            })
    }

    proptest! {
        #[test]
        fn ranges_cover_exactly_the_asked_bytes_inside_the_file((size, raw) in layout(), off in 0u64..40_000, len in 0u64..40_000) {
            let m = ExtentMap::new(size, &raw, DEV).unwrap();
            let got = m.ranges(off, len);
            let want = off.saturating_add(len).min(size).saturating_sub(off);
            prop_assert_eq!(got.iter().map(|r| r.1).sum::<u64>(), want);
            // Every byte maps back to the file byte it was asked for.
            let mut at = off;
            for (p, l) in got {
                let e = raw.iter().find(|e| e.physical <= p && p + l <= e.physical + e.length).expect("inside one extent");
                prop_assert_eq!(e.logical + (p - e.physical), at);
                at += l;
            }
        }

        #[test]
        fn arbitrary_extents_never_panic_and_what_is_accepted_stays_on_the_device(
            size in 0u64..1 << 20,
            raw in prop::collection::vec((0u64..1 << 20, any::<u64>(), 0u64..1 << 20, any::<u32>()), 0..8),
            off in any::<u64>(), len in any::<u64>(),
        ) {
            let raw: Vec<RawExtent> = raw.into_iter().map(|(l, p, n, f)| ext(l, p, n, f)).collect();
            if let Ok(m) = ExtentMap::new(size, &raw, DEV) {
                for (p, l) in m.ranges(off, len).into_iter().chain(m.fence()) {
                    prop_assert!(p + l <= DEV);
                }
            }
        }
    }
}
