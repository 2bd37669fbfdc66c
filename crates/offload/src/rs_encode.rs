// SPDX-License-Identifier: Apache-2.0
//! The `rs-encode` kernel: Reed–Solomon parity of an object, computed where it is stored.
//!
//! Erasure-coding data that a drive already holds (CSDPLAN-EC's workload) moves only the
//! parity, not the data. The codes are Intel ISA-L's, the library Swift's `isa_l_rs_vand`
//! and `isa_l_rs_cauchy` policies use through liberasurecode, called for its SIMD
//! implementation rather than rewritten: the parity equals what Swift stores.
//!
//! Arguments: `k` and `m` (u64, required: data and parity fragments, `1 <= k, m` and
//! `k + m <= 32`), `unit` (u64, default 262144: bytes of each fragment per stripe, at most
//! 64 MiB), `matrix` (`vand`, default, or `cauchy`). Exactly one input and one output object.
//!
//! The input is a sequence of stripes of `k * unit` bytes (the last one zero-padded), as a
//! Swift object is a sequence of segments of `k * fragment size` bytes. For each stripe the
//! output receives its `m` parity fragments of `unit` bytes, one after the other: stripe
//! `s`, parity `p` is at `(s * m + p) * unit`. An empty input has no stripes.
//!
//! Record: `[("output_length", U64), ("stripes", U64)]`.

use crate::{check_shape, Args, InputStream, Job, Kernel, KernelError, OutputSink, Param, ParamType, Record, Value};

/// The `rs-encode` kernel.
pub(crate) struct RsEncode;

static PARAMS: [Param; 4] = [
    Param { key: "k", ty: ParamType::U64, required: true, doc: "data fragments per stripe" },
    Param { key: "m", ty: ParamType::U64, required: true, doc: "parity fragments per stripe (k + m <= 32)" },
    Param { key: "unit", ty: ParamType::U64, required: false, doc: "bytes of each fragment per stripe (default 262144)" },
    Param { key: "matrix", ty: ParamType::Str, required: false, doc: "vand (default; Swift's isa_l_rs_vand) or cauchy (isa_l_rs_cauchy)" },
];

const DEFAULT_UNIT: u64 = 256 << 10;
const MAX_UNIT: u64 = 64 << 20;
const MAX_FRAGMENTS: u64 = 32;

#[link(name = "isal")]
extern "C" {
    fn gf_gen_rs_matrix(a: *mut u8, m: i32, k: i32);
    fn gf_gen_cauchy1_matrix(a: *mut u8, m: i32, k: i32);
    fn ec_init_tables(k: i32, rows: i32, a: *mut u8, gftbls: *mut u8);
    fn ec_encode_data(len: i32, k: i32, rows: i32, gftbls: *mut u8, data: *mut *mut u8, coding: *mut *mut u8);
}

/// Which generator matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Matrix {
    Vandermonde,
    Cauchy,
}

/// ISA-L's encoder for one (k, m) code.
pub(crate) struct Encoder {
    k: usize,
    m: usize,
    tables: Vec<u8>,
}

impl Encoder {
    /// The encoder of `k` data and `m` parity fragments (`k + m <= 32`).
    pub(crate) fn new(k: usize, m: usize, matrix: Matrix) -> Encoder {
        assert!(k >= 1 && m >= 1 && k + m <= MAX_FRAGMENTS as usize, "k {k}, m {m}");
        let rows = k + m;
        let mut a = vec![0u8; rows * k];
        let mut tables = vec![0u8; 32 * k * m];
        // SAFETY: `a` holds rows * k bytes and `tables` 32 * k * m, the sizes ISA-L writes
        // for these arguments; the parity rows start at a[k * k].
        unsafe {
            match matrix {
                Matrix::Vandermonde => gf_gen_rs_matrix(a.as_mut_ptr(), rows as i32, k as i32),
                Matrix::Cauchy => gf_gen_cauchy1_matrix(a.as_mut_ptr(), rows as i32, k as i32),
            }
            ec_init_tables(k as i32, m as i32, a.as_mut_ptr().add(k * k), tables.as_mut_ptr());
        }
        Encoder { k, m, tables }
    }

