// SPDX-License-Identifier: Apache-2.0
//! Checksum kernels: `crc32c`, `xxh3`, `sha256`, `blake3` and `md5`.
//!
//! Verifying an object's integrity where it is stored saves moving the object to the host
//! only to reduce it to a few bytes. All five kernels take no arguments, one or more input
//! objects and no output object, and return one record per input:
//! `[("digest", Str(lowercase hex))]`.
//!
//! | kernel   | digest                                         | equals                             |
//! |----------|------------------------------------------------|------------------------------------|
//! | `crc32c` | CRC-32C (Castagnoli), 8 hex digits             | Python `"%08x" % crc32c.crc32c(d)` |
//! | `xxh3`   | XXH3 64-bit, seed 0, 16 hex digits             | `xxhash.xxh3_64_hexdigest(d)`      |
//! | `sha256` | SHA-256, 64 hex digits                         | `sha256sum`                        |
//! | `blake3` | BLAKE3, 32-byte output, 64 hex digits          | `b3sum`                            |
//! | `md5`    | MD5, 32 hex digits                             | `md5sum`                           |
//!
//! `md5` is not for new integrity schemes; it is what object stores already record (Swift's
//! `ETag` of every stored file), so their auditors can verify where the data lives.
//!
//! One generic kernel ([`Checksum`]) serves them all; each algorithm only supplies a
//! [`Digest`] state that is fed chunk by chunk. `crc32c` is the throughput benchmark: its
//! update is a single call into the crate's hardware (SSE 4.2) implementation per chunk.

use crate::{check_shape, Args, InputStream, Job, Kernel, KernelError, OutputSink, Record, Value};
use std::marker::PhantomData;

/// The kernels of this module, for [`crate::Registry::standard`].
pub(crate) fn kernels() -> Vec<Box<dyn Kernel>> {
    vec![
        Box::new(Checksum::<Crc32c>::new()),
        Box::new(Checksum::<Xxh3>::new()),
        Box::new(Checksum::<Sha256>::new()),
        Box::new(Checksum::<Blake3>::new()),
        Box::new(Checksum::<Md5>::new()),
    ]
}

/// A streaming digest algorithm.
pub(crate) trait Digest: Default + 'static {
    /// The kernel name.
    const NAME: &'static str;
    /// The one-line summary.
    const SUMMARY: &'static str;
    /// Feeds the next bytes.
    fn update(&mut self, data: &[u8]);
    /// The digest of all bytes fed, as lowercase hex.
    fn hex(self) -> String;
}

/// CRC-32C state.
#[derive(Default)]
pub(crate) struct Crc32c(u32);

impl Digest for Crc32c {
    const NAME: &'static str = "crc32c";
    const SUMMARY: &'static str = "CRC-32C (Castagnoli) of each input, as 8 hex digits";
    #[inline]
    fn update(&mut self, data: &[u8]) {
        self.0 = crc32c::crc32c_append(self.0, data);
    }
    fn hex(self) -> String {
        format!("{:08x}", self.0)
    }
}

/// XXH3-64 state (seed 0).
#[derive(Default)]
pub(crate) struct Xxh3(Box<xxhash_rust::xxh3::Xxh3>);

impl Digest for Xxh3 {
    const NAME: &'static str = "xxh3";
    const SUMMARY: &'static str = "XXH3 64-bit hash (seed 0) of each input, as 16 hex digits";
    fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }
    fn hex(self) -> String {
        format!("{:016x}", self.0.digest())
    }
}

/// SHA-256 state.
#[derive(Default)]
pub(crate) struct Sha256(sha2::Sha256);

impl Digest for Sha256 {
    const NAME: &'static str = "sha256";
    const SUMMARY: &'static str = "SHA-256 of each input, as 64 hex digits (like sha256sum)";
    fn update(&mut self, data: &[u8]) {
        sha2::Digest::update(&mut self.0, data);
    }
    fn hex(self) -> String {
        hex::encode(sha2::Digest::finalize(self.0))
    }
}

/// BLAKE3 state.
#[derive(Default)]
pub(crate) struct Blake3(Box<blake3::Hasher>);

impl Digest for Blake3 {
    const NAME: &'static str = "blake3";
    const SUMMARY: &'static str = "BLAKE3 hash of each input, as 64 hex digits (like b3sum)";
    fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }
    fn hex(self) -> String {
        self.0.finalize().to_hex().to_string()
    }
}

/// MD5 state.
#[derive(Default)]
pub(crate) struct Md5(md5::Md5);

impl Digest for Md5 {
    const NAME: &'static str = "md5";
    const SUMMARY: &'static str = "MD5 of each input, as 32 hex digits (like md5sum; what Swift's ETag records)";
    fn update(&mut self, data: &[u8]) {
        md5::Digest::update(&mut self.0, data);
    }
    fn hex(self) -> String {
        hex::encode(md5::Digest::finalize(self.0))
    }
}

/// Digests one whole input stream.
pub(crate) fn digest<D: Digest>(input: &mut dyn InputStream) -> Result<String, KernelError> {
    let mut state = D::default();
    while let Some(chunk) = input.next_chunk()? {
        state.update(chunk);
    }
    Ok(state.hex())
}

