// SPDX-License-Identifier: Apache-2.0
//! The store's journal: a superblock and two halves of checksummed frames.
//!
//! Superblock (the region's first page): magic `KVST`, version (u32), page bytes (u32),
//! journal pages (u32), active half (u32), epoch (u64), CRC32C of the 28 bytes before it.
//! A frame: payload length (u32), CRC32C of epoch and payload (u32), epoch (u64), payload
//! (records). Replay reads the active half's frames until one is empty, torn, or of
//! another epoch, so a write cut short loses only itself. A checkpoint is written into the
//! other half under the next epoch, then the superblock switches to it: either the old
//! state or the new one is found after a crash, never a mixture.

use crate::KvError;
use insitu_media::Backing;
use std::sync::Arc;

const MAGIC: &[u8; 4] = b"KVST";
const VERSION: u32 = 1;
const FRAME_HEADER: usize = 16;

/// One change to the store's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record {
    Create {
        seq: u64,
        layers: u16,
        kv_heads: u16,
        head_dim: u16,
        dtype: u8,
        dims_per_page: u8,
    },
    Fork {
        parent: u64,
        child: u64,
    },
    Free {
        seq: u64,
    },
    /// The sequence just created or forked is not kept: the store drops it when it opens.
    Owned {
        seq: u64,
    },
    /// Pages `first..` of a head's list: kind 0 = K, 1 = V, 2 + g = dimension group g of K.
    Pages {
        seq: u64,
        layer: u16,
        head: u16,
        kind: u8,
        first: u32,
        pages: Vec<u32>,
    },
}

impl Record {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Record::Create { seq, layers, kv_heads, head_dim, dtype, dims_per_page } => {
                out.push(1);
                out.extend_from_slice(&seq.to_le_bytes());
                out.extend_from_slice(&layers.to_le_bytes());
                out.extend_from_slice(&kv_heads.to_le_bytes());
                out.extend_from_slice(&head_dim.to_le_bytes());
                out.extend_from_slice(&[*dtype, *dims_per_page]);
            }
            Record::Fork { parent, child } => {
                out.push(2);
                out.extend_from_slice(&parent.to_le_bytes());
                out.extend_from_slice(&child.to_le_bytes());
            }
            Record::Free { seq } => {
                out.push(3);
                out.extend_from_slice(&seq.to_le_bytes());
            }
            Record::Owned { seq } => {
                out.push(5);
                out.extend_from_slice(&seq.to_le_bytes());
            }
            Record::Pages { seq, layer, head, kind, first, pages } => {
                out.push(4);
                out.extend_from_slice(&seq.to_le_bytes());
                out.extend_from_slice(&layer.to_le_bytes());
                out.extend_from_slice(&head.to_le_bytes());
                out.push(*kind);
                out.extend_from_slice(&first.to_le_bytes());
                out.extend_from_slice(&(pages.len() as u32).to_le_bytes());
                pages.iter().for_each(|p| out.extend_from_slice(&p.to_le_bytes()));
            }
        }
    }

    /// Decodes the records of a frame's payload (a frame that passed its checksum).
    fn decode_all(mut b: &[u8]) -> Option<Vec<Record>> {
        fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
            let (h, t) = (b.get(..n)?, b.get(n..)?);
            *b = t;
            Some(h)
        }
        let u16_ = |b: &mut &[u8]| take(b, 2).map(|x| u16::from_le_bytes([x[0], x[1]]));
        let u32_ = |b: &mut &[u8]| take(b, 4).map(|x| u32::from_le_bytes(x.try_into().expect("4")));
        let u64_ = |b: &mut &[u8]| take(b, 8).map(|x| u64::from_le_bytes(x.try_into().expect("8")));
        let mut out = Vec::new();
        while !b.is_empty() {
            let tag = take(&mut b, 1)?[0];
            out.push(match tag {
                1 => {
                    let (seq, layers, kv_heads, head_dim) = (u64_(&mut b)?, u16_(&mut b)?, u16_(&mut b)?, u16_(&mut b)?);
                    let x = take(&mut b, 2)?;
                    Record::Create { seq, layers, kv_heads, head_dim, dtype: x[0], dims_per_page: x[1] }
                }
                2 => Record::Fork { parent: u64_(&mut b)?, child: u64_(&mut b)? },
                3 => Record::Free { seq: u64_(&mut b)? },
                4 => {
                    let (seq, layer, head) = (u64_(&mut b)?, u16_(&mut b)?, u16_(&mut b)?);
                    let kind = take(&mut b, 1)?[0];
                    let (first, n) = (u32_(&mut b)?, u32_(&mut b)? as usize);
                    let pages = take(&mut b, n.checked_mul(4)?)?.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4"))).collect();
                    Record::Pages { seq, layer, head, kind, first, pages }
                }
                5 => Record::Owned { seq: u64_(&mut b)? },
                _ => return None,
            });
        }
        Some(out)
    }
}

/// The superblock and the active half of the journal.
pub(crate) struct Journal {
    media: Arc<Backing>,
    base: u64,
    page_bytes: usize,
    pages: usize,
    active: u32,
    epoch: u64,
    /// Write position in the active half.
    pos: usize,
}