    /// Writes the parity of `data` (k fragments of `unit` bytes, back to back) into
    /// `parity` (m fragments of `unit` bytes, back to back).
    pub(crate) fn encode(&mut self, data: &mut [u8], parity: &mut [u8], unit: usize) {
        assert!(data.len() == self.k * unit && parity.len() == self.m * unit && unit <= i32::MAX as usize);
        let mut d: Vec<*mut u8> = data.chunks_exact_mut(unit).map(|c| c.as_mut_ptr()).collect();
        let mut p: Vec<*mut u8> = parity.chunks_exact_mut(unit).map(|c| c.as_mut_ptr()).collect();
        // SAFETY: k data and m parity pointers, each to `unit` valid bytes that do not
        // overlap; the tables were made for this k and m.
        unsafe { ec_encode_data(unit as i32, self.k as i32, self.m as i32, self.tables.as_mut_ptr(), d.as_mut_ptr(), p.as_mut_ptr()) };
    }
}

/// Checked arguments: (k, m, unit, matrix).
fn parse(args: &Args<'_>) -> Result<(usize, usize, usize, Matrix), KernelError> {
    let bad = |key: &str, detail: String| KernelError::BadArgument { key: key.into(), detail };
    let k = args.u64_or("k", 0);
    let m = args.u64_or("m", 0);
    if k == 0 || m == 0 || k + m > MAX_FRAGMENTS {
        return Err(bad("k", format!("k = {k} and m = {m}: both must be at least 1 and k + m at most {MAX_FRAGMENTS}")));
    }
    let unit = args.u64_or("unit", DEFAULT_UNIT);
    if unit == 0 || unit > MAX_UNIT {
        return Err(bad("unit", format!("{unit} is not in 1..={MAX_UNIT}")));
    }
    let matrix = match args.str("matrix").unwrap_or("vand") {
        "vand" => Matrix::Vandermonde,
        "cauchy" => Matrix::Cauchy,
        other => return Err(bad("matrix", format!("{other:?} is neither vand nor cauchy"))),
    };
    Ok((k as usize, m as usize, unit as usize, matrix))
}

impl Kernel for RsEncode {
    fn name(&self) -> &'static str {
        "rs-encode"
    }
    fn summary(&self) -> &'static str {
        "Reed-Solomon parity of each stripe of the input (ISA-L, the codes of Swift's isa_l_rs_vand)"
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
    fn output_capacity(&self, args: &Args<'_>, input_len: u64) -> u64 {
        match parse(args) {
            Ok((k, m, unit, _)) => input_len.div_ceil((k * unit) as u64) * (m * unit) as u64,
            Err(_) => 0,
        }
    }
    fn prepare(&self, args: &Args<'_>) -> Result<Box<dyn Job>, KernelError> {
        args.check(self.params())?;
        let (k, m, unit, matrix) = parse(args)?;
        Ok(Box::new(RsEncodeJob { k, m, unit, matrix }))
    }
}

struct RsEncodeJob {
    k: usize,
    m: usize,
    unit: usize,
    matrix: Matrix,
}

