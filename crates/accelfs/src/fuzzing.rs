// SPDX-License-Identifier: Apache-2.0
//! The hostile-image harness shared by the libFuzzer target (`fuzz/fuzz_targets/accelfs.rs`)
//! and the crate's property tests. Not for use outside tests.
//!
//! Random bytes almost never pass the superblock and metadata checksums, so a fuzzer would
//! only ever test those. [`run`] can therefore also patch a valid image and [`reseal`] it
//! (recompute both checksums), so that damaged but checksum-valid metadata reaches every
//! later check.

use crate::device::MemDevice;
use crate::layout::{BLOCK_SIZE, MAX_META_EXTENTS};
use crate::{fsck, Fs};
use std::sync::OnceLock;

/// Images longer than this are cut: big enough for any layout, small enough to be fast.
const MAX_IMAGE: usize = 256 << 10;

/// Runs one input: byte 0 picks how the image is made (bit 0 clear: the rest of the input
/// is the image; set: the rest is `(offset lo, offset hi, value)` patches applied to
/// [`sample_image`]) and whether it is [`reseal`]ed (bit 1). Then [`exercise`].
pub fn run(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let mut image = if mode & 1 == 0 {
        rest[..rest.len().min(MAX_IMAGE)].to_vec()
    } else {
        let mut image = sample_image().to_vec();
        for p in rest.chunks_exact(3) {
            let at = u16::from_le_bytes([p[0], p[1]]) as usize % image.len();
            image[at] = p[2];
        }
        image
    };
    if mode & 2 != 0 {
        reseal(&mut image);
    }
    exercise(image);
}

/// Checks the parsers' contract on `image`: [`fsck`] and [`Fs::open`] return (never panic
/// or hang); open succeeds exactly when fsck finds the image clean; and on an image that
/// opens, reads of every file, writes, a sync and a reopen work and leave fsck clean.
pub fn exercise(image: Vec<u8>) {
    let dev = MemDevice::from_image(image);
    let report = fsck(&dev).expect("a memory device does not fail reads");
    let fs = match Fs::open(dev.clone(), 0) {
        Ok(fs) => fs,
        Err(e) => {
            assert!(!report.is_clean(), "fsck passed an image that open refused ({e})");
            return;
        }
    };
    assert!(report.is_clean(), "open accepted an image fsck rejects: {:?}", report.problems);
    let mut total = 0u64;
    for e in fs.list() {
        let f = fs.open_file(&e.name).expect("listed");
        let mut b = vec![0u8; e.size as usize];
        f.read_exact_at(&mut b, 0).expect("a listed file reads whole");
        total += e.size;
    }
    assert!(total <= fs.capacity());
    // Changes may run out of room; what they must not do is break the file system.
    let changed = (|| {
        let f = match fs.open_file("fuzz") {
            Ok(f) => f,
            Err(_) => fs.create("fuzz")?,
        };
        f.write_at(&[0xAB; 5000], 3000)?;
        f.set_len(4100)?;
        if let Some(e) = fs.list().first() {
            fs.remove(&e.name)?;
        }
        fs.sync()
    })();
    if changed.is_ok() {
        let listed = fs.list();
        drop(fs);
        let report = fsck(&dev).expect("a memory device does not fail reads");
        assert!(report.is_clean(), "a sync left problems: {:?}", report.problems);
        assert_eq!(Fs::open(dev, 0).expect("a synced image reopens").list(), listed);
    }
}

/// A small valid image (16 blocks): files "a" (5000 bytes) and "b" (100 bytes), a removed
/// file's blocks free again, both superblock slots written.
pub fn sample_image() -> &'static [u8] {
    static IMAGE: OnceLock<Vec<u8>> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let dev = MemDevice::new(16 * BLOCK_SIZE as u64);
        let fs = Fs::format(dev.clone(), 0).expect("format");
        let c = fs.create("c").expect("create");
        c.write_at(&[3; 9000], 0).expect("write");
        fs.create("a").expect("create").write_at(&[1; 5000], 0).expect("write");
        fs.sync().expect("sync");
        fs.remove("c").expect("remove");
        fs.create("b").expect("create").write_at(&[2; 100], 0).expect("write");
        fs.sync().expect("sync");
        drop(c);
        drop(fs);
        dev.image()
    })
}

/// Recomputes the metadata checksum and the superblock checksum of each slot that carries
/// the superblock magic, whatever else it holds. Never panics, whatever `image` is.
pub fn reseal(image: &mut [u8]) {
    for slot in 0..2 {
        let at = slot * BLOCK_SIZE;
        if image.len() < at + BLOCK_SIZE || &image[at..at + 8] != b"INSITUAF" {
            continue;
        }
        let sb = &image[at..at + BLOCK_SIZE];
        let n = (u32::from_le_bytes(sb[44..48].try_into().expect("4 bytes")) as usize).min(MAX_META_EXTENTS);
        let meta_len = u64::from_le_bytes(sb[32..40].try_into().expect("8 bytes")).min(image.len() as u64) as usize;
        let mut blob = Vec::new();
        for i in 0..n {
            let e = 48 + 16 * i;
            let start = u64::from_le_bytes(sb[e..e + 8].try_into().expect("8 bytes"));
            let count = u64::from_le_bytes(sb[e + 8..e + 16].try_into().expect("8 bytes"));
            let mut b = start;
            // Bounded by meta_len, however large count is.
            while b < start.saturating_add(count) && blob.len() < meta_len {
                let Some(off) = b.checked_mul(BLOCK_SIZE as u64).filter(|o| o + BLOCK_SIZE as u64 <= image.len() as u64) else { break };
                blob.extend_from_slice(&image[off as usize..off as usize + BLOCK_SIZE]);
                b += 1;
            }
        }
        blob.truncate(meta_len);
        let crc = crc32c::crc32c(&blob);
        image[at + 40..at + 44].copy_from_slice(&crc.to_le_bytes());
        let crc = crc32c::crc32c(&image[at..at + BLOCK_SIZE - 4]);
        image[at + BLOCK_SIZE - 4..at + BLOCK_SIZE].copy_from_slice(&crc.to_le_bytes());
    }
}
