// SPDX-License-Identifier: Apache-2.0
//! The shared test vectors in `docs/vectors/`.
//!
//! Every vector is produced here by the real encoder (invalid ones by patching a real
//! encoding so that exactly one rule is broken). The test checks that the committed files
//! match what this code generates, then checks the committed files on their own, the way the
//! Python side does: each valid vector decodes to the descriptor (or result) its JSON entry
//! describes and re-encodes to the same bytes; each invalid one fails with an error whose
//! text contains the entry's `error`.
//!
//! To rewrite the files after an intended change:
//! `INSITU_REGEN_VECTORS=1 cargo test -p insitu-proto --test vectors`.

use std::fs;
use std::path::{Path, PathBuf};

use insitu_proto::{DecodeError, Descriptor, ExecResult, Extent, ExtentKind, Limits, Value, VirtualObject};
use serde_json::{json, Value as Json};

/// One vector: a file of bytes and its entry in `vectors.json`.
struct Vector {
    name: &'static str,
    bytes: Vec<u8>,
    entry: Json,
}

fn regenerating() -> bool {
    std::env::var_os("INSITU_REGEN_VECTORS").is_some_and(|v| v == "1")
}

fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/vectors")
}

// ---------------------------------------------------------------------------------------
// JSON form of descriptors, results and values (see docs/vectors/README.md).

fn value_to_json(v: &Value) -> Json {
    let (ty, value) = match v {
        Value::U64(x) => ("u64", json!(x)),
        Value::I64(x) => ("i64", json!(x)),
        Value::Str(s) => ("str", json!(s)),
        Value::Bytes(b) => ("bytes", json!(hex::encode(b))),
        Value::Bool(b) => ("bool", json!(b)),
        Value::U64List(l) => ("u64-list", json!(l)),
    };
    assert_eq!(ty, v.type_name());
    json!({ "type": ty, "value": value })
}

fn value_from_json(j: &Json) -> Value {
    let value = &j["value"];
    match j["type"].as_str().expect("value type") {
        "u64" => Value::U64(value.as_u64().expect("u64")),
        "i64" => Value::I64(value.as_i64().expect("i64")),
        "str" => Value::Str(value.as_str().expect("str").to_owned()),
        "bytes" => Value::Bytes(hex::decode(value.as_str().expect("hex")).expect("hex")),
        "bool" => Value::Bool(value.as_bool().expect("bool")),
        "u64-list" => Value::U64List(value.as_array().expect("list").iter().map(|x| x.as_u64().expect("u64")).collect()),
        other => panic!("unknown value type {other:?}"),
    }
}

fn fields_to_json(fields: &[(String, Value)]) -> Json {
    Json::Array(fields.iter().map(|(k, v)| json!([k, value_to_json(v)])).collect())
}

fn fields_from_json(j: &Json) -> Vec<(String, Value)> {
    j.as_array().expect("field list").iter().map(|pair| (pair[0].as_str().expect("key").to_owned(), value_from_json(&pair[1]))).collect()
}

fn object_to_json(o: &VirtualObject) -> Json {
    let extents: Vec<Json> = o
        .extents
        .iter()
        .map(|e| {
            let kind = match e.kind {
                ExtentKind::Data => "data",
                ExtentKind::Zero => "zero",
            };
            json!({ "kind": kind, "start_sector": e.start_sector, "sectors": e.sectors })
        })
        .collect();
    json!({ "length": o.length, "extents": extents })
}

fn object_from_json(j: &Json) -> VirtualObject {
    let extents = j["extents"]
        .as_array()
        .expect("extents")
        .iter()
        .map(|e| Extent {
            kind: match e["kind"].as_str().expect("kind") {
                "data" => ExtentKind::Data,
                "zero" => ExtentKind::Zero,
                other => panic!("unknown extent kind {other:?}"),
            },
            start_sector: e["start_sector"].as_u64().expect("start_sector"),
            sectors: u32::try_from(e["sectors"].as_u64().expect("sectors")).expect("sectors fit u32"),
        })
        .collect();
    let offset = j["offset"].as_u64().map_or(0, |o| u32::try_from(o).expect("offset"));
    VirtualObject { offset, length: j["length"].as_u64().expect("length"), extents }
}

