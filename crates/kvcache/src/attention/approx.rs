// SPDX-License-Identifier: Apache-2.0
//! SparF's approximate pass in f32: each token's score over a few components of K, the
//! softmax of a row of them, and sums over pages.
//!
//! These numbers only rank pages and tokens, and weigh the mean of V by the mass of the
//! kept tokens; none of them enters an output's arithmetic otherwise, so f32's seven
//! digits are more than the ranking needs (InstInfer's engine scores in f16). The exact
//! pass that follows stays in f64. In f32 the vector registers hold twice the lanes, and
//! a pass that scores every token of the context costs about what the exact pass over
//! the kept eighth does. A score beyond f32's range (products of elements above 10^19,
//! which no f16 page holds) makes its row's softmax NaN, and that row then weighs no
//! page: the other rows rank them, ties to the lower page, as a split's page masses in
//! f32 on the wire always did. The exact pass over the pages read is f64 and unaffected.
//!
//! Every loop here is elementwise or sums into [`LANES`] independent accumulators, so
//! the compiler vectorises it without reordering an operation: each kernel is compiled
//! for the baseline and again with AVX2, the copy chosen at run time, and both give the
//! same bits (Rust never fuses a multiply and an add on its own).

/// Independent accumulators of a sum: one AVX2 register of f32.
const LANES: usize = 8;

use super::kernels::dispatched;

dispatched! {
    /// `acc[t] += w_0 · x_0[t]`, then `acc[t] += w_1 · x_1[t]`, … for the `(w_i, x_i)` of
    /// `terms`, each `x_i` as long as `acc`: a token's score summed over the components in
    /// the order given, a block of tokens at a time, held in registers over every term.
    fn axpy_terms / axpy_terms_baseline(acc: &mut [f32], terms: &[(f32, &[f32])]) {
        const BLOCK: usize = 4 * LANES;
        for (_, x) in terms {
            assert_eq!(x.len(), acc.len(), "each term as long as the sum");
        }
        let whole = acc.len() / BLOCK * BLOCK;
        for (i, a) in acc[..whole].chunks_exact_mut(BLOCK).enumerate() {
            let mut v = [0f32; BLOCK];
            v.copy_from_slice(a);
            for (w, x) in terms {
                let x = &x[i * BLOCK..(i + 1) * BLOCK];
                for l in 0..BLOCK {
                    v[l] += w * x[l];
                }
            }
            a.copy_from_slice(&v);
        }
        for (w, x) in terms {
            acc[whole..].iter_mut().zip(&x[whole..]).for_each(|(y, v)| *y += w * v);
        }
    }
}

dispatched! {
    /// `x[i] *= factor` for every element.
    fn scale / scale_baseline(x: &mut [f32], factor: f32) {
        x.iter_mut().for_each(|v| *v *= factor);
    }
}

dispatched! {
    /// The largest element (−∞ for none; a NaN may be passed over).
    fn max / max_baseline(x: &[f32]) -> f32 {
        let mut lanes = [f32::NEG_INFINITY; LANES];
        let mut chunks = x.chunks_exact(LANES);
        for c in &mut chunks {
            for l in 0..LANES {
                lanes[l] = if c[l] > lanes[l] { c[l] } else { lanes[l] };
            }
        }
        chunks.remainder().iter().chain(&lanes).copied().fold(f32::NEG_INFINITY, f32::max)
    }
}

dispatched! {
    /// The sum of the elements, element `i` into accumulator `i mod LANES`, the
    /// accumulators added pairwise, then the elements past the last whole `LANES`.
    fn sum / sum_baseline(x: &[f32]) -> f32 {
        let mut lanes = [0f32; LANES];
        let mut chunks = x.chunks_exact(LANES);
        for c in &mut chunks {
            for l in 0..LANES {
                lanes[l] += c[l];
            }
        }
        let l = &lanes;
        let whole = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
        chunks.remainder().iter().fold(whole, |s, v| s + v)
    }
}

dispatched! {
    /// `x[i] = exp(x[i] - max)` for every element, by [`exp_nonpositive`].
    fn exp_shift / exp_shift_baseline(x: &mut [f32], max: f32) {
        x.iter_mut().for_each(|v| *v = exp_nonpositive(*v - max));
    }
}

/// In-place softmax of `x`. The largest value is subtracted first, so nothing overflows.
pub(super) fn softmax(x: &mut [f32]) {
    exp_shift(x, max(x));
    let inv = 1.0 / sum(x);
    scale(x, inv);
}

/// `log Σ exp(x_i)`, with `x` left holding `exp(x_i - max(x))`; −∞ for no elements.
pub(super) fn log_sum_exp(x: &mut [f32]) -> f64 {
    let m = max(x);
    if m == f32::NEG_INFINITY {
        return f64::NEG_INFINITY;
    }
    exp_shift(x, m);
    f64::from(m) + f64::from(sum(x)).ln()
}

