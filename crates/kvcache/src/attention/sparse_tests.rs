// SPDX-License-Identifier: Apache-2.0
//! SparF and SparQ against a plain reference of Algorithm 1, and their page accounting
//! against the pages the selections need.

use std::collections::HashSet;

use proptest::prelude::*;

use super::testutil::{assert_close, attention, dense_ref, layout, run, scale_of, sparf_capped_ref, sparf_ref, MemHead, Read, Rng, MIXED_TOL, SHAPES};
use super::Method;
use crate::{AttendStats, Kind};

#[test]
fn sparf_with_k_at_least_tokens_equals_dense() {
    let mut rng = Rng::new(3);
    for shape in SHAPES {
        let h = MemHead::random(layout(shape), 77, &mut rng);
        let q = rng.vec(2 * shape.0);
        let dense = run(&h, &q, 0.3, Method::Dense);
        h.take_reads();
        for k in [77, 78, 1000] {
            assert_eq!(run(&h, &q, 0.3, Method::SparF { r: 4, k, local: 3, pages: 0, mean_v: true }), dense);
            assert!(!h.take_reads().iter().any(|r| matches!(r, Read::Dim(_))), "no approximate pass needed");
        }
    }
}

#[test]
fn sparf_matches_algorithm_1_reference() {
    let mut rng = Rng::new(4);
    for shape in SHAPES {
        let l = layout(shape);
        for (tokens, r, k, local) in [(50, 4, 8, 2), (200, 1, 1, 0), (200, 1, 1, 1), (333, shape.0, 40, 0), (333, 8, 10, 25), (1100, 16, 64, 8)] {
            let h = MemHead::random(l, tokens, &mut rng);
            let q = rng.vec(3 * l.head_dim);
            let (out, _) = run(&h, &q, 0.2, Method::SparF { r, k, local, pages: 0, mean_v: true });
            for (g, qr) in q.chunks(l.head_dim).enumerate() {
                let (want, i, j) = sparf_ref(&h, qr, 0.2, r, k, local);
                assert_eq!((i.len(), j.len()), (r.min(l.head_dim), k));
                if local <= k {
                    assert_eq!(j[k - local..], (tokens - local..tokens).collect::<Vec<_>>(), "the local tokens are kept");
                } else {
                    assert!(j.iter().all(|&t| t >= tokens - local), "the best of the local tokens are kept");
                }
                let what = format!("{shape:?} tokens {tokens} r {r} k {k} local {local} row {g}");
                assert_close(&out[g * l.head_dim..][..l.head_dim], &want, MIXED_TOL, &what);
            }
        }
    }
}

#[test]
fn sparf_with_a_zero_query_mixes_means_of_v() {
    let mut rng = Rng::new(5);
    let h = MemHead::random(layout(SHAPES[0]), 90, &mut rng);
    let q = vec![0f32; 16];
    let (out, _) = run(&h, &q, 0.25, Method::SparF { r: 3, k: 9, local: 4, pages: 0, mean_v: true });
    assert_close(&out, &sparf_ref(&h, &q, 0.25, 3, 9, 4).0, MIXED_TOL, "zero query");
}

/// The pages SparF must read for query rows `q`: the dimension groups holding a kept
/// component and the token groups (K and V) holding a kept token, each once; and the
/// distinct kept tokens.
fn expected_reads(h: &MemHead, q: &[f32], r: usize, k: usize, local: usize) -> (HashSet<Read>, usize) {
    let l = h.layout;
    let (mut reads, mut toks) = (HashSet::new(), HashSet::new());
    for qr in q.chunks(l.head_dim) {
        let (_, i, j) = sparf_ref(h, qr, 0.5, r, k, local);
        reads.extend(i.iter().map(|d| Read::Dim(d / l.dims_per_page)));
        for t in j {
            reads.insert(Read::Token(Kind::K, t / l.tokens_per_page));
            reads.insert(Read::Token(Kind::V, t / l.tokens_per_page));
            toks.insert(t);
        }
    }
    (reads, toks.len())
}