fn descriptor_to_json(d: &Descriptor) -> Json {
    json!({
        "function": d.function,
        "args": fields_to_json(&d.args),
        "inputs": d.inputs.iter().map(object_to_json).collect::<Vec<_>>(),
        "outputs": d.outputs.iter().map(object_to_json).collect::<Vec<_>>(),
        "result": d.result.as_ref().map(object_to_json),
    })
}

fn descriptor_from_json(j: &Json) -> Descriptor {
    let objects = |key: &str| j[key].as_array().expect("objects").iter().map(object_from_json).collect();
    Descriptor {
        function: j["function"].as_str().expect("function").to_owned(),
        args: fields_from_json(&j["args"]),
        inputs: objects("inputs"),
        outputs: objects("outputs"),
        result: j.get("result").filter(|r| !r.is_null()).map(object_from_json),
    }
}

fn result_to_json(r: &ExecResult) -> Json {
    json!({ "records": r.records.iter().map(|rec| fields_to_json(rec)).collect::<Vec<_>>() })
}

fn result_from_json(j: &Json) -> ExecResult {
    ExecResult { records: j["records"].as_array().expect("records").iter().map(fields_from_json).collect() }
}

/// The variant name of a decode error, e.g. `Truncated`.
fn error_kind(e: &DecodeError) -> String {
    let debug = format!("{e:?}");
    debug.split([' ', '{', '(']).next().unwrap_or_default().to_owned()
}

// ---------------------------------------------------------------------------------------
// The vectors.

fn obj(length: u64, extents: Vec<Extent>) -> VirtualObject {
    VirtualObject { offset: 0, length, extents }
}

fn minimal_crc32c() -> Descriptor {
    Descriptor::new("crc32c", vec![obj(1000, vec![Extent::data(2048, 2)])])
}

fn grep_fragmented() -> Descriptor {
    // A 10000-byte file in four pieces: 8 sectors of data, a 4-sector hole, 7 sectors at an
    // odd sector address (not 4 KiB aligned), and a 1-sector unwritten tail.
    let input = obj(10000, vec![Extent::data(4096, 8), Extent::zero(4), Extent::data(10007, 7), Extent::zero(1)]);
    let mut d = Descriptor::new("grep", vec![input]);
    d.args.push(("pattern".into(), Value::Str("foo".into())));
    d.args.push(("ignore_case".into(), Value::Bool(true)));
    d.args.push(("max_count".into(), Value::U64(100)));
    d
}

fn zstd_with_output() -> Descriptor {
    let input = obj(65536, vec![Extent::data(8192, 128)]);
    let output = obj(70000, vec![Extent::data(16384, 100), Extent::data(20000, 37)]);
    let mut d = Descriptor::new("zstd", vec![input]);
    d.args.push(("level".into(), Value::U64(3)));
    d.outputs.push(output);
    d
}

fn empty_object() -> Descriptor {
    Descriptor::new("sha256", vec![obj(0, vec![])])
}

fn all_value_types() -> Descriptor {
    let mut d = Descriptor::new("x-test_1", vec![obj(512, vec![Extent::data(0, 1)]), obj(0, vec![])]);
    d.args = vec![
        ("u".into(), Value::U64(u64::MAX)),
        ("i".into(), Value::I64(-2)),
        ("s".into(), Value::Str("héllo, wörld".into())),
        ("b".into(), Value::Bytes(vec![0x00, 0xff, 0x10])),
        ("t".into(), Value::Bool(false)),
        ("l".into(), Value::U64List(vec![1, 0x1_0000_0000, u64::MAX])),
        ("empty_str".into(), Value::Str(String::new())),
        ("empty_list".into(), Value::U64List(vec![])),
    ];
    d
}

fn set(bytes: &mut [u8], at: usize, with: &[u8]) {
    bytes[at..at + with.len()].copy_from_slice(with);
}

/// Rewrites the total-length field after the caller changed the length.
fn fix_total(bytes: &mut [u8]) {
    let total = u32::try_from(bytes.len()).unwrap().to_le_bytes();
    set(bytes, 8, &total);
}

