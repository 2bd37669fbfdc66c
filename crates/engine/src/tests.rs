// SPDX-License-Identifier: Apache-2.0
use super::*;
use insitu_proto::{Extent, Value, VirtualObject};
use std::sync::atomic::Ordering;

const NS_BYTES: usize = 8 << 20;

/// A target over an 8 MiB image whose bytes follow a known pattern.
fn target_with(visibility: Visibility) -> (tempfile::TempDir, Engine, Vec<u8>) {
    target_in(tempfile::tempdir().unwrap(), visibility)
}

/// The same target on disk (a reader thread reads ahead of the kernel) and in memory
/// (/dev/shm: the kernel reads for itself), so that every EXEC test covers both paths.
fn targets_on_disk_and_in_memory() -> Vec<(tempfile::TempDir, Engine, Vec<u8>)> {
    let mut all = vec![target_with(Visibility::Sharable)];
    assert!(!all[0].1.namespace(1).unwrap().media().is_in_memory());
    if let Ok(shm) = tempfile::tempdir_in("/dev/shm") {
        let t = target_in(shm, Visibility::Sharable);
        assert!(t.1.namespace(1).unwrap().media().is_in_memory(), "/dev/shm is a memory file system");
        all.push(t);
    }
    all
}

fn target_in(dir: tempfile::TempDir, visibility: Visibility) -> (tempfile::TempDir, Engine, Vec<u8>) {
    let img = dir.path().join("ns.img");
    let data: Vec<u8> = (0..NS_BYTES).map(|i| if i % 61 == 60 { b'\n' } else { b'a' + (i % 26) as u8 }).collect();
    std::fs::write(&img, &data).unwrap();
    let mut t = Engine::new();
    let cfg = NamespaceConfig { visibility, ..Default::default() };
    t.add_namespace(&img, cfg).unwrap();
    (dir, t, data)
}

fn records(out: &ExecOutcome) -> Vec<insitu_proto::Record> {
    ExecResult::decode(&out.result).unwrap().records
}

fn field<'a>(rec: &'a insitu_proto::Record, key: &str) -> &'a Value {
    &rec.iter().find(|(k, _)| k == key).unwrap().1
}

fn media_reads(t: &Engine) -> u64 {
    t.namespace(1).unwrap().media().counters().read_bytes.load(Ordering::Relaxed)
}

#[test]
fn exec_streams_fragmented_objects_with_holes() {
    for (_d, t, data) in targets_on_disk_and_in_memory() {
        exec_streams_fragmented_objects_with_holes_on(&t, &data);
    }
}

fn exec_streams_fragmented_objects_with_holes_on(t: &Engine, data: &[u8]) {
    // Three data extents out of order, a hole between them, a tail cut mid-sector, and an
    // extent larger than one read chunk.
    let extents = vec![Extent::data(9000, 3), Extent::zero(2), Extent::data(17, 5000), Extent::data(1, 1)];
    let length = (3 + 2 + 5000) * 512 + 300;
    let obj = VirtualObject { offset: 0, length, extents };
    let mut expect = Vec::new();
    expect.extend_from_slice(&data[9000 * 512..9003 * 512]);
    expect.extend_from_slice(&[0u8; 1024]);
    expect.extend_from_slice(&data[17 * 512..5017 * 512]);
    expect.extend_from_slice(&data[512..812]);
    let out = t.exec(1, &Descriptor::new("wc", vec![obj.clone()]).encode()).unwrap();
    let rec = &records(&out)[0];
    assert_eq!(field(rec, "bytes"), &Value::U64(expect.len() as u64));
    assert_eq!(field(rec, "lines"), &Value::U64(expect.iter().filter(|b| **b == b'\n').count() as u64));
    let crc = t.exec(1, &Descriptor::new("crc32c", vec![obj]).encode()).unwrap();
    assert_eq!(field(&records(&crc)[0], "digest"), &Value::Str(format!("{:08x}", crc32c_of(&expect))));
    assert!(out.media_read_bytes >= (3 + 5000 + 1) * 512, "media bytes {}", out.media_read_bytes);
}

