// SPDX-License-Identifier: Apache-2.0
//! The KV-cache commands end to end over NVMe/TCP: attention equals a host computation,
//! bad input is refused with its own status and changes nothing, and a restarted target
//! still has every flushed page.

mod common;

use common::{opts, NQN};
use insitu_daemon::{NamespaceSpec, ServerHandle, SubsystemConfig, Target, TargetConfig};
use insitu_fabric::{opcode, Command, SGL_TRANSPORT_DATA_BLOCK};
use insitu_initiator::Session;
use insitu_proto::attention::{decode_info, Admin, Append, Attend, AttendResult};
use insitu_proto::attention::{Dtype, Method};
use std::path::Path;

const HEADS: usize = 2;
const D: usize = 16;

fn serve(dir: &Path, private_bytes: Option<u64>) -> ServerHandle {
    let shared = dir.join("shared.img");
    std::fs::File::create(&shared).unwrap().set_len(8 << 20).unwrap();
    let mut namespaces = vec![NamespaceSpec::sharable(&shared)];
    if let Some(len) = private_bytes {
        let private = dir.join("private.img");
        let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&private).unwrap();
        if f.metadata().unwrap().len() == 0 {
            f.set_len(len).unwrap();
        }
        namespaces.push(NamespaceSpec::private(&private));
    }
    let cfg = TargetConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        subsystems: vec![SubsystemConfig { nqn: NQN.into(), namespaces, allow_hosts: vec![] }],
        ..TargetConfig::default()
    };
    Target::bind(cfg).unwrap().spawn()
}

/// Sends a write-direction KV command; returns (status as (sct, sc), dword 0).
fn send(s: &Session, op: u8, tag: u32, data: &[u8]) -> ((u8, u8), u32) {
    let mut c = Command::zeroed();
    c.set_opcode(op).set_cdw(10, tag).set_sgl(0, data.len() as u32, SGL_TRANSPORT_DATA_BLOCK);
    let (cqe, _) = s.submit(c, Some(data), 0).unwrap();
    ((((cqe.status >> 8) & 7) as u8, (cqe.status & 0xFF) as u8), cqe.dw0)
}

fn result(s: &Session, tag: u32, len: usize) -> ((u8, u8), Vec<u8>) {
    let mut c = Command::zeroed();
    c.set_opcode(opcode::KV_RESULT).set_cdw(10, tag).set_sgl(0, len as u32, SGL_TRANSPORT_DATA_BLOCK);
    let (cqe, data) = s.submit(c, None, len).unwrap();
    ((((cqe.status >> 8) & 7) as u8, (cqe.status & 0xFF) as u8), data)
}

fn info(s: &Session, seq: u64) -> Vec<usize> {
    let (st, len) = send(s, opcode::KV_ADMIN, 99, &Admin::Info { seq }.encode());
    assert_eq!(st, (0, 0));
    let (st, data) = result(s, 99, len as usize);
    assert_eq!(st, (0, 0));
    decode_info(&data).unwrap().6
}

fn values(n: usize, seed: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32 + seed) * 0.731).sin() * 1.5).collect()
}

fn create(s: &Session, seq: u64) -> (u8, u8) {
    create_as(s, seq, false)
}

fn create_as(s: &Session, seq: u64, kept: bool) -> (u8, u8) {
    send(s, opcode::KV_ADMIN, 0, &Admin::Create { seq, layers: 2, kv_heads: HEADS, head_dim: D, dtype: Dtype::F32, dims_per_page: 1, kept }.encode()).0
}

/// The status of an info request for `seq`: (0, 0) while it exists.
fn info_status(s: &Session, seq: u64) -> (u8, u8) {
    send(s, opcode::KV_ADMIN, 99, &Admin::Info { seq }.encode()).0
}