/// Offset of the first argument's value tag: header, function name, key length, key.
fn first_value_at(d: &Descriptor) -> usize {
    32 + d.function.len() + 1 + d.args[0].0.len()
}

/// Offset of the first object's header, for a descriptor with no arguments.
fn first_object_at(d: &Descriptor) -> usize {
    assert!(d.args.is_empty());
    32 + d.function.len()
}

fn valid_descriptors() -> Vec<(&'static str, Descriptor)> {
    vec![
        ("crc32c-minimal", minimal_crc32c()),
        ("grep-fragmented", grep_fragmented()),
        ("zstd-output", zstd_with_output()),
        ("empty-object", empty_object()),
        ("all-value-types", all_value_types()),
        ("grep-result-object", grep_result_object()),
    ]
}

/// EXEC over a fabric: the result goes to a result object instead of inline.
fn grep_result_object() -> Descriptor {
    let mut d = grep_fragmented();
    d.result = Some(obj(64 << 10, vec![Extent::data(1 << 20, 128)]));
    d
}

/// (name, bytes, expected error substring)
fn invalid_descriptors() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let min = minimal_crc32c();
    let min_bytes = min.encode();
    let obj_at = first_object_at(&min);
    let extent_at = obj_at + 16;
    let mut v = Vec::new();

    let mut b = min_bytes.clone();
    set(&mut b, 0, b"ISCX");
    v.push(("bad-magic", b, "bad magic"));

    let mut b = min_bytes.clone();
    set(&mut b, 4, &2u16.to_le_bytes());
    v.push(("bad-version", b, "unsupported version 2"));

    let mut b = min_bytes.clone();
    set(&mut b, 6, &24u16.to_le_bytes());
    v.push(("bad-header-length", b, "invalid header length at byte 6"));

    v.push(("truncated-header", min_bytes[..10].to_vec(), "truncated: total length at byte 8"));

    let mut b = min_bytes.clone();
    set(&mut b, 8, &(u32::try_from(min_bytes.len()).unwrap() + 1).to_le_bytes());
    v.push(("total-length-mismatch", b, "invalid total length at byte 8"));

    let mut b = min_bytes.clone();
    b.push(0);
    v.push(("appended-byte", b, "invalid total length at byte 8"));

    let mut b = min_bytes.clone();
    b[12] = 1;
    v.push(("nonzero-reserved-header", b, "invalid reserved bytes at byte 12"));

    let mut b = min_bytes.clone();
    b[22] = 0x02;
    v.push(("unknown-flag", b, "invalid flags at byte 22"));

    let mut b = min_bytes.clone();
    b[22] = 0x01;
    v.push(("result-flag-without-outputs", b, "the result-object flag needs at least one output object"));

    let mut b = min_bytes.clone();
    b[extent_at + 13] = 0x80;
    v.push(("nonzero-reserved-extent", b, "invalid reserved bytes at byte 67"));

    let mut b = min_bytes.clone();
    b.extend_from_slice(&[0; 4]);
    fix_total(&mut b);
    v.push(("trailing-bytes", b, "4 unexpected trailing bytes after byte 70"));

    v.push(("no-inputs", Descriptor::new("crc32c", vec![]).encode(), "invalid input count at byte 18"));

    let mut d = minimal_crc32c();
    d.function = "CRC32C".into();
    v.push(("bad-function-name", d.encode(), "invalid function name at byte 32"));

    let mut d = minimal_crc32c();
    d.function = String::new();
    v.push(("empty-function-name", d.encode(), "invalid function name at byte 16"));

    let mut d = minimal_crc32c();
    d.function = "a".repeat(33);
    v.push(("long-function-name", d.encode(), "invalid function name at byte 16"));

    let mut d = minimal_crc32c();
    d.args.push(("Seed".into(), Value::U64(0)));
    v.push(("bad-argument-key", d.encode(), "invalid argument key at byte 39"));

    let mut d = minimal_crc32c();
    d.args.push(("seed".into(), Value::U64(0)));
    let mut b = d.encode();
    b[first_value_at(&d)] = 7;
    v.push(("unknown-value-tag", b, "unknown value tag 7 at byte 43"));

    let mut d = minimal_crc32c();
    d.args.push(("flag".into(), Value::Bool(true)));
    let mut b = d.encode();
    b[first_value_at(&d) + 1] = 2;
    v.push(("bool-not-0-or-1", b, "invalid bool value at byte 44"));

    let mut d = minimal_crc32c();
    d.args.push(("name".into(), Value::Str("ab".into())));
    let mut b = d.encode();
    set(&mut b, first_value_at(&d) + 5, &[0xff, 0xfe]);
    v.push(("string-not-utf8", b, "string value at byte 43 is not valid UTF-8"));

    let mut d = minimal_crc32c();
    d.args.push(("name".into(), Value::Str("a".into())));
    let mut b = d.encode();
    set(&mut b, first_value_at(&d) + 1, &65537u32.to_le_bytes());
    v.push(("string-over-limit", b, "too many string value: 65537 (limit 65536)"));

    let mut d = minimal_crc32c();
    d.args.push(("pattern".into(), Value::Str("a".into())));
    d.args.push(("pattern".into(), Value::Str("b".into())));
    v.push(("duplicate-argument-key", d.encode(), "duplicate key \"pattern\""));

    let mut d = minimal_crc32c();
    d.args = (0..33).map(|i| (format!("k{i}"), Value::Bool(true))).collect();
    v.push(("too-many-arguments", d.encode(), "too many arguments: 33 (limit 32)"));

    let d = Descriptor::new("wc", vec![obj(0, vec![]); 65]);
    v.push(("too-many-inputs", d.encode(), "too many input objects: 65 (limit 64)"));

    let mut d = zstd_with_output();
    d.outputs = vec![obj(0, vec![]); 9];
    v.push(("too-many-outputs", d.encode(), "too many output objects: 9 (limit 8)"));

    let mut b = grep_fragmented().encode();
    b.truncate(b.len() - 8);
    fix_total(&mut b);
    v.push(("truncated-extent-list", b, "truncated: extent list at byte 101 needs 64 bytes, only 56 left"));

    let mut b = min_bytes.clone();
    set(&mut b, obj_at + 8, &1_000_000u32.to_le_bytes());
    v.push(("extent-count-beyond-bytes", b, "truncated: extent list at byte 54 needs 16000000 bytes, only 16 left"));

    let mut b = min_bytes.clone();
    set(&mut b, obj_at + 8, &u32::MAX.to_le_bytes());
    v.push(("extent-count-over-limit", b, "too many extents in one object: 4294967295 (limit 1048576)"));

    let mut d = minimal_crc32c();
    d.inputs[0] = obj(0, vec![Extent::data(2048, 0)]);
    v.push(("zero-sector-extent", d.encode(), "invalid extent sectors at byte 62: must be at least 1"));

    let mut d = minimal_crc32c();
    d.inputs[0] = obj(512, vec![Extent { kind: ExtentKind::Zero, start_sector: 5, sectors: 1 }]);
    v.push(("zero-extent-with-start", d.encode(), "invalid extent start at byte 54: must be 0 for a zero extent"));

    let mut b = min_bytes.clone();
    b[extent_at + 12] = 2;
    v.push(("bad-extent-kind", b, "invalid extent kind at byte 66: must be 0 (data) or 1 (zero), found 2"));

    let mut d = minimal_crc32c();
    d.inputs[0].length = 1025;
    v.push(("length-exceeds-extents", d.encode(), "invalid object length at byte 38: 1025 bytes but extents cover only 1024"));

    let mut d = minimal_crc32c();
    d.inputs[0] = obj((1 << 48) + 1, vec![Extent::data(0, u32::MAX)]);
    v.push(("object-length-over-limit", d.encode(), "too many object length bytes: 281474976710657 (limit 281474976710656)"));

    let mut d = zstd_with_output();
    d.outputs[0].extents.push(Extent::zero(4));
    v.push(("zero-extent-in-output", d.encode(), "output objects cannot have zero extents"));

    v
}