/// A bitwise CRC-32C, independent of the kernel's implementation.
fn crc32c_of(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
        }
    }
    !crc
}

#[test]
fn many_inputs_return_one_record_each_in_order() {
    for (_d, t, data) in targets_on_disk_and_in_memory() {
        many_inputs_on(&t, &data);
    }
}

fn many_inputs_on(t: &Engine, data: &[u8]) {
    let objs: Vec<VirtualObject> = (0..5u64).map(|i| VirtualObject { offset: 0, length: 1000 + i, extents: vec![Extent::data(i * 100, 2)] }).collect();
    let out = t.exec(1, &Descriptor::new("crc32c", objs).encode()).unwrap();
    let recs = records(&out);
    assert_eq!(recs.len(), 5);
    for (i, rec) in recs.iter().enumerate() {
        let start = i * 100 * 512;
        let want = crc32c_of(&data[start..start + 1000 + i]);
        assert_eq!(field(rec, "digest"), &Value::Str(format!("{want:08x}")));
    }
}

#[test]
fn objects_starting_inside_a_sector_skip_their_offset() {
    for (_d, t, data) in targets_on_disk_and_in_memory() {
        // An offset within the first extent, one that ends the first extent exactly
        // (a one-sector extent skipped up to its last byte), and one across a hole.
        let cases = [
            (80u32, 4000u64, vec![Extent::data(30, 8)]),
            (511, 1000, vec![Extent::data(5, 1), Extent::data(70, 2)]),
            (300, 900, vec![Extent::zero(1), Extent::data(9, 2)]),
        ];
        for (offset, length, extents) in cases {
            let mut whole = Vec::new();
            for e in &extents {
                match e.kind {
                    insitu_proto::ExtentKind::Data => whole.extend_from_slice(&data[e.start_sector as usize * 512..][..e.bytes() as usize]),
                    insitu_proto::ExtentKind::Zero => whole.extend(std::iter::repeat_n(0u8, e.bytes() as usize)),
                }
            }
            let expect = &whole[offset as usize..offset as usize + length as usize];
            let obj = VirtualObject { offset, length, extents };
            let out = t.exec(1, &Descriptor::new("crc32c", vec![obj]).encode()).unwrap();
            assert_eq!(field(&records(&out)[0], "digest"), &Value::Str(format!("{:08x}", crc32c_of(expect))), "offset {offset}");
        }
    }
}

#[test]
fn outputs_land_in_their_extents_and_nothing_else_changes() {
    for (_d, t, data) in targets_on_disk_and_in_memory() {
        outputs_on(&t, &data);
    }
}

fn outputs_on(t: &Engine, data: &[u8]) {
    let input = VirtualObject { offset: 0, length: 20 * 512 - 7, extents: vec![Extent::data(100, 20)] };
    let output = VirtualObject { offset: 0, length: 20 * 512, extents: vec![Extent::data(5000, 10), Extent::data(4000, 10)] };
    let mut d = Descriptor::new("sort", vec![input]);
    d.outputs.push(output);
    let out = t.exec(1, &d.encode()).unwrap();
    let len = match field(&records(&out)[0], "output_length") {
        Value::U64(n) => *n as usize,
        v => panic!("{v:?}"),
    };
    let mut lines: Vec<&[u8]> = data[100 * 512..120 * 512 - 7].split(|b| *b == b'\n').collect();
    if lines.last() == Some(&&b""[..]) {
        lines.pop();
    }
    lines.sort();
    let want: Vec<u8> = lines.iter().flat_map(|l| l.iter().copied().chain([b'\n'])).collect();
    assert_eq!(len, want.len());
    let mut got = vec![0u8; 20 * 512];
    t.read(1, 5000, &mut got[..10 * 512]).unwrap();
    t.read(1, 4000, &mut got[10 * 512..]).unwrap();
    assert_eq!(&got[..len], &want[..]);
    let mut untouched = vec![0u8; 512];
    t.read(1, 5010, &mut untouched).unwrap();
    assert_eq!(untouched, data[5010 * 512..5011 * 512]);
}

