// SPDX-License-Identifier: Apache-2.0
use super::*;
use crate::{attend, Method};
use std::time::Instant;

const D: usize = 16;
const H: usize = 2;

fn image(dir: &std::path::Path, len: u64) -> Arc<Backing> {
    let p = dir.join("private.img");
    let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&p).unwrap();
    if f.metadata().unwrap().len() == 0 {
        f.set_len(len).unwrap();
    }
    Arc::new(Backing::open(&p, false).unwrap())
}

fn open(dir: &std::path::Path, len: u64) -> KvCache {
    KvCache::open(image(dir, len), 0, len, 4096).unwrap()
}

fn rows(n: usize, seed: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32 + seed) * 0.37).sin()).collect()
}

/// Every K and V row and every dimension of K the store returns for head `h` of `layer`.
fn read_back(s: &KvCache, seq: u64, layer: usize, h: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let v = s.head(seq, layer, h).unwrap();
    let l = *v.layout();
    let t = v.tokens();
    let (mut k, mut vv) = (Vec::new(), Vec::new());
    let mut buf = vec![0f32; l.tokens_per_page * l.head_dim];
    for g in 0..l.token_groups(t) {
        let (n, _) = v.load_token_group(Kind::K, g, &mut buf).unwrap();
        k.extend_from_slice(&buf[..n * l.head_dim]);
        let (n, _) = v.load_token_group(Kind::V, g, &mut buf).unwrap();
        vv.extend_from_slice(&buf[..n * l.head_dim]);
    }
    let mut dims = vec![0f32; l.head_dim * t];
    for g in 0..l.dim_groups() {
        v.load_dim_group(g, &mut dims[g * l.dims_per_page * t..(g + 1) * l.dims_per_page * t]).unwrap();
    }
    (k, vv, dims)
}

/// Head `h`'s rows out of a `[heads][tokens][D]` append.
fn head_rows(x: &[f32], h: usize, tokens: usize) -> &[f32] {
    &x[h * tokens * D..(h + 1) * tokens * D]
}

fn transpose(k: &[f32], t: usize) -> Vec<f32> {
    (0..D).flat_map(|d| (0..t).map(move |i| k[i * D + d])).collect()
}

#[test]
fn appended_rows_read_back_from_pages_and_the_group_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path(), 16 << 20);
    s.create(1, 2, H, D, Dtype::F32, 1).unwrap();
    // With D = 16 f32, a token page holds 64 tokens and a dimension page 1024.
    let (t1, t2) = (1500, 37);
    let (k1, v1) = (rows(H * t1 * D, 1.0), rows(H * t1 * D, 2.0));
    assert_eq!(s.append(1, 1, t1, &k1, &v1).unwrap(), t1);
    let mut k_all = vec![Vec::new(); H];
    let mut v_all = vec![Vec::new(); H];
    for h in 0..H {
        k_all[h].extend_from_slice(head_rows(&k1, h, t1));
        v_all[h].extend_from_slice(head_rows(&v1, h, t1));
    }
    for i in 0..t2 {
        let (k, v) = (rows(H * D, 10.0 + i as f32), rows(H * D, 20.0 + i as f32));
        assert_eq!(s.append(1, 1, 1, &k, &v).unwrap(), t1 + i + 1);
        for h in 0..H {
            k_all[h].extend_from_slice(&k[h * D..(h + 1) * D]);
            v_all[h].extend_from_slice(&v[h * D..(h + 1) * D]);
        }
    }
    let t = t1 + t2;
    for h in 0..H {
        let (k, v, dims) = read_back(&s, 1, 1, h);
        assert_eq!(k, k_all[h]);
        assert_eq!(v, v_all[h]);
        assert_eq!(dims, transpose(&k_all[h], t));
        let sum: Vec<f64> = (0..D).map(|d| v_all[h].chunks(D).map(|r| f64::from(r[d])).sum()).collect();
        let got = s.head(1, 1, h).unwrap().v_sum();
        assert!(sum.iter().zip(&got).all(|(a, b)| (a - b).abs() < 1e-9));
    }
    assert_eq!(s.info(1).unwrap().tokens, vec![0, t]);
}

