// SPDX-License-Identifier: Apache-2.0
//! Partial (split-K) attention: parts over disjoint token sets, merged by their
//! log-sum-exp, equal attention over the union.

use super::testutil::{assert_close, attention, dense_ref, dot, layout, MemHead, Rng, SHAPES};
use super::{attend, attend_partial, Method};
use crate::{AttendStats, HeadPages};

/// Merges parts `(out, lse)` of one query row as the host does.
fn merge(parts: &[(Vec<f32>, f64)], hd: usize) -> Vec<f64> {
    let top = parts.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = parts.iter().map(|p| (p.1 - top).exp()).collect();
    let total: f64 = w.iter().sum();
    (0..hd).map(|d| parts.iter().zip(&w).map(|(p, w)| w * f64::from(p.0[d])).sum::<f64>() / total).collect()
}

/// The rows of `h` at `tokens`, as a head of their own.
fn slice(h: &MemHead, tokens: &[usize]) -> MemHead {
    let hd = h.layout.head_dim;
    let pick = |x: &[f32]| tokens.iter().flat_map(|&t| x[t * hd..(t + 1) * hd].iter().copied()).collect();
    MemHead::new(h.layout, pick(&h.k), pick(&h.v))
}

#[test]
fn dense_parts_merge_to_dense_over_every_token() {
    let mut rng = Rng::new(21);
    for shape in SHAPES {
        let l = layout(shape);
        let tokens = 5 * l.tokens_per_page + 3;
        let h = MemHead::random(l, tokens, &mut rng);
        let q = rng.vec(2 * l.head_dim);
        let scale = 0.3;
        // Three targets, whole pages dealt in turn, as the host splits a sequence.
        let owner = |t: usize| (t / l.tokens_per_page) % 3;
        let parts: Vec<MemHead> = (0..3).map(|i| slice(&h, &(0..tokens).filter(|&t| owner(t) == i).collect::<Vec<_>>())).collect();
        for (row, qr) in q.chunks(l.head_dim).enumerate() {
            let mut got = Vec::new();
            for p in &parts {
                let (mut out, mut lse) = (vec![0f32; q.len()], vec![0f64; 2]);
                attend_partial(p, &q, scale, Method::Dense, &mut out, &mut lse).unwrap();
                // The log-sum-exp is that of the part's scaled scores.
                let want: f64 = (0..p.tokens()).map(|t| (dot(qr, &p.k[t * l.head_dim..][..l.head_dim]) * f64::from(scale)).exp()).sum::<f64>().ln();
                assert!((lse[row] - want).abs() < 1e-9, "{shape:?}: lse {} vs {want}", lse[row]);
                got.push((out[row * l.head_dim..][..l.head_dim].to_vec(), lse[row]));
            }
            assert_close(&merge(&got, l.head_dim).iter().map(|&x| x as f32).collect::<Vec<_>>(), &dense_ref(&h, qr, f64::from(scale)), 1e-6, "merged dense");
        }
    }
}

#[test]
fn a_part_equals_the_whole_call_when_it_holds_every_token() {
    let mut rng = Rng::new(22);
    let l = layout(SHAPES[1]);
    let h = MemHead::random(l, 300, &mut rng);
    let q = rng.vec(3 * l.head_dim);
    for m in [Method::Dense, Method::SparF { r: 5, k: 40, local: 4, pages: 3, mean_v: false }, Method::SparQ { r: 3, k: 20, local: 2, mean_v: false }] {
        let mut whole = vec![0f32; q.len()];
        let stats = attend(&h, &q, 0.25, m, &mut whole).unwrap();
        let (mut out, mut lse) = (vec![0f32; q.len()], vec![0f64; 3]);
        assert_eq!(attend_partial(&h, &q, 0.25, m, &mut out, &mut lse).unwrap(), stats, "{m:?}");
        assert_eq!(out, whole, "{m:?}");
        assert!(lse.iter().all(|x| x.is_finite()), "{m:?}: {lse:?}");
    }
}

#[test]
fn a_sparse_part_reports_the_log_sum_exp_of_its_kept_tokens() {
    // Without a page cap every row keeps its own k tokens; with k = tokens - 1 exactly one
    // token is left out, and attention over the rest with its lse recombines with that
    // token's own score to the dense result.
    let mut rng = Rng::new(23);
    let l = layout(SHAPES[0]);
    let n = 40;
    let h = MemHead::random(l, n, &mut rng);
    let q = rng.vec(l.head_dim);
    let (mut out, mut lse) = (vec![0f32; q.len()], vec![0f64; 1]);
    let m = Method::SparQ { r: l.head_dim, k: n - 1, local: 0, mean_v: false };
    attend_partial(&h, &q, 0.5, m, &mut out, &mut lse).unwrap();
    // With r = head_dim the approximate scores are the exact ones: the token left out is
    // the lowest-scoring one.
    let scores: Vec<f64> = (0..n).map(|t| dot(&q, &h.k[t * l.head_dim..][..l.head_dim]) * 0.5).collect();
    let worst = (0..n).min_by(|&a, &b| scores[a].total_cmp(&scores[b])).unwrap();
    let kept: Vec<usize> = (0..n).filter(|&t| t != worst).collect();
    assert_close(&out, &attention(&h, &q, 0.5, &kept), 1e-6, "sparse part");
    let want: f64 = kept.iter().map(|&t| scores[t].exp()).sum::<f64>().ln();
    assert!((lse[0] - want).abs() < 1e-9, "lse {} vs {want}", lse[0]);
    let left = (h.v[worst * l.head_dim..][..l.head_dim].to_vec(), scores[worst]);
    assert_close(&merge(&[(out, lse[0]), left], l.head_dim).iter().map(|&x| x as f32).collect::<Vec<_>>(), &dense_ref(&h, &q, 0.5), 1e-6, "recombined");
}

#[test]
fn an_empty_part_is_empty_and_a_mean_of_v_is_refused() {
    let l = layout(SHAPES[0]);
    let empty = MemHead::new(l, Vec::new(), Vec::new());
    let q = vec![0.5f32; 2 * l.head_dim];
    let (mut out, mut lse) = (vec![1f32; q.len()], vec![0f64; 2]);
    for m in [Method::Dense, Method::SparF { r: 2, k: 4, local: 1, pages: 1, mean_v: false }] {
        assert_eq!(attend_partial(&empty, &q, 0.5, m, &mut out, &mut lse).unwrap(), AttendStats::default());
        assert!(out.iter().all(|&x| x == 0.0) && lse.iter().all(|&x| x == f64::NEG_INFINITY));
    }
    // A whole (not partial) call over an empty cache stays an error.
    assert!(attend(&empty, &q, 0.5, Method::Dense, &mut out).is_err());
    let mut rng = Rng::new(24);
    let h = MemHead::random(l, 50, &mut rng);
    let err = attend_partial(&h, &q, 0.5, Method::SparF { r: 2, k: 4, local: 1, pages: 0, mean_v: true }, &mut out, &mut lse).unwrap_err();
    assert!(err.to_string().contains("mean of V"), "{err}");
    let err = attend_partial(&h, &q, 0.5, Method::Dense, &mut out, &mut lse[..1]).unwrap_err();
    assert!(err.to_string().contains("log-sum-exp slots"), "{err}");
}