/// Polls until `f` holds: a controller ends once its connections' threads are done.
fn eventually(f: impl Fn() -> bool) -> bool {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::time::Instant::now() < until {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    false
}

fn append(s: &Session, seq: u64, layer: usize, k: &[f32], v: &[f32], tokens: usize) -> ((u8, u8), u32) {
    send(s, opcode::KV_APPEND, 0, &Append { seq, layer, heads: HEADS, head_dim: D, tokens, k: k.to_vec(), v: v.to_vec() }.encode())
}

/// Dense attention of one query row over `t` rows of K and V (row-major), in f64.
fn reference(q: &[f32], k: &[f32], v: &[f32], t: usize, scale: f64) -> Vec<f64> {
    let s: Vec<f64> = (0..t).map(|j| (0..D).map(|i| f64::from(q[i]) * f64::from(k[j * D + i])).sum::<f64>() * scale).collect();
    let m = s.iter().cloned().fold(f64::MIN, f64::max);
    let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
    let z: f64 = e.iter().sum();
    (0..D).map(|i| (0..t).map(|j| e[j] / z * f64::from(v[j * D + i])).sum()).collect()
}

#[test]
fn a_target_without_a_private_namespace_refuses_kv_commands() {
    let dir = tempfile::tempdir().unwrap();
    let h = serve(dir.path(), None);
    let s = Session::connect(opts(&h.local_addr().to_string())).unwrap();
    assert_eq!(create(&s, 1), (1, 0xC4));
    assert_eq!(insitu_proto::attention::explain_status(1, 0xC4), "the target has no private namespace for a KV cache (start it with --private IMG)");
}

#[test]
fn attention_over_the_fabric_equals_a_host_computation() {
    let dir = tempfile::tempdir().unwrap();
    let h = serve(dir.path(), Some(32 << 20));
    let s = Session::connect(opts(&h.local_addr().to_string())).unwrap();
    assert_eq!(create(&s, 7), (0, 0));
    let t = 150; // two full 64-token pages (16 f32 dimensions) and a DRAM tail
    let (k, v) = (values(HEADS * t * D, 1.0), values(HEADS * t * D, 2.0));
    assert_eq!(append(&s, 7, 1, &k, &v, t), ((0, 0), t as u32));
    let group = 3;
    let q = values(HEADS * group * D, 3.0);
    let scale = 0.25f32;
    let req = Attend {
        layer: 1,
        heads: HEADS,
        group,
        head_dim: D,
        method: Method::Dense,
        scale,
        seqs: vec![7],
        q: q.clone(),
        new_kv: None,
        new_entries: None,
        groups: None,
        vectors: Dtype::F32,
        reduced: None,
    };
    let (st, len) = send(&s, opcode::KV_ATTEND, 5, &req.encode());
    assert_eq!(st, (0, 0));
    let (st, data) = result(&s, 5, len as usize);
    assert_eq!(st, (0, 0));
    let r = AttendResult::decode(&data).unwrap();
    for h in 0..HEADS {
        let (kh, vh) = (&k[h * t * D..(h + 1) * t * D], &v[h * t * D..(h + 1) * t * D]);
        for g in 0..group {
            let row = (h * group + g) * D;
            let want = reference(&q[row..row + D], kh, vh, t, f64::from(scale));
            for (i, w) in want.iter().enumerate() {
                assert!((f64::from(r.out[row + i]) - w).abs() < 1e-5, "head {h} row {g} dim {i}");
            }
        }
    }
    assert_eq!(r.stats.media_bytes, (2 * HEADS * 2 * 4096) as u64, "every full page was read: {:?}", r.stats);
    // The result was released when read.
    assert_eq!(result(&s, 5, len as usize).0, (1, 0xC5));
}

#[test]
fn bad_requests_get_their_own_status_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let h = serve(dir.path(), Some(1 << 20));
    let s = Session::connect(opts(&h.local_addr().to_string())).unwrap();
    assert_eq!(create(&s, 1), (0, 0));
    assert_eq!(create(&s, 1), (1, 0xC1), "a second create of the same id");
    let t = 20;
    assert_eq!(append(&s, 1, 0, &values(HEADS * t * D, 0.0), &values(HEADS * t * D, 1.0), t).0, (0, 0));
    let before = info(&s, 1);
    // Unknown sequence.
    assert_eq!(append(&s, 9, 0, &values(HEADS * D, 0.0), &values(HEADS * D, 0.0), 1).0, (1, 0xC0));
    // Wrong head size, with the same byte count (2 heads x 16 = 4 heads x 8).
    let wrong = Append { seq: 1, layer: 0, heads: 4, head_dim: 8, tokens: 1, k: values(32, 0.0), v: values(32, 0.0) };
    assert_eq!(send(&s, opcode::KV_APPEND, 0, &wrong.encode()).0, (1, 0xC2));
    // A layer the sequence does not have.
    assert_eq!(append(&s, 1, 2, &values(HEADS * D, 0.0), &values(HEADS * D, 0.0), 1).0, (1, 0xC2));
    // Malformed: truncated.
    let mut cut = Append { seq: 1, layer: 0, heads: HEADS, head_dim: D, tokens: 1, k: values(HEADS * D, 0.0), v: values(HEADS * D, 0.0) }.encode();
    cut.truncate(cut.len() - 4);
    assert_eq!(send(&s, opcode::KV_APPEND, 0, &cut).0, (0, 0x02));
    // More than the 1 MiB namespace holds (750 token pages): refused before anything is written.
    let big = 3000;
    assert_eq!(append(&s, 1, 0, &values(HEADS * big * D, 0.0), &values(HEADS * big * D, 0.0), big).0, (1, 0xC3));
    // An attention batch with one unknown sequence appends nothing to the known one.
    let req = Attend {
        layer: 0,
        heads: HEADS,
        group: 1,
        head_dim: D,
        method: Method::Dense,
        scale: 0.25,
        seqs: vec![1, 42],
        q: values(2 * HEADS * D, 0.0),
        new_kv: Some((values(2 * HEADS * D, 0.0), values(2 * HEADS * D, 0.0))),
        new_entries: None,
        groups: None,
        vectors: Dtype::F32,
        reduced: None,
    };
    assert_eq!(send(&s, opcode::KV_ATTEND, 3, &req.encode()).0, (1, 0xC0));
    assert_eq!(info(&s, 1), before, "nothing changed");
}

