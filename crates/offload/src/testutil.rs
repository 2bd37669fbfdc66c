// SPDX-License-Identifier: Apache-2.0
//! Helpers shared by the kernels' unit tests: running a kernel over in-memory data at
//! several chunk sizes, and running the standard tool it is checked against.

use crate::{Args, InputStream, KernelError, OutputSink, Record, Registry, SliceInput, Value, VecSink};
use std::io::Write;
use std::process::{Command, Stdio};

/// Chunk sizes every kernel is run at; `usize::MAX` delivers the whole object at once.
pub(crate) const CHUNKS: [usize; 5] = [1, 7, 4096, 65536, usize::MAX];

/// Runs kernel `name` with `args` over `inputs`, cut into `chunk`-byte chunks, with one
/// output sink of `out_cap` bytes when `out_cap` is `Some`. Returns the records and the
/// output bytes.
pub(crate) fn run_kernel(
    name: &str,
    args: &[(String, Value)],
    inputs: &[&[u8]],
    chunk: usize,
    out_cap: Option<u64>,
) -> Result<(Vec<Record>, Vec<u8>), KernelError> {
    let registry = Registry::standard();
    let kernel = registry.get(name).expect("kernel registered");
    let job = kernel.prepare(&Args::new(args))?;
    let mut streams: Vec<SliceInput<'_>> = inputs.iter().map(|d| SliceInput::new(d, chunk)).collect();
    let mut ins: Vec<&mut dyn InputStream> = streams.iter_mut().map(|s| s as &mut dyn InputStream).collect();
    let mut sink = out_cap.map(VecSink::new);
    let mut outs: Vec<&mut dyn OutputSink> = sink.iter_mut().map(|s| s as &mut dyn OutputSink).collect();
    let records = job.run(&mut ins, &mut outs)?;
    Ok((records, sink.map(|s| s.data).unwrap_or_default()))
}

/// The field `key` of `record`.
pub(crate) fn field<'r>(record: &'r Record, key: &str) -> &'r Value {
    &record.iter().find(|(k, _)| k == key).unwrap_or_else(|| panic!("no field {key}")).1
}

/// The field `key` of `record`, which must be a `U64`.
pub(crate) fn u64_field(record: &Record, key: &str) -> u64 {
    match field(record, key) {
        Value::U64(v) => *v,
        other => panic!("{key} is {other:?}"),
    }
}

/// Runs `program args` with `stdin` as input under `LC_ALL=C` and returns its stdout, or
/// `None` (with a note on stderr) when the program is not installed.
pub(crate) fn tool(program: &str, args: &[&str], stdin: &[u8]) -> Option<Vec<u8>> {
    let mut child = match Command::new(program).args(args).env("LC_ALL", "C").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("skipping comparison with {program}: {e}");
            return None;
        }
    };
    let mut pipe = child.stdin.take().expect("stdin piped");
    let data = stdin.to_vec();
    // Write from another thread so a tool that writes before reading all input can't block us.
    let writer = std::thread::spawn(move || {
        let _ = pipe.write_all(&data);
    });
    let out = child.wait_with_output().expect("tool runs");
    writer.join().expect("writer thread");
    Some(out.stdout)
}

/// A string argument.
pub(crate) fn s(key: &str, v: &str) -> (String, Value) {
    (key.into(), Value::Str(v.into()))
}

/// Deterministic pseudo-random bytes (xorshift), drawn from `alphabet`.
pub(crate) fn random_bytes(seed: u64, len: usize, alphabet: &[u8]) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            alphabet[(x % alphabet.len() as u64) as usize]
        })
        .collect()
}

/// `data` cut at `cuts` (clamped to its length, in any order) into consecutive pieces.
pub(crate) fn pieces(data: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| (*c).min(data.len())).collect();
    cuts.sort_unstable();
    let mut out = Vec::new();
    let mut at = 0;
    for c in cuts.into_iter().chain([data.len()]) {
        out.push(data[at..c].to_vec());
        at = c;
    }
    out
}