/// Batched loads (any set of token groups: adjacent pages, scattered ones, the DRAM tail,
/// more than one read's worth; several dimension groups) give the rows appended, and dense attention over the store equals
/// a plain computation over those rows.
#[test]
fn batched_loads_give_the_appended_rows() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path(), 64 << 20);
    s.create(1, 1, H, D, Dtype::F32, 1).unwrap();
    // 64 tokens a page: a prefill of 300 pages (adjacent), then tokens one at a time (pages
    // of the two heads interleave), then a tail in DRAM.
    let t1 = 64 * 300;
    let (k1, v1) = (rows(H * t1 * D, 1.0), rows(H * t1 * D, 2.0));
    s.append(1, 0, t1, &k1, &v1).unwrap();
    let mut truth: Vec<(Vec<f32>, Vec<f32>)> = (0..H).map(|h| (head_rows(&k1, h, t1).to_vec(), head_rows(&v1, h, t1).to_vec())).collect();
    for i in 0..64 * 3 + 9 {
        let (k, v) = (rows(H * D, 7.0 + i as f32), rows(H * D, 9.0 + i as f32));
        s.append(1, 0, 1, &k, &v).unwrap();
        for (h, (tk, tv)) in truth.iter_mut().enumerate() {
            tk.extend_from_slice(&k[h * D..(h + 1) * D]);
            tv.extend_from_slice(&v[h * D..(h + 1) * D]);
        }
    }
    let view = s.head(1, 0, 1).unwrap();
    let l = *view.layout();
    let (n, per) = (view.tokens(), l.tokens_per_page * D);
    let last = l.token_groups(n) - 1;
    let all: Vec<usize> = (0..=last).collect();
    for groups in [all.clone(), vec![0, 2, 3, 4, 299, 300, 302], vec![last], vec![1, last], vec![301]] {
        for (kind, want) in [(Kind::K, &truth[1].0), (Kind::V, &truth[1].1)] {
            let mut out = vec![f32::NAN; groups.len() * per];
            let (got_rows, loaded) = view.load_token_groups(kind, &groups, &mut out).unwrap();
            assert_eq!(loaded.pages as usize, groups.iter().filter(|&&g| g != last).count());
            for ((slot, &g), r) in groups.iter().enumerate().zip(got_rows) {
                assert_eq!(r, l.tokens_per_page.min(n - g * l.tokens_per_page));
                assert_eq!(out[slot * per..][..r * D], want[g * per..][..r * D], "{kind:?} group {g} of {groups:?}");
            }
        }
    }
    assert!(view.load_token_groups(Kind::K, &[last + 1], &mut vec![0f32; per]).is_err());
    // Dimension groups (one dimension each here), several in one batch.
    let dim_groups = [0usize, 3, 7, 15];
    let mut dims = vec![f32::NAN; dim_groups.len() * n];
    view.load_dim_groups(&dim_groups, &mut dims).unwrap();
    let all_dims = transpose(&truth[1].0, n);
    for (i, &g) in dim_groups.iter().enumerate() {
        assert_eq!(dims[i * n..(i + 1) * n], all_dims[g * n..(g + 1) * n], "dimension {g}");
    }
    assert!(view.load_dim_groups(&[16], &mut vec![0f32; n]).is_err());
    let q = rows(3 * D, 5.0);
    let mut out = vec![0f32; 3 * D];
    attend(&view, &q, 0.25, Method::Dense, &mut out).unwrap();
    let (tk, tv) = &truth[1];
    for (qr, o) in q.chunks(D).zip(out.chunks(D)) {
        let sc: Vec<f64> = tk.chunks(D).map(|k| qr.iter().zip(k).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum::<f64>() * 0.25).collect();
        let m = sc.iter().cloned().fold(f64::MIN, f64::max);
        let w: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = w.iter().sum();
        for d in 0..D {
            let want: f64 = w.iter().zip(tv.chunks(D)).map(|(w, v)| w * f64::from(v[d])).sum::<f64>() / z;
            assert!((f64::from(o[d]) - want).abs() < 1e-5, "dense over the store: {} vs {want}", o[d]);
        }
    }
}

#[test]
fn f16_pages_hold_rounded_values() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path(), 16 << 20);
    s.create(2, 1, H, D, Dtype::F16, 2).unwrap();
    let t = 300;
    let (k, v) = (rows(H * t * D, 3.0), rows(H * t * D, 4.0));
    s.append(2, 0, t, &k, &v).unwrap();
    let round = |x: &[f32]| x.iter().map(|x| half::f16::from_f32(*x).to_f32()).collect::<Vec<_>>();
    let (rk, rv, _) = read_back(&s, 2, 0, 1);
    let pages = t / 128 * 128; // 128 f16 tokens per page; the tail stays exact in DRAM
    assert_eq!(rk[..pages * D], round(&head_rows(&k, 1, t)[..pages * D])[..]);
    assert_eq!(rv[pages * D..], head_rows(&v, 1, t)[pages * D..]);
}