#[test]
fn sparf_reads_only_pages_holding_selected_units() {
    let mut rng = Rng::new(6);
    for shape in SHAPES {
        let l = layout(shape);
        for (tokens, group, r, k, local) in [(300, 1, 2, 8, 2), (300, 4, 3, 5, 1), (5000, 1, 8, 64, 4), (5000, 4, 8, 64, 4)] {
            let h = MemHead::random(l, tokens, &mut rng);
            let q = rng.vec(group * l.head_dim);
            let (_, stats) = run(&h, &q, 0.5, Method::SparF { r, k, local, pages: 0, mean_v: true });
            let reads = h.take_reads();
            let (want, distinct) = expected_reads(&h, &q, r, k, local);
            assert_eq!(reads.len(), want.len(), "a page read twice");
            assert_eq!(reads.into_iter().collect::<HashSet<_>>(), want);
            let dims = want.iter().filter(|r| matches!(r, Read::Dim(_))).count() as u64;
            let pages = dims * h.dim_group_pages() + (want.len() as u64 - dims);
            let want = AttendStats { pages_read: pages, media_bytes: pages * l.page_bytes as u64, rows_used: 2 * distinct as u64, drive_wait_ns: 0 };
            assert_eq!(stats, want, "{shape:?} tokens {tokens} group {group}");
            if tokens >= 5000 && group == 1 {
                // Long caches are what SparF is for: one query row then reads less than
                // dense. Not a law: on short caches a dimension group can cost as much as
                // the whole cache, and four rows of random data (no locality, so every kept
                // token is on a page of its own) need 642 pages here against dense's 626
                // with the 64-dimension f32 layout.
                let (_, dense) = run(&h, &q, 0.5, Method::Dense);
                assert!(stats.pages_read < dense.pages_read && stats.media_bytes < dense.media_bytes, "{shape:?} group {group}: {stats:?} vs {dense:?}");
            }
        }
    }
}

