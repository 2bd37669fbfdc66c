// SPDX-License-Identifier: Apache-2.0
//! The inner loops of attention, vectorised (by the compiler, or by hand where it does not), and top-k.
//!
//! Products of two f32 values are exact in f64, so a dot product of f32 rows accumulated in
//! f64 loses only the rounding of the additions; eight independent accumulators let the
//! loop use vector registers (f64 addition is not reassociated by the compiler on its own).
//!
//! Each kernel is compiled twice on x86-64: for the baseline (SSE2, two f64 lanes) and
//! for AVX2 (four lanes), chosen at run time by what the CPU has, so one build runs
//! everywhere and uses the wider registers where they exist. Both copies do the same
//! operations in the same order lane by lane (Rust never fuses a multiply and an add on
//! its own), so they give the same bits.

use std::cmp::Ordering;

/// Defines `pub(super) fn $name` from one body, also kept as `$baseline` (the body as the
/// baseline target compiles it); on x86-64 the body is compiled again with AVX2 enabled,
/// and each call of `$name` takes that copy when the CPU has AVX2.
///
/// With `<$simd>`, the body is generic over `$simd: `[`Simd`]: the baseline copy uses
/// [`Plain`]'s loops and the AVX2 copy `avx2::Avx2`'s. Without, the body is plain loops the
/// compiler vectorises on its own (the f32 kernels of `approx`).
macro_rules! dispatched {
    ($(#[$doc:meta])* fn $name:ident / $baseline:ident <$simd:ident> ($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        dispatched!(@dispatch $(#[$doc])* $name ($($arg: $ty),*) $(-> $ret)?, $baseline::<avx2::Avx2>, $baseline::<Plain>);

        /// The body of the kernel of the same name without the `_baseline`, generic over
        /// the loops it is built from (inlined into each copy).
        #[inline(always)]
        fn $baseline<$simd: Simd>($($arg: $ty),*) $(-> $ret)? $body
    };
    ($(#[$doc:meta])* fn $name:ident / $baseline:ident ($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        dispatched!(@dispatch $(#[$doc])* $name ($($arg: $ty),*) $(-> $ret)?, $baseline, $baseline);

        /// The body of the kernel of the same name without the `_baseline`, inlined into
        /// each copy.
        #[inline(always)]
        fn $baseline($($arg: $ty),*) $(-> $ret)? $body
    };
    (@dispatch $(#[$doc:meta])* $name:ident ($($arg:ident: $ty:ty),*) $(-> $ret:ty)?, $avx2_body:path, $plain_body:path) => {
        $(#[$doc])*
        pub(super) fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    $avx2_body($($arg),*)
                }
                if std::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2, checked just above.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $plain_body($($arg),*)
        }
    };
}
pub(super) use dispatched;

/// The two loops whose vectorised form the compiler does not find on its own: a block of
/// dot products (it keeps the eight accumulators of a row in scalar registers) and the
/// exponentials of a row. [`Plain`] writes them as plain loops; `avx2::Avx2` with AVX2
/// intrinsics that do the same operations in the same order, lane by lane, so both give the
/// same bits.
trait Simd {
    /// `out[r] = q[r] · k` for `R` rows, each summed in [`LANES`] accumulators (element `i`
    /// into accumulator `i mod LANES`, the elements past the last whole [`LANES`] into a
    /// tail), added by [`sum_lanes`], then the tail.
    fn dot_block<const R: usize>(q: [&[f64]; R], k: &[f32], out: &mut [f64]);
    /// `x[i] = exp_nonpositive(x[i] - max)` for every element.
    fn exp_shift(x: &mut [f64], max: f64);
}

/// [`Simd`] in plain loops.
struct Plain;

impl Simd for Plain {
    #[inline(always)]
    fn dot_block<const R: usize>(q: [&[f64]; R], k: &[f32], out: &mut [f64]) {
        let kc = k.chunks_exact(LANES);
        let mut acc = [[0.0f64; LANES]; R];
        let mut tail = [0.0f64; R];
        for r in 0..R {
            debug_assert_eq!(q[r].len(), k.len());
            let qr = q[r].chunks_exact(LANES).remainder();
            for (a, b) in qr.iter().zip(kc.remainder()) {
                tail[r] += a * f64::from(*b);
            }
        }
        for (i, b) in kc.enumerate() {
            let base = i * LANES;
            for l in 0..LANES {
                let x = f64::from(b[l]);
                for r in 0..R {
                    acc[r][l] += q[r][base + l] * x;
                }
            }
        }
        for r in 0..R {
            out[r] = sum_lanes(&acc[r]) + tail[r];
        }
    }

    #[inline(always)]
    fn exp_shift(x: &mut [f64], max: f64) {
        for v in x.iter_mut() {
            *v = exp_nonpositive(*v - max);
        }
    }
}

/// Independent accumulators of [`dot`]: two AVX2 vectors or four SSE2 ones of f64.
const LANES: usize = 8;

dispatched! {
    /// `q · k`, q already widened to f64, accumulated in f64.
    fn dot / dot_baseline<S>(q: &[f64], k: &[f32]) -> f64 {
        let mut out = [0.0];
        S::dot_block::<1>([q], k, &mut out);
        out[0]
    }
}

dispatched! {
    /// `out[r] = q_r · k` for the rows `q_r` of `q`, up to four rows at a time so that each
    /// element of `k` is loaded and widened once per block (grouped-query attention). Every
    /// row is summed exactly as [`dot`] sums it, so a row's result does not depend on the
    /// rows beside it.
    fn dot_rows / dot_rows_baseline<S>(q: &[f64], k: &[f32], out: &mut [f64]) {
        dot_rows_into::<S>(q, k, out);
    }
}

dispatched! {
    /// `out[r * stride + t] = scale · (q_r · k_t)` for the rows `q_r` of `q` and the
    /// consecutive rows `k_t` of `k` (`head_dim` elements each): [`dot_rows`] for a run of
    /// tokens in one call, each product summed as [`dot`] sums it.
    fn score_run / score_run_baseline<S>(q: &[f64], k: &[f32], head_dim: usize, scale: f64, out: &mut [f64], stride: usize) {
        let rows = q.len() / head_dim;
        let mut dots = vec![0f64; rows];
        for (t, kt) in k.chunks_exact(head_dim).enumerate() {
            dot_rows_into::<S>(q, kt, &mut dots);
            for (r, d) in dots.iter().enumerate() {
                out[r * stride + t] = d * scale;
            }
        }
    }
}

/// The body of [`dot_rows`]: blocks of up to four rows, with LANES accumulators each, so
/// that four rows use eight of the sixteen AVX2 registers (the SSE2 copy may spill some).
#[inline(always)]
fn dot_rows_into<S: Simd>(q: &[f64], k: &[f32], out: &mut [f64]) {
    let hd = k.len();
    let mut rows = q.chunks_exact(hd);
    let mut at = 0;
    while at < out.len() {
        let n = (out.len() - at).min(4);
        let o = &mut out[at..at + n];
        match n {
            4 => S::dot_block::<4>(std::array::from_fn(|_| rows.next().unwrap()), k, o),
            3 => S::dot_block::<3>(std::array::from_fn(|_| rows.next().unwrap()), k, o),
            2 => S::dot_block::<2>(std::array::from_fn(|_| rows.next().unwrap()), k, o),
            _ => S::dot_block::<1>(std::array::from_fn(|_| rows.next().unwrap()), k, o),
        }
        at += n;
    }
}

/// The sum of independent accumulators, pairwise in a fixed order.
#[inline(always)]
fn sum_lanes(a: &[f64; LANES]) -> f64 {
    ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]))
}