#[test]
fn a_restarted_target_keeps_every_flushed_page() {
    let dir = tempfile::tempdir().unwrap();
    let t = 140; // two full pages per head and kind, 12 tokens in DRAM
    let (k, v) = (values(HEADS * t * D, 4.0), values(HEADS * t * D, 5.0));
    let q = values(HEADS * D, 6.0);
    let attend = |s: &Session| {
        let req = Attend {
            layer: 0,
            heads: HEADS,
            group: 1,
            head_dim: D,
            method: Method::Dense,
            scale: 0.25,
            seqs: vec![3],
            q: q.clone(),
            new_kv: None,
            new_entries: None,
            groups: None,
            vectors: Dtype::F32,
            reduced: None,
        };
        let (st, len) = send(s, opcode::KV_ATTEND, 1, &req.encode());
        assert_eq!(st, (0, 0));
        AttendResult::decode(&result(s, 1, len as usize).1).unwrap().out
    };
    {
        let h = serve(dir.path(), Some(32 << 20));
        let s = Session::connect(opts(&h.local_addr().to_string())).unwrap();
        assert_eq!(create_as(&s, 3, true), (0, 0));
        assert_eq!(append(&s, 3, 0, &k, &v, t).0, (0, 0));
        s.disconnect().unwrap();
        h.shutdown();
    }
    let h = serve(dir.path(), Some(32 << 20));
    let s = Session::connect(opts(&h.local_addr().to_string())).unwrap();
    assert_eq!(info(&s, 3), vec![128, 0], "the 128 flushed tokens are back; the 12 in DRAM are not");
    // Attention over what survived equals a host computation over the first 128 tokens.
    let out = attend(&s);
    for hd in 0..HEADS {
        let want = reference(&q[hd * D..(hd + 1) * D], &k[hd * t * D..hd * t * D + 128 * D], &v[hd * t * D..hd * t * D + 128 * D], 128, 0.25);
        for i in 0..D {
            assert!((f64::from(out[hd * D + i]) - want[i]).abs() < 1e-5);
        }
    }
}

#[test]
fn a_host_that_goes_takes_its_sequences_with_it_and_kept_ones_stay() {
    let dir = tempfile::tempdir().unwrap();
    let t = 140;
    let (k, v) = (values(HEADS * t * D, 4.0), values(HEADS * t * D, 5.0));
    let h = serve(dir.path(), Some(32 << 20));
    let addr = h.local_addr().to_string();
    let watcher = Session::connect(opts(&addr)).unwrap();
    // A host that disconnects, one whose connection breaks with a command in flight, and
    // one that simply drops its sockets: each had an owned sequence, a kept one, and an
    // owned fork of the kept one.
    let proxy = common::Proxy::start(&addr);
    for (i, how) in ["disconnect", "cut", "drop"].into_iter().enumerate() {
        let host = Session::connect(opts(if how == "cut" { &proxy.addr } else { &addr })).unwrap();
        let (owned, kept, fork) = (10 * i as u64 + 1, 10 * i as u64 + 2, 10 * i as u64 + 3);
        assert_eq!(create_as(&host, owned, false), (0, 0));
        assert_eq!(create_as(&host, kept, true), (0, 0));
        for seq in [owned, kept] {
            assert_eq!(append(&host, seq, 0, &k, &v, t).0, (0, 0));
        }
        let f = Admin::Fork { parent: kept, child: fork, kept: false };
        assert_eq!(send(&host, opcode::KV_ADMIN, 0, &f.encode()).0, (0, 0));
        assert_eq!(info_status(&watcher, owned), (0, 0), "another host sees an owned sequence");
        match how {
            "disconnect" => host.disconnect().unwrap(),
            "cut" => {
                proxy.cut_next();
                let _ = host.submit(Command::zeroed(), None, 0);
                drop(host);
            }
            _ => drop(host),
        }
        assert!(eventually(|| info_status(&watcher, owned) == (1, 0xC0)), "{how}: the owned sequence went with its host");
        assert_eq!(info_status(&watcher, fork), (1, 0xC0), "{how}: and so did the owned fork");
        assert_eq!(info(&watcher, kept), vec![t, 0], "{how}: the kept one stays, every token");
    }
    // The watcher's own sequences: one owned, which a restart ends with its host, and the
    // kept ones, which survive it (their whole pages).
    assert_eq!(create_as(&watcher, 40, false), (0, 0));
    assert_eq!(append(&watcher, 40, 0, &k, &v, t).0, (0, 0));
    drop(watcher);
    h.shutdown();
    let h = serve(dir.path(), Some(32 << 20));
    let s = Session::connect(opts(&h.local_addr().to_string())).unwrap();
    assert_eq!(info_status(&s, 40), (1, 0xC0), "an owned sequence does not outlive a restart");
    for kept in [2, 12, 22] {
        assert_eq!(info(&s, kept), vec![128, 0]);
        assert_eq!(send(&s, opcode::KV_ADMIN, 0, &Admin::Free { seq: kept }.encode()).0, (0, 0));
    }
}