impl Journal {
    /// Opens the journal of the region at `base`, formatting it when the region holds none.
    pub(crate) fn open(media: Arc<Backing>, base: u64, page_bytes: usize, pages: usize) -> Result<Journal, KvError> {
        let mut sb = vec![0u8; 36];
        media.read_at(&mut sb, base)?;
        let mut j = Journal { media, base, page_bytes, pages, active: 0, epoch: 1, pos: 0 };
        if &sb[..4] != MAGIC || crc32c::crc32c(&sb[..28]) != u32::from_le_bytes(sb[28..32].try_into().expect("4")) {
            for half in 0..2 {
                j.media.write_at(&[0u8; FRAME_HEADER], j.half_base(half))?;
            }
            j.write_superblock()?;
            return Ok(j);
        }
        let field = |o: usize| u32::from_le_bytes(sb[o..o + 4].try_into().expect("4"));
        if field(4) != VERSION || field(8) as usize != page_bytes || field(12) as usize != pages {
            return Err(KvError::BadRequest(format!(
                "the private namespace holds a KV store of version {}, {}-byte pages and {} journal pages; this target expects version {VERSION}, {page_bytes} and {pages}",
                field(4),
                field(8),
                field(12)
            )));
        }
        j.active = field(16) & 1;
        j.epoch = u64::from_le_bytes(sb[20..28].try_into().expect("8"));
        Ok(j)
    }

    fn half_bytes(&self) -> usize {
        self.pages / 2 * self.page_bytes
    }

    fn half_base(&self, half: u32) -> u64 {
        self.base + (1 + u64::from(half) * (self.pages / 2) as u64) * self.page_bytes as u64
    }

    fn write_superblock(&self) -> Result<(), KvError> {
        let mut sb = Vec::with_capacity(32);
        sb.extend_from_slice(MAGIC);
        for v in [VERSION, self.page_bytes as u32, self.pages as u32, self.active] {
            sb.extend_from_slice(&v.to_le_bytes());
        }
        sb.extend_from_slice(&self.epoch.to_le_bytes());
        let crc = crc32c::crc32c(&sb);
        sb.extend_from_slice(&crc.to_le_bytes());
        self.media.write_at(&sb, self.base)?;
        self.media.flush()?;
        Ok(())
    }

    /// Every record of the active half, in order; sets the write position after them.
    pub(crate) fn replay(&mut self) -> Result<Vec<Record>, KvError> {
        let mut half = vec![0u8; self.half_bytes()];
        self.media.read_at(&mut half, self.half_base(self.active))?;
        let mut out = Vec::new();
        let mut pos = 0;
        while pos + FRAME_HEADER <= half.len() {
            let len = u32::from_le_bytes(half[pos..pos + 4].try_into().expect("4")) as usize;
            let crc = u32::from_le_bytes(half[pos + 4..pos + 8].try_into().expect("4"));
            let epoch = u64::from_le_bytes(half[pos + 8..pos + 16].try_into().expect("8"));
            let end = pos + FRAME_HEADER + len;
            if len == 0 || end > half.len() || epoch != self.epoch || crc32c::crc32c(&half[pos + 8..end]) != crc {
                break;
            }
            match Record::decode_all(&half[pos + FRAME_HEADER..end]) {
                Some(r) => out.extend(r),
                None => break,
            }
            pos = end;
        }
        self.pos = pos;
        Ok(out)
    }

    fn frame(&self, records: &[Record]) -> Vec<u8> {
        let mut payload = Vec::new();
        records.iter().for_each(|r| r.encode(&mut payload));
        let mut f = Vec::with_capacity(FRAME_HEADER + payload.len() + FRAME_HEADER);
        f.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        let mut covered = self.epoch.to_le_bytes().to_vec();
        covered.extend_from_slice(&payload);
        f.extend_from_slice(&crc32c::crc32c(&covered).to_le_bytes());
        f.extend_from_slice(&covered);
        f
    }

    /// Appends `records` as one frame and makes it durable; `false` when the active half
    /// has no room (nothing written).
    pub(crate) fn append(&mut self, records: &[Record]) -> Result<bool, KvError> {
        let f = self.frame(records);
        if self.pos + f.len() + FRAME_HEADER > self.half_bytes() {
            return Ok(false);
        }
        // A zeroed header after the frame ends replay there, whatever the half held before.
        let mut w = f;
        w.extend_from_slice(&[0u8; FRAME_HEADER]);
        self.media.write_at(&w, self.half_base(self.active) + self.pos as u64)?;
        self.media.flush()?;
        self.pos += w.len() - FRAME_HEADER;
        Ok(true)
    }

    /// Writes `records` (the whole state) into the other half under the next epoch, then
    /// switches the superblock to it.
    pub(crate) fn rewrite(&mut self, records: &[Record]) -> Result<(), KvError> {
        let next = Journal { active: self.active ^ 1, epoch: self.epoch + 1, pos: 0, media: self.media.clone(), ..*self };
        let mut w = next.frame(records);
        if w.len() + FRAME_HEADER > self.half_bytes() {
            return Err(KvError::Full { needed: (w.len() / self.page_bytes + 1) as u64, free: (self.half_bytes() / self.page_bytes) as u64 });
        }
        let len = w.len();
        w.extend_from_slice(&[0u8; FRAME_HEADER]);
        self.media.write_at(&w, next.half_base(next.active))?;
        self.media.flush()?;
        next.write_superblock()?;
        (self.active, self.epoch, self.pos) = (next.active, next.epoch, len);
        Ok(())
    }
}
