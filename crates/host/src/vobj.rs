// SPDX-License-Identifier: Apache-2.0
//! Turning a file into a virtual object: `fsync`, `stat` and FIEMAP, then file-system extents
//! mapped to 512-byte sectors of the namespace. Holes and unwritten extents become zero
//! extents; anything whose bytes are not plainly on the device is refused.

use crate::device::DeviceMap;
use crate::fiemap::{fiemap, flags, FiemapExtent};
use crate::OasError;
use insitu_proto::{Extent, VirtualObject, SECTOR};
use std::fs::File;
use std::path::Path;

/// Flags whose extents cannot be read from the device as they are.
const REFUSED: &[(u32, &str)] = &[
    (flags::UNKNOWN, "has no known location"),
    (flags::DELALLOC, "is not yet allocated (delayed allocation survived fsync)"),
    (flags::ENCODED, "is stored encoded (compressed)"),
    (flags::DATA_ENCRYPTED, "is stored encrypted"),
    (flags::DATA_INLINE, "is stored inline in the inode"),
    (flags::DATA_TAIL, "is packed into a shared tail block"),
    (flags::NOT_ALIGNED, "is not block aligned"),
];

/// Largest sector count of one wire extent; longer file-system extents are split.
const MAX_EXTENT_SECTORS: u64 = 1 << 31;

/// Builds the virtual object of `file` (at `path`, for messages) on the device `map`.
///
/// The file's data is synced first, so the target reads what the host wrote.
pub fn virtual_object(file: &File, path: &Path, map: &DeviceMap) -> Result<VirtualObject, OasError> {
    let io = |e| OasError::Io { path: path.to_owned(), source: e };
    // fdatasync, not fsync: the data and what locates it must be on the device, but an
    // atime-only inode change must not cost a journal commit on every offload.
    file.sync_data().map_err(io)?;
    let length = file.metadata().map_err(io)?.len();
    let extents = fiemap(file, length).map_err(|e| OasError::Fiemap { path: path.to_owned(), source: e })?;
    from_extents(&extents, length, map.offset, path)
}

/// The pure part of [`virtual_object`]: FIEMAP extents (device byte addresses) to wire
/// extents (namespace sectors, with the device starting at `device_offset` in the namespace).
pub fn from_extents(extents: &[FiemapExtent], length: u64, device_offset: u64, path: &Path) -> Result<VirtualObject, OasError> {
    let mut out = ObjectBuilder::default();
    for e in extents {
        if e.logical >= length {
            break; // preallocated beyond EOF
        }
        if let Some((_, why)) = REFUSED.iter().find(|(f, _)| e.flags & f != 0) {
            return Err(OasError::NotOffloadable { path: path.to_owned(), offset: e.logical, reason: (*why).into() });
        }
        if e.logical < out.covered {
            return Err(OasError::NotOffloadable { path: path.to_owned(), offset: e.logical, reason: "overlaps the previous extent".into() });
        }
        let physical = device_offset.checked_add(e.physical);
        let aligned = [e.logical, e.length, physical.unwrap_or(1)].iter().all(|v| v % SECTOR == 0);
        if !aligned {
            return Err(OasError::NotOffloadable {
                path: path.to_owned(),
                offset: e.logical,
                reason: format!("extent at device byte {} (+{}) is not 512-byte aligned", e.physical, e.length),
            });
        }
        out.zeros_until(e.logical);
        if e.flags & flags::UNWRITTEN != 0 {
            out.zeros_until(e.logical + e.length);
        } else {
            out.data(physical.unwrap_or(0) / SECTOR, e.length / SECTOR);
        }
    }
    out.zeros_until(length.next_multiple_of(SECTOR));
    out.trim(length);
    Ok(VirtualObject { offset: 0, length, extents: out.extents })
}

#[derive(Default)]
struct ObjectBuilder {
    extents: Vec<Extent>,
    covered: u64,
}

impl ObjectBuilder {
    fn zeros_until(&mut self, logical: u64) {
        if logical > self.covered {
            self.push(None, (logical - self.covered).div_ceil(SECTOR));
        }
    }

