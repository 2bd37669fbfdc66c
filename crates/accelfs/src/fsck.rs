// SPDX-License-Identifier: Apache-2.0
//! Consistency checks of the committed state, used by [`fsck`] to report and by
//! `Fs::open` to refuse a damaged file system before it writes anything.

use crate::device::BlockDevice;
use crate::layout::{blocks_for, Extent, Meta, Superblock, BLOCK_SIZE, BS, SUPERBLOCKS};
use crate::Error;

/// At most this many problems are listed; a wrecked image would otherwise give one per
/// block.
const MAX_PROBLEMS: usize = 64;

/// What [`fsck`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FsckReport {
    /// Generation of the committed state checked (`None`: no valid superblock).
    pub generation: Option<u64>,
    /// Files found.
    pub files: u64,
    /// Blocks in the file system.
    pub blocks: u64,
    /// Blocks the free list holds.
    pub free_blocks: u64,
    /// Inconsistencies, in plain words. Empty for a clean file system.
    pub problems: Vec<String>,
    /// Harmless findings, such as a superblock slot torn by a crash during a commit (the
    /// other slot holds the committed state, and the next commit rewrites this one).
    pub notes: Vec<String>,
}

impl FsckReport {
    /// Whether no problem was found.
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks the file system on `dev` without changing it: both superblock slots, the
/// metadata checksum, every file's extents (in range, not overlapping each other, the
/// metadata or the free list), that used and free blocks together cover the device exactly
/// once (no leak, no double use), that names point to live inodes and every inode has a
/// name, and that file sizes match their extents. An `Err` only when the device cannot be
/// read.
pub fn fsck(dev: &dyn BlockDevice) -> Result<FsckReport, Error> {
    let mut r = FsckReport::default();
    match load(dev)? {
        Err(why) => r.problems.push(why.into_text()),
        Ok(Loaded { sb, meta, notes }) => {
            r.notes = notes;
            r.generation = Some(sb.generation);
            r.blocks = sb.block_count;
            r.files = meta.inodes.len() as u64;
            r.free_blocks = meta.free.iter().map(|e| e.count).fold(0, u64::saturating_add);
            r.problems = problems(&sb, &meta);
        }
    }
    Ok(r)
}

/// The committed state of a device.
pub(crate) struct Loaded {
    pub sb: Superblock,
    pub meta: Meta,
    pub notes: Vec<String>,
}

/// Why a device holds no usable committed state.
pub(crate) enum Unusable {
    /// Neither superblock slot is valid: not an accelfs (or never formatted).
    NoSuperblock(String),
    /// A valid superblock, but its metadata is damaged.
    Damaged(String),
}

impl Unusable {
    pub fn into_text(self) -> String {
        match self {
            Unusable::NoSuperblock(s) | Unusable::Damaged(s) => s,
        }
    }
}

/// Reads the newest valid superblock and its metadata. The outer `Err` is a device
/// failure; the inner one says why there is no usable state.
pub(crate) fn load(dev: &dyn BlockDevice) -> Result<Result<Loaded, Unusable>, Error> {
    let blocks = dev.len() / BS;
    if blocks < SUPERBLOCKS {
        return Ok(Err(Unusable::NoSuperblock(format!("the device holds {} bytes, less than two superblocks", dev.len()))));
    }
    let mut best: Option<Superblock> = None;
    let mut why = Vec::new();
    let mut notes = Vec::new();
    for slot in 0..SUPERBLOCKS {
        let mut b = vec![0u8; BLOCK_SIZE];
        dev.read_at(&mut b, slot * BS).map_err(|e| Error::io(format!("reading superblock slot {slot} of {}", dev.describe()), e))?;
        match Superblock::decode(&b, blocks) {
            Ok(Some(sb)) => {
                if best.as_ref().is_none_or(|s| sb.generation > s.generation) {
                    best = Some(sb);
                }
            }
            Ok(None) => why.push(format!("slot {slot} is blank")),
            Err(e) => {
                notes.push(format!("superblock slot {slot} is unusable ({e}); the other slot is used"));
                why.push(format!("slot {slot}: {e}"));
            }
        }
    }
    let Some(sb) = best else { return Ok(Err(Unusable::NoSuperblock(format!("no valid superblock ({})", why.join("; "))))) };
    // Bounded: decode checked that meta_len fits the device.
    let mut blob = vec![0u8; (blocks_for(sb.meta_len) * BS) as usize];
    let mut at = 0;
    for e in &sb.meta {
        let n = ((e.count * BS) as usize).min(blob.len() - at);
        dev.read_at(&mut blob[at..at + n], e.start * BS)
            .map_err(|err| Error::io(format!("reading the metadata at block {} of {}", e.start, dev.describe()), err))?;
        at += n;
    }
    blob.truncate(sb.meta_len as usize);
    if crc32c::crc32c(&blob) != sb.meta_crc {
        return Ok(Err(Unusable::Damaged(format!("the metadata of generation {} fails its checksum", sb.generation))));
    }
    let meta = match Meta::decode(&blob) {
        Ok(m) => m,
        Err(e) => return Ok(Err(Unusable::Damaged(format!("the metadata of generation {} is malformed: {e}", sb.generation)))),
    };
    if meta.generation != sb.generation {
        return Ok(Err(Unusable::Damaged(format!("the metadata is of generation {}, its superblock of {}", meta.generation, sb.generation))));
    }
    Ok(Ok(Loaded { sb, meta, notes }))
}

/// Who holds a run of blocks.
#[derive(Clone, Copy)]
enum Owner {
    Superblocks,
    Meta,
    File(u64),
    Free,
}

/// Every inconsistency of a decoded state, in plain words (at most [`MAX_PROBLEMS`]).
pub(crate) fn problems(sb: &Superblock, m: &Meta) -> Vec<String> {
    let mut p = Vec::new();
    let names: std::collections::HashMap<u64, &str> = m.dir.iter().map(|(n, i)| (*i, n.as_str())).collect();
    let who = |o: Owner| match o {
        Owner::Superblocks => "the superblocks".to_string(),
        Owner::Meta => "the metadata".to_string(),
        Owner::File(ino) => match names.get(&ino) {
            Some(n) => format!("file {n:?} (inode {ino})"),
            None => format!("inode {ino}"),
        },
        Owner::Free => "the free list".to_string(),
    };
    let mut runs: Vec<(Extent, Owner)> = vec![(Extent { start: 0, count: SUPERBLOCKS }, Owner::Superblocks)];
    runs.extend(sb.meta.iter().map(|e| (*e, Owner::Meta)));
    for (ino, i) in &m.inodes {
        if *ino == 0 || *ino >= m.next_ino {
            p.push(format!("inode {ino} is outside the numbers handed out (1..{})", m.next_ino));
        }
        let held = i.blocks();
        if held != blocks_for(i.size) {
            p.push(format!("{} is {} bytes long but holds {held} blocks ({} expected)", who(Owner::File(*ino)), i.size, blocks_for(i.size)));
        }
        runs.extend(i.extents.iter().map(|e| (*e, Owner::File(*ino))));
    }
    runs.extend(m.free.iter().map(|e| (*e, Owner::Free)));
    for (name, ino) in &m.dir {
        if !m.inodes.contains_key(ino) {
            p.push(format!("the name {name:?} points to inode {ino}, which does not exist"));
        }
    }
    if names.len() != m.dir.len() {
        p.push("an inode has more than one name".into());
    }
    for ino in m.inodes.keys().filter(|i| !names.contains_key(i)) {
        p.push(format!("inode {ino} has no name (an orphan)"));
    }
    // Sort every run by start and walk them once: a gap is a leak, an overlap double use.
    runs.retain(|(e, o)| match e.end() {
        Some(end) if e.count > 0 && end <= sb.block_count => true,
        _ => {
            p.push(format!("{} names blocks {}+{}, outside the device's {} blocks", who(*o), e.start, e.count, sb.block_count));
            false
        }
    });
    runs.sort_by_key(|(e, _)| e.start);
    let mut covered = 0u64;
    let mut last = Owner::Superblocks;
    for (e, o) in &runs {
        if p.len() >= MAX_PROBLEMS {
            break;
        }
        let end = e.start + e.count;
        if e.start > covered {
            p.push(format!("blocks {covered}..{} are neither used nor free (leaked)", e.start));
        } else if e.start < covered {
            p.push(format!("blocks {}..{} belong to both {} and {}", e.start, end.min(covered), who(last), who(*o)));
        }
        if end > covered {
            covered = end;
            last = *o;
        }
    }
    if covered < sb.block_count && p.len() < MAX_PROBLEMS {
        p.push(format!("blocks {covered}..{} are neither used nor free (leaked)", sb.block_count));
    }
    if p.len() >= MAX_PROBLEMS {
        p.truncate(MAX_PROBLEMS);
        p.push("(more problems not listed)".into());
    }
    p
}
