// SPDX-License-Identifier: Apache-2.0
//! Property tests of the descriptor and result codecs and of `Descriptor::check_extents`.
//!
//! Case counts are kept modest so the suite runs in seconds; raise them for a longer soak
//! with `PROPTEST_CASES=10000 cargo test -p insitu-proto --release --test properties`.

use insitu_proto::{DecodeError, Descriptor, ExecResult, Extent, ExtentError, ExtentKind, Limits, Value, VirtualObject, SECTOR};
use proptest::prelude::*;

/// `default` cases, or `PROPTEST_CASES` when set.
fn cases(default: u32) -> ProptestConfig {
    let n = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    ProptestConfig::with_cases(n)
}

// ---------------------------------------------------------------------------------------
// Strategies.

fn name() -> impl Strategy<Value = String> {
    "[a-z0-9_-]{1,32}"
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u64>().prop_map(Value::U64),
        any::<i64>().prop_map(Value::I64),
        any::<String>().prop_map(Value::Str),
        prop::collection::vec(any::<u8>(), 0..40).prop_map(Value::Bytes),
        any::<bool>().prop_map(Value::Bool),
        prop::collection::vec(any::<u64>(), 0..8).prop_map(Value::U64List),
    ]
}

/// Arguments with unique keys.
fn args() -> impl Strategy<Value = Vec<(String, Value)>> {
    prop::collection::vec((name(), value()), 0..6).prop_map(|mut list| {
        let mut seen = std::collections::HashSet::new();
        list.retain(|(k, _)| seen.insert(k.clone()));
        list
    })
}

fn extent(allow_zero: bool) -> impl Strategy<Value = Extent> {
    let data = (any::<u64>(), 1..=u32::MAX).prop_map(|(s, n)| Extent::data(s, n));
    let zero = (1..=u32::MAX).prop_map(Extent::zero);
    if allow_zero {
        prop_oneof![3 => data, 1 => zero].boxed()
    } else {
        data.boxed()
    }
}

/// A structurally valid object: `length` anywhere from 0 to what the extents cover.
/// Input objects may start inside their first sector.
fn object(allow_zero: bool) -> impl Strategy<Value = VirtualObject> {
    (prop::collection::vec(extent(allow_zero), 0..5), any::<u64>(), 0..512u32).prop_map(move |(extents, seed, offset)| {
        let covered: u64 = extents.iter().map(Extent::bytes).sum();
        let offset = if allow_zero && covered > 0 { offset } else { 0 };
        let length = seed % (covered.min(1 << 48) - u64::from(offset) + 1);
        VirtualObject { offset, length, extents }
    })
}

fn descriptor() -> impl Strategy<Value = Descriptor> {
    (name(), args(), prop::collection::vec(object(true), 1..4), prop::collection::vec(object(false), 0..3), prop::option::of(object(false)))
        .prop_map(|(function, args, inputs, outputs, result)| Descriptor { function, args, inputs, outputs, result })
}

fn result() -> impl Strategy<Value = ExecResult> {
    // Result field names need not be unique.
    prop::collection::vec(prop::collection::vec((name(), value()), 0..5), 0..4).prop_map(|records| ExecResult { records })
}

/// Bytes that look like a descriptor: right magic, version, header length and total length,
/// small counts, a valid function name, then a body of random pieces that the format uses
/// (names, tags, small integers, runs of zeros, stray bytes), so that decoding gets past the
/// header and exercises the rules of the body.
fn descriptor_like_noise() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        3 => name().prop_map(|n| [vec![u8::try_from(n.len()).unwrap()], n.into_bytes()].concat()),
        2 => (1u8..=7).prop_map(|t| vec![t]),
        3 => (0u32..40).prop_map(|v| v.to_le_bytes().to_vec()),
        3 => (0u64..5000).prop_map(|v| v.to_le_bytes().to_vec()),
        2 => (1usize..8).prop_map(|n| vec![0; n]),
        1 => any::<u8>().prop_map(|b| vec![b]),
    ];
    let n_inputs = prop_oneof![1 => Just(0u16), 4 => 1u16..=3];
    (name(), 0u8..=3, n_inputs, 0u16..=2, prop::collection::vec(piece, 0..30)).prop_map(|(function, n_args, n_inputs, n_outputs, pieces)| {
        let body: Vec<u8> = pieces.concat();
        let mut b = Vec::with_capacity(32 + function.len() + body.len());
        b.extend_from_slice(b"ISCD");
        b.extend_from_slice(&1u16.to_le_bytes());
        b.extend_from_slice(&32u16.to_le_bytes());
        b.extend_from_slice(&u32::try_from(32 + function.len() + body.len()).unwrap().to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        b.extend_from_slice(&[u8::try_from(function.len()).unwrap(), n_args]);
        b.extend_from_slice(&n_inputs.to_le_bytes());
        b.extend_from_slice(&n_outputs.to_le_bytes());
        b.extend_from_slice(&[0; 10]);
        b.extend_from_slice(function.as_bytes());
        b.extend_from_slice(&body);
        b
    })
}