fn sample_result() -> ExecResult {
    // sha256 of the empty input, then a grep record.
    let digest = hex::decode("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855").unwrap();
    ExecResult {
        records: vec![
            vec![("digest".into(), Value::Bytes(digest)), ("bytes".into(), Value::U64(0))],
            vec![
                ("matches".into(), Value::U64(2)),
                ("line_numbers".into(), Value::U64List(vec![3, 17])),
                ("first_match".into(), Value::Str("foo bar".into())),
                ("truncated".into(), Value::Bool(false)),
            ],
        ],
    }
}

fn all_vectors() -> Vec<Vector> {
    let mut out = Vec::new();
    for (name, d) in valid_descriptors() {
        let bytes = d.encode();
        let entry = json!({
            "name": name, "file": format!("{name}.hex"), "kind": "descriptor", "valid": true,
            "descriptor": descriptor_to_json(&d),
        });
        out.push(Vector { name, bytes, entry });
    }
    for (name, bytes, error) in invalid_descriptors() {
        let e = Descriptor::decode(&bytes, &Limits::default()).expect_err(name);
        assert!(e.to_string().contains(error), "{name}: {e} does not contain {error:?}");
        let entry = json!({
            "name": name, "file": format!("{name}.hex"), "kind": "descriptor", "valid": false,
            "error": error, "error_kind": error_kind(&e),
        });
        out.push(Vector { name, bytes, entry });
    }
    let r = sample_result();
    out.push(Vector {
        name: "result-digest-grep",
        bytes: r.encode(),
        entry: json!({
            "name": "result-digest-grep", "file": "result-digest-grep.hex", "kind": "result", "valid": true,
            "result": result_to_json(&r),
        }),
    });
    let mut b = r.encode();
    b.truncate(b.len() - 1);
    let e = ExecResult::decode(&b).expect_err("truncated result");
    out.push(Vector {
        name: "result-truncated",
        bytes: b,
        entry: json!({
            "name": "result-truncated", "file": "result-truncated.hex", "kind": "result", "valid": false,
            "error": "truncated: bool value", "error_kind": error_kind(&e),
        }),
    });
    out
}

