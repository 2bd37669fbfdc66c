// SPDX-License-Identifier: Apache-2.0
//! Writes the seed corpus of the `capsule` and `pdu` targets into DIR (default
//! fuzz/seeds): well-formed sessions, and each PDU of them alone; and of the `kv` target:
//! one request of each kind.

use insitu_fabric::CommonHeader;

fn main() -> std::io::Result<()> {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "seeds".into()));
    let (capsule, pdu) = (dir.join("capsule"), dir.join("pdu"));
    std::fs::create_dir_all(&capsule)?;
    std::fs::create_dir_all(&pdu)?;
    for (name, bytes) in insitu_daemon::fuzzing::seed_inputs() {
        std::fs::write(capsule.join(name), &bytes)?;
        // Each PDU alone, after the digest byte the pdu target reads first (ICReq never
        // carries digests; the rest use the session's).
        let flags = if name.ends_with("digests") { 3u8 } else { 0 };
        let mut at = 0;
        let mut n = 0;
        while at + 8 <= bytes.len() {
            let ch = CommonHeader::parse(bytes[at..at + 8].try_into().expect("8 bytes"), 1 << 24).expect("seeds are well formed");
            let end = at + ch.plen as usize;
            let mut one = vec![if n == 0 { 0 } else { flags }];
            one.extend_from_slice(&bytes[at..end]);
            std::fs::write(pdu.join(format!("{name}-{n:02}")), one)?;
            (at, n) = (end, n + 1);
        }
    }
    let kv = dir.join("kv");
    std::fs::create_dir_all(&kv)?;
    use insitu_proto::attention::{Admin, Append, Attend, AttendResult};
    use insitu_proto::attention::{AttendStats, Dtype, Method};
    let f = |n: usize| (0..n).map(|i| i as f32 * 0.25).collect::<Vec<f32>>();
    let requests = [
        ("admin-create", Admin::Create { seq: 1, layers: 2, kv_heads: 2, head_dim: 8, dtype: Dtype::F16, dims_per_page: 2 }.encode()),
        ("admin-fork", Admin::Fork { parent: 1, child: 2 }.encode()),
        ("append", Append { seq: 1, layer: 0, heads: 2, head_dim: 8, tokens: 3, k: f(48), v: f(48) }.encode()),
        (
            "attend-dense",
            Attend { layer: 1, heads: 2, group: 3, head_dim: 8, method: Method::Dense, scale: 0.35, seqs: vec![1, 2], q: f(96), new_kv: None, groups: None, vectors: Dtype::F32 }.encode(),
        ),
        (
            "attend-sparf",
            Attend {
                layer: 0,
                heads: 1,
                group: 1,
                head_dim: 8,
                method: Method::SparF { r: 2, k: 4, local: 1, pages: 1, mean_v: false },
                scale: 0.35,
                seqs: vec![3],
                q: f(8),
                new_kv: Some((f(8), f(8))),
                groups: None,
                vectors: Dtype::F32,
            }
            .encode(),
        ),
        (
            "result",
            AttendResult { entries: 1, heads: 1, group: 1, head_dim: 4, stats: AttendStats { pages_read: 2, media_bytes: 8192, rows_used: 8 }, out: f(4), lse: None, vectors: Dtype::F32 }
                .encode(),
        ),
        (
            "result-partial",
            AttendResult { entries: 1, heads: 1, group: 2, head_dim: 2, stats: AttendStats::default(), out: f(4), lse: Some(vec![0.5, f64::NEG_INFINITY]), vectors: Dtype::F32 }.encode(),
        ),
    ];
    for (name, bytes) in requests {
        std::fs::write(kv.join(name), bytes)?;
    }
    Ok(())
}