#[test]
fn f16_dimension_pages_read_back_whatever_their_width() {
    for dpp in [1, 2] {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path(), 32 << 20);
        s.create(3, 1, H, D, Dtype::F16, dpp).unwrap();
        let t = 4200; // over two dimension pages of 2,048 tokens at one dimension a page
        let k = rows(H * t * D, 5.0);
        s.append(3, 0, t, &k, &rows(H * t * D, 6.0)).unwrap();
        let tpd = s.head(3, 0, 1).unwrap().layout().tokens_per_dim_page;
        let paged = t / tpd * tpd;
        assert!(paged > 0, "{dpp} dimensions a page: some tokens must be on pages");
        let want = transpose(head_rows(&k, 1, t), t);
        let (_, _, dims) = read_back(&s, 3, 0, 1);
        for (i, (got, want)) in dims.iter().zip(&want).enumerate() {
            let want = if i % t < paged { half::f16::from_f32(*want).to_f32() } else { *want };
            assert_eq!(*got, want, "{dpp} dimensions a page: dimension {} token {}", i / t, i % t);
        }
    }
}

#[test]
fn forks_share_the_prefix_and_diverge() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path(), 16 << 20);
    s.create(1, 1, H, D, Dtype::F32, 1).unwrap();
    let t = 100;
    s.append(1, 0, t, &rows(H * t * D, 1.0), &rows(H * t * D, 2.0)).unwrap();
    let used = s.usage().pages_free;
    s.fork(1, 2).unwrap();
    assert_eq!(s.usage().pages_free, used, "a fork shares pages");
    assert!(matches!(s.fork(1, 2), Err(KvError::SequenceExists(2))));
    assert!(matches!(s.fork(9, 3), Err(KvError::UnknownSequence(9))));
    let before = read_back(&s, 1, 0, 0);
    s.append(2, 0, 40, &rows(H * 40 * D, 5.0), &rows(H * 40 * D, 6.0)).unwrap();
    assert_eq!(read_back(&s, 1, 0, 0), before, "the parent is untouched");
    let (k2, _, _) = read_back(&s, 2, 0, 0);
    assert_eq!(k2[..t * D], before.0[..]);
    assert_eq!(s.info(2).unwrap().tokens, vec![140]);
    s.free(1).unwrap();
    assert_eq!(read_back(&s, 2, 0, 0).0[..t * D], before.0[..], "the child keeps shared pages");
}

#[test]
fn freed_pages_are_reused_and_full_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path(), 1 << 20);
    let empty = s.usage();
    s.create(1, 1, H, D, Dtype::F32, 1).unwrap();
    s.append(1, 0, 200, &rows(H * 200 * D, 1.0), &rows(H * 200 * D, 2.0)).unwrap();
    let (info, usage, data) = (s.info(1).unwrap(), s.usage(), read_back(&s, 1, 0, 1));
    let big = 4000;
    match s.append(1, 0, big, &rows(H * big * D, 0.0), &rows(H * big * D, 0.0)) {
        Err(KvError::Full { needed, free }) => assert!(needed > free),
        other => panic!("expected Full, got {other:?}"),
    }
    assert_eq!((s.info(1).unwrap(), s.usage(), read_back(&s, 1, 0, 1)), (info, usage, data));
    assert!(matches!(s.append(1, 0, 1, &rows(3, 0.0), &rows(3, 0.0)), Err(KvError::Mismatch { .. })));
    assert!(matches!(s.append(1, 4, 1, &rows(H * D, 0.0), &rows(H * D, 0.0)), Err(KvError::Mismatch { .. })));
    assert!(matches!(s.append(5, 0, 1, &rows(H * D, 0.0), &rows(H * D, 0.0)), Err(KvError::UnknownSequence(5))));
    s.free(1).unwrap();
    assert_eq!(s.usage(), empty);
    for round in 0..5 {
        s.create(10 + round, 1, H, D, Dtype::F32, 1).unwrap();
        s.append(10 + round, 0, 600, &rows(H * 600 * D, 1.0), &rows(H * 600 * D, 2.0)).unwrap();
        s.free(10 + round).unwrap();
    }
    assert_eq!(s.usage(), empty, "space freed is space reused");
}

#[test]
fn pages_of_a_head_spread_over_dies() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path(), 16 << 20);
    s.create(1, 4, 3, D, Dtype::F32, 1).unwrap();
    for _ in 0..20 {
        for layer in 0..4 {
            s.append(1, layer, 64, &rows(3 * 64 * D, 1.0), &rows(3 * 64 * D, 2.0)).unwrap();
        }
    }
    let v = s.head(1, 2, 1).unwrap();
    let dies: std::collections::HashSet<u32> = v.head.k_pages.iter().map(|p| (p + (v.data_base / 4096) as u32) % 8).collect();
    assert!(dies.len() >= 6, "a head's K pages land on {} of 8 dies", dies.len());
}