#[test]
fn bad_descriptors_are_refused_before_any_media_read() {
    let (_d, t, _) = target_with(Visibility::Sharable);
    let ok = VirtualObject { offset: 0, length: 512, extents: vec![Extent::data(0, 1)] };
    let ns_sectors = (NS_BYTES / 512) as u64;
    let mut cases: Vec<(Vec<u8>, Status)> = Vec::new();
    cases.push((b"garbage".to_vec(), Status::BAD_DESCRIPTOR));
    let good = Descriptor::new("crc32c", vec![ok.clone()]).encode();
    cases.push((good[..good.len() - 1].to_vec(), Status::BAD_DESCRIPTOR));
    cases.push((Descriptor::new("nope", vec![ok.clone()]).encode(), Status::UNKNOWN_FUNCTION));
    let past_end = VirtualObject { offset: 0, length: 1024, extents: vec![Extent::data(ns_sectors - 1, 2)] };
    cases.push((Descriptor::new("crc32c", vec![past_end]).encode(), Status::LBA_OUT_OF_RANGE));
    let overflow = VirtualObject { offset: 0, length: 512, extents: vec![Extent::data(u64::MAX - 1, 4)] };
    cases.push((Descriptor::new("crc32c", vec![overflow]).encode(), Status::LBA_OUT_OF_RANGE));
    let mut bad_regex = Descriptor::new("grep", vec![ok.clone()]);
    bad_regex.args = vec![("pattern".into(), Value::Str("(".into())), ("regex".into(), Value::Bool(true))];
    cases.push((bad_regex.encode(), Status::BAD_ARGUMENT));
    let mut unknown_arg = Descriptor::new("wc", vec![ok.clone()]);
    unknown_arg.args = vec![("bogus".into(), Value::U64(1))];
    cases.push((unknown_arg.encode(), Status::BAD_ARGUMENT));
    let mut overlap = Descriptor::new("sort", vec![ok.clone()]);
    overlap.outputs.push(VirtualObject { offset: 0, length: 512, extents: vec![Extent::data(0, 1)] });
    cases.push((overlap.encode(), Status::INVALID_FIELD));
    cases.push((Descriptor::new("sort", vec![ok.clone()]).encode(), Status::INVALID_FIELD));
    let mut two_inputs = Descriptor::new("sort", vec![ok.clone(), ok]);
    two_inputs.outputs.push(VirtualObject { offset: 0, length: 512, extents: vec![Extent::data(8, 1)] });
    cases.push((two_inputs.encode(), Status::INVALID_FIELD));
    for (bytes, status) in cases {
        let err = t.exec(1, &bytes).unwrap_err();
        assert_eq!(err.status, status, "{err}");
        assert!(!err.message.is_empty());
    }
    assert_eq!(media_reads(&t), 0, "a refused command read the media");
}

#[test]
fn private_and_missing_namespaces_are_refused() {
    let (_d, t, _) = target_with(Visibility::Private);
    let obj = VirtualObject { offset: 0, length: 512, extents: vec![Extent::data(0, 1)] };
    let err = t.exec(1, &Descriptor::new("crc32c", vec![obj.clone()]).encode()).unwrap_err();
    assert_eq!(err.status, Status::INVALID_NAMESPACE);
    assert!(err.message.contains("private"), "{err}");
    assert!(t.read(1, 0, &mut [0u8; 512]).is_err());
    assert_eq!(t.exec(2, &Descriptor::new("crc32c", vec![obj]).encode()).unwrap_err().status, Status::INVALID_NAMESPACE);
    assert!(t.host_namespaces().is_empty());
    assert_eq!(media_reads(&t), 0);
}

