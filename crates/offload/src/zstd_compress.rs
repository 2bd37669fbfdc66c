// SPDX-License-Identifier: Apache-2.0
//! The `zstd` kernel: compresses one object into a standard zstd frame.
//!
//! Compressing where the data lives moves fewer bytes to the host or to the next tier.
//!
//! Argument: `level` (u64, default 3, accepted 1..=19). Exactly one input and one output
//! object. The input is streamed through zstd's streaming encoder and the compressed bytes
//! go straight to the output sink. The output is a single frame that `zstd -d` decompresses
//! to the input; its header records the content size and it ends with a checksum.
//!
//! Record: `[("output_length", U64), ("input_length", U64)]`. The host must provide
//! `compress_bound(input_len) + 64` bytes of output (see [`Kernel::output_capacity`]).

use crate::stream::{unwrap_io, SinkWriter};
use crate::{check_shape, Args, InputStream, Job, Kernel, KernelError, OutputSink, Param, ParamType, Record, Value};
use std::io::Write;

/// The `zstd` kernel.
pub(crate) struct Zstd;

static PARAMS: [Param; 1] = [Param { key: "level", ty: ParamType::U64, required: false, doc: "compression level 1..=19 (default 3)" }];

/// Frame header, block headers and checksum beyond what `ZSTD_compressBound` allows for.
const MARGIN: u64 = 64;

impl Kernel for Zstd {
    fn name(&self) -> &'static str {
        "zstd"
    }
    fn summary(&self) -> &'static str {
        "compress the input into a zstd frame (with content size and checksum)"
    }
    fn params(&self) -> &'static [Param] {
        &PARAMS
    }
    fn max_inputs(&self) -> usize {
        1
    }
    fn output_count(&self) -> usize {
        1
    }
    fn output_capacity(&self, _args: &Args<'_>, input_len: u64) -> u64 {
        usize::try_from(input_len).map_or(u64::MAX, |n| zstd::zstd_safe::compress_bound(n) as u64).saturating_add(MARGIN)
    }
    fn prepare(&self, args: &Args<'_>) -> Result<Box<dyn Job>, KernelError> {
        args.check(self.params())?;
        let level = args.u64_or("level", 3);
        if !(1..=19).contains(&level) {
            return Err(KernelError::BadArgument { key: "level".into(), detail: format!("{level} is not in 1..=19") });
        }
        Ok(Box::new(ZstdJob { level: level as i32 }))
    }
}

/// A prepared `zstd` run.
struct ZstdJob {
    level: i32,
}

impl Job for ZstdJob {
    fn run(self: Box<Self>, inputs: &mut [&mut dyn InputStream], outputs: &mut [&mut dyn OutputSink]) -> Result<Vec<Record>, KernelError> {
        check_shape("zstd", inputs, outputs, Some(1), 1)?;
        let input = &mut *inputs[0];
        let sink = &mut *outputs[0];
        let input_length = compress(self.level, input, sink).map_err(unwrap_io)?;
        let output_length = sink.finish()?;
        Ok(vec![vec![("output_length".into(), Value::U64(output_length)), ("input_length".into(), Value::U64(input_length))]])
    }
}

/// Streams `input` through the encoder into `sink`; returns the bytes read.
fn compress(level: i32, input: &mut dyn InputStream, sink: &mut dyn OutputSink) -> std::io::Result<u64> {
    let mut encoder = zstd::Encoder::new(SinkWriter::new(sink), level)?;
    encoder.include_checksum(true)?;
    encoder.include_contentsize(true)?;
    // With the size pledged, the frame header carries it (and zstd checks it).
    encoder.set_pledged_src_size(Some(input.len()))?;
    let mut read = 0u64;
    while let Some(chunk) = input.next_chunk()? {
        read += chunk.len() as u64;
        encoder.write_all(chunk)?;
    }
    encoder.finish()?;
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{random_bytes, run_kernel, tool, u64_field, CHUNKS};

    fn level(l: u64) -> Vec<(String, Value)> {
        vec![("level".into(), Value::U64(l))]
    }

    fn capacity(len: u64) -> u64 {
        Zstd.output_capacity(&Args::new(&[]), len)
    }

    fn compress_all(args: &[(String, Value)], data: &[u8], chunk: usize) -> Vec<u8> {
        let (records, out) = run_kernel("zstd", args, &[data], chunk, Some(capacity(data.len() as u64))).unwrap();
        assert_eq!(u64_field(&records[0], "output_length"), out.len() as u64);
        assert_eq!(u64_field(&records[0], "input_length"), data.len() as u64);
        out
    }

    fn inputs() -> Vec<Vec<u8>> {
        let all: Vec<u8> = (0..=255).collect();
        vec![Vec::new(), b"hello hello hello hello\n".to_vec(), random_bytes(3, 200_000, b"abcde \n"), random_bytes(4, 300_000, &all)]
    }

    #[test]
    fn round_trips_through_the_library_and_the_zstd_tool() {
        for data in inputs() {
            for &chunk in &CHUNKS[1..] {
                let frame = compress_all(&[], &data, chunk);
                assert_eq!(zstd::decode_all(&frame[..]).unwrap(), data);
                let size = zstd::zstd_safe::get_frame_content_size(&frame).unwrap();
                assert_eq!(size, Some(data.len() as u64), "content size in the header");
                if let Some(out) = tool("zstd", &["-d", "-c"], &frame) {
                    assert_eq!(out, data, "zstd -d over {} bytes", data.len());
                }
            }
        }
        // Byte-at-a-time chunks on a smaller input.
        let data = random_bytes(5, 5000, b"xyz\n");
        assert_eq!(zstd::decode_all(&compress_all(&[], &data, 1)[..]).unwrap(), data);
    }

    #[test]
    fn levels() {
        let data = random_bytes(6, 100_000, b"abcdefgh\n");
        for l in [1, 3, 19] {
            assert_eq!(zstd::decode_all(&compress_all(&level(l), &data, 4096)[..]).unwrap(), data);
        }
        for l in [0, 20, 100] {
            assert!(matches!(run_kernel("zstd", &level(l), &[b"x"], 1, Some(100)), Err(KernelError::BadArgument { .. })));
        }
        let wrong_type = [crate::testutil::s("level", "3")];
        assert!(matches!(run_kernel("zstd", &wrong_type, &[b"x"], 1, Some(100)), Err(KernelError::BadArgument { .. })));
    }

    #[test]
    fn has_a_checksum() {
        let frame = compress_all(&[], b"checksummed", 4);
        // Frame header descriptor byte: bit 2 is the content-checksum flag.
        assert_ne!(frame[4] & 0b100, 0);
    }

    #[test]
    fn output_too_small() {
        let data = random_bytes(8, 50_000, &(0..=255).collect::<Vec<u8>>());
        let err = run_kernel("zstd", &[], &[&data], 4096, Some(1000)).unwrap_err();
        assert!(matches!(err, KernelError::OutputTooSmall { index: 0, capacity: 1000 }), "{err:?}");
    }

    #[test]
    fn bad_shape() {
        assert!(matches!(run_kernel("zstd", &[], &[b"a"], 1, None), Err(KernelError::BadShape(_))));
        assert!(matches!(run_kernel("zstd", &[], &[b"a", b"b"], 1, Some(100)), Err(KernelError::BadShape(_))));
    }
}
