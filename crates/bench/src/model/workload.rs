// SPDX-License-Identifier: Apache-2.0
//! The analysis workloads of CSDPLAN's evaluation (Count, Vector Addition, Array Merge,
//! PageRank) as data for the offload kernels of the same names, split evenly over drives.

use super::rig::Placer;
use crate::dataset::Rng;
use insitu_offload::{Args, Registry};
use insitu_proto::{Descriptor, Value, VirtualObject};

/// The kernels, in CSDPLAN's order.
pub(crate) const KERNELS: [&str; 4] = ["count", "vector-add", "array-merge", "pagerank"];

/// How many times slower than one host core CSDPLAN-EC measured each kernel (Fig. 3), in
/// [`KERNELS`] order, for the presets it measured.
pub(crate) fn paper_slowdown(preset: &str) -> Option<[f64; 4]> {
    match preset.split('@').next()? {
        "newport" => Some([1.7, 6.3, 2.8, 1.3]),
        "smartssd" => Some([1.6, 4.6, 28.1, 15.4]),
        _ => None,
    }
}

/// PageRank power iterations.
pub(crate) const PAGERANK_ITERATIONS: u64 = 20;
/// Edges per node of the generated graphs.
const EDGES_PER_NODE: u64 = 8;

/// One drive's share of a workload: its input arrays and the kernel's arguments.
pub(crate) struct Share {
    pub(crate) inputs: Vec<Vec<u8>>,
    pub(crate) args: Vec<(String, Value)>,
}

fn u64s(n: u64, mut f: impl FnMut() -> u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(n as usize * 8);
    for _ in 0..n {
        v.extend_from_slice(&f().to_le_bytes());
    }
    v
}

/// `bytes` of input for `kernel` (rounded down to whole elements), from `seed`.
pub(crate) fn generate(kernel: &str, bytes: u64, seed: u64) -> Result<Share, String> {
    let mut rng = Rng::new(seed);
    let share = match kernel {
        "count" => Share { inputs: vec![u64s(bytes / 8, || rng.next_u64())], args: vec![("min".into(), Value::U64(0)), ("max".into(), Value::U64(1 << 63))] },
        "vector-add" => {
            let n = bytes / 16;
            Share { inputs: vec![u64s(n, || rng.next_u64()), u64s(n, || rng.next_u64())], args: vec![] }
        }
        "array-merge" => {
            let n = bytes / 16;
            let ascending = |rng: &mut Rng| {
                let mut x = 0u64;
                u64s(n, || {
                    x += rng.below(1000);
                    x
                })
            };
            let a = ascending(&mut rng);
            Share { inputs: vec![a, ascending(&mut rng)], args: vec![] }
        }
        "pagerank" => {
            let edges = bytes / 8;
            let nodes = (edges / EDGES_PER_NODE).max(16);
            let data = u64s(edges, || (rng.below(nodes) << 32) | rng.below(nodes));
            // Each u64 is read as two little-endian u32s: (low, high) = (source, destination).
            let args = vec![("nodes".into(), Value::U64(nodes)), ("iterations".into(), Value::U64(PAGERANK_ITERATIONS))];
            Share { inputs: vec![data], args }
        }
        other => return Err(format!("unknown kernel {other:?}: choose from {}", KERNELS.join(", "))),
    };
    Ok(share)
}

/// Where a share lives in a drive's image, and the descriptor that runs the kernel on it.
pub(crate) struct Placed {
    pub(crate) inputs: Vec<VirtualObject>,
    pub(crate) output: Option<VirtualObject>,
    pub(crate) descriptor: Vec<u8>,
}

/// Places `share`'s inputs (contiguous) and an output object sized as the kernel asks.
pub(crate) fn place(kernel: &str, share: &Share, placer: &mut Placer) -> Placed {
    let inputs: Vec<VirtualObject> = share.inputs.iter().map(|d| placer.place(d.len() as u64, 1, 0)).collect();
    let registry = Registry::standard();
    let k = registry.get(kernel).expect("workload kernels are standard");
    let total: u64 = share.inputs.iter().map(|d| d.len() as u64).sum();
    let output = (k.output_count() == 1).then(|| placer.place(k.output_capacity(&Args::new(&share.args), total).max(1), 1, 0));
    let mut d = Descriptor::new(kernel, inputs.clone());
    d.args = share.args.clone();
    d.outputs = output.iter().cloned().collect();
    Placed { inputs, output, descriptor: d.encode() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::meter::{run_in_memory, Meter};

    #[test]
    fn every_workload_runs_and_merges_stay_sorted() {
        let meter = Meter::new(None).unwrap();
        for k in KERNELS {
            let share = generate(k, 1 << 16, 3).unwrap();
            let ins: Vec<&[u8]> = share.inputs.iter().map(|v| v.as_slice()).collect();
            let (records, out) = run_in_memory(k, &share.args, &ins, &meter).unwrap();
            assert!(!records.is_empty(), "{k}");
            if k == "array-merge" {
                let v: Vec<u64> = out.chunks(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
                assert_eq!(v.len(), (1 << 16) / 8);
                assert!(v.is_sorted());
            }
            let mut p = Placer::default();
            let placed = place(k, &share, &mut p);
            assert_eq!(placed.output.is_some(), k != "count");
        }
        assert!(generate("sort", 8, 1).is_err());
        assert_eq!(paper_slowdown("newport@2000").unwrap()[1], 6.3);
        assert!(paper_slowdown("intel-p4600").is_none());
    }
}