impl Job for RsEncodeJob {
    fn run(self: Box<Self>, inputs: &mut [&mut dyn InputStream], outputs: &mut [&mut dyn OutputSink]) -> Result<Vec<Record>, KernelError> {
        check_shape("rs-encode", inputs, outputs, Some(1), 1)?;
        let (input, sink) = (&mut *inputs[0], &mut *outputs[0]);
        let mut encoder = Encoder::new(self.k, self.m, self.matrix);
        let mut stripe = vec![0u8; self.k * self.unit];
        let mut parity = vec![0u8; self.m * self.unit];
        let (mut filled, mut stripes) = (0usize, 0u64);
        let mut flush = |stripe: &mut [u8], filled: &mut usize| -> Result<(), KernelError> {
            stripe[*filled..].fill(0);
            encoder.encode(stripe, &mut parity, self.unit);
            sink.write(&parity)?;
            *filled = 0;
            stripes += 1;
            Ok(())
        };
        while let Some(mut chunk) = input.next_chunk()? {
            while !chunk.is_empty() {
                let n = chunk.len().min(stripe.len() - filled);
                stripe[filled..filled + n].copy_from_slice(&chunk[..n]);
                filled += n;
                chunk = &chunk[n..];
                if filled == stripe.len() {
                    flush(&mut stripe, &mut filled)?;
                }
            }
        }
        if filled > 0 {
            flush(&mut stripe, &mut filled)?;
        }
        let output_length = sink.finish()?;
        Ok(vec![vec![("output_length".into(), Value::U64(output_length)), ("stripes".into(), Value::U64(stripes))]])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{random_bytes, run_kernel, u64_field, CHUNKS};

    /// GF(2^8) multiplication with ISA-L's polynomial, x^8 + x^4 + x^3 + x^2 + 1.
    fn gf_mul(mut a: u8, mut b: u8) -> u8 {
        let mut p = 0u8;
        while b != 0 {
            if b & 1 != 0 {
                p ^= a;
            }
            let carry = a & 0x80 != 0;
            a <<= 1;
            if carry {
                a ^= 0x1d;
            }
            b >>= 1;
        }
        p
    }

    /// The parity of one stripe from first principles: row r of the Vandermonde part of
    /// `gf_gen_rs_matrix` is [1, g, g^2, ...] with g = 2^r.
    fn reference(data: &[u8], k: usize, m: usize, unit: usize) -> Vec<u8> {
        let mut out = vec![0u8; m * unit];
        let mut gen = 1u8;
        for r in 0..m {
            let mut coef = 1u8;
            for j in 0..k {
                for b in 0..unit {
                    out[r * unit + b] ^= gf_mul(coef, data[j * unit + b]);
                }
                coef = gf_mul(coef, gen);
            }
            gen = gf_mul(gen, 2);
        }
        out
    }

    fn args(k: u64, m: u64, unit: u64) -> Vec<(String, Value)> {
        vec![("k".into(), Value::U64(k)), ("m".into(), Value::U64(m)), ("unit".into(), Value::U64(unit))]
    }

    #[test]
    fn parity_equals_the_vandermonde_code_stripe_by_stripe() {
        for (k, m, unit, len) in [(4usize, 2usize, 64usize, 1000usize), (3, 2, 100, 3 * 100 * 3), (6, 3, 32, 1), (2, 1, 16, 0)] {
            let data = random_bytes(k as u64, len, &(0..=255).collect::<Vec<u8>>());
            let cap = RsEncode.output_capacity(&Args::new(&args(k as u64, m as u64, unit as u64)), len as u64);
            for &chunk in &CHUNKS[1..] {
                let (records, out) = run_kernel("rs-encode", &args(k as u64, m as u64, unit as u64), &[&data], chunk, Some(cap)).unwrap();
                let stripes = len.div_ceil(k * unit);
                assert_eq!(u64_field(&records[0], "stripes"), stripes as u64);
                assert_eq!(out.len(), stripes * m * unit);
                for s in 0..stripes {
                    let mut stripe = vec![0u8; k * unit];
                    let part = &data[s * k * unit..((s + 1) * k * unit).min(len)];
                    stripe[..part.len()].copy_from_slice(part);
                    assert_eq!(&out[s * m * unit..(s + 1) * m * unit], &reference(&stripe, k, m, unit)[..], "k {k} m {m} stripe {s}");
                }
            }
        }
    }

    #[test]
    fn cauchy_parity_differs_and_bad_arguments_are_refused() {
        let data = random_bytes(9, 4 * 64, &[1, 2, 3, 200]);
        let mut a = args(4, 2, 64);
        let (_, vand) = run_kernel("rs-encode", &a, &[&data], 7, Some(128)).unwrap();
        a.push(("matrix".into(), Value::Str("cauchy".into())));
        let (_, cauchy) = run_kernel("rs-encode", &a, &[&data], 7, Some(128)).unwrap();
        assert_ne!(vand, cauchy);
        for bad in [args(0, 2, 64), args(4, 0, 64), args(20, 13, 64), args(4, 2, 0), args(4, 2, MAX_UNIT + 1)] {
            assert!(matches!(run_kernel("rs-encode", &bad, &[&data], 7, Some(1 << 20)), Err(KernelError::BadArgument { .. })));
        }
        let mut odd = args(4, 2, 64);
        odd.push(("matrix".into(), Value::Str("xor".into())));
        assert!(matches!(run_kernel("rs-encode", &odd, &[&data], 7, Some(128)), Err(KernelError::BadArgument { .. })));
    }
}