/// Lowercase hex, 64 characters (32 bytes) a line, newline-terminated.
fn to_hex_file(bytes: &[u8]) -> String {
    let hex = hex::encode(bytes);
    let mut s = String::new();
    for line in hex.as_bytes().chunks(64) {
        s.push_str(std::str::from_utf8(line).unwrap());
        s.push('\n');
    }
    s
}

fn from_hex_file(text: &str) -> Vec<u8> {
    let joined: String = text.split_whitespace().collect();
    hex::decode(joined).expect("vector file is hex")
}

// ---------------------------------------------------------------------------------------
// Tests.

#[test]
fn committed_vectors_match_the_encoder() {
    let dir = vectors_dir();
    let vectors = all_vectors();
    let index = Json::Array(vectors.iter().map(|v| v.entry.clone()).collect());
    if regenerating() {
        fs::create_dir_all(&dir).unwrap();
        for old in fs::read_dir(&dir).unwrap() {
            let path = old.unwrap().path();
            if path.extension().is_some_and(|e| e == "hex") {
                fs::remove_file(path).unwrap();
            }
        }
        for v in &vectors {
            fs::write(dir.join(format!("{}.hex", v.name)), to_hex_file(&v.bytes)).unwrap();
        }
        fs::write(dir.join("vectors.json"), serde_json::to_string_pretty(&index).unwrap() + "\n").unwrap();
        return;
    }
    let hint = "regenerate with INSITU_REGEN_VECTORS=1 cargo test -p insitu-proto --test vectors";
    let committed: Json = serde_json::from_str(&fs::read_to_string(dir.join("vectors.json")).expect(hint)).unwrap();
    assert_eq!(committed, index, "docs/vectors/vectors.json is stale; {hint}");
    for v in &vectors {
        let text = fs::read_to_string(dir.join(format!("{}.hex", v.name))).unwrap_or_else(|_| panic!("{}: {hint}", v.name));
        assert_eq!(from_hex_file(&text), v.bytes, "{}.hex is stale; {hint}", v.name);
    }
}