dispatched! {
    /// `acc += Σ_i w[i] * x_i` over the `w.len()` consecutive rows `x_i` of `x`, four rows a
    /// pass, so each accumulator is loaded and stored once per four rows.
    fn axpy_rows / axpy_rows_baseline<S>(acc: &mut [f64], w: &[f64], x: &[f32]) {
        let hd = acc.len();
        let mut ws = w.chunks_exact(4);
        let mut xs = x.chunks_exact(4 * hd);
        for (w, x) in (&mut ws).zip(&mut xs) {
            let (x0, rest) = x.split_at(hd);
            let (x1, rest) = rest.split_at(hd);
            let (x2, x3) = rest.split_at(hd);
            for i in 0..hd {
                acc[i] += (w[0] * f64::from(x0[i]) + w[1] * f64::from(x1[i])) + (w[2] * f64::from(x2[i]) + w[3] * f64::from(x3[i]));
            }
        }
        for (w, x) in ws.remainder().iter().zip(xs.remainder().chunks_exact(hd)) {
            axpy_baseline::<S>(acc, *w, x);
        }
    }
}

dispatched! {
    /// `acc += a * x`, x widened to f64.
    fn axpy / axpy_baseline<S>(acc: &mut [f64], a: f64, x: &[f32]) {
        debug_assert_eq!(acc.len(), x.len());
        for (y, v) in acc.iter_mut().zip(x) {
            *y += a * f64::from(*v);
        }
    }
}