#[test]
fn a_reopened_store_has_every_flushed_page() {
    let dir = tempfile::tempdir().unwrap();
    let t = 1100;
    let (k, v) = (rows(H * t * D, 1.0), rows(H * t * D, 2.0));
    let (want, q) = {
        let s = open(dir.path(), 16 << 20);
        s.create(1, 2, H, D, Dtype::F32, 1).unwrap();
        s.create(2, 1, H, D, Dtype::F32, 1).unwrap();
        s.append(1, 0, t, &k, &v).unwrap();
        s.append(1, 1, 70, &k[..H * 70 * D], &v[..H * 70 * D]).unwrap();
        s.fork(1, 3).unwrap();
        s.free(2).unwrap();
        let q = rows(D, 9.0);
        let mut out = vec![0f32; D];
        // What attention gives over the first 1088 tokens (the flushed pages).
        s.create(4, 1, H, D, Dtype::F32, 1).unwrap();
        s.append(
            4,
            0,
            1088,
            &[head_rows(&k, 0, t)[..1088 * D].to_vec(), head_rows(&k, 1, t)[..1088 * D].to_vec()].concat(),
            &[head_rows(&v, 0, t)[..1088 * D].to_vec(), head_rows(&v, 1, t)[..1088 * D].to_vec()].concat(),
        )
        .unwrap();
        attend(&s.head(4, 0, 1).unwrap(), &q, 0.25, Method::Dense, &mut out).unwrap();
        (out, q)
    };
    let s = open(dir.path(), 16 << 20);
    assert_eq!(s.info(1).unwrap().tokens, vec![1088, 64], "tokens in whole pages survive");
    assert_eq!(s.info(3).unwrap().tokens, vec![1088, 64]);
    assert!(matches!(s.info(2), Err(KvError::UnknownSequence(2))));
    let (rk, rv, dims) = read_back(&s, 1, 0, 1);
    assert_eq!(rk, head_rows(&k, 1, t)[..1088 * D]);
    assert_eq!(rv, head_rows(&v, 1, t)[..1088 * D]);
    assert_eq!(dims, transpose(&rk, 1088), "the dimension tail is rebuilt from token pages");
    let mut out = vec![0f32; D];
    attend(&s.head(1, 0, 1).unwrap(), &q, 0.25, Method::SparF { r: 4, k: 1088, local: 0, pages: 0, mean_v: true }, &mut out).unwrap();
    assert_eq!(out, want);
    // Appending goes on where the pages end, and frees release shared pages exactly once.
    s.append(1, 0, 10, &rows(H * 10 * D, 3.0), &rows(H * 10 * D, 4.0)).unwrap();
    for id in [1, 3, 4] {
        s.free(id).unwrap();
    }
    assert_eq!(s.usage().pages_free, s.usage().pages_total);
}

#[test]
fn journal_checkpoints_and_a_torn_tail_lose_nothing_flushed() {
    let dir = tempfile::tempdir().unwrap();
    let len = 4 << 20; // 1024 pages: a 32-page journal, 16 per half
    {
        let s = open(dir.path(), len);
        s.create(1, 1, 1, D, Dtype::F32, 1).unwrap();
        // One 64-token page per append: a frame per call, far more than a half holds.
        for i in 0..200 {
            s.append(1, 0, 64, &rows(64 * D, i as f32), &rows(64 * D, 1.0)).unwrap();
            for c in 0..8 {
                s.create(1000 + i * 8 + c, 1, 1, D, Dtype::F32, 1).unwrap();
                s.free(1000 + i * 8 + c).unwrap();
            }
        }
    }
    let s = open(dir.path(), len);
    assert_eq!(s.info(1).unwrap().tokens, vec![200 * 64]);
    assert_eq!(s.usage().sequences, 1);
    let want = read_back(&s, 1, 0, 0);
    drop(s);
    // Garbage after the last frame of the active half: replay stops before it.
    let media = image(dir.path(), len);
    let mut sb = vec![0u8; 36];
    media.read_at(&mut sb, 0).unwrap();
    let active = u64::from(u32::from_le_bytes(sb[16..20].try_into().unwrap()));
    assert!(u64::from_le_bytes(sb[20..28].try_into().unwrap()) >= 2, "the journal was checkpointed");
    let half = 1 + active * 16;
    let mut j = vec![0u8; 16 * 4096];
    media.read_at(&mut j, half * 4096).unwrap();
    let mut pos = 0;
    while u32::from_le_bytes(j[pos..pos + 4].try_into().unwrap()) != 0 {
        pos += 16 + u32::from_le_bytes(j[pos..pos + 4].try_into().unwrap()) as usize;
    }
    media.write_at(&[0xAB; 64], half * 4096 + pos as u64).unwrap();
    let s = open(dir.path(), len);
    assert_eq!(read_back(&s, 1, 0, 0), want);
}

