// SPDX-License-Identifier: Apache-2.0
//! Dense attention against a plain f64 reference, and what every method shares: grouped
//! query rows, batches, request checks and store faults.

use std::collections::HashSet;

use super::testutil::{assert_close, dense_ref, layout, run, scale_of, MemHead, Rng, SHAPES};
use super::{attend, attend_all, Method, Task};
use crate::{AttendStats, Dtype, HeadPages, Kind, KvError, Layout};

#[test]
fn dense_matches_f64_reference_and_reads_every_page_once() {
    let mut rng = Rng::new(1);
    for shape in SHAPES {
        let l = layout(shape);
        for tokens in [1, l.tokens_per_page, 3 * l.tokens_per_page + 1, 517] {
            for group in [1, 3] {
                let h = MemHead::random(l, tokens, &mut rng);
                let q = rng.vec(group * l.head_dim);
                let (out, stats) = run(&h, &q, scale_of(&h), Method::Dense);
                for (g, qr) in q.chunks(l.head_dim).enumerate() {
                    let want = dense_ref(&h, qr, f64::from(scale_of(&h)));
                    assert_close(&out[g * l.head_dim..][..l.head_dim], &want, 1e-6, "dense");
                }
                let pages = 2 * l.token_groups(tokens) as u64;
                let want = AttendStats { pages_read: pages, media_bytes: pages * l.page_bytes as u64, rows_used: 2 * tokens as u64, drive_wait_ns: 0 };
                assert_eq!(stats, want, "{shape:?} tokens {tokens} group {group}");
                let reads = h.take_reads();
                assert_eq!(reads.iter().collect::<HashSet<_>>().len(), reads.len(), "a page read twice");
                assert_eq!(reads.len() as u64, pages);
            }
        }
    }
}

#[test]
fn dense_keeps_precision_with_peaked_scores_and_long_caches() {
    // Large scores (a peaked softmax) and 20,000 tokens: summing V in f32 instead of f64
    // puts output 0 off by 7e-8 here, seven times what the check allows.
    let mut rng = Rng::new(2);
    let l = layout(SHAPES[2]);
    let h = MemHead::random(l, 20_000, &mut rng);
    let q: Vec<f32> = rng.vec(2 * l.head_dim).iter().map(|x| x * 8.0).collect();
    let (out, _) = run(&h, &q, 0.125, Method::Dense);
    for (g, qr) in q.chunks(l.head_dim).enumerate() {
        assert_close(&out[g * l.head_dim..][..l.head_dim], &dense_ref(&h, qr, 0.125), 1e-6, "long dense");
    }
}

#[test]
fn rows_of_a_group_equal_separate_single_row_calls() {
    let mut rng = Rng::new(8);
    for shape in SHAPES {
        let h = MemHead::random(layout(shape), 250, &mut rng);
        let q = rng.vec(4 * shape.0);
        for m in [Method::Dense, Method::SparF { r: 5, k: 20, local: 3, pages: 0, mean_v: true }, Method::SparQ { r: 2, k: 7, local: 0, mean_v: true }] {
            let (out, _) = run(&h, &q, 0.4, m);
            for (qr, o) in q.chunks(shape.0).zip(out.chunks(shape.0)) {
                assert_eq!(run(&h, qr, 0.4, m).0, o, "{m:?}");
            }
        }
    }
}

#[test]
fn attend_all_equals_sequential_attend_and_returns_the_first_error() {
    let mut rng = Rng::new(9);
    let heads: Vec<MemHead> = (0..7).map(|i| MemHead::random(layout(SHAPES[i % 4]), 40 + 37 * i, &mut rng)).collect();
    let qs: Vec<Vec<f32>> = heads.iter().map(|h| rng.vec(2 * h.layout.head_dim)).collect();
    for m in [Method::Dense, Method::SparF { r: 4, k: 16, local: 2, pages: 0, mean_v: true }] {
        let mut outs: Vec<Vec<f32>> = qs.iter().map(|q| vec![0f32; q.len()]).collect();
        let tasks = heads.iter().zip(&qs).zip(&mut outs).map(|((h, q), out)| Task { head: h, q, out, lse: None }).collect();
        let total = attend_all(tasks, 0.3, m).unwrap();
        let mut sum = AttendStats::default();
        for ((h, q), out) in heads.iter().zip(&qs).zip(&outs) {
            let (want, stats) = run(h, q, 0.3, m);
            assert_eq!(&want, out);
            sum += stats;
        }
        assert_eq!(total, sum);
    }
    // Tasks 2 and 5 are malformed; the error is task 2's.
    let mut outs: Vec<Vec<f32>> = qs.iter().map(|q| vec![0f32; q.len()]).collect();
    outs[2].pop();
    outs[5].pop();
    let tasks = heads.iter().zip(&qs).zip(&mut outs).map(|((h, q), out)| Task { head: h, q, out, lse: None }).collect();
    let err = attend_all(tasks, 0.3, Method::Dense).unwrap_err().to_string();
    assert!(err.contains(&format!("output of {} elements", qs[2].len() - 1)), "{err}");
}