dispatched! {
    /// Replaces `x` by `exp(x - max(x))` and returns the sum of the new values and `max(x)`:
    /// the softmax is `x / sum`. Subtracting the maximum keeps every exponent at most 0, so nothing
    /// overflows and the largest weight is exactly 1. The exponentials are
    /// [`exp_nonpositive`]'s, four lanes at a time with AVX2, where libm's `exp` is a call
    /// per element (a SparF step scores every token of the context).
    fn exp_shifted / exp_shifted_baseline<S>(x: &mut [f64]) -> (f64, f64) {
        // LANES independent maxima and sums, so that no reduction's chain of dependent
        // steps sets the pace; the exponentials in a loop of their own, which vectorises.
        let mut maxes = [f64::NEG_INFINITY; LANES];
        let mut chunks = x.chunks_exact(LANES);
        for c in &mut chunks {
            for l in 0..LANES {
                maxes[l] = maxes[l].max(c[l]);
            }
        }
        let max = chunks.remainder().iter().chain(&maxes).copied().fold(f64::NEG_INFINITY, f64::max);
        S::exp_shift(x, max);
        let mut sums = [0.0; LANES];
        let mut chunks = x.chunks_exact(LANES);
        for c in &mut chunks {
            for l in 0..LANES {
                sums[l] += c[l];
            }
        }
        let tail = chunks.remainder().iter().fold(0.0, |t, v| t + v);
        (sum_lanes(&sums) + tail, max)
    }
}

/// Below this, `exp(x)` is subnormal (under 2.2e-308) and [`exp_nonpositive`] gives 0: next
/// to a largest weight of 1, nothing a softmax sums can tell the difference.
const EXP_MIN: f64 = -708.0;

/// `1/k!` for `k = 0, 1, …, 13`: the Taylor coefficients of `exp`.
const EXP_TAYLOR: [f64; 14] = {
    let mut c = [1.0; 14];
    let mut k = 2;
    while k < 14 {
        c[k] = c[k - 1] / k as f64;
        k += 1;
    }
    c
};

const LOG2E: f64 = std::f64::consts::LOG2_E;
/// `ln 2` in fdlibm's split: the high part has 32 significant bits, so `n · LN2_HI` is exact.
const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
/// 1.5 · 2^52: adding and subtracting it rounds to an integer.
const ROUND: f64 = 6_755_399_441_055_744.0;

/// `exp(x)` for `x <= 0` (NaN stays NaN), to within 2 units in the last place of libm's,
/// in plain multiplies and adds, so that a loop of it vectorises and every compiled copy
/// gives the same bits: `x = n·ln 2 + r` with `|r| <= ln 2 / 2` (Cody and Waite: `ln 2` in
/// two parts, the first exact times any `n` here), `exp(r)` by its Taylor series to `r^13`
/// (the next term is below 2^-57 of the sum), and `2^n` written into the exponent bits.
/// `n` is rounded with the 1.5·2^52 trick, which plain adds do.
#[inline(always)]
fn exp_nonpositive(x: f64) -> f64 {
    let clamped = if x < EXP_MIN { EXP_MIN } else { x };
    let shifted = clamped * LOG2E + ROUND;
    let n = shifted - ROUND;
    let r = (clamped - n * LN2_HI) - n * LN2_LO;
    // Estrin's scheme: pairs, then pairs of pairs, …, so the chain of dependent steps is
    // 5 long rather than Horner's 13.
    let a = &EXP_TAYLOR;
    let (r2, r4) = (r * r, r * r * (r * r));
    let pair = |k: usize| a[k] + a[k + 1] * r;
    let low = (pair(0) + pair(2) * r2) + (pair(4) + pair(6) * r2) * r4;
    let high = (pair(8) + pair(10) * r2) + pair(12) * r4;
    let p = low + high * (r4 * r4);
    // The low bits of `shifted` hold n (|n| <= 1022 here), two's complement.
    let n_int = shifted.to_bits().wrapping_sub(ROUND.to_bits()) as i64;
    let scale = f64::from_bits(((n_int + 1023) as u64) << 52);
    if x < EXP_MIN {
        0.0
    } else {
        p * scale
    }
}