/// Below this, `exp(x)` is under f32's smallest normal number and [`exp_nonpositive`]
/// gives 0: next to a largest weight of 1, nothing a softmax sums can tell the difference.
const EXP_MIN: f32 = -87.0;
/// `ln 2` in two parts, the high one with 9 significant bits, so that `n · LN2_HI` is exact
/// for every `|n| <= 126` (Cody and Waite).
const LN2_HI: f32 = f32::from_bits(0x3f31_8000); // 0.693359375
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5 · 2^23: adding and subtracting it rounds an f32 to an integer.
const ROUND: f32 = 12_582_912.0;
/// `1/k!` for `k = 0, 1, …, 7`.
const TAYLOR: [f32; 8] = [1.0, 1.0, 0.5, 1.0 / 6.0, 1.0 / 24.0, 1.0 / 120.0, 1.0 / 720.0, 1.0 / 5040.0];

/// `exp(x)` for `x <= 0` in f32 (NaN stays NaN), in plain multiplies and adds so that a
/// loop of it vectorises: `x = n·ln 2 + r` with `|r| <= ln 2 / 2`, `exp(r)` by its Taylor
/// series to `r^7` (the next term is below 2^-27 of the sum, under half an f32 unit), and
/// `2^n` written into the exponent bits.
#[inline(always)]
fn exp_nonpositive(x: f32) -> f32 {
    let clamped = if x < EXP_MIN { EXP_MIN } else { x };
    let shifted = clamped * std::f32::consts::LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = (clamped - n * LN2_HI) - n * LN2_LO;
    let c = &TAYLOR;
    let r2 = r * r;
    let pair = |k: usize| c[k] + c[k + 1] * r;
    let p = (pair(0) + pair(2) * r2) + (pair(4) + pair(6) * r2) * (r2 * r2);
    // The low bits of `shifted` hold n (-126 <= n <= 0 here), two's complement.
    let n_int = shifted.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    let two_n = f32::from_bits(((n_int + 127) as u32) << 23);
    if x < EXP_MIN {
        0.0
    } else {
        p * two_n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn exp_nonpositive_is_within_two_f32_units_of_the_exact_value() {
        for i in 0..=1_000_000u32 {
            let x = -(i as f32) * (EXP_MIN.abs() / 1_000_000.0);
            let want = f64::from(x).exp();
            let got = f64::from(exp_nonpositive(x));
            // Two units in the last place of an f32 near `want`.
            assert!((got - want).abs() <= 2.0 * want * f64::from(f32::EPSILON), "exp({x}) = {got}, not {want}");
        }
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(-0.0), 1.0);
        assert_eq!(exp_nonpositive(EXP_MIN - 0.01), 0.0);
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
        assert!(exp_nonpositive(f32::NAN).is_nan());
    }

    #[test]
    fn every_copy_of_a_kernel_gives_the_same_bits_as_plain_loops() {
        let mut x = 0.3f32;
        let mut next = move || {
            x = (x * 3.7 + 0.13).fract();
            x - 0.5
        };
        for n in [0, 1, 7, 8, 9, 32, 63, 64, 65, 2051] {
            let xs: Vec<Vec<f32>> = (0..5).map(|_| (0..n).map(|_| next()).collect()).collect();
            let terms: Vec<(f32, &[f32])> = xs.iter().map(|x| (next() * 4.0, x.as_slice())).collect();
            let start: Vec<f32> = (0..n).map(|_| next()).collect();
            let mut want = start.clone();
            for (w, x) in &terms {
                want.iter_mut().zip(*x).for_each(|(y, v)| *y += w * v);
            }
            let (mut got, mut plain) = (start.clone(), start.clone());
            axpy_terms(&mut got, &terms);
            axpy_terms_baseline(&mut plain, &terms);
            assert_eq!(bits(&got), bits(&want), "n = {n}");
            assert_eq!(bits(&plain), bits(&want), "n = {n}");

            let logits: Vec<f32> = start.iter().map(|v| v * 300.0).collect();
            let (mut a, mut b) = (logits.clone(), logits.clone());
            let m = max(&logits);
            assert_eq!(m, logits.iter().copied().fold(f32::NEG_INFINITY, f32::max));
            assert_eq!(m.to_bits(), max_baseline(&logits).to_bits());
            exp_shift(&mut a, m);
            exp_shift_baseline(&mut b, m);
            assert_eq!(bits(&a), bits(&b), "n = {n}");
            assert_eq!(bits(&a), bits(&logits.iter().map(|v| exp_nonpositive(v - m)).collect::<Vec<_>>()), "n = {n}");
            assert_eq!(sum(&a).to_bits(), sum_baseline(&a).to_bits(), "n = {n}");
        }
    }

    #[test]
    fn softmax_sums_to_one_and_log_sum_exp_is_the_log_of_the_sum() {
        let mut x = vec![100.0f32, 99.0, -1000.0, 98.5];
        let lse = log_sum_exp(&mut x.clone());
        let want = 100.0 + (1.0 + (-1f64).exp() + (-1.5f64).exp()).ln();
        assert!((lse - want).abs() < 1e-6, "{lse} vs {want}");
        softmax(&mut x);
        assert!((x.iter().map(|&v| f64::from(v)).sum::<f64>() - 1.0).abs() < 1e-6);
        assert!((x[0] / x[1] - 1f32.exp()).abs() < 1e-5 && x[2] == 0.0);
        assert_eq!(log_sum_exp(&mut []), f64::NEG_INFINITY);
        assert_eq!(log_sum_exp(&mut [f32::NEG_INFINITY; 3]), f64::NEG_INFINITY);
    }
}
