// SPDX-License-Identifier: Apache-2.0
//! The on-disk formats: the superblock (two slots, blocks 0 and 1) and the metadata blob
//! it points to (inodes, directory, free list). See the crate docs for the picture.
//!
//! Every decoder here takes bytes that may be anything: it checks each length against what
//! is left before reading, never reserves memory from a count it read, and says in plain
//! words what was wrong.

use std::collections::BTreeMap;

/// Bytes in a block, the unit of allocation and of the buffer cache.
pub const BLOCK_SIZE: usize = 4096;
pub(crate) const BS: u64 = BLOCK_SIZE as u64;
/// Blocks 0 and 1 hold the two superblock slots.
pub(crate) const SUPERBLOCKS: u64 = 2;
/// The smallest device an accelfs accepts, in blocks.
pub const MIN_BLOCKS: u64 = 8;
/// The longest file name, in bytes.
pub const MAX_NAME: usize = 255;
/// A superblock names at most this many extents for the metadata blob.
pub(crate) const MAX_META_EXTENTS: usize = 64;

const SB_MAGIC: &[u8; 8] = b"INSITUAF";
const META_MAGIC: &[u8; 8] = b"AFSMETA1";
pub(crate) const VERSION: u32 = 1;
/// The superblock's CRC-32C covers bytes `[0, SB_CRC_AT)` and sits at `SB_CRC_AT`.
const SB_CRC_AT: usize = BLOCK_SIZE - 4;
const SB_EXTENTS_AT: usize = 48;

/// A run of `count` blocks from block `start`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Extent {
    pub start: u64,
    pub count: u64,
}

impl Extent {
    /// One past the last block, or `None` on overflow (only in hostile metadata).
    pub fn end(&self) -> Option<u64> {
        self.start.checked_add(self.count)
    }
}

/// Blocks needed for `bytes` bytes.
pub(crate) fn blocks_for(bytes: u64) -> u64 {
    bytes.div_ceil(BS)
}

/// One superblock slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Superblock {
    pub block_count: u64,
    pub generation: u64,
    pub meta_len: u64,
    pub meta_crc: u32,
    pub meta: Vec<Extent>,
}