/// [`Simd`] with AVX2 intrinsics: four f64 lanes a register, so a row's [`LANES`]
/// accumulators are two registers, and the exponentials four at a time.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Simd, EXP_MIN, EXP_TAYLOR, LANES, LN2_HI, LN2_LO, LOG2E, ROUND};
    use std::arch::x86_64::*;

    /// Only named by the AVX2 copies of the kernels, which run once the CPU is known to
    /// have AVX2 (see `dispatched!`).
    pub(super) struct Avx2;

    impl Simd for Avx2 {
        #[inline(always)]
        fn dot_block<const R: usize>(q: [&[f64]; R], k: &[f32], out: &mut [f64]) {
            // SAFETY: this type is used only where the CPU has AVX2.
            unsafe { dot_block::<R>(q, k, out) }
        }

        #[inline(always)]
        fn exp_shift(x: &mut [f64], max: f64) {
            // SAFETY: as above.
            unsafe { exp_shift(x, max) }
        }
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn dot_block<const R: usize>(q: [&[f64]; R], k: &[f32], out: &mut [f64]) {
        let whole = k.len() / LANES * LANES;
        let mut tail = [0.0f64; R];
        for r in 0..R {
            assert_eq!(q[r].len(), k.len(), "one query element for each key element");
            for (a, b) in q[r][whole..].iter().zip(&k[whole..]) {
                tail[r] += a * f64::from(*b);
            }
        }
        // Accumulators 0-3 and 4-7 of each row.
        let mut lo = [_mm256_setzero_pd(); R];
        let mut hi = [_mm256_setzero_pd(); R];
        let mut i = 0;
        while i < whole {
            // SAFETY: `i + 8 <= whole <= len` for `k` and for every row of `q` (checked
            // above); the loads take unaligned addresses.
            unsafe {
                let x0 = _mm256_cvtps_pd(_mm_loadu_ps(k.as_ptr().add(i)));
                let x1 = _mm256_cvtps_pd(_mm_loadu_ps(k.as_ptr().add(i + 4)));
                for r in 0..R {
                    let qr = q[r].as_ptr().add(i);
                    lo[r] = _mm256_add_pd(lo[r], _mm256_mul_pd(_mm256_loadu_pd(qr), x0));
                    hi[r] = _mm256_add_pd(hi[r], _mm256_mul_pd(_mm256_loadu_pd(qr.add(4)), x1));
                }
            }
            i += LANES;
        }
        for r in 0..R {
            // `sum_lanes`: ((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7)).
            let pairs = _mm256_add_pd(lo[r], hi[r]);
            let (low, high) = (_mm256_castpd256_pd128(pairs), _mm256_extractf128_pd::<1>(pairs));
            let (a, b) = (_mm_add_sd(low, _mm_unpackhi_pd(low, low)), _mm_add_sd(high, _mm_unpackhi_pd(high, high)));
            out[r] = _mm_cvtsd_f64(_mm_add_sd(a, b)) + tail[r];
        }
    }

    /// `exp_nonpositive` four lanes at a time, operation for operation (no fused
    /// multiply-add), then the elements past the last four one by one.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn exp_shift(x: &mut [f64], max: f64) {
        let splat = _mm256_set1_pd;
        let (maxv, floor, round) = (splat(max), splat(EXP_MIN), splat(ROUND));
        let c: [__m256d; 14] = std::array::from_fn(|k| splat(EXP_TAYLOR[k]));
        let mut chunks = x.chunks_exact_mut(4);
        for v in &mut chunks {
            // SAFETY: four f64 in the chunk, unaligned load and store.
            let xv = _mm256_sub_pd(unsafe { _mm256_loadu_pd(v.as_ptr()) }, maxv);
            // `if x < EXP_MIN { EXP_MIN } else { x }`, a NaN kept: max_pd gives its second
            // operand when either is NaN.
            let clamped = _mm256_max_pd(floor, xv);
            let shifted = _mm256_add_pd(_mm256_mul_pd(clamped, splat(LOG2E)), round);
            let n = _mm256_sub_pd(shifted, round);
            let r = _mm256_sub_pd(_mm256_sub_pd(clamped, _mm256_mul_pd(n, splat(LN2_HI))), _mm256_mul_pd(n, splat(LN2_LO)));
            let r2 = _mm256_mul_pd(r, r);
            let r4 = _mm256_mul_pd(_mm256_mul_pd(r, r), _mm256_mul_pd(r, r));
            let pair = |k: usize| _mm256_add_pd(c[k], _mm256_mul_pd(c[k + 1], r));
            let (add, mul) = (_mm256_add_pd, _mm256_mul_pd);
            let low = add(add(pair(0), mul(pair(2), r2)), mul(add(pair(4), mul(pair(6), r2)), r4));
            let high = add(add(pair(8), mul(pair(10), r2)), mul(pair(12), r4));
            let p = add(low, mul(high, mul(r4, r4)));
            let n_int = _mm256_sub_epi64(_mm256_castpd_si256(shifted), _mm256_castpd_si256(round));
            let scale = _mm256_castsi256_pd(_mm256_slli_epi64::<52>(_mm256_add_epi64(n_int, _mm256_set1_epi64x(1023))));
            let below = _mm256_cmp_pd::<_CMP_LT_OQ>(xv, floor);
            let e = _mm256_blendv_pd(mul(p, scale), _mm256_setzero_pd(), below);
            // SAFETY: as the load.
            unsafe { _mm256_storeu_pd(v.as_mut_ptr(), e) };
        }
        for v in chunks.into_remainder() {
            *v = super::exp_nonpositive(*v - max);
        }
    }
}