#[test]
fn owned_sequences_go_with_their_owner_and_never_outlive_a_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let len = 4 << 20; // a 16-page journal half: the appends below checkpoint it
    let t = 130;
    let (k, v) = (rows(H * t * D, 1.0), rows(H * t * D, 2.0));
    {
        let s = open(dir.path(), len);
        let (a, b) = (s.new_owner(), s.new_owner());
        assert_ne!(a, b);
        s.create_as(Lifetime::Owned(a), 1, 1, H, D, Dtype::F32, 1).unwrap();
        s.create_as(Lifetime::Owned(b), 2, 1, H, D, Dtype::F32, 1).unwrap();
        s.create(3, 1, H, D, Dtype::F32, 1).unwrap();
        for seq in [1, 2, 3] {
            s.append(seq, 0, t, &k, &v).unwrap();
        }
        // A kept fork of an owned parent outlives the owner; an owned fork of a kept one
        // does not.
        s.fork(1, 4).unwrap();
        s.fork_as(Lifetime::Owned(a), 3, 5).unwrap();
        let u = s.usage();
        assert_eq!((u.sequences, u.kept, u.reclaimed), (5, 2, 0));
        assert_eq!(s.free_owned(a).unwrap(), 2);
        assert!(matches!(s.info(1), Err(KvError::UnknownSequence(1))));
        assert!(matches!(s.info(5), Err(KvError::UnknownSequence(5))));
        assert_eq!(read_back(&s, 4, 0, 1).0, head_rows(&k, 1, t), "the kept fork keeps the shared pages");
        assert_eq!(s.free_owned(a).unwrap(), 0, "nothing twice");
        let u = s.usage();
        assert_eq!((u.sequences, u.kept, u.reclaimed), (3, 2, 2));
        // Owner b never ends here; enough journal frames after it to checkpoint (67 bytes a
        // create and free, 64 KiB a half).
        for i in 0..2500 {
            s.create_as(Lifetime::Owned(b), 100 + i, 1, 1, D, Dtype::F32, 1).unwrap();
            s.free(100 + i).unwrap();
        }
        s.free(4).unwrap();
        s.free(3).unwrap();
        s.create(3, 1, H, D, Dtype::F32, 1).unwrap();
        s.append(3, 0, t, &k, &v).unwrap();
    }
    let mut sb = vec![0u8; 36];
    image(dir.path(), len).read_at(&mut sb, 0).unwrap();
    assert!(u64::from_le_bytes(sb[20..28].try_into().unwrap()) >= 3, "the journal was checkpointed twice");
    let s = open(dir.path(), len);
    assert!(matches!(s.info(2), Err(KvError::UnknownSequence(2))), "an owned sequence is gone after a reopening");
    assert_eq!(s.info(3).unwrap().tokens, vec![128]);
    let u = s.usage();
    assert_eq!((u.sequences, u.kept, u.reclaimed), (1, 1, 1));
    s.free(3).unwrap();
    assert_eq!(s.usage().pages_free, s.usage().pages_total, "the orphan's pages are free again");
    drop(s);
    let s = open(dir.path(), len);
    assert_eq!(s.usage().reclaimed, 0, "the orphan's end was journaled");
}

mod model {
    use super::*;
    use proptest::prelude::*;

    /// Who holds a sequence in the model: kept (`None`) or owner `Some(0 | 1)`.
    type Holder = Option<usize>;

    #[derive(Debug, Clone)]
    enum Op {
        Create(u64, Holder),
        Append(u64, usize),
        Fork(u64, u64, Holder),
        Free(u64),
        /// The owner ends: its sequences go, and a new owner takes its place.
        End(usize),
    }