/// The checksum kernel for algorithm `D`.
pub(crate) struct Checksum<D>(PhantomData<fn() -> D>);

impl<D: Digest> Checksum<D> {
    fn new() -> Self {
        Checksum(PhantomData)
    }
}

impl<D: Digest> Kernel for Checksum<D> {
    fn name(&self) -> &'static str {
        D::NAME
    }
    fn summary(&self) -> &'static str {
        D::SUMMARY
    }
    fn prepare(&self, args: &Args<'_>) -> Result<Box<dyn Job>, KernelError> {
        args.check(self.params())?;
        Ok(Box::new(ChecksumJob::<D>(PhantomData)))
    }
}

/// A prepared checksum run.
struct ChecksumJob<D>(PhantomData<fn() -> D>);

impl<D: Digest> Job for ChecksumJob<D> {
    fn run(self: Box<Self>, inputs: &mut [&mut dyn InputStream], outputs: &mut [&mut dyn OutputSink]) -> Result<Vec<Record>, KernelError> {
        check_shape(D::NAME, inputs, outputs, None, 0)?;
        inputs.iter_mut().map(|input| Ok(vec![("digest".to_string(), Value::Str(digest::<D>(&mut **input)?))])).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{random_bytes, run_kernel, tool, CHUNKS};
    use proptest::prelude::*;

    fn digests(kernel: &str, inputs: &[&[u8]], chunk: usize) -> Vec<String> {
        let (records, _) = run_kernel(kernel, &[], inputs, chunk, None).unwrap();
        records
            .iter()
            .map(|r| {
                assert_eq!(r.len(), 1);
                match &r[0] {
                    (k, Value::Str(s)) if k == "digest" => s.clone(),
                    other => panic!("unexpected field {other:?}"),
                }
            })
            .collect()
    }

    fn one(kernel: &str, data: &[u8]) -> String {
        let all: Vec<String> = CHUNKS.iter().map(|&c| digests(kernel, &[data], c)[0].clone()).collect();
        assert!(all.windows(2).all(|w| w[0] == w[1]), "{kernel}: digest depends on chunk size: {all:?}");
        all[0].clone()
    }

    fn ramp() -> Vec<u8> {
        (0..40).flat_map(|_| 0..=255u8).collect()
    }

    /// Vectors computed with Python's `crc32c` and `xxhash` packages.
    #[test]
    fn crc32c_and_xxh3_vectors() {
        let cases: [(&[u8], &str, &str); 4] = [
            (b"", "00000000", "2d06800538d394c2"),
            (b"abc", "364b3fb7", "78af5f94892f3950"),
            (b"123456789", "e3069283", "72dcb18b67a17dff"),
            (&ramp(), "bd846cd7", "c03d2231ab9348f3"),
        ];
        for (data, crc, xxh) in cases {
            assert_eq!(one("crc32c", data), crc);
            assert_eq!(one("xxh3", data), xxh);
        }
    }

    #[test]
    fn sha256_and_blake3_vectors() {
        assert_eq!(one("sha256", b""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(one("sha256", b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(one("md5", b""), "d41d8cd98f00b204e9800998ecf8427e");
        assert_eq!(one("md5", b"abc"), "900150983cd24fb0d6963f7d28e17f72");
        assert_eq!(one("blake3", b""), "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262");
        assert_eq!(one("blake3", b"abc"), "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85");
    }

    #[test]
    fn matches_sha256sum_and_b3sum() {
        let inputs = [b"".to_vec(), b"hello\n".to_vec(), ramp(), random_bytes(1, 300_000, &ramp()[..256])];
        for data in &inputs {
            for (kernel, program) in [("sha256", "sha256sum"), ("blake3", "b3sum"), ("md5", "md5sum")] {
                let Some(out) = tool(program, &[], data) else { continue };
                let want = String::from_utf8(out).unwrap();
                let want = want.split_whitespace().next().unwrap().to_string();
                assert_eq!(one(kernel, data), want, "{kernel} over {} bytes", data.len());
            }
        }
    }

    #[test]
    fn one_record_per_input() {
        let got = digests("crc32c", &[b"123456789", b"", b"abc"], 4);
        assert_eq!(got, ["e3069283", "00000000", "364b3fb7"]);
    }

    #[test]
    fn refuses_arguments_and_bad_shape() {
        let args = [crate::testutil::s("x", "y")];
        assert!(matches!(run_kernel("sha256", &args, &[b"a"], 1, None), Err(KernelError::BadArgument { .. })));
        assert!(matches!(run_kernel("xxh3", &[], &[], 1, None), Err(KernelError::BadShape(_))));
        assert!(matches!(run_kernel("blake3", &[], &[b"a"], 1, Some(10)), Err(KernelError::BadShape(_))));
    }

    proptest! {
        #[test]
        fn chunking_does_not_matter(data in proptest::collection::vec(any::<u8>(), 0..3000), chunk in 1usize..600) {
            for k in ["crc32c", "xxh3", "sha256", "blake3", "md5"] {
                prop_assert_eq!(&digests(k, &[&data], chunk)[0], &digests(k, &[&data], usize::MAX)[0]);
            }
        }
    }
}
