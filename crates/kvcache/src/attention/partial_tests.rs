// SPDX-License-Identifier: Apache-2.0
//! Partial (split-K) attention: parts over disjoint token sets, merged by their
//! log-sum-exp, equal attention over the union.

use super::testutil::{assert_close, attention, dense_ref, dot, layout, run, MemHead, Rng, SHAPES};
use super::{attend, attend_groups, attend_partial, page_log_mass, page_log_mass_reduced, reduce_queries, Method};
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

/// SparF's page choice made by a host over parts, as `sparse::attend` makes it over a
/// whole cache: the first page, the local tokens' pages, and the `budget` others of the
/// largest mass (the largest over the rows of the softmax-normalised page mass).
fn host_choice(masses: &[Vec<f64>], rows: usize, local_from: usize, budget: usize) -> Vec<usize> {
    let groups = masses.len();
    let lz: Vec<f64> = (0..rows)
        .map(|r| {
            let m = masses.iter().map(|g| g[r]).fold(f64::NEG_INFINITY, f64::max);
            m + masses.iter().map(|g| (g[r] - m).exp()).sum::<f64>().ln()
        })
        .collect();
    let mass: Vec<f64> = masses.iter().map(|g| (0..rows).map(|r| (g[r] - lz[r]).exp()).fold(0.0, f64::max)).collect();
    let mut cand: Vec<usize> = (1..local_from.min(groups)).collect();
    cand.sort_by(|&a, &b| mass[b].total_cmp(&mass[a]).then(a.cmp(&b)));
    let mut pick: Vec<usize> = cand.into_iter().take(budget).chain(std::iter::once(0)).chain(local_from..groups).collect();
    pick.sort_unstable();
    pick.dedup();
    pick
}

#[test]
fn two_phase_sparf_over_parts_reads_the_pages_and_gives_the_result_of_one_cache() {
    let mut rng = Rng::new(23);
    for shape in SHAPES {
        let l = layout(shape);
        let tpp = l.tokens_per_page;
        let tokens = 12 * tpp + 5;
        let h = MemHead::random(l, tokens, &mut rng);
        let rows = 3;
        let q = rng.vec(rows * l.head_dim);
        let scale = 0.3;
        let (r, local, budget) = (3.min(l.head_dim), tpp + 2, 4);
        let k = (budget + 3) * tpp + local; // every token of the reach, as the host sets it
        let (whole, whole_stats) = run(&h, &q, scale, Method::SparF { r, k, local, pages: budget, mean_v: false });
        let local_from = (tokens - local) / tpp;

        // Three parts, whole pages dealt in turn; each part's pages are global pages.
        let n = 3;
        let owned: Vec<Vec<usize>> = (0..n).map(|i| (0..l.token_groups(tokens)).filter(|g| g % n == i).collect()).collect();
        let parts: Vec<MemHead> = owned.iter().map(|gs| slice(&h, &gs.iter().flat_map(|&g| g * tpp..tokens.min((g + 1) * tpp)).collect::<Vec<_>>())).collect();
        let mut masses = vec![Vec::new(); l.token_groups(tokens)];
        let mut dim_reads = 0;
        for (p, gs) in parts.iter().zip(&owned) {
            let (m, stats) = page_log_mass(p, &q, scale, r).unwrap();
            dim_reads += stats.pages_read;
            assert_eq!(m.len(), rows * gs.len());
            for (j, &g) in gs.iter().enumerate() {
                masses[g] = (0..rows).map(|row| m[row * gs.len() + j]).collect();
            }
        }
        let chosen = host_choice(&masses, rows, local_from, budget);
        let mut got = vec![Vec::new(); rows];
        let mut token_pages = 0;
        for (p, gs) in parts.iter().zip(&owned) {
            let local_groups: Vec<usize> = gs.iter().enumerate().filter(|(_, g)| chosen.contains(g)).map(|(j, _)| j).collect();
            let (mut out, mut lse) = (vec![0f32; q.len()], vec![0f64; rows]);
            let stats = attend_groups(p, &q, scale, &local_groups, &mut out, &mut lse).unwrap();
            token_pages += stats.pages_read;
            for row in 0..rows {
                got[row].push((out[row * l.head_dim..][..l.head_dim].to_vec(), lse[row]));
            }
        }
        for row in 0..rows {
            let merged: Vec<f32> = merge(&got[row], l.head_dim).iter().map(|&x| x as f32).collect();
            let want: Vec<f64> = whole[row * l.head_dim..][..l.head_dim].iter().map(|&x| f64::from(x)).collect();
            assert_close(&merged, &want, 1e-5, &format!("{shape:?} row {row}"));
        }
        // The same token pages (K and V of each chosen page) as one cache; the dimension
        // pages add up to one cache's, give or take a part's last, partly filled page.
        assert_eq!(token_pages, 2 * chosen.len() as u64, "{shape:?}");
        let whole_dim = whole_stats.pages_read - token_pages;
        let used_groups = whole_dim / h.dim_group_pages();
        assert!(dim_reads >= whole_dim && dim_reads <= whole_dim + n as u64 * used_groups, "{shape:?}: {dim_reads} dimension pages, {whole_dim} on one cache");
    }
}