    fn holder() -> impl Strategy<Value = Holder> {
        prop_oneof![Just(None), (0usize..2).prop_map(Some)]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u64..4, holder()).prop_map(|(s, h)| Op::Create(s, h)),
            (0u64..4, 1usize..150).prop_map(|(s, t)| Op::Append(s, t)),
            (0u64..4, 0u64..4, holder()).prop_map(|(a, b, h)| Op::Fork(a, b, h)),
            (0u64..4).prop_map(Op::Free),
            (0usize..2).prop_map(Op::End),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn the_store_behaves_like_a_map_of_row_lists(ops in proptest::collection::vec(op(), 1..30)) {
            let dir = tempfile::tempdir().unwrap();
            let s = open(dir.path(), 4 << 20);
            let mut m: HashMap<u64, (Vec<f32>, Holder)> = HashMap::new(); // K rows of head 0
            let mut owners = [s.new_owner(), s.new_owner()];
            let lifetime = |h: Holder, owners: &[Owner; 2]| h.map_or(Lifetime::Kept, |o| Lifetime::Owned(owners[o]));
            let mut n = 0f32;
            for op in ops {
                match op {
                    Op::Create(id, h) => {
                        let ok = !m.contains_key(&id);
                        prop_assert_eq!(s.create_as(lifetime(h, &owners), id, 1, 1, D, Dtype::F32, 1).is_ok(), ok);
                        if ok { m.insert(id, (Vec::new(), h)); }
                    }
                    Op::Append(id, t) => {
                        n += 1.0;
                        let k = rows(t * D, n);
                        let r = s.append(id, 0, t, &k, &k);
                        match m.get_mut(&id).map(|(rows, _)| rows) {
                            Some(rows) => { let fine = r.is_ok() || matches!(r, Err(KvError::Full { .. })); prop_assert!(fine, "append failed: {:?}", r); if r.is_ok() { rows.extend_from_slice(&k); } }
                            None => prop_assert!(matches!(r, Err(KvError::UnknownSequence(_)))),
                        }
                    }
                    Op::Fork(a, b, h) => {
                        let ok = m.contains_key(&a) && !m.contains_key(&b);
                        prop_assert_eq!(s.fork_as(lifetime(h, &owners), a, b).is_ok(), ok);
                        if ok { let rows = m[&a].0.clone(); m.insert(b, (rows, h)); }
                    }
                    Op::Free(id) => prop_assert_eq!(s.free(id).is_ok(), m.remove(&id).is_some()),
                    Op::End(o) => {
                        let held = m.values().filter(|(_, h)| *h == Some(o)).count();
                        prop_assert_eq!(s.free_owned(owners[o]).unwrap(), held);
                        m.retain(|_, (_, h)| *h != Some(o));
                        owners[o] = s.new_owner();
                    }
                }
            }
            for (id, (rows, _)) in &m {
                prop_assert_eq!(&read_back(&s, *id, 0, 0).0, rows);
            }
            prop_assert_eq!(s.usage().kept, m.values().filter(|(_, h)| h.is_none()).count());
            drop(s);
            // Reopened: the kept sequences' whole pages, and nothing of the owned ones.
            let s = open(dir.path(), 4 << 20);
            m.retain(|_, (_, h)| h.is_none());
            prop_assert_eq!(s.usage().sequences, m.len());
            let per_page = 4096 / (D * 4);
            for (id, (rows, _)) in &m {
                let kept = rows.len() / D / per_page * per_page;
                prop_assert_eq!(&read_back(&s, *id, 0, 0).0, &rows[..kept * D].to_vec());
            }
            for id in m.keys() { s.free(*id).unwrap(); }
            prop_assert_eq!(s.usage().pages_free, s.usage().pages_total);
        }
    }
}

#[test]
fn the_first_and_last_pages_of_the_lists_spread_over_the_channels() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path(), 16 << 20);
    let heads = 8;
    s.create(1, 1, heads, D, Dtype::F32, 1).unwrap();
    // 64 tokens a page: four whole pages in every K and V list.
    let t = 256;
    s.append(1, 0, t, &rows(heads * t * D, 1.0), &rows(heads * t * D, 2.0)).unwrap();
    let st = s.state.lock().unwrap();
    let channels = 8;
    let lists: Vec<&Vec<u32>> = st.seqs[&1].heads.iter().flat_map(|h| [&h.k_pages, &h.v_pages]).collect();
    for (what, pick) in [("first", 0usize), ("last", 3)] {
        let mut load = vec![0; channels];
        for l in &lists {
            assert_eq!(l.len(), 4);
            load[l[pick] as usize % channels] += 1;
        }
        let (lo, hi) = (load.iter().min().unwrap(), load.iter().max().unwrap());
        assert!(hi - lo <= 1, "the {what} pages of the lists fall unevenly on the channels: {load:?}");
    }
}