impl Superblock {
    /// The slot's block: fields little-endian, CRC-32C of everything before it in the last
    /// four bytes.
    pub fn encode(&self) -> Vec<u8> {
        debug_assert!(self.meta.len() <= MAX_META_EXTENTS);
        let mut b = vec![0u8; BLOCK_SIZE];
        b[0..8].copy_from_slice(SB_MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(BLOCK_SIZE as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.block_count.to_le_bytes());
        b[24..32].copy_from_slice(&self.generation.to_le_bytes());
        b[32..40].copy_from_slice(&self.meta_len.to_le_bytes());
        b[40..44].copy_from_slice(&self.meta_crc.to_le_bytes());
        b[44..48].copy_from_slice(&(self.meta.len() as u32).to_le_bytes());
        for (i, e) in self.meta.iter().enumerate() {
            let at = SB_EXTENTS_AT + 16 * i;
            b[at..at + 8].copy_from_slice(&e.start.to_le_bytes());
            b[at + 8..at + 16].copy_from_slice(&e.count.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b[..SB_CRC_AT]);
        b[SB_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes a slot of a device of `device_blocks` blocks. `Ok(None)`: the slot is blank
    /// (all zero, never written). `Err`: why the slot cannot be used.
    pub fn decode(b: &[u8], device_blocks: u64) -> Result<Option<Superblock>, String> {
        if b.len() != BLOCK_SIZE {
            return Err(format!("a superblock is {BLOCK_SIZE} bytes, got {}", b.len()));
        }
        if b.iter().all(|x| *x == 0) {
            return Ok(None);
        }
        if &b[0..8] != SB_MAGIC {
            return Err("no accelfs magic (INSITUAF)".into());
        }
        if le32(b, SB_CRC_AT) != crc32c::crc32c(&b[..SB_CRC_AT]) {
            return Err("checksum mismatch (a torn or damaged superblock)".into());
        }
        let version = le32(b, 8);
        if version != VERSION {
            return Err(format!("format version {version}; this build reads version {VERSION}"));
        }
        let bs = le32(b, 12);
        if bs as usize != BLOCK_SIZE {
            return Err(format!("block size {bs}; this build uses {BLOCK_SIZE}"));
        }
        let block_count = le64(b, 16);
        if block_count < MIN_BLOCKS || block_count > device_blocks {
            return Err(format!("{block_count} blocks recorded, but the device has {device_blocks} (at least {MIN_BLOCKS} needed)"));
        }
        let n = le32(b, 44) as usize;
        if n == 0 || n > MAX_META_EXTENTS {
            return Err(format!("{n} metadata extents (1 to {MAX_META_EXTENTS} allowed)"));
        }
        let mut meta = Vec::with_capacity(n);
        let mut room = 0u64;
        for i in 0..n {
            let at = SB_EXTENTS_AT + 16 * i;
            let e = Extent { start: le64(b, at), count: le64(b, at + 8) };
            match e.end() {
                Some(end) if e.count > 0 && e.start >= SUPERBLOCKS && end <= block_count => room += e.count,
                _ => return Err(format!("metadata extent {} (+{}) lies outside blocks {SUPERBLOCKS}..{block_count}", e.start, e.count)),
            }
            meta.push(e);
        }
        let meta_len = le64(b, 32);
        if meta_len == 0 || meta_len > room.saturating_mul(BS) || meta_len > block_count * BS {
            return Err(format!("metadata length {meta_len} does not fit its {room} blocks"));
        }
        Ok(Some(Superblock { block_count, generation: le64(b, 24), meta_len, meta_crc: le32(b, 40), meta }))
    }
}

/// One file: its length in bytes and the blocks that hold it, in file order. It always
/// holds exactly `blocks_for(size)` blocks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Inode {
    pub size: u64,
    pub extents: Vec<Extent>,
}

impl Inode {
    /// Blocks the inode holds.
    pub fn blocks(&self) -> u64 {
        self.extents.iter().map(|e| e.count).fold(0u64, u64::saturating_add)
    }

    /// The device block holding file block `fb`.
    pub fn phys(&self, mut fb: u64) -> Option<u64> {
        for e in &self.extents {
            if fb < e.count {
                return Some(e.start + fb);
            }
            fb -= e.count;
        }
        None
    }
}

/// The metadata blob: everything but the superblock, written whole to free blocks at each
/// commit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Meta {
    pub generation: u64,
    pub next_ino: u64,
    pub inodes: BTreeMap<u64, Inode>,
    pub dir: BTreeMap<String, u64>,
    pub free: Vec<Extent>,
}

impl Meta {
    /// An upper bound of [`Meta::encode`]'s length with `extra_free` more free extents.
    pub fn encoded_bound(&self, extra_free: usize) -> u64 {
        let inodes: usize = self.inodes.values().map(|i| 20 + 16 * i.extents.len()).sum();
        let dir: usize = self.dir.keys().map(|n| 10 + n.len()).sum();
        (36 + inodes + dir + 16 * (self.free.len() + extra_free)) as u64
    }

    /// Magic, generation, next inode number, then counted lists of inodes
    /// (number, size, extents), directory entries (inode, name) and free extents; all
    /// integers little-endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.encoded_bound(0) as usize);
        b.extend_from_slice(META_MAGIC);
        b.extend_from_slice(&self.generation.to_le_bytes());
        b.extend_from_slice(&self.next_ino.to_le_bytes());
        b.extend_from_slice(&(self.inodes.len() as u32).to_le_bytes());
        for (ino, i) in &self.inodes {
            b.extend_from_slice(&ino.to_le_bytes());
            b.extend_from_slice(&i.size.to_le_bytes());
            put_extents(&mut b, &i.extents);
        }
        b.extend_from_slice(&(self.dir.len() as u32).to_le_bytes());
        for (name, ino) in &self.dir {
            b.extend_from_slice(&ino.to_le_bytes());
            b.extend_from_slice(&(name.len() as u16).to_le_bytes());
            b.extend_from_slice(name.as_bytes());
        }
        put_extents(&mut b, &self.free);
        b
    }

    /// Decodes a blob. Structure only (lengths, names, duplicates); whether the extents
    /// make sense together is `check`'s business.
    pub fn decode(b: &[u8]) -> Result<Meta, String> {
        let mut r = Reader { b, at: 0 };
        if r.take(8)? != META_MAGIC {
            return Err("the metadata block has no AFSMETA1 magic".into());
        }
        let mut m = Meta { generation: r.u64()?, next_ino: r.u64()?, ..Meta::default() };
        for _ in 0..r.u32()? {
            let ino = r.u64()?;
            let size = r.u64()?;
            let extents = r.extents()?;
            if m.inodes.insert(ino, Inode { size, extents }).is_some() {
                return Err(format!("inode {ino} is listed twice"));
            }
        }
        for _ in 0..r.u32()? {
            let ino = r.u64()?;
            let len = r.u16()? as usize;
            let name = std::str::from_utf8(r.take(len)?).map_err(|_| format!("the name of inode {ino} is not UTF-8"))?;
            check_name(name).map_err(|why| format!("directory entry {name:?}: {why}"))?;
            if m.dir.insert(name.to_owned(), ino).is_some() {
                return Err(format!("the name {name:?} is listed twice"));
            }
        }
        m.free = r.extents()?;
        if r.at != b.len() {
            return Err(format!("{} bytes follow the free list", b.len() - r.at));
        }
        Ok(m)
    }
}

/// Whether `name` may name a file: 1 to [`MAX_NAME`] bytes, no `/` (kept for directories
/// later) and no NUL.
pub(crate) fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err("a name has 1 to 255 bytes");
    }
    if name.contains(['/', '\0']) {
        return Err("a name may not contain '/' or NUL");
    }
    Ok(())
}