/// Checks the committed files alone, as an independent implementation would.
#[test]
fn committed_vectors_decode_as_described() {
    if regenerating() {
        return; // the files are being rewritten concurrently
    }
    let dir = vectors_dir();
    let index: Json = serde_json::from_str(&fs::read_to_string(dir.join("vectors.json")).unwrap()).unwrap();
    let entries = index.as_array().unwrap();
    assert!(entries.len() >= 20);
    for entry in entries {
        let name = entry["name"].as_str().unwrap();
        let bytes = from_hex_file(&fs::read_to_string(dir.join(entry["file"].as_str().unwrap())).unwrap());
        let valid = entry["valid"].as_bool().unwrap();
        let outcome = match entry["kind"].as_str().unwrap() {
            "descriptor" => Descriptor::decode(&bytes, &Limits::default()).map(|d| {
                if valid {
                    assert_eq!(d, descriptor_from_json(&entry["descriptor"]), "{name}");
                    assert_eq!(d.encode(), bytes, "{name}: re-encoding differs");
                }
            }),
            "result" => ExecResult::decode(&bytes).map(|r| {
                if valid {
                    assert_eq!(r, result_from_json(&entry["result"]), "{name}");
                    assert_eq!(r.encode(), bytes, "{name}: re-encoding differs");
                }
            }),
            other => panic!("{name}: unknown kind {other}"),
        };
        match (valid, outcome) {
            (true, Ok(())) => {}
            (true, Err(e)) => panic!("{name}: valid vector fails to decode: {e}"),
            (false, Ok(())) => panic!("{name}: invalid vector decodes"),
            (false, Err(e)) => {
                let want = entry["error"].as_str().unwrap();
                assert!(e.to_string().contains(want), "{name}: {e} does not contain {want:?}");
                assert_eq!(error_kind(&e), entry["error_kind"].as_str().unwrap(), "{name}");
            }
        }
    }
}

/// The names the brief and the spec promise exist.
#[test]
fn required_vectors_exist() {
    let names: Vec<&str> = all_vectors().iter().map(|v| v.name).collect();
    for required in [
        "crc32c-minimal",
        "grep-fragmented",
        "zstd-output",
        "empty-object",
        "bad-magic",
        "bad-version",
        "truncated-header",
        "truncated-extent-list",
        "total-length-mismatch",
        "nonzero-reserved-header",
        "unknown-value-tag",
        "duplicate-argument-key",
        "zero-sector-extent",
        "length-exceeds-extents",
        "zero-extent-in-output",
        "bad-function-name",
        "no-inputs",
        "extent-count-beyond-bytes",
        "result-digest-grep",
    ] {
        assert!(names.contains(&required), "missing vector {required}");
    }
}

/// The annotated dumps in docs/compute-descriptor.md are the vectors they name.
///
/// A dump follows a line `<!-- dump: NAME -->` inside a code block, one field a line as
/// `OFFSET: xx xx ... | comment`; the bytes of consecutive lines must be the vector's bytes.
#[test]
fn annotated_dumps_in_spec_match_vectors() {
    let spec = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/compute-descriptor.md")).unwrap();
    let vectors = all_vectors();
    let mut checked = Vec::new();
    let mut lines = spec.lines();
    while let Some(line) = lines.next() {
        let Some(name) = line.strip_prefix("<!-- dump: ").and_then(|r| r.strip_suffix(" -->")) else { continue };
        let want = &vectors.iter().find(|v| v.name == name).unwrap_or_else(|| panic!("no vector {name}")).bytes;
        let mut dumped = Vec::new();
        for line in lines.by_ref().skip_while(|l| l.starts_with("```")) {
            let Some((off, rest)) = line.split_once(": ") else { break };
            let Ok(off) = usize::from_str_radix(off, 16) else { break };
            assert_eq!(off, dumped.len(), "{name}: dump line at {off:#x} is out of sequence");
            let hex = rest.split('|').next().unwrap();
            dumped.extend(hex.split_whitespace().map(|b| u8::from_str_radix(b, 16).unwrap()));
        }
        assert_eq!(&dumped, want, "the dump of {name} in docs/compute-descriptor.md is out of date");
        checked.push(name);
    }
    assert!(checked.contains(&"grep-fragmented") && checked.contains(&"result-digest-grep"), "{checked:?}");
}