#[test]
fn kv_pages_smaller_than_flash_pages_stripe_by_flash_page() {
    let dir = tempfile::tempdir().unwrap();
    // 4 KiB KV pages on a drive of 32 KiB flash pages: eight share a die.
    let s = KvCache::open_on_drive(image(dir.path(), 32 << 20), 0, 32 << 20, 4096, 32768).unwrap();
    let heads = 4;
    s.create(1, 1, heads, D, Dtype::F32, 1).unwrap();
    let t = 8 * 4096 / (D * 4); // eight whole pages in every list
    s.append(1, 0, t, &rows(heads * t * D, 1.0), &rows(heads * t * D, 2.0)).unwrap();
    let st = s.state.lock().unwrap();
    let flash_page = |p: u32| (st.first_unit + u64::from(p)) / st.per_unit;
    let channels = 8;
    let mut first = vec![0; channels];
    for l in st.seqs[&1].heads.iter().flat_map(|h| [&h.k_pages, &h.v_pages]) {
        let on: Vec<u64> = l.iter().map(|&p| flash_page(p) % channels as u64).collect();
        let mut distinct = on.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), channels, "a list's eight pages share channels: {on:?}");
        first[on[0] as usize] += 1;
    }
    assert!(first.iter().max().unwrap() - first.iter().min().unwrap() <= 1, "the lists' first pages bunch: {first:?}");
    drop(st);
    drop(s);
    assert!(KvCache::open_on_drive(image(dir.path(), 32 << 20), 0, 32 << 20, 4096, 6144).is_err(), "a flash page of 1.5 KV pages");
}

#[test]
fn f16_pages_decode_as_each_value_alone_would() {
    for n in [1usize, 255, 256, 257, 1000] {
        let vals: Vec<half::f16> = (0..n).map(|i| half::f16::from_f32(((i as f32) * 0.731).sin() * 1000.0)).collect();
        let bytes: Vec<u8> = vals.iter().flat_map(|x| x.to_le_bytes()).collect();
        let mut out = vec![f32::NAN; n];
        decode(Dtype::F16, &bytes, &mut out);
        assert!(vals.iter().zip(&out).all(|(a, b)| a.to_f32() == *b), "{n} values");
        // At an odd address the bytes are not f16 values in place, and are copied first.
        let mut odd = vec![0u8; bytes.len() + 1];
        odd[1..].copy_from_slice(&bytes);
        let mut out = vec![f32::NAN; n];
        decode(Dtype::F16, &odd[1..], &mut out);
        assert!(vals.iter().zip(&out).all(|(a, b)| a.to_f32() == *b), "{n} values at an odd address");
    }
}

/// Delivers every read 2 ms after it may start, and records how each was issued: `None`
/// at once, `Some(t)` after what it depends on, delivered at `t`.
#[derive(Default)]
struct Issued(Mutex<Vec<(Option<Instant>, Instant)>>);

impl insitu_media::Pacing for Issued {
    fn on_read(&self, _: u64, _: u64, _: ReadPurpose) -> Instant {
        let done = Instant::now() + std::time::Duration::from_millis(2);
        self.0.lock().unwrap().push((None, done));
        done
    }
    fn on_read_after(&self, _: u64, _: u64, _: ReadPurpose, after: Instant) -> Instant {
        let done = after.max(Instant::now()) + std::time::Duration::from_millis(2);
        self.0.lock().unwrap().push((Some(after), done));
        done
    }
    fn on_write(&self, _: u64, _: u64) -> Instant {
        Instant::now()
    }
}

fn request(seqs: Vec<u64>, method: Method) -> insitu_proto::attention::Attend {
    insitu_proto::attention::Attend {
        layer: 0,
        heads: H,
        group: 1,
        head_dim: D,
        method,
        scale: 0.25,
        q: rows(seqs.len() * H * D, 3.0),
        seqs,
        new_kv: None,
        new_entries: None,
        groups: None,
        vectors: Dtype::F32,
        reduced: None,
    }
}