fn put_extents(b: &mut Vec<u8>, es: &[Extent]) {
    b.extend_from_slice(&(es.len() as u32).to_le_bytes());
    for e in es {
        b.extend_from_slice(&e.start.to_le_bytes());
        b.extend_from_slice(&e.count.to_le_bytes());
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        match self.at.checked_add(n) {
            Some(end) if end <= self.b.len() => {
                let s = &self.b[self.at..end];
                self.at = end;
                Ok(s)
            }
            _ => Err(format!("the metadata ends early: {n} bytes wanted at offset {} of {}", self.at, self.b.len())),
        }
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn extents(&mut self) -> Result<Vec<Extent>, String> {
        let n = self.u32()? as usize;
        // Checked before reading so that a huge count fails at once, not after a long loop.
        if n.saturating_mul(16) > self.b.len() - self.at {
            return Err(format!("{n} extents listed, but only {} bytes remain", self.b.len() - self.at));
        }
        (0..n).map(|_| Ok(Extent { start: self.u64()?, count: self.u64()? })).collect()
    }
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_and_meta_round_trip() {
        let sb = Superblock { block_count: 100, generation: 7, meta_len: 5000, meta_crc: 9, meta: vec![Extent { start: 90, count: 2 }] };
        assert_eq!(Superblock::decode(&sb.encode(), 100).unwrap(), Some(sb.clone()));
        assert!(Superblock::decode(&sb.encode(), 99).unwrap_err().contains("device has 99"));
        let mut bad = sb.encode();
        bad[30] ^= 1;
        assert!(Superblock::decode(&bad, 100).unwrap_err().contains("checksum"));
        assert_eq!(Superblock::decode(&[0; BLOCK_SIZE], 100).unwrap(), None);

        let mut m = Meta { generation: 3, next_ino: 5, ..Meta::default() };
        m.inodes.insert(1, Inode { size: 4097, extents: vec![Extent { start: 2, count: 2 }] });
        m.dir.insert("a".into(), 1);
        m.free.push(Extent { start: 4, count: 10 });
        let b = m.encode();
        assert!(b.len() as u64 <= m.encoded_bound(0));
        assert_eq!(Meta::decode(&b).unwrap(), m);
        for cut in 0..b.len() {
            assert!(Meta::decode(&b[..cut]).is_err());
        }
    }
}
