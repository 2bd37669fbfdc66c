// SPDX-License-Identifier: Apache-2.0
//! What one decode step's attention costs the engine, without a transport or a host: a
//! batch of sequences in a store on a file in memory, each KV head attended as a
//! KV_ATTEND of that batch would attend it, on the store's threads and on one thread.
//!
//! `cargo run --release -p insitu-kvcache --example attend_cost -- [SEQS] [TOKENS] [ITERS] [dense|sparf|none]`
//! (defaults 8, 2048, 50: the `8x2048` point of `insitu bench llm` with SmolLM2-135M's
//! 3 KV heads of 64, 3 query rows each, f16 pages, SparF at 1/8 as the host asks for it;
//! the last argument runs one method, or neither). Then what a decode step's append of one
//! token costs a sequence.

use std::sync::Arc;
use std::time::Instant;

use insitu_kvcache::{attend, Dtype, KvCache, Method, Task};
use insitu_media::Backing;

const HEADS: usize = 3;
const HEAD_DIM: usize = 64;
const GROUP: usize = 3;

fn main() {
    let arg = |i: usize, default: usize| std::env::args().nth(i).map_or(default, |a| a.parse().expect("a number"));
    let (seqs, tokens, iters) = (arg(1, 8), arg(2, 2048), arg(3, 50));
    let dir = std::path::Path::new("/dev/shm").join(format!("insitu-attend-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("private.img");
    let len = (seqs * tokens * HEADS * HEAD_DIM * 2 * 3 + (64 << 20)) as u64;
    std::fs::File::create(&path).unwrap().set_len(len).unwrap();
    let store = KvCache::open(Arc::new(Backing::open(&path, false).unwrap()), 0, len, 4096).unwrap();
    let mut x = 0.1f32;
    let mut next = move || {
        x = (x * 3.7 + 0.13).fract();
        x - 0.5
    };
    for s in 0..seqs as u64 {
        store.create(s, 1, HEADS, HEAD_DIM, Dtype::F16, 1).unwrap();
        let k: Vec<f32> = (0..HEADS * tokens * HEAD_DIM).map(|_| next()).collect();
        let v: Vec<f32> = (0..HEADS * tokens * HEAD_DIM).map(|_| next()).collect();
        store.append(s, 0, tokens, &k, &v).unwrap();
    }
    let q: Vec<f32> = (0..seqs * HEADS * GROUP * HEAD_DIM).map(|_| next() * 4.0).collect();
    let scale = 1.0 / (HEAD_DIM as f32).sqrt();
    // SparF's parameters as `insitu.llm.sparf.params(0.125, 64, tokens, 32)` gives them.
    let (tpp, ratio) = (4096 / (2 * HEAD_DIM), 0.125f64);
    let r = (ratio * HEAD_DIM as f64).round() as usize;
    let k = (ratio * tokens as f64 / 2.0).ceil() as usize;
    let local = (k / 4).max(1);
    let pages = (9.0 * ratio * tokens as f64 / (8.0 * tpp as f64)).ceil() as usize;
    let sparf = Method::SparF { r, k: (pages + 2) * tpp + local, local, pages, mean_v: false };
    let heads: Vec<_> = (0..seqs as u64).flat_map(|s| (0..HEADS).map(move |h| (s, h))).map(|(s, h)| store.head(s, 0, h).unwrap()).collect();
    let only = std::env::args().nth(4);
    for (name, method) in [("dense", Method::Dense), ("sparf", sparf)] {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let mut out = vec![0f32; q.len()];
        let mut run_pool = || {
            let tasks = heads
                .iter()
                .zip(q.chunks(GROUP * HEAD_DIM))
                .zip(out.chunks_mut(GROUP * HEAD_DIM))
                .map(|((head, q), out)| Task { head, q, out, lse: None })
                .collect();
            store.attend_all(tasks, scale, method).unwrap()
        };
        run_pool();
        let t = Instant::now();
        for _ in 0..iters {
            run_pool();
        }
        let pool = t.elapsed().as_secs_f64() / iters as f64;
        let t = Instant::now();
        for _ in 0..iters {
            for (head, (q, out)) in heads.iter().zip(q.chunks(GROUP * HEAD_DIM).zip(out.chunks_mut(GROUP * HEAD_DIM))) {
                attend(head, q, scale, method, out).unwrap();
            }
        }
        let one = t.elapsed().as_secs_f64() / iters as f64;
        println!(
            "{name}: {seqs} x {tokens} x {HEADS} heads: threads {:.3} ms, one thread {:.3} ms ({:.1} us a head)",
            pool * 1e3,
            one * 1e3,
            one * 1e6 / heads.len() as f64
        );
    }
    let kv: Vec<f32> = (0..HEADS * HEAD_DIM).map(|_| next()).collect();
    let t = Instant::now();
    for _ in 0..iters {
        for s in 0..seqs as u64 {
            store.append(s, 0, 1, &kv, &kv).unwrap();
        }
    }
    println!("append: {:.1} us a sequence's token", t.elapsed().as_secs_f64() * 1e6 / (iters * seqs) as f64);
    std::fs::remove_dir_all(&dir).unwrap();
}