#[test]
fn chosen_groups_are_checked_and_an_empty_choice_is_an_empty_part() {
    let mut rng = Rng::new(24);
    let l = layout(SHAPES[0]);
    let h = MemHead::random(l, 3 * l.tokens_per_page, &mut rng);
    let q = rng.vec(l.head_dim);
    let (mut out, mut lse) = (vec![1f32; q.len()], vec![0f64; 1]);
    assert_eq!(attend_groups(&h, &q, 0.5, &[], &mut out, &mut lse).unwrap(), AttendStats::default());
    assert!(out.iter().all(|&x| x == 0.0) && lse[0] == f64::NEG_INFINITY);
    for bad in [&[1usize, 1][..], &[2, 1], &[3]] {
        assert!(attend_groups(&h, &q, 0.5, bad, &mut out, &mut lse).is_err(), "{bad:?}");
    }
    // Every group chosen: dense over the part.
    let (mut dense, mut dense_lse) = (vec![0f32; q.len()], vec![0f64; 1]);
    attend_partial(&h, &q, 0.5, Method::Dense, &mut dense, &mut dense_lse).unwrap();
    attend_groups(&h, &q, 0.5, &[0, 1, 2], &mut out, &mut lse).unwrap();
    assert_close(&out, &dense.iter().map(|&x| f64::from(x)).collect::<Vec<_>>(), 1e-6, "all groups");
    assert!((lse[0] - dense_lse[0]).abs() < 1e-9);
}

#[test]
fn reduced_queries_give_the_page_masses_of_the_full_ones_bit_for_bit() {
    let mut rng = Rng::new(29);
    for shape in SHAPES {
        let l = layout(shape);
        let h = MemHead::random(l, 7 * l.tokens_per_page + 2, &mut rng);
        let (rows, scale) = (3, 0.3);
        let q = rng.vec(rows * l.head_dim);
        for r in [1, 2.min(l.head_dim), l.head_dim] {
            let (full, full_stats) = page_log_mass(&h, &q, scale, r).unwrap();
            let (dims, vals, l1) = reduce_queries(&q, rows, l.head_dim, r);
            assert_eq!((dims.len(), vals.len(), l1.len()), (r, rows * r, rows));
            let (got, stats) = page_log_mass_reduced(&h, &vals, &dims, &l1, scale).unwrap();
            assert_eq!(got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), full.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), "{shape:?} r {r}");
            assert_eq!(stats, full_stats, "the same dimension pages read");
        }
        // Components out of order or past the head, or values that do not fit them: refused.
        let (dims, vals, l1) = reduce_queries(&q, rows, l.head_dim, 2.min(l.head_dim));
        if dims.len() == 2 {
            assert!(page_log_mass_reduced(&h, &vals, &[dims[1], dims[0]], &l1, scale).is_err());
        }
        assert!(page_log_mass_reduced(&h, &vals, &[l.head_dim], &l1, scale).is_err());
        assert!(page_log_mass_reduced(&h, &vals[1..], &dims, &l1, scale).is_err());
    }
}
