// SPDX-License-Identifier: Apache-2.0
//! The file system's operations against a model, on memory and on a real file.

use insitu_accelfs::{fsck, BlockDevice, Error, FileDevice, Fs, MemDevice, BLOCK_SIZE};
use std::collections::BTreeMap;

fn read_all(fs: &Fs, name: &str) -> Vec<u8> {
    let f = fs.open_file(name).unwrap();
    let mut b = vec![0u8; f.len().unwrap() as usize];
    f.read_exact_at(&mut b, 0).unwrap();
    b
}

fn check_model(fs: &Fs, model: &BTreeMap<String, Vec<u8>>) {
    let names: Vec<String> = fs.list().into_iter().map(|e| e.name).collect();
    assert_eq!(names, model.keys().cloned().collect::<Vec<_>>());
    for (name, data) in model {
        assert!(read_all(fs, name) == *data, "contents of {name} differ");
    }
}

#[test]
fn names_errors_and_reopen() {
    let dev = MemDevice::new(1 << 20);
    let fs = Fs::format(dev.clone(), 1 << 16).unwrap();
    let a = fs.create("a").unwrap();
    assert!(matches!(fs.create("a"), Err(Error::Exists(_))));
    assert!(matches!(fs.create(""), Err(Error::InvalidName { .. })));
    assert!(matches!(fs.create("x/y"), Err(Error::InvalidName { .. })));
    assert!(matches!(fs.create(&"n".repeat(256)), Err(Error::InvalidName { .. })));
    assert!(matches!(fs.open_file("b"), Err(Error::NotFound(_))));
    a.write_at(b"abc", 5).unwrap();
    let mut b = [9u8; 8];
    assert_eq!(a.read_at(&mut b, 0).unwrap(), 8);
    assert_eq!(&b, b"\0\0\0\0\0abc");
    assert_eq!(a.read_at(&mut b, 6).unwrap(), 2);
    assert!(matches!(a.read_exact_at(&mut b, 1), Err(Error::OutOfRange { .. })));
    a.set_len(2).unwrap();
    a.set_len(6000).unwrap();
    let data = read_all(&fs, "a");
    assert_eq!(data.len(), 6000);
    assert!(data.iter().all(|x| *x == 0), "bytes past a shrink read as zeros after growing again");
    fs.remove("a").unwrap();
    assert!(matches!(a.len(), Err(Error::Removed(_))));
    fs.create("b").unwrap().write_at(&[7; 10_000], 0).unwrap();
    let g = fs.generation();
    fs.sync().unwrap();
    assert_eq!(fs.generation(), g + 1);
    fs.sync().unwrap();
    assert_eq!(fs.generation(), g + 1, "a sync with nothing new commits no metadata");
    drop((a, fs));
    let fs = Fs::open(dev.clone(), 1 << 16).unwrap();
    assert_eq!(read_all(&fs, "b"), vec![7; 10_000]);
    assert!(fs.fsck().unwrap().is_clean());
    // Not an accelfs, and too small for one.
    assert!(matches!(Fs::open(MemDevice::new(1 << 20), 0), Err(Error::NotFormatted { .. })));
    assert!(matches!(Fs::format(MemDevice::new(4096 * 7), 0), Err(Error::DeviceTooSmall { .. })));
    let e = Fs::open(MemDevice::new(1 << 20), 0).unwrap_err().to_string();
    assert!(e.contains("format it with Fs::format"), "{e}");
    // open_or_format formats a blank device only.
    let fresh = MemDevice::new(1 << 20);
    Fs::open_or_format(fresh.clone(), 0).unwrap().create("z").unwrap();
    assert_eq!(Fs::open_or_format(fresh, 0).unwrap().list().len(), 1);
    assert!(Fs::open_or_format(MemDevice::from_image(vec![1; 1 << 20]), 0).is_err());
}