#[test]
fn a_request_books_every_read_at_once_waits_once_and_sparf_reads_its_pages_after_its_dimensions() {
    let dir = tempfile::tempdir().unwrap();
    let pacing = Arc::new(Issued::default());
    let p = dir.path().join("private.img");
    std::fs::File::create(&p).unwrap().set_len(16 << 20).unwrap();
    let media = Arc::new(Backing::open(&p, false).unwrap().with_pacing(pacing.clone()));
    let s = KvCache::open(media, 0, 16 << 20, 4096).unwrap();
    // 1,500 tokens of D = 16 f32: 23 token pages and one whole dimension block per head.
    for seq in 1..=4 {
        s.create(seq, 1, H, D, Dtype::F32, 1).unwrap();
        s.append(seq, 0, 1500, &rows(H * 1500 * D, seq as f32), &rows(H * 1500 * D, -(seq as f32))).unwrap();
    }
    let t = Instant::now();
    pacing.0.lock().unwrap().clear();
    s.attend_request(request(vec![1, 2, 3, 4], Method::Dense), Default::default()).unwrap();
    let reads = std::mem::take(&mut *pacing.0.lock().unwrap());
    assert!(reads.len() >= 4 * H, "every head reads: {}", reads.len());
    assert!(reads.iter().all(|(after, _)| after.is_none()), "dense reads depend on nothing: all on the queue at once");
    let last = reads.iter().map(|r| r.1).max().unwrap();
    assert!(Instant::now() >= last, "the request answers once its last read has arrived");

    let sparf = Method::SparF { r: 4, k: 256, local: 64, pages: 3, mean_v: false };
    s.attend_request(request(vec![1], sparf), Default::default()).unwrap();
    let reads = std::mem::take(&mut *pacing.0.lock().unwrap());
    let dims: Vec<Instant> = reads.iter().filter(|r| r.0.is_none()).map(|r| r.1).collect();
    let pages: Vec<Instant> = reads.iter().filter_map(|r| r.0).collect();
    assert!(!dims.is_empty() && !pages.is_empty(), "{reads:?}");
    assert!(pages.iter().all(|a| dims.contains(a)), "each head's pages are read when its dimension pages have arrived");
    assert!(t.elapsed() >= std::time::Duration::from_millis(4));
    assert!(Instant::now() >= reads.iter().map(|r| r.1).max().unwrap());
}

#[test]
fn a_request_on_a_store_without_a_device_model_reports_no_drive_time() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path(), 16 << 20);
    s.create(1, 1, H, D, Dtype::F32, 1).unwrap();
    s.append(1, 0, 300, &rows(H * 300 * D, 1.0), &rows(H * 300 * D, 2.0)).unwrap();
    let r = s.attend_request(request(vec![1], Method::Dense), Default::default()).unwrap();
    assert!(r.stats.pages_read > 0);
    assert_eq!(r.stats.drive_wait_ns, 0);
}

/// Delivers every read 200 ms after it is issued: a drive far slower than the engine.
struct Slow;

impl insitu_media::Pacing for Slow {
    fn on_read(&self, _: u64, _: u64, _: ReadPurpose) -> Instant {
        Instant::now() + std::time::Duration::from_millis(200)
    }
    fn on_read_after(&self, _: u64, _: u64, _: ReadPurpose, after: Instant) -> Instant {
        after.max(Instant::now()) + std::time::Duration::from_millis(200)
    }
    fn on_write(&self, _: u64, _: u64) -> Instant {
        Instant::now()
    }
}

#[test]
fn a_request_reports_how_long_it_waited_on_the_drive_after_its_engine() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("private.img");
    std::fs::File::create(&p).unwrap().set_len(16 << 20).unwrap();
    let media = Arc::new(Backing::open(&p, false).unwrap().with_pacing(Arc::new(Slow)));
    let s = KvCache::open(media, 0, 16 << 20, 4096).unwrap();
    s.create(1, 1, H, D, Dtype::F32, 1).unwrap();
    s.append(1, 0, 300, &rows(H * 300 * D, 1.0), &rows(H * 300 * D, 2.0)).unwrap();
    let t = Instant::now();
    let r = s.attend_request(request(vec![1], Method::Dense), Default::default()).unwrap();
    let took = t.elapsed();
    let waited = std::time::Duration::from_nanos(r.stats.drive_wait_ns);
    // The engine needs well under a millisecond for 300 tokens; the drive 200 ms.
    assert!(took >= std::time::Duration::from_millis(200), "{took:?}");
    assert!(waited >= std::time::Duration::from_millis(100) && waited <= took, "waited {waited:?} of {took:?}");
}

#[test]
fn f16_pages_widen_to_the_values_half_gives_for_every_bit_pattern() {
    use half::slice::HalfFloatSliceExt;
    // Every f16 bit pattern, at lengths that leave a remainder after the blocks of eight.
    let all: Vec<half::f16> = (0..=u16::MAX).map(half::f16::from_bits).collect();
    for len in [all.len(), all.len() - 3, 7, 0] {
        let (mut got, mut want) = (vec![0f32; len], vec![0f32; len]);
        widen_f16(&all[..len], &mut got);
        all[..len].convert_to_f32_slice(&mut want);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "f16 bits {i:#06x}: {g} against {w}");
        }
    }
}
