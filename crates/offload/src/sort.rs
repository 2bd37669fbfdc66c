// SPDX-License-Identifier: Apache-2.0
//! The `sort` kernel: the input's lines sorted bytewise, identical to `LC_ALL=C sort`.
//!
//! No arguments; exactly one input and one output object. Lines are split on `'\n'` (a last
//! line without `'\n'` is still a line) and ordered by unsigned byte comparison, a line that
//! is a prefix of another first. Every output line ends with `'\n'`, the last one included;
//! an empty input gives an empty output. Record:
//! `[("output_length", U64), ("lines", U64)]`. The output needs `input_len + 1` bytes.
//!
//! Unlike the other kernels, `sort` must hold the whole input: it reads it into one buffer
//! and sorts slices of it (no allocation per line), then writes the output in 64 KiB pieces.

use crate::{check_shape, Args, InputStream, Job, Kernel, KernelError, OutputSink, Record, Value};

/// The `sort` kernel.
pub(crate) struct Sort;

/// Size of the pieces handed to the output sink.
const WRITE_BUF: usize = 64 * 1024;

impl Kernel for Sort {
    fn name(&self) -> &'static str {
        "sort"
    }
    fn summary(&self) -> &'static str {
        "sort the input's lines bytewise, like LC_ALL=C sort"
    }
    fn max_inputs(&self) -> usize {
        1
    }
    fn output_count(&self) -> usize {
        1
    }
    fn output_capacity(&self, _args: &Args<'_>, input_len: u64) -> u64 {
        input_len.saturating_add(1)
    }
    fn prepare(&self, args: &Args<'_>) -> Result<Box<dyn Job>, KernelError> {
        args.check(self.params())?;
        Ok(Box::new(SortJob))
    }
}

/// A prepared `sort` run.
struct SortJob;

impl Job for SortJob {
    fn run(self: Box<Self>, inputs: &mut [&mut dyn InputStream], outputs: &mut [&mut dyn OutputSink]) -> Result<Vec<Record>, KernelError> {
        check_shape("sort", inputs, outputs, Some(1), 1)?;
        let input = &mut *inputs[0];
        let sink = &mut *outputs[0];

        let mut data = Vec::with_capacity(usize::try_from(input.len()).unwrap_or(0));
        while let Some(chunk) = input.next_chunk()? {
            data.extend_from_slice(chunk);
        }
        let mut lines: Vec<&[u8]> = Vec::new();
        let mut start = 0;
        for end in memchr::memchr_iter(b'\n', &data) {
            lines.push(&data[start..end]);
            start = end + 1;
        }
        if start < data.len() {
            lines.push(&data[start..]);
        }
        lines.sort_unstable();

        let mut buf = Vec::with_capacity(WRITE_BUF);
        for line in &lines {
            if buf.len() + line.len() + 1 > WRITE_BUF && !buf.is_empty() {
                sink.write(&buf)?;
                buf.clear();
            }
            if line.len() + 1 > WRITE_BUF {
                sink.write(line)?;
                sink.write(b"\n")?;
            } else {
                buf.extend_from_slice(line);
                buf.push(b'\n');
            }
        }
        sink.write(&buf)?;
        let output_length = sink.finish()?;
        Ok(vec![vec![("output_length".into(), Value::U64(output_length)), ("lines".into(), Value::U64(lines.len() as u64))]])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{random_bytes, run_kernel, tool, u64_field, CHUNKS};
    use proptest::prelude::*;

    fn sort(data: &[u8], chunk: usize) -> Vec<u8> {
        let cap = Sort.output_capacity(&Args::new(&[]), data.len() as u64);
        let (records, out) = run_kernel("sort", &[], &[data], chunk, Some(cap)).unwrap();
        assert_eq!(u64_field(&records[0], "output_length"), out.len() as u64);
        assert_eq!(u64_field(&records[0], "lines"), out.iter().filter(|&&b| b == b'\n').count() as u64);
        out
    }

    fn check(data: &[u8]) {
        let ours = sort(data, usize::MAX);
        for &c in &CHUNKS[1..] {
            assert_eq!(sort(data, c), ours, "chunk {c}");
        }
        if let Some(want) = tool("sort", &[], data) {
            assert_eq!(ours, want, "input {:?}", String::from_utf8_lossy(&data[..data.len().min(60)]));
        }
    }

    #[test]
    fn small_cases() {
        assert_eq!(sort(b"", 1), b"");
        assert_eq!(sort(b"b\na\nc", 1), b"a\nb\nc\n");
        assert_eq!(sort(b"\n\n", 1), b"\n\n");
        assert_eq!(sort(b"ab\na\nb\n\xff\n\x00\nB\n", 3), b"\x00\nB\na\nab\nb\n\xff\n");
        for data in [&b""[..], b"x", b"b\na\n", b"b\r\na\r\n", b"\n", b"same\nsame\nsame"] {
            check(data);
        }
    }

    #[test]
    fn matches_system_sort() {
        let all: Vec<u8> = (0..=255).collect();
        for seed in 0..6 {
            check(&random_bytes(seed, 30_000, b"abAB \t\r\n\n\x00\x80\xff"));
            check(&random_bytes(seed + 10, 30_000, &all));
        }
        // Lines longer than the write buffer.
        let mut long = random_bytes(20, 200_000, b"xyz");
        long.extend_from_slice(b"\nxa\n");
        long.extend(random_bytes(21, 100_000, b"xyz"));
        check(&long);
    }

    #[test]
    fn output_too_small_and_bad_shape() {
        let err = run_kernel("sort", &[], &[b"b\na"], 1, Some(3)).unwrap_err();
        assert!(matches!(err, KernelError::OutputTooSmall { .. }), "{err:?}");
        assert!(run_kernel("sort", &[], &[b"b\na"], 1, Some(4)).is_ok());
        assert!(matches!(run_kernel("sort", &[], &[b"a"], 1, None), Err(KernelError::BadShape(_))));
        assert!(matches!(run_kernel("sort", &[], &[], 1, Some(9)), Err(KernelError::BadShape(_))));
        let args = [crate::testutil::s("reverse", "yes")];
        assert!(matches!(run_kernel("sort", &args, &[b"a"], 1, Some(9)), Err(KernelError::BadArgument { .. })));
    }

    proptest! {
        #[test]
        fn chunking_does_not_matter(data in proptest::collection::vec(any::<u8>(), 0..2000), chunk in 1usize..300) {
            prop_assert_eq!(sort(&data, chunk), sort(&data, usize::MAX));
        }
    }
}