/// Decodes with default limits; if it succeeds, the bytes must be the canonical encoding.
fn decode_is_canonical(bytes: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(d) = Descriptor::decode(bytes, &Limits::default()) {
        prop_assert_eq!(d.encode(), bytes, "decoded descriptor re-encodes differently");
    }
    Ok(())
}

fn result_decode_is_canonical(bytes: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(r) = ExecResult::decode(bytes) {
        prop_assert_eq!(r.encode(), bytes, "decoded result re-encodes differently");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// (a) Round trips; (b) arbitrary bytes; (c) mutations of valid encodings.

proptest! {
    #![proptest_config(cases(256))]

    #[test]
    fn descriptor_roundtrip(d in descriptor()) {
        let bytes = d.encode();
        prop_assert_eq!(bytes.len(), u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize);
        let back = Descriptor::decode(&bytes, &Limits::default());
        prop_assert_eq!(back.as_ref(), Ok(&d));
    }

    #[test]
    fn result_roundtrip(r in result()) {
        let bytes = r.encode();
        prop_assert_eq!(ExecResult::decode(&bytes), Ok(r));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        decode_is_canonical(&bytes)?;
        result_decode_is_canonical(&bytes)?;
    }

    #[test]
    fn arbitrary_body_never_panics(bytes in descriptor_like_noise()) {
        decode_is_canonical(&bytes)?;
        // The body noise behind a result header, with a small record count.
        let mut r = b"ISRS\x01\x00".to_vec();
        r.extend_from_slice(&[bytes[17] & 3, 0]);
        r.extend_from_slice(&bytes[32 + usize::from(bytes[16])..]);
        result_decode_is_canonical(&r)?;
    }
}

proptest! {
    #![proptest_config(cases(64))]

    /// Every single-byte change at every position: no panic, and anything accepted is
    /// canonical.
    #[test]
    fn mutated_descriptor_never_panics(d in descriptor(), xor in 1u8..=255) {
        let bytes = d.encode();
        for i in 0..bytes.len() {
            for flip in [xor, 0xff, 0x01, 0x80] {
                let mut m = bytes.clone();
                m[i] ^= flip;
                decode_is_canonical(&m)?;
            }
        }
    }

    /// Every proper prefix fails; with the total length patched to match, it fails as
    /// truncated (every field of a canonical encoding is needed).
    #[test]
    fn truncated_descriptor_is_rejected(d in descriptor()) {
        let bytes = d.encode();
        for cut in 0..bytes.len() {
            let prefix = &bytes[..cut];
            prop_assert!(Descriptor::decode(prefix, &Limits::default()).is_err(), "prefix of {} bytes decoded", cut);
            if cut >= 12 {
                let mut patched = prefix.to_vec();
                patched[8..12].copy_from_slice(&u32::try_from(cut).unwrap().to_le_bytes());
                let e = Descriptor::decode(&patched, &Limits::default());
                let truncated = matches!(e, Err(DecodeError::Truncated { .. }));
                prop_assert!(truncated, "cut at {}: {:?}", cut, e);
            }
        }
    }

    /// Appended bytes fail: as a total-length mismatch, or as trailing bytes when the total
    /// length is patched to match.
    #[test]
    fn extended_descriptor_is_rejected(d in descriptor(), extra in prop::collection::vec(any::<u8>(), 1..20)) {
        let bytes = d.encode();
        let mut longer = bytes.clone();
        longer.extend_from_slice(&extra);
        let e = Descriptor::decode(&longer, &Limits::default());
        let mismatch = matches!(e, Err(DecodeError::BadField { field: "total length", offset: 8, .. }));
        prop_assert!(mismatch, "{:?}", e);
        let total = u32::try_from(longer.len()).unwrap().to_le_bytes();
        longer[8..12].copy_from_slice(&total);
        let e = Descriptor::decode(&longer, &Limits::default());
        prop_assert_eq!(e, Err(DecodeError::Trailing { offset: bytes.len(), extra: extra.len() }));
    }

    #[test]
    fn mutated_result_never_panics(r in result(), xor in 1u8..=255) {
        let bytes = r.encode();
        for i in 0..bytes.len() {
            let mut m = bytes.clone();
            m[i] ^= xor;
            result_decode_is_canonical(&m)?;
        }
        for cut in 0..bytes.len() {
            prop_assert!(ExecResult::decode(&bytes[..cut]).is_err(), "result prefix of {} bytes decoded", cut);
        }
        let mut longer = bytes.clone();
        longer.push(xor);
        let trailing = matches!(ExecResult::decode(&longer), Err(DecodeError::Trailing { .. }));
        prop_assert!(trailing);
    }
}

// ---------------------------------------------------------------------------------------
// (d) check_extents against a brute-force model.

/// Small extents crowded into a small namespace, so that overlaps and out-of-range extents
/// are common; now and then one near the top of the sector space, to exercise overflow.
fn crowded_extent(allow_zero: bool) -> impl Strategy<Value = Extent> {
    let near = (0u64..48, 1u32..12).prop_map(|(s, n)| Extent::data(s, n));
    let far = (0u64..8, 1u32..=u32::MAX).prop_map(|(back, n)| Extent::data(u64::MAX - back, n));
    let zero = (1u32..8).prop_map(Extent::zero);
    if allow_zero {
        prop_oneof![12 => near, 1 => far, 3 => zero].boxed()
    } else {
        prop_oneof![12 => near, 1 => far].boxed()
    }
}

fn crowded_object(allow_zero: bool) -> impl Strategy<Value = VirtualObject> {
    prop::collection::vec(crowded_extent(allow_zero), 0..4).prop_map(|extents| VirtualObject {
        offset: 0,
        length: extents.iter().map(Extent::bytes).sum(),
        extents,
    })
}

fn crowded_descriptor() -> impl Strategy<Value = Descriptor> {
    (prop::collection::vec(crowded_object(true), 1..4), prop::collection::vec(crowded_object(false), 0..3)).prop_map(|(inputs, outputs)| Descriptor {
        function: "f".into(),
        args: vec![],
        inputs,
        outputs,
        result: None,
    })
}

/// (object index, is output, start, end) of every data extent, in check order, in u128.
fn data_spans(d: &Descriptor) -> Vec<(usize, bool, u128, u128)> {
    let objects = d.inputs.iter().map(|o| (false, o)).chain(d.outputs.iter().map(|o| (true, o)));
    let mut spans = Vec::new();
    for (index, (is_output, obj)) in objects.enumerate() {
        for e in obj.extents.iter().filter(|e| e.kind == ExtentKind::Data) {
            let start = u128::from(e.start_sector);
            spans.push((index, is_output, start, start + u128::from(e.sectors)));
        }
    }
    spans
}

proptest! {
    #![proptest_config(cases(512))]

    #[test]
    fn check_extents_matches_brute_force(
        d in crowded_descriptor(),
        ns_sectors in prop_oneof![1 => 0u64..60, 3 => 60u64..64],
        ns_tail in 0u64..SECTOR,
    ) {
        let namespace_bytes = ns_sectors * SECTOR + ns_tail;
        let got = d.check_extents(namespace_bytes);
        let spans = data_spans(&d);

        // Range: the first data extent, in check order, that ends past the namespace.
        let limit = u128::from(namespace_bytes) / u128::from(SECTOR);
        let first_out = spans.iter().find(|s| s.3 > limit);
        if let Some(&(object, _, start, end)) = first_out {
            let want = ExtentError::OutOfRange {
                object,
                start_sector: u64::try_from(start).unwrap(),
                sectors: u32::try_from(end - start).unwrap(),
                namespace_sectors: ns_sectors,
            };
            prop_assert_eq!(got, Err(want));
            return Ok(());
        }

        // Every data extent is inside the namespace now; any Ok must agree.
        prop_assert!(spans.iter().all(|s| s.3 <= limit));

        // Overlap, O(n^2): two distinct data extents sharing a sector, one of them an output.
        let mut conflicts = Vec::new();
        for (i, a) in spans.iter().enumerate() {
            for b in &spans[i + 1..] {
                if (a.1 || b.1) && a.2 < b.3 && b.2 < a.3 {
                    conflicts.push((a, b));
                }
            }
        }
        match got {
            Ok(()) => prop_assert!(conflicts.is_empty(), "missed overlap {:?}", conflicts),
            Err(ExtentError::OutputOverlap { object, other, sector }) => {
                prop_assert!(!conflicts.is_empty(), "reported an overlap that does not exist");
                // The report names a real conflict: two distinct extents of those objects,
                // at least one of them an output's, both holding `sector`.
                let sector = u128::from(sector);
                let holds = |s: &&(usize, bool, u128, u128)| s.2 <= sector && sector < s.3;
                let named = conflicts.iter().any(|(a, b)| {
                    holds(a) && holds(b) && ((a.0 == object && b.0 == other) || (a.0 == other && b.0 == object))
                });
                prop_assert!(named, "overlap report {} / {} at {} matches no conflict {:?}", object, other, sector, conflicts);
            }
            Err(e) => prop_assert!(false, "unexpected {:?}", e),
        }
    }

    /// Inputs may overlap each other, even within one object.
    #[test]
    fn overlapping_inputs_are_allowed(d in crowded_descriptor()) {
        let mut inputs = d.inputs;
        for obj in &mut inputs {
            obj.extents.retain(|e| e.start_sector < 1 << 32); // drop the near-overflow ones
        }
        let inputs_only = Descriptor { inputs, outputs: vec![], ..d };
        prop_assert_eq!(inputs_only.check_extents(1 << 20), Ok(()));
    }

    /// Whatever the sizes, a descriptor that passes has every data extent inside the
    /// namespace, by u128 arithmetic.
    #[test]
    fn passing_descriptors_are_in_range(d in descriptor(), namespace_bytes in any::<u64>()) {
        if d.check_extents(namespace_bytes).is_ok() {
            let limit = u128::from(namespace_bytes / SECTOR);
            for (object, _, start, end) in data_spans(&d) {
                prop_assert!(end <= limit, "object {} extent {}..{} passes in {} sectors", object, start, end, limit);
            }
        }
    }
}

/// Fixed cases for the rules, named so a failure reads as a sentence.
#[test]
fn check_extents_examples() {
    let input = |extents: Vec<Extent>| VirtualObject { offset: 0, length: 0, extents };
    let d = |inputs: Vec<VirtualObject>, outputs: Vec<VirtualObject>| Descriptor { function: "f".into(), args: vec![], inputs, outputs, result: None };
    let ns = 100 * SECTOR;

    // The last sector of the namespace is usable; one past is not. A partial sector is not.
    assert!(d(vec![input(vec![Extent::data(99, 1)])], vec![]).check_extents(ns).is_ok());
    assert!(d(vec![input(vec![Extent::data(99, 2)])], vec![]).check_extents(ns).is_err());
    assert!(d(vec![input(vec![Extent::data(99, 1)])], vec![]).check_extents(ns - 1).is_err());
    // Overflowing start + sectors is out of range, not a wrap-around.
    assert!(matches!(d(vec![input(vec![Extent::data(u64::MAX, 2)])], vec![]).check_extents(u64::MAX), Err(ExtentError::OutOfRange { .. })));
    // Zero extents address nothing.
    assert!(d(vec![input(vec![Extent::zero(1000)])], vec![]).check_extents(0).is_ok());
    // Adjacent is not overlapping.
    assert!(d(vec![input(vec![Extent::data(0, 10)])], vec![input(vec![Extent::data(10, 10)])]).check_extents(ns).is_ok());
    // An output inside a long input, an output over another output, an output over itself.
    assert_eq!(
        d(vec![input(vec![Extent::data(0, 50)])], vec![input(vec![Extent::data(20, 1)])]).check_extents(ns),
        Err(ExtentError::OutputOverlap { object: 1, other: 0, sector: 20 })
    );
    assert!(d(vec![input(vec![])], vec![input(vec![Extent::data(5, 5)]), input(vec![Extent::data(9, 5)])]).check_extents(ns).is_err());
    assert!(d(vec![input(vec![])], vec![input(vec![Extent::data(5, 5), Extent::data(9, 5)])]).check_extents(ns).is_err());
    // Two inputs reading the same sectors are fine.
    assert!(d(vec![input(vec![Extent::data(0, 10)]), input(vec![Extent::data(0, 10), Extent::data(5, 1)])], vec![]).check_extents(ns).is_ok());
}

/// A hostile extent count is refused before the extent list is allocated.
#[test]
fn huge_extent_counts_fail_fast() {
    let d = Descriptor::new("f", vec![VirtualObject::default()]);
    let mut bytes = d.encode();
    let count_at = 32 + 1 + 8;
    for n in [1u32, 1000, 1 << 20, (1 << 20) + 1, u32::MAX] {
        bytes[count_at..count_at + 4].copy_from_slice(&n.to_le_bytes());
        match Descriptor::decode(&bytes, &Limits::default()) {
            Err(DecodeError::Truncated { field: "extent list", need, have: 0, .. }) => {
                assert_eq!(need, n as usize * 16)
            }
            Err(DecodeError::TooMany { field: "extents in one object", count, .. }) => assert!(count > 1 << 20),
            other => panic!("count {n}: {other:?}"),
        }
    }
    // Same with generous limits: the remaining-bytes check still applies.
    let limits = Limits { max_extents_per_object: u32::MAX, ..Limits::default() };
    assert!(matches!(Descriptor::decode(&bytes, &limits), Err(DecodeError::Truncated { field: "extent list", .. })));
}

/// A list argument that claims many elements fails when they run out.
#[test]
fn huge_list_counts_fail_fast() {
    let mut d = Descriptor::new("f", vec![VirtualObject::default()]);
    d.args.push(("l".into(), Value::U64List(vec![])));
    let mut bytes = d.encode();
    let count_at = 32 + 1 + 2 + 1;
    bytes[count_at..count_at + 4].copy_from_slice(&65536u32.to_le_bytes());
    assert!(matches!(Descriptor::decode(&bytes, &Limits::default()), Err(DecodeError::Truncated { field: "list element", .. })));
    bytes[count_at..count_at + 4].copy_from_slice(&65537u32.to_le_bytes());
    assert!(matches!(Descriptor::decode(&bytes, &Limits::default()), Err(DecodeError::TooMany { field: "list elements", .. })));
}

/// Where each byte of a small object comes from: its namespace byte address, or `None` for
/// a zero byte.
fn byte_sources(obj: &VirtualObject) -> Vec<Option<u64>> {
    let all = obj.extents.iter().flat_map(|e| {
        (0..e.bytes()).map(move |i| match e.kind {
            ExtentKind::Data => Some(e.start_sector * SECTOR + i),
            ExtentKind::Zero => None,
        })
    });
    all.skip(obj.offset as usize).take(obj.length as usize).collect()
}

proptest! {
    #![proptest_config(cases(512))]

    /// A range of an object is an object whose bytes are exactly those of the range.
    #[test]
    fn a_range_holds_the_bytes_of_the_range(
        extents in prop::collection::vec((0u64..1000, 1u32..4, any::<bool>()), 0..5),
        offset in 0u32..512, cut in any::<u64>(), start in any::<u64>(), len in any::<u64>(),
    ) {
        let extents: Vec<Extent> = extents.into_iter().map(|(s, n, zero)| if zero { Extent::zero(n) } else { Extent::data(s, n) }).collect();
        let covered: u64 = extents.iter().map(Extent::bytes).sum();
        let offset = if covered == 0 { 0 } else { offset };
        let length = (covered - u64::from(offset)).saturating_sub(cut % 600);
        let obj = VirtualObject { offset, length, extents };
        let start = start % (length + 1);
        let len = len % (length - start + 1);
        let part = obj.range(start, len).expect("in range");
        prop_assert!(part.offset < 512);
        prop_assert!(part.extent_bytes() >= u64::from(part.offset) + part.length);
        prop_assert_eq!(byte_sources(&part), byte_sources(&obj)[start as usize..(start + len) as usize].to_vec());
        // Round trip through the wire, as an input of a descriptor.
        let d = Descriptor::new("wc", vec![part.clone()]);
        prop_assert_eq!(Descriptor::decode(&d.encode(), &Limits::default()).map(|d| d.inputs[0].clone()), Ok(part));
        prop_assert!(obj.range(start, length - start + 1).is_none());
    }
}