#[test]
fn sparq_outputs_equal_sparf_with_element_counts() {
    let mut rng = Rng::new(7);
    for shape in SHAPES {
        let l = layout(shape);
        for (group, r, k) in [(1, 4, 16), (2, 8, 50), (1, 4, 400)] {
            let h = MemHead::random(l, 300, &mut rng);
            let q = rng.vec(group * l.head_dim);
            let (f, _) = run(&h, &q, 0.5, Method::SparF { r, k, local: 4, pages: 0, mean_v: true });
            let (s, stats) = run(&h, &q, 0.5, Method::SparQ { r, k, local: 4, mean_v: true });
            assert_eq!(f, s, "same arithmetic");
            let size = l.dtype.size() as u64;
            let bytes = if k >= 300 {
                2 * 300 * l.head_dim as u64 * size
            } else if group == 1 {
                (r as u64 * 300 + 2 * k as u64 * l.head_dim as u64) * size
            } else {
                // Several rows: the union of their components and of their tokens.
                let (want, distinct) = expected_reads(&h, &q, r, k, 4);
                let dims: usize = (0..l.dim_groups())
                    .filter(|g| want.contains(&Read::Dim(*g)))
                    .map(|g| {
                        let kept = |d: usize| q.chunks(l.head_dim).any(|qr| sparf_ref(&h, qr, 0.5, r, k, 4).1.contains(&d));
                        (g * l.dims_per_page..(g + 1) * l.dims_per_page).filter(|&d| kept(d)).count()
                    })
                    .sum();
                (dims as u64 * 300 + 2 * distinct as u64 * l.head_dim as u64) * size
            };
            assert_eq!(stats.media_bytes, bytes, "{shape:?} group {group} r {r} k {k}");
            assert_eq!(stats.pages_read, bytes.div_ceil(l.page_bytes as u64));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn random_shapes_match_the_references(
        shape in 0..SHAPES.len(),
        tokens in 1usize..700,
        group in 1usize..5,
        r in 1usize..140,
        k in 1usize..800,
        local in 0usize..40,
        seed in any::<u64>(),
    ) {
        let l = layout(SHAPES[shape]);
        let mut rng = Rng::new(seed);
        let h = MemHead::random(l, tokens, &mut rng);
        let q = rng.vec(group * l.head_dim);
        let scale = scale_of(&h);
        let (dense, _) = run(&h, &q, scale, Method::Dense);
        let (sparf, stats) = run(&h, &q, scale, Method::SparF { r, k, local, pages: 0, mean_v: true });
        prop_assert_eq!(&run(&h, &q, scale, Method::SparQ { r, k, local, mean_v: true }).0, &sparf);
        for (g, qr) in q.chunks(l.head_dim).enumerate() {
            let o = g * l.head_dim..(g + 1) * l.head_dim;
            assert_close(&dense[o.clone()], &dense_ref(&h, qr, f64::from(scale)), 1e-6, "dense");
            assert_close(&sparf[o], &sparf_ref(&h, qr, f64::from(scale), r, k, local).0, MIXED_TOL, "sparf");
        }
        prop_assert!(stats.rows_used <= 2 * tokens as u64);
    }
}

#[test]
fn a_page_cap_bounds_the_token_pages_read() {
    let mut rng = Rng::new(11);
    for shape in SHAPES {
        let l = layout(shape);
        let tokens = 1100;
        let h = MemHead::random(l, tokens, &mut rng);
        let q = rng.vec(3 * l.head_dim);
        let (r, k, local) = (4, 70, 17);
        let groups = l.token_groups(tokens);
        let uncapped = run(&h, &q, 0.3, Method::SparF { r, k, local, pages: 0, mean_v: true });
        h.take_reads();
        for cap in [1, 4, 9] {
            let (out, stats) = run(&h, &q, 0.3, Method::SparF { r, k, local, pages: cap, mean_v: true });
            assert!(out.iter().all(|x| x.is_finite()));
            let reads = h.take_reads();
            // The first page (the attention sink) is read besides the cap, like the local ones.
            let mut local_pages: HashSet<usize> = ((tokens - local) / l.tokens_per_page..groups).collect();
            local_pages.insert(0);
            for kind in [Kind::K, Kind::V] {
                let read: HashSet<usize> = reads
                    .iter()
                    .filter_map(|r| match r {
                        Read::Token(k2, g) if *k2 == kind => Some(*g),
                        _ => None,
                    })
                    .collect();
                assert!(read.difference(&local_pages).count() <= cap, "{shape:?} cap {cap}: {kind:?} pages {read:?}");
            }
            assert!(stats.pages_read < uncapped.1.pages_read, "{shape:?} cap {cap}: {stats:?} vs {:?}", uncapped.1);
        }
    }
}

#[test]
fn a_page_cap_shares_components_and_picks_pages_by_mass() {
    let mut rng = Rng::new(12);
    for shape in SHAPES {
        let l = layout(shape);
        for (tokens, group, r, k, local, pages) in
            [(1100, 3, 4, 400, 17, 6), (1100, 3, 8, 40, 5, 9), (300, 1, 2, 300 - 1, 1, 3), (300, 4, 3, 50, 0, 2), (40, 2, 3, 30, 39, 1)]
        {
            let h = MemHead::random(l, tokens, &mut rng);
            let q = rng.vec(group * l.head_dim);
            let plan = (r, k, local, pages);
            let (out, stats) = run(&h, &q, 0.3, Method::SparF { r, k, local, pages, mean_v: true });
            let reads = h.take_reads();
            let want = sparf_capped_ref(&h, &q, 0.3, plan);
            let what = format!("{shape:?} tokens {tokens} group {group} plan {plan:?}");
            let mut expected = HashSet::new();
            for (g, (o, i, j)) in want.iter().enumerate() {
                assert_close(&out[g * l.head_dim..][..l.head_dim], o, MIXED_TOL, &what);
                assert_eq!(i.len(), r.min(l.head_dim), "{what}");
                expected.extend(i.iter().map(|d| Read::Dim(d / l.dims_per_page)));
                for t in j {
                    expected.insert(Read::Token(Kind::K, t / l.tokens_per_page));
                    expected.insert(Read::Token(Kind::V, t / l.tokens_per_page));
                }
            }
            // The rows share their components: one set of dimension pages for the head.
            assert!(want.windows(2).all(|w| w[0].1 == w[1].1), "{what}");
            assert_eq!(reads.len(), expected.len(), "{what}: a page read twice");
            assert_eq!(reads.into_iter().collect::<HashSet<_>>(), expected, "{what}");
            assert!(stats.pages_read > 0, "{what}");
        }
    }
}

#[test]
fn without_the_mean_of_v_the_kept_tokens_carry_all_the_weight() {
    let mut rng = Rng::new(13);
    for shape in SHAPES {
        let l = layout(shape);
        for (tokens, group, plan) in [(1100, 3, (8, 200, 16, 9)), (300, 1, (2, 40, 4, 0)), (300, 2, (3, 50, 0, 2))] {
            let h = MemHead::random(l, tokens, &mut rng);
            let q = rng.vec(group * l.head_dim);
            let (r, k, local, pages) = plan;
            let (mixed, with_mean) = run(&h, &q, 0.3, Method::SparF { r, k, local, pages, mean_v: true });
            let (out, stats) = run(&h, &q, 0.3, Method::SparF { r, k, local, pages, mean_v: false });
            let what = format!("{shape:?} tokens {tokens} group {group} plan {plan:?}");
            assert_ne!(out, mixed, "{what}: the mix with the mean of V changes the result");
            let kept: Vec<Vec<usize>> = if pages > 0 {
                sparf_capped_ref(&h, &q, 0.3, plan).into_iter().map(|(_, _, j)| j).collect()
            } else {
                q.chunks(l.head_dim).map(|qr| sparf_ref(&h, qr, 0.3, r, k, local).2).collect()
            };
            for ((o, qr), j) in out.chunks(l.head_dim).zip(q.chunks(l.head_dim)).zip(&kept) {
                assert_close(o, &attention(&h, qr, 0.3, j), 1e-5, &what);
            }
            // The same selections, so the same pages.
            assert_eq!(stats, with_mean, "{what}");
            let sparq = run(&h, &q, 0.3, Method::SparQ { r, k, local, mean_v: false });
            if pages == 0 {
                assert_eq!(sparq.0, out, "{what}: SparQ computes what SparF does");
            }
        }
    }
}