#[test]
fn bad_shapes_are_bad_requests() {
    let mut rng = Rng::new(10);
    let h = MemHead::random(layout(SHAPES[0]), 20, &mut rng);
    let q = rng.vec(32);
    let sparse = |r, k| Method::SparF { r, k, local: 0, pages: 0, mean_v: true };
    let cases: [(&[f32], usize, f32, Method); 8] = [
        (&q[..31], 31, 0.5, Method::Dense),
        (&q[..0], 0, 0.5, Method::Dense),
        (&q, 16, 0.5, Method::Dense),
        (&q, 32, f32::NAN, Method::Dense),
        (&q, 32, 0.5, sparse(0, 4)),
        (&q, 32, 0.5, sparse(4, 0)),
        (&q, 32, 0.5, Method::SparQ { r: 0, k: 4, local: 1, mean_v: true }),
        (&q[..16], 32, 0.5, sparse(4, 4)),
    ];
    for (i, (q, out_len, scale, m)) in cases.into_iter().enumerate() {
        let mut out = vec![0f32; out_len];
        assert!(matches!(attend(&h, q, scale, m, &mut out), Err(KvError::BadRequest(_))), "case {i}");
    }
    let empty = MemHead::new(layout(SHAPES[0]), Vec::new(), Vec::new());
    assert!(matches!(attend(&empty, &q[..16], 0.5, Method::Dense, &mut [0f32; 16]), Err(KvError::BadRequest(_))));
    assert!(h.take_reads().is_empty(), "nothing is read for a bad request");
}

/// A store that gives one row short in token group 1, or a V sum of the wrong size.
struct Faulty(MemHead, bool);

impl HeadPages for Faulty {
    fn layout(&self) -> &Layout {
        self.0.layout()
    }
    fn tokens(&self) -> usize {
        self.0.tokens()
    }
    fn load_token_group(&self, kind: Kind, group: usize, out: &mut [f32]) -> Result<(usize, crate::Loaded), KvError> {
        let (rows, cost) = self.0.load_token_group(kind, group, out)?;
        Ok((if self.1 && group == 1 { rows - 1 } else { rows }, cost))
    }
    fn load_dim_group(&self, group: usize, out: &mut [f32]) -> Result<crate::Loaded, KvError> {
        self.0.load_dim_group(group, out)
    }
    fn v_sum(&self) -> Vec<f64> {
        let mut s = self.0.v_sum();
        if !self.1 {
            s.pop();
        }
        s
    }
}

#[test]
fn store_faults_are_io_errors() {
    let mut rng = Rng::new(12);
    let l = layout(SHAPES[0]);
    let q = rng.vec(16);
    let short = Faulty(MemHead::random(l, 30, &mut rng), true);
    let sparse = Method::SparF { r: 16, k: 29, local: 29, pages: 0, mean_v: true };
    for m in [Method::Dense, sparse] {
        let err = attend(&short, &q, 0.5, m, &mut [0f32; 16]).unwrap_err();
        assert!(matches!(err, KvError::Io(_)) && err.to_string().contains("K token group 1 gave 3 rows, 4 expected"), "{err}");
    }
    let bad_sum = Faulty(MemHead::random(l, 30, &mut rng), false);
    let err = attend(&bad_sum, &q, 0.5, sparse, &mut [0f32; 16]).unwrap_err();
    assert!(matches!(err, KvError::Io(_)), "{err}");
    assert!(bad_sum.0.take_reads().is_empty());
}

/// Dense throughput in GB/s of K and V (as f32) through [`MemHead`], whose loads are
/// memcpys: `cargo test -p insitu-kvcache --release attention -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement, not a check"]
fn dense_throughput() {
    let mut rng = Rng::new(11);
    let l = layout((128, Dtype::F16, 4096, 2));
    let h = MemHead::random(l, 32_768, &mut rng);
    for group in [1, 4, 8] {
        let q = rng.vec(group * l.head_dim);
        let mut out = vec![0f32; q.len()];
        attend(&h, &q, 0.09, Method::Dense, &mut out).unwrap();
        let reps = 20;
        let t = std::time::Instant::now();
        for _ in 0..reps {
            attend(&h, &q, 0.09, Method::Dense, &mut out).unwrap();
            h.take_reads();
        }
        let secs = t.elapsed().as_secs_f64() / reps as f64;
        let bytes = 2.0 * (h.tokens() * l.head_dim * 4) as f64;
        println!("dense, {} tokens, head 128, group {group}: {:.2} ms, {:.2} GB/s of K+V", h.tokens(), secs * 1e3, bytes / secs / 1e9);
    }
}