#[test]
fn random_operations_match_a_model() {
    let dev = MemDevice::new(4 << 20);
    // A small cache (16 blocks) so that eviction and write-back run all the time.
    let mut fs = Fs::format(dev.clone(), 0).unwrap();
    let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut rng = 0x1234_5678_9abc_def0u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    for step in 0..3000 {
        let name = format!("f{}", next(6));
        match next(10) {
            0 => {
                if let std::collections::btree_map::Entry::Vacant(v) = model.entry(name) {
                    fs.create(v.key()).unwrap();
                    v.insert(Vec::new());
                }
            }
            1..=4 => {
                if let Some(m) = model.get_mut(&name) {
                    let (off, len) = (next(60_000) as usize, 1 + next(20_000) as usize);
                    let data: Vec<u8> = (0..len).map(|i| (i as u64 + step) as u8).collect();
                    fs.open_file(&name).unwrap().write_at(&data, off as u64).unwrap();
                    if m.len() < off + len {
                        m.resize(off + len, 0);
                    }
                    m[off..off + len].copy_from_slice(&data);
                }
            }
            5 => {
                if let Some(m) = model.get_mut(&name) {
                    let len = next(70_000) as usize;
                    fs.open_file(&name).unwrap().set_len(len as u64).unwrap();
                    m.resize(len, 0);
                }
            }
            6 => {
                if model.remove(&name).is_some() {
                    fs.remove(&name).unwrap();
                }
            }
            7 => fs.sync().unwrap(),
            8 => {
                if let Some(m) = model.get(&name) {
                    let (off, len) = (next(80_000) as usize, next(10_000) as usize);
                    let mut b = vec![0u8; len];
                    let n = fs.open_file(&name).unwrap().read_at(&mut b, off as u64).unwrap();
                    let want = &m[off.min(m.len())..(off + len).min(m.len())];
                    assert_eq!(&b[..n], want);
                }
            }
            _ => {
                if next(10) == 0 {
                    drop(fs);
                    let report = fsck(&dev).unwrap();
                    assert!(report.is_clean(), "{:?}", report.problems);
                    fs = Fs::open(dev.clone(), 0).unwrap();
                    check_model(&fs, &model);
                }
            }
        }
    }
    check_model(&fs, &model);
    let s = fs.stats();
    assert!(s.hits > 0 && s.misses > 0 && s.evictions > 0 && s.writebacks > 0 && s.resident <= s.capacity, "{s:?}");
}

#[test]
fn freed_space_is_reused_and_a_full_fs_says_so() {
    let dev = MemDevice::new(64 * BLOCK_SIZE as u64);
    let fs = Fs::format(dev.clone(), 0).unwrap();
    let cap = fs.capacity();
    for round in 0..5u8 {
        let f = fs.create("big").unwrap();
        let mut written = 0u64;
        let err = loop {
            match f.write_at(&[round; BLOCK_SIZE], written) {
                Ok(()) => written += BLOCK_SIZE as u64,
                Err(e) => break e,
            }
        };
        assert!(matches!(err, Error::NoSpace { .. }), "{err}");
        assert!(err.to_string().contains("remove or shrink"), "{err}");
        assert!(written >= cap - 8 * BLOCK_SIZE as u64, "round {round}: only {written} of {cap} bytes fit");
        fs.sync().unwrap();
        assert!(fs.fsck().unwrap().is_clean());
        fs.remove("big").unwrap();
    }
}

#[test]
fn a_file_range_holds_a_file_system() {
    let img = tempfile::NamedTempFile::new().unwrap();
    img.as_file().set_len(8 << 20).unwrap();
    let dev = || FileDevice::new(img.reopen().unwrap(), 1 << 20, 4 << 20, img.path().display().to_string());
    let fs = Fs::format(dev(), 1 << 20).unwrap();
    let f = fs.create("data").unwrap();
    let blob: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    f.write_at(&blob, 12_345).unwrap();
    f.sync().unwrap();
    drop((f, fs));
    let fs = Fs::open(dev(), 1 << 20).unwrap();
    let f = fs.open_file("data").unwrap();
    let mut b = vec![0u8; blob.len()];
    f.read_exact_at(&mut b, 12_345).unwrap();
    assert!(b == blob);
    assert!(fsck(&dev()).unwrap().is_clean());
    // Outside the range nothing was touched.
    let mut head = vec![0u8; 1 << 20];
    std::os::unix::fs::FileExt::read_exact_at(img.as_file(), &mut head, 0).unwrap();
    assert!(head.iter().all(|x| *x == 0));
    assert_eq!(dev().len(), 4 << 20);
}