/// Sends KV_ATTEND with `cdw11`; returns (status, dword 0).
fn send_attend(s: &Session, tag: u32, cdw11: u32, data: &[u8]) -> ((u8, u8), u32) {
    let mut c = Command::zeroed();
    c.set_opcode(opcode::KV_ATTEND).set_cdw(10, tag).set_cdw(11, cdw11).set_sgl(0, data.len() as u32, SGL_TRANSPORT_DATA_BLOCK);
    let (cqe, _) = s.submit(c, Some(data), 0).unwrap();
    ((((cqe.status >> 8) & 7) as u8, (cqe.status & 0xFF) as u8), cqe.dw0)
}

#[test]
fn a_result_asked_for_before_its_attention_arrives_with_its_log_sum_exp() {
    let dir = tempfile::tempdir().unwrap();
    let h = serve(dir.path(), Some(32 << 20));
    let s = Session::connect(opts(&h.local_addr().to_string())).unwrap();
    assert_eq!(create(&s, 4), (0, 0));
    let t = 40;
    let (k, v) = (values(HEADS * t * D, 4.0), values(HEADS * t * D, 5.0));
    assert_eq!(append(&s, 4, 0, &k, &v, t), ((0, 0), t as u32));
    let q = values(HEADS * D, 6.0);
    let scale = 0.3f32;
    let req = Attend {
        layer: 0,
        heads: HEADS,
        group: 1,
        head_dim: D,
        method: Method::Dense,
        scale,
        seqs: vec![4],
        q: q.clone(),
        new_kv: None,
        new_entries: None,
        groups: None,
        vectors: Dtype::F32,
        reduced: None,
    };
    let len = insitu_proto::attention::RESULT_HEADER_LEN + 4 * q.len() + 8 * HEADS;
    // The KV_RESULT goes first and waits: one round trip for the exchange.
    let ((st, data), (ast, alen)) = std::thread::scope(|sc| {
        let r = sc.spawn(|| result(&s, 12, len));
        std::thread::sleep(std::time::Duration::from_millis(30));
        let a = send_attend(&s, 12, 1, &req.encode());
        (r.join().unwrap(), a)
    });
    assert_eq!((ast, st), ((0, 0), (0, 0)));
    assert_eq!(alen as usize, len);
    let r = AttendResult::decode(&data).unwrap();
    let lse = r.lse.expect("a partial result carries the log-sum-exp");
    for h in 0..HEADS {
        let (kh, vh) = (&k[h * t * D..(h + 1) * t * D], &v[h * t * D..(h + 1) * t * D]);
        let qh = &q[h * D..(h + 1) * D];
        let want = reference(qh, kh, vh, t, f64::from(scale));
        for (i, w) in want.iter().enumerate() {
            assert!((f64::from(r.out[h * D + i]) - w).abs() < 1e-5, "head {h} dim {i}");
        }
        let scores = (0..t).map(|j| (0..D).map(|i| f64::from(qh[i]) * f64::from(kh[j * D + i])).sum::<f64>() * f64::from(scale));
        let want_lse = scores.map(f64::exp).sum::<f64>().ln();
        assert!((lse[h] - want_lse).abs() < 1e-9, "head {h}: {} vs {want_lse}", lse[h]);
    }
    // A tag that never comes: "no result" after the grace period, not a hang.
    assert_eq!(result(&s, 13, len).0, (1, 0xC5));
    // Unknown options are refused before anything is appended.
    let with_new = Attend { new_kv: Some((values(HEADS * D, 7.0), values(HEADS * D, 8.0))), ..req };
    assert_eq!(send_attend(&s, 14, 2, &with_new.encode()).0, (0, 0x02));
    assert_eq!(info(&s, 4), vec![t, 0]);
}