#[test]
fn block_commands_check_ranges() {
    let (_d, t, data) = target_with(Visibility::Sharable);
    let last = (NS_BYTES / 512 - 1) as u64;
    let mut buf = vec![0u8; 512];
    t.read(1, last, &mut buf).unwrap();
    assert_eq!(buf, data[NS_BYTES - 512..]);
    assert_eq!(t.read(1, last, &mut [0u8; 1024]).unwrap_err().status, Status::LBA_OUT_OF_RANGE);
    assert_eq!(t.write(1, u64::MAX, &[0u8; 512]).unwrap_err().status, Status::LBA_OUT_OF_RANGE);
    assert_eq!(t.write(1, 0, &[0u8; 100]).unwrap_err().status, Status::INVALID_FIELD);
    t.write_zeroes(1, 10, 3).unwrap();
    let mut z = vec![1u8; 4 * 512];
    t.read(1, 9, &mut z).unwrap();
    assert_eq!(&z[..512], &data[9 * 512..10 * 512]);
    assert!(z[512..].iter().all(|b| *b == 0));
    assert_eq!(t.write_zeroes(1, last, 2).unwrap_err().status, Status::LBA_OUT_OF_RANGE);
}

#[test]
fn results_go_to_the_result_object_when_one_is_given() {
    let (_d, t, _) = target_with(Visibility::Sharable);
    let input = VirtualObject { offset: 0, length: 4096, extents: vec![Extent::data(0, 8)] };
    let mut d = Descriptor::new("wc", vec![input.clone()]);
    d.result = Some(VirtualObject { offset: 0, length: 1024, extents: vec![Extent::data(3000, 2)] });
    let out = t.exec(1, &d.encode()).unwrap();
    assert!(out.result_in_object);
    let mut stored = vec![0u8; 1024];
    t.read(1, 3000, &mut stored).unwrap();
    assert_eq!(&stored[..out.result.len()], &out.result[..]);
    assert_eq!(ExecResult::decode(&stored[..out.result.len()]).unwrap(), ExecResult::decode(&out.result).unwrap());
    // Too small a result object: refused, nothing written there.
    let mut small = Descriptor::new("wc", vec![input]);
    small.result = Some(VirtualObject { offset: 0, length: 8, extents: vec![Extent::data(4000, 1)] });
    assert_eq!(t.exec(1, &small.encode()).unwrap_err().status, Status::RESULT_TOO_LARGE);
}

#[test]
fn a_compute_budget_is_charged_with_the_kernels_cpu_time() {
    #[derive(Default)]
    struct Tally(std::sync::atomic::AtomicU64, std::sync::atomic::AtomicU64);
    impl ComputeBudget for Tally {
        fn charge(&self, cpu_ns: u64) {
            self.0.fetch_add(cpu_ns, Ordering::Relaxed);
            self.1.fetch_add(1, Ordering::Relaxed);
        }
    }
    let (_d, t, _) = target_with(Visibility::Sharable);
    let tally = Arc::new(Tally::default());
    let t = t.with_compute_budget(tally.clone());
    let obj = VirtualObject { offset: 0, length: 6 << 20, extents: vec![Extent::data(0, 12 * 1024)] };
    t.exec(1, &Descriptor::new("sha256", vec![obj]).encode()).unwrap();
    // sha256 over 6 MiB takes milliseconds of CPU, charged chunk by chunk.
    assert!(tally.1.load(Ordering::Relaxed) >= 3, "charged {} times", tally.1.load(Ordering::Relaxed));
    assert!(tally.0.load(Ordering::Relaxed) > 1_000_000, "charged {} ns", tally.0.load(Ordering::Relaxed));
    // Two inputs share one meter: nothing is charged twice, so the total cannot exceed the
    // CPU the calling thread (which runs the kernel) really used.
    tally.0.store(0, Ordering::Relaxed);
    let half = VirtualObject { offset: 0, length: 2 << 20, extents: vec![Extent::data(0, 4096)] };
    let other = VirtualObject { offset: 0, length: 2 << 20, extents: vec![Extent::data(4096, 4096)] };
    let mut d = Descriptor::new("vector-add", vec![half, other]);
    d.outputs.push(VirtualObject { offset: 0, length: 2 << 20, extents: vec![Extent::data(8192, 4096)] });
    let before = thread_cpu_ns();
    t.exec(1, &d.encode()).unwrap();
    let used = thread_cpu_ns() - before;
    let charged = tally.0.load(Ordering::Relaxed);
    assert!(charged > 0 && charged <= used, "charged {charged} ns of {used} ns used");
}