#[test]
fn streams_read_ahead_and_see_later_writes() {
    let dev = MemDevice::new(16 << 20);
    let fs = Fs::format(dev.clone(), 1 << 16).unwrap();
    let f = fs.create("s").unwrap();
    let data: Vec<u8> = (0..(3 << 20) + 777).map(|i| (i * 31 % 251) as u8).collect();
    f.write_at(&data, 0).unwrap();
    f.sync().unwrap();
    // 64 KiB reads (streams: read ahead 1 MiB) at unaligned offsets, then odd sizes.
    let mut got = Vec::new();
    let mut buf = vec![0u8; 65536];
    let mut at = 3u64;
    got.extend_from_slice(&data[..3]);
    loop {
        let n = f.read_at(&mut buf, at).unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        at += n as u64;
    }
    assert!(got == data, "a stream read back other bytes");
    // A write inside the read-ahead window is seen by the next read, as is a shrink.
    let mut probe = vec![0u8; 65536];
    f.read_exact_at(&mut probe, 1 << 20).unwrap();
    f.write_at(b"NEW", (1 << 20) + 70_000).unwrap();
    f.read_exact_at(&mut probe, (1 << 20) + 65536).unwrap();
    assert_eq!(&probe[70_000 - 65536..70_000 - 65536 + 3], b"NEW");
    f.read_exact_at(&mut probe, 2 << 20).unwrap();
    f.set_len((2 << 20) + 10).unwrap();
    f.set_len(3 << 20).unwrap();
    f.read_exact_at(&mut probe, 2 << 20).unwrap();
    assert_eq!(&probe[..10], &data[2 << 20..(2 << 20) + 10]);
    assert!(probe[10..].iter().all(|b| *b == 0), "bytes past a shrink read as zeros after regrowth");
    assert!(fsck(&dev).unwrap().is_clean());
}

#[test]
fn a_file_grows_over_more_free_extents_than_any_limit() {
    let dev = MemDevice::new(1024 * BLOCK_SIZE as u64);
    let fs = Fs::format(dev.clone(), 1 << 20).unwrap();
    for i in 0..400 {
        fs.create(&format!("f{i}")).unwrap().write_at(&[1u8; BLOCK_SIZE], 0).unwrap();
    }
    // Fill the rest but a few blocks, then free every other small file: 200 one-block holes.
    let tail = fs.create("tail").unwrap();
    let mut at = 0u64;
    while fs.free_bytes() > 8 * BLOCK_SIZE as u64 {
        tail.write_at(&[2u8; BLOCK_SIZE], at).unwrap();
        at += BLOCK_SIZE as u64;
    }
    fs.sync().unwrap();
    for i in (0..400).step_by(2) {
        fs.remove(&format!("f{i}")).unwrap();
    }
    fs.sync().unwrap();
    // 150 blocks in one write take well over a hundred free extents.
    let data: Vec<u8> = (0..150 * BLOCK_SIZE).map(|i| (i % 251) as u8).collect();
    let f = fs.create("scattered").unwrap();
    f.write_at(&data, 0).unwrap();
    fs.sync().unwrap();
    assert!(fs.fsck().unwrap().is_clean());
    drop((f, tail));
    drop(fs);
    let fs = Fs::open(dev, 1 << 20).unwrap();
    assert!(read_all(&fs, "scattered") == data, "the scattered file reads back");
}