    fn data(&mut self, sector: u64, sectors: u64) {
        self.push(Some(sector), sectors);
    }

    /// Appends a run, merging with the previous one where contiguous and splitting runs too
    /// long for one wire extent.
    fn push(&mut self, mut sector: Option<u64>, mut sectors: u64) {
        self.covered += sectors * SECTOR;
        while sectors > 0 {
            if let Some(last) = self.extents.last_mut() {
                let contiguous = match sector {
                    None => last.kind == insitu_proto::ExtentKind::Zero,
                    Some(s) => last.kind == insitu_proto::ExtentKind::Data && last.start_sector + u64::from(last.sectors) == s,
                };
                let room = MAX_EXTENT_SECTORS - u64::from(last.sectors);
                if contiguous && room > 0 {
                    let take = room.min(sectors);
                    last.sectors += take as u32;
                    sectors -= take;
                    sector = sector.map(|s| s + take);
                    continue;
                }
            }
            let take = sectors.min(MAX_EXTENT_SECTORS);
            self.extents.push(match sector {
                Some(s) => Extent::data(s, take as u32),
                None => Extent::zero(take as u32),
            });
            sectors -= take;
            sector = sector.map(|s| s + take);
        }
    }

    /// Drops trailing extents wholly beyond `length` (a file-system block past EOF).
    fn trim(&mut self, length: u64) {
        let mut total: u64 = self.extents.iter().map(Extent::bytes).sum();
        while let Some(last) = self.extents.last() {
            if total - last.bytes() >= length && !(length == 0 && total == 0) {
                total -= last.bytes();
                self.extents.pop();
            } else {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(logical: u64, physical: u64, length: u64, flags: u32) -> FiemapExtent {
        FiemapExtent { logical, physical, length, flags }
    }

    #[test]
    fn holes_unwritten_and_tails_become_zero_extents() {
        let map = [ext(0, 1 << 20, 4096, 0), ext(8192, 2 << 20, 4096, flags::UNWRITTEN), ext(16384, (1 << 20) + 4096, 4096, flags::LAST)];
        let obj = from_extents(&map, 16384 + 100, 1024, Path::new("f")).unwrap();
        let s = |b: u64| (b + 1024) / 512;
        assert_eq!(obj.extents, vec![Extent::data(s(1 << 20), 8), Extent::zero(24), Extent::data(s((1 << 20) + 4096), 8)]);
        assert_eq!(obj.length, 16484);
    }

    #[test]
    fn trailing_hole_and_empty_file() {
        let obj = from_extents(&[ext(0, 4096, 1024, 0)], 5000, 0, Path::new("f")).unwrap();
        assert_eq!(obj.extents, vec![Extent::data(8, 2), Extent::zero(8)]);
        assert!(obj.extent_bytes() >= obj.length);
        let empty = from_extents(&[], 0, 0, Path::new("f")).unwrap();
        assert!(empty.extents.is_empty());
        let sparse = from_extents(&[], 3000, 0, Path::new("f")).unwrap();
        assert_eq!(sparse.extents, vec![Extent::zero(6)]);
    }

    #[test]
    fn physically_contiguous_extents_merge_and_beyond_eof_is_ignored() {
        let map = [ext(0, 4096, 4096, 0), ext(4096, 8192, 4096, 0), ext(8192, 1 << 20, 4096, flags::LAST)];
        let obj = from_extents(&map, 8192, 0, Path::new("f")).unwrap();
        assert_eq!(obj.extents, vec![Extent::data(8, 16)]);
    }

    #[test]
    fn unsafe_extents_are_refused_with_the_reason() {
        for (flag, word) in [(flags::DATA_INLINE, "inline"), (flags::DELALLOC, "allocated"), (flags::ENCODED, "encoded")] {
            let err = from_extents(&[ext(0, 0, 4096, flag)], 100, 0, Path::new("f")).unwrap_err();
            assert!(err.to_string().contains(word), "{err}");
        }
        let err = from_extents(&[ext(0, 100, 4096, 0)], 100, 0, Path::new("f")).unwrap_err();
        assert!(err.to_string().contains("aligned"), "{err}");
    }
}
