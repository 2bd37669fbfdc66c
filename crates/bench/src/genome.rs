// SPDX-License-Identifier: Apache-2.0
//! A genome-style job, as HAYAGUI's case study runs it end to end beside the data: read a
//! reference sequence in 64 KiB batches and index its k-mers, file the index and read it
//! back, then stream a large target sequence (short reads, one per line) in 64 KiB batches
//! and match every read against the reference through the index.
//!
//! The job is one function over [`Files`], so the same code runs on each storage stack of
//! [`crate::kv`]; what it found (reads, matched reads, mismatches) must be equal on all of
//! them. The data is generated here, deterministically: a random reference, and reads
//! sampled from it with about 1% substitutions, plus reads that match nothing.

use crate::dataset::Rng;
use crate::Error;
use serde::Serialize;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::time::Instant;

/// Hashes a k-mer (already uniform-ish bits) with one multiply, for the lookup table.
#[derive(Default)]
struct KmerHasher(u64);

impl Hasher for KmerHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, k: u64) {
        self.0 = (k ^ (k >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// k-mer to its first position in the reference.
type Index = HashMap<u64, u32, BuildHasherDefault<KmerHasher>>;

/// Bytes per read call, as the paper's application loads its inputs.
const BATCH: usize = 64 << 10;
/// k-mer length: 2 bits per base, packed in a u64.
const K: usize = 24;
/// Bases per read of the target sequence.
const READ_LEN: usize = 100;
/// Seeds looked up per read, at these offsets.
const SEEDS: [usize; 3] = [0, 38, 76];
/// Most substitutions for a read to count as matched.
const MAX_MISMATCH: u32 = 5;
/// Bytes per index entry: k-mer and reference position.
const ENTRY: usize = 12;

/// Where the job's files live: a storage stack.
pub(crate) trait Files {
    /// Creates (or replaces) `name` holding `data`, durable when this returns.
    fn put(&mut self, name: &str, data: &[u8]) -> Result<(), Error>;
    /// Reads up to `buf.len()` bytes of `name` at `offset`; 0 at the end.
    fn read_at(&mut self, name: &str, buf: &mut [u8], offset: u64) -> Result<usize, Error>;
    /// Forgets any cached view of the files, so the job starts cold.
    fn cold(&mut self) -> Result<(), Error>;
}

/// The job's inputs, generated once and written to every stack.
pub(crate) struct GenomeData {
    pub(crate) reference: Vec<u8>,
    pub(crate) target: Vec<u8>,
}

fn base(x: u64) -> u8 {
    b"ACGT"[(x & 3) as usize]
}

fn code(b: u8) -> Option<u64> {
    match b {
        b'A' => Some(0),
        b'C' => Some(1),
        b'G' => Some(2),
        b'T' => Some(3),
        _ => None,
    }
}

impl GenomeData {
    /// A reference of `reference_bases` bases (FASTA: a header, 80 bases per line) and a
    /// target of about `target_bytes` bytes of reads.
    pub(crate) fn generate(reference_bases: usize, target_bytes: usize, seed: u64) -> GenomeData {
        let mut rng = Rng::new(seed);
        let bases: Vec<u8> = (0..reference_bases).map(|_| base(rng.next_u64())).collect();
        let mut reference = b">insitu synthetic reference\n".to_vec();
        for line in bases.chunks(80) {
            reference.extend_from_slice(line);
            reference.push(b'\n');
        }
        let mut target = Vec::with_capacity(target_bytes + READ_LEN + 1);
        while target.len() < target_bytes {
            if rng.below(10) == 0 || bases.len() <= READ_LEN {
                target.extend((0..READ_LEN).map(|_| base(rng.next_u64())));
            } else {
                let at = rng.below((bases.len() - READ_LEN) as u64) as usize;
                target.extend(bases[at..at + READ_LEN].iter().map(|b| if rng.below(100) == 0 { base(rng.next_u64()) } else { *b }));
            }
            target.push(b'\n');
        }
        GenomeData { reference, target }
    }
}

/// Reads all of `name` in `BATCH` calls, handing each batch to `f`; returns the bytes.
fn stream(files: &mut dyn Files, name: &str, mut f: impl FnMut(&[u8])) -> Result<u64, Error> {
    let mut buf = vec![0u8; BATCH];
    let mut at = 0u64;
    loop {
        let n = files.read_at(name, &mut buf, at)?;
        if n == 0 {
            return Ok(at);
        }
        f(&buf[..n]);
        at += n as u64;
    }
}

/// What the job found; equal on every stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Found {
    reads: u64,
    matched: u64,
    mismatches: u64,
}

/// Seconds of each step of the genome job.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GenomeSteps {
    /// Reading the reference sequence.
    pub load_reference: f64,
    /// Indexing its k-mers.
    pub index: f64,
    /// Filing the index.
    pub save_index: f64,
    /// Reading the index back.
    pub load_index: f64,
    /// Streaming the target sequence and matching every read.
    pub match_target: f64,
}

/// The genome job's run on one stack, in [`KvReport::genome`](crate::KvReport::genome).
#[derive(Debug, Clone, Serialize)]
pub struct GenomeRun {
    /// The stack.
    pub system: String,
    /// Seconds of the whole job.
    pub seconds: f64,
    /// Reads in the target sequence.
    pub reads: u64,
    /// Reads matched against the reference.
    pub matched: u64,
    /// Substitutions over all matched reads.
    pub mismatches: u64,
    /// Reads per second of the whole job.
    pub reads_per_s: f64,
    /// Size of the reference file, bytes.
    pub reference_bytes: usize,
    /// Size of the target file, bytes.
    pub target_bytes: usize,
    /// Seconds of each step.
    pub steps_seconds: GenomeSteps,
}

/// Runs the job over `files` (holding `reference.fa` and `target.seq`); returns what it
/// found, its steps' seconds and the whole job's seconds.
pub(crate) fn run(files: &mut dyn Files) -> Result<(Found, GenomeSteps, f64), Error> {
    let mut steps = GenomeSteps::default();
    let started = Instant::now();
    // 1. The reference's bases, without its header and newlines.
    let mut bases = Vec::new();
    let mut in_header = false;
    let mut line_start = true;
    stream(files, "reference.fa", |batch| {
        for &b in batch {
            if line_start && b == b'>' {
                in_header = true;
            }
            line_start = b == b'\n';
            if b == b'\n' {
                in_header = false;
            } else if !in_header {
                bases.push(b);
            }
        }
    })?;
    steps.load_reference = started.elapsed().as_secs_f64();
    // 2. Index: every k-mer's first position, sorted by k-mer.
    let t = Instant::now();
    let mut entries: Vec<(u64, u32)> = Vec::with_capacity(bases.len());
    let mask = (1u64 << (2 * K)) - 1;
    let (mut kmer, mut valid) = (0u64, 0usize);
    for (i, &b) in bases.iter().enumerate() {
        match code(b) {
            Some(c) => {
                kmer = ((kmer << 2) | c) & mask;
                valid += 1;
            }
            None => valid = 0,
        }
        if valid >= K {
            entries.push((kmer, (i + 1 - K) as u32));
        }
    }
    entries.sort_unstable();
    entries.dedup_by_key(|e| e.0);
    steps.index = t.elapsed().as_secs_f64();
    // 3. File the index, then read it back as the matching step would after a restart.
    let t = Instant::now();
    let mut blob = Vec::with_capacity(entries.len() * ENTRY);
    for (k, p) in &entries {
        blob.extend_from_slice(&k.to_le_bytes());
        blob.extend_from_slice(&p.to_le_bytes());
    }
    files.put("reference.idx", &blob)?;
    drop(blob);
    steps.save_index = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut loaded = Vec::with_capacity(entries.len() * ENTRY);
    stream(files, "reference.idx", |b| loaded.extend_from_slice(b))?;
    if loaded.len() != entries.len() * ENTRY {
        return Err(format!("the index read back has {} bytes, {} were filed", loaded.len(), entries.len() * ENTRY).into());
    }
    let read_back = loaded.chunks_exact(ENTRY).map(|c| (u64::from_le_bytes(c[..8].try_into().expect("8")), u32::from_le_bytes(c[8..].try_into().expect("4"))));
    if !read_back.clone().eq(entries.iter().copied()) {
        return Err("the index read back differs from the one filed: the stack corrupts data".into());
    }
    let mut index = Index::with_capacity_and_hasher(entries.len(), BuildHasherDefault::default());
    index.extend(read_back);
    drop((entries, loaded));
    steps.load_index = t.elapsed().as_secs_f64();
    // 4. Match every read of the target.
    let t = Instant::now();
    let mut found = Found::default();
    let mut partial = Vec::new();
    let mut on_read = |read: &[u8]| {
        if read.is_empty() {
            return;
        }
        found.reads += 1;
        if let Some(mm) = best_match(read, &bases, &index) {
            found.matched += 1;
            found.mismatches += u64::from(mm);
        }
    };
    stream(files, "target.seq", |batch| {
        let mut rest = batch;
        while let Some(nl) = rest.iter().position(|b| *b == b'\n') {
            if partial.is_empty() {
                on_read(&rest[..nl]);
            } else {
                partial.extend_from_slice(&rest[..nl]);
                on_read(&partial);
                partial.clear();
            }
            rest = &rest[nl + 1..];
        }
        partial.extend_from_slice(rest);
    })?;
    on_read(&partial);
    steps.match_target = t.elapsed().as_secs_f64();
    Ok((found, steps, started.elapsed().as_secs_f64()))
}

/// Substitutions of `read` against the reference at the position its first seed with a
/// hit points to, if at most `MAX_MISMATCH` (later seeds are tried only when an earlier
/// one finds nothing close, as seed-and-extend aligners do).
fn best_match(read: &[u8], bases: &[u8], index: &Index) -> Option<u32> {
    for off in SEEDS {
        let Some(seed) = read.get(off..off + K) else { continue };
        let Some(kmer) = seed.iter().try_fold(0u64, |k, b| code(*b).map(|c| (k << 2) | c)) else { continue };
        let Some(&pos) = index.get(&kmer) else { continue };
        let Some(start) = (pos as usize).checked_sub(off) else { continue };
        let Some(window) = bases.get(start..start + read.len()) else { continue };
        let mm = window.iter().zip(read).filter(|(a, b)| a != b).count() as u32;
        if mm <= MAX_MISMATCH {
            return Some(mm);
        }
    }
    None
}

/// The job's report for one stack.
pub(crate) fn report(system: &str, found: &Found, steps: &GenomeSteps, secs: f64, data: &GenomeData) -> GenomeRun {
    GenomeRun {
        system: system.to_string(),
        seconds: secs,
        reads: found.reads,
        matched: found.matched,
        mismatches: found.mismatches,
        reads_per_s: found.reads as f64 / secs.max(1e-9),
        reference_bytes: data.reference.len(),
        target_bytes: data.target.len(),
        steps_seconds: steps.clone(),
    }
}

/// Puts the inputs on a stack.
pub(crate) fn stage(files: &mut dyn Files, data: &GenomeData) -> Result<(), Error> {
    files.put("reference.fa", &data.reference)?;
    files.put("target.seq", &data.target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[derive(Default)]
    struct Mem(HashMap<String, Vec<u8>>);

    impl Files for Mem {
        fn put(&mut self, name: &str, data: &[u8]) -> Result<(), Error> {
            self.0.insert(name.into(), data.to_vec());
            Ok(())
        }
        fn read_at(&mut self, name: &str, buf: &mut [u8], offset: u64) -> Result<usize, Error> {
            let f = self.0.get(name).ok_or("no such file")?;
            let at = (offset as usize).min(f.len());
            let n = buf.len().min(f.len() - at);
            buf[..n].copy_from_slice(&f[at..at + n]);
            Ok(n)
        }
        fn cold(&mut self) -> Result<(), Error> {
            Ok(())
        }
    }

    #[test]
    fn sampled_reads_match_and_random_ones_do_not() {
        let data = GenomeData::generate(200_000, 1 << 20, 7);
        let mut m = Mem::default();
        stage(&mut m, &data).unwrap();
        let (found, _, _) = run(&mut m).unwrap();
        let reads = data.target.iter().filter(|b| **b == b'\n').count() as u64;
        assert_eq!(found.reads, reads);
        // 90% of reads are sampled with 1% substitutions: nearly all of them match; the 10%
        // random ones (almost) never do.
        let share = found.matched as f64 / reads as f64;
        assert!((0.85..0.91).contains(&share), "{found:?}");
        assert!(found.mismatches > 0 && found.mismatches < found.matched * 3, "{found:?}");
    }

    /// Hands out at most 7 bytes per read, so that reads and the header straddle calls.
    struct Trickle(Mem);

    impl Files for Trickle {
        fn put(&mut self, name: &str, data: &[u8]) -> Result<(), Error> {
            self.0.put(name, data)
        }
        fn read_at(&mut self, name: &str, buf: &mut [u8], offset: u64) -> Result<usize, Error> {
            let n = buf.len().min(7);
            self.0.read_at(name, &mut buf[..n], offset)
        }
        fn cold(&mut self) -> Result<(), Error> {
            Ok(())
        }
    }

    #[test]
    fn reads_cut_by_batch_edges_are_matched_whole() {
        let data = GenomeData::generate(50_000, 200_000, 9);
        let mut whole = Mem::default();
        stage(&mut whole, &data).unwrap();
        let mut cut = Trickle(Mem::default());
        stage(&mut cut, &data).unwrap();
        let (a, b) = (run(&mut whole).unwrap().0, run(&mut cut).unwrap().0);
        assert_eq!(a, b);
        assert!(a.matched > 0);
    }
}