/// [`exp_shifted`], also returning the log of the unshifted sum (`max + ln(sum)`): the
/// log-sum-exp a partial result reports.
pub(super) fn exp_shifted_lse(x: &mut [f64]) -> (f64, f64) {
    let (sum, max) = exp_shifted(x);
    (sum, max + sum.ln())
}

/// Fills `idx` with the `k` best of `0..n` under `first` (an order in which the better
/// index comes first; it must be total, so ties are broken by index), in ascending index
/// order. Linear time: a selection, then a sort of the `k` chosen only.
pub(super) fn top_k(n: usize, k: usize, idx: &mut Vec<usize>, first: impl Fn(usize, usize) -> Ordering) {
    idx.clear();
    idx.extend(0..n);
    if k < n {
        if k > 0 {
            idx.select_nth_unstable_by(k - 1, |&a, &b| first(a, b));
        }
        idx.truncate(k);
    }
    idx.sort_unstable();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_and_axpy_match_plain_f64_loops() {
        for n in [0, 1, 7, 8, 9, 64, 131] {
            let q: Vec<f64> = (0..n).map(|i| (i as f64 * 0.37).sin()).collect();
            let k: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let plain: f64 = q.iter().zip(&k).map(|(a, b)| a * f64::from(*b)).sum();
            assert!((dot(&q, &k) - plain).abs() <= 1e-12 * (1.0 + plain.abs()), "n = {n}");
            let mut acc = q.clone();
            axpy(&mut acc, 0.5, &k);
            for i in 0..n {
                assert_eq!(acc[i], q[i] + 0.5 * f64::from(k[i]));
            }
        }
    }

    #[test]
    fn row_blocked_kernels_match_one_row_at_a_time() {
        for hd in [1, 7, 16, 18] {
            for rows in 1..10 {
                let q: Vec<f64> = (0..rows * hd).map(|i| (i as f64 * 0.71).sin()).collect();
                let x: Vec<f32> = (0..rows * hd).map(|i| (i as f32 * 0.13).cos()).collect();
                let mut got = vec![0.0; rows];
                dot_rows(&q, &x[..hd], &mut got);
                for (g, qr) in got.iter().zip(q.chunks(hd)) {
                    assert_eq!(g.to_bits(), dot(qr, &x[..hd]).to_bits(), "dot_rows {hd} {rows}");
                }
                // A run of `rows` tokens, into a row-major table of 2 + rows columns at 2.
                let stride = rows + 2;
                let mut table = vec![-1.0; rows * stride];
                score_run(&q, &x, hd, 0.3, &mut table[2..], stride);
                for (r, qr) in q.chunks(hd).enumerate() {
                    assert_eq!(&table[r * stride..r * stride + 2], [-1.0, -1.0], "score_run writes only its run");
                    for (t, kt) in x.chunks(hd).enumerate() {
                        assert_eq!(table[r * stride + 2 + t].to_bits(), (dot(qr, kt) * 0.3).to_bits(), "score_run {hd} {rows}");
                    }
                }
                let w = &q[..rows];
                let mut got = vec![0.25; hd];
                let mut want = got.clone();
                axpy_rows(&mut got, w, &x);
                for (w, xr) in w.iter().zip(x.chunks(hd)) {
                    axpy(&mut want, *w, xr);
                }
                for (g, w) in got.iter().zip(&want) {
                    assert!((g - w).abs() <= 1e-13 * (1.0 + w.abs()), "axpy_rows {hd} {rows}");
                }
            }
        }
    }

    #[test]
    fn every_copy_of_a_kernel_gives_the_same_bits() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        };
        for hd in [1, 3, 8, 17, 64, 128] {
            for rows in 1..10 {
                let q: Vec<f64> = (0..rows * hd).map(|_| next()).collect();
                let x: Vec<f32> = (0..rows * hd).map(|_| next() as f32).collect();
                let (mut a, mut b) = (vec![0.0; rows], vec![0.0; rows]);
                dot_rows(&q, &x[..hd], &mut a);
                dot_rows_baseline::<Plain>(&q, &x[..hd], &mut b);
                assert_eq!(a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), b.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
                assert_eq!(dot(&q[..hd], &x[..hd]).to_bits(), dot_baseline::<Plain>(&q[..hd], &x[..hd]).to_bits());
                let (mut a, mut b) = (vec![0.0; rows * rows], vec![0.0; rows * rows]);
                score_run(&q, &x, hd, 0.7, &mut a, rows);
                score_run_baseline::<Plain>(&q, &x, hd, 0.7, &mut b, rows);
                assert_eq!(a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), b.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
                let (mut a, mut b) = (q[..hd].to_vec(), q[..hd].to_vec());
                axpy_rows(&mut a, &q[..rows], &x);
                axpy_rows_baseline::<Plain>(&mut b, &q[..rows], &x);
                axpy(&mut a, 0.3, &x[..hd]);
                axpy_baseline::<Plain>(&mut b, 0.3, &x[..hd]);
                assert_eq!(a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{hd} {rows}");
                let mut a: Vec<f64> = q.iter().map(|v| v * 800.0).collect();
                let mut b = a.clone();
                let (sa, sb) = (exp_shifted(&mut a), exp_shifted_baseline::<Plain>(&mut b));
                assert_eq!((sa.0.to_bits(), sa.1.to_bits()), (sb.0.to_bits(), sb.1.to_bits()));
                assert_eq!(a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{hd} {rows}");
            }
        }
    }

    /// Units in the last place between `a` and `b` (finite, same sign).
    fn ulps(a: f64, b: f64) -> u64 {
        a.to_bits().abs_diff(b.to_bits())
    }

    #[test]
    fn exp_nonpositive_is_libms_within_two_ulps_down_to_its_floor() {
        let mut worst = 0;
        for i in 0..=2_000_000u64 {
            let x = -(i as f64) * (EXP_MIN.abs() / 2_000_000.0);
            worst = worst.max(ulps(exp_nonpositive(x), x.exp()));
        }
        for x in [0.0, -0.0, -1e-300, -f64::MIN_POSITIVE, -0.5 * std::f64::consts::LN_2, -std::f64::consts::LN_2, -1.0, -20.0, EXP_MIN] {
            worst = worst.max(ulps(exp_nonpositive(x), x.exp()));
        }
        assert!(worst <= 2, "{worst} ulps");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(EXP_MIN - 1e-9), 0.0);
        assert_eq!(exp_nonpositive(f64::NEG_INFINITY), 0.0);
        assert!(exp_nonpositive(f64::NAN).is_nan());
    }

    #[test]
    fn top_k_breaks_ties_by_index_and_returns_ascending() {
        let s = [0.5f64, 0.9, 0.5, 0.1, 0.9];
        let by = |a: usize, b: usize| s[b].total_cmp(&s[a]).then(a.cmp(&b));
        let mut idx = Vec::new();
        top_k(s.len(), 3, &mut idx, by);
        assert_eq!(idx, [0, 1, 4]);
        top_k(s.len(), 9, &mut idx, by);
        assert_eq!(idx, [0, 1, 2, 3, 4]);
        top_k(s.len(), 0, &mut idx, by);
        assert!(idx.is_empty());
    }
}
