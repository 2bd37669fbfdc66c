// SPDX-License-Identifier: Apache-2.0
//! open() and fsck on hostile images: random bytes, and a valid image with random bytes
//! changed (checksums left broken, or recomputed so that the damage reaches the deeper
//! checks). Neither may panic, hang or allocate without bound; open succeeds exactly when
//! fsck finds nothing wrong (see `insitu_accelfs::fuzzing::exercise`).

use insitu_accelfs::{fsck, fuzzing, Error, Fs, MemDevice, BLOCK_SIZE};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn random_images(image in proptest::collection::vec(any::<u8>(), 0..40_000), reseal in any::<bool>()) {
        let mut input = vec![if reseal { 2 } else { 0 }];
        input.extend(image);
        fuzzing::run(&input);
    }

    #[test]
    fn patched_valid_images(patches in proptest::collection::vec((any::<u16>(), any::<u8>()), 1..12), reseal in any::<bool>(), meta_only in any::<bool>()) {
        let mut input = vec![if reseal { 3 } else { 1 }];
        for (at, v) in patches {
            // Half the cases aim at the superblocks and the metadata at the device's end.
            let at = if meta_only && at >= 2 * BLOCK_SIZE as u16 { u16::MAX - at % (3 * BLOCK_SIZE as u16) } else { at };
            input.extend(at.to_le_bytes());
            input.push(v);
        }
        fuzzing::run(&input);
    }
}

#[test]
fn the_sample_image_is_clean_and_damage_is_named() {
    let image = fuzzing::sample_image().to_vec();
    let report = fsck(&MemDevice::from_image(image.clone())).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(report.files, 2);
    fuzzing::exercise(image.clone());

    // Both superblocks broken: not an accelfs.
    let mut bad = image.clone();
    bad[20] ^= 1;
    bad[BLOCK_SIZE + 20] ^= 1;
    assert!(matches!(Fs::open(MemDevice::from_image(bad), 0), Err(Error::NotFormatted { .. })));

    // One superblock broken: the other one serves, and fsck notes it.
    let mut one = image.clone();
    one[20] ^= 1;
    let r = fsck(&MemDevice::from_image(one.clone())).unwrap();
    assert!(r.is_clean() && !r.notes.is_empty(), "{r:?}");
    assert!(Fs::open(MemDevice::from_image(one), 0).is_ok());

    // A file's extent moved onto another's, checksums fixed: refused, and fsck says why.
    let dev = MemDevice::from_image(image.clone());
    let fs = Fs::open(dev.clone(), 0).unwrap();
    let names: Vec<String> = fs.list().into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["a", "b"]);
    drop(fs);
    let sb_slot = (0..2).max_by_key(|s| u64::from_le_bytes(image[s * BLOCK_SIZE + 24..s * BLOCK_SIZE + 32].try_into().unwrap())).unwrap();
    let sb = &image[sb_slot * BLOCK_SIZE..];
    let meta_at = u64::from_le_bytes(sb[48..56].try_into().unwrap()) as usize * BLOCK_SIZE;
    let mut damaged = image.clone();
    // Inode records start at byte 28 of the blob: number, size, extent count, then the
    // first extent's start. Point inode 1's first extent at block 0 (the superblocks).
    damaged[meta_at + 28 + 20..meta_at + 28 + 28].copy_from_slice(&0u64.to_le_bytes());
    fuzzing::reseal(&mut damaged);
    let r = fsck(&MemDevice::from_image(damaged.clone())).unwrap();
    assert!(r.problems.iter().any(|p| p.contains("belong to both the superblocks")), "{:?}", r.problems);
    assert!(r.problems.iter().any(|p| p.contains("leaked")), "{:?}", r.problems);
    let e = Fs::open(MemDevice::from_image(damaged), 0).unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }) && e.to_string().contains("run fsck"), "{e}");
}
