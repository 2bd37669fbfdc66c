// SPDX-License-Identifier: Apache-2.0
//! Analysis kernels over arrays of binary numbers, the workloads computational-storage
//! planners measure (Count, Vector Addition, Array Merge, PageRank):
//!
//! * `count`: how many little-endian u64 elements lie in `[min, max)` (args `min`, default
//!   0; `max`, default 2^64-1). Any number of inputs; per input
//!   `[("count", U64), ("elements", U64)]`.
//! * `vector-add`: element-wise wrapping sum of two equally long u64 arrays, written to one
//!   output. Record `[("output_length", U64), ("elements", U64)]`.
//! * `array-merge`: the merge of two ascending u64 arrays, written to one output (ascending).
//!   Record `[("output_length", U64), ("elements", U64)]`.
//! * `pagerank`: PageRank over a graph given as little-endian u32 `(source, destination)`
//!   pairs, with `nodes` (required), `iterations` (default 20) and a damping of 0.85;
//!   dangling nodes spread their rank evenly. Writes one little-endian f64 per node to the
//!   output. Record `[("output_length", U64), ("nodes", U64), ("edges", U64)]`.
//!
//! An input whose length is not a whole number of elements is refused (`Failed`). Elements
//! straddling chunk boundaries are reassembled, so results never depend on chunking.

use crate::{check_shape, Args, InputStream, Job, Kernel, KernelError, OutputSink, Param, ParamType, Record, Value};

/// Calls `f` with every `N`-byte element of `input`, in order.
fn for_each<const N: usize>(input: &mut dyn InputStream, kernel: &str, mut f: impl FnMut([u8; N])) -> Result<u64, KernelError> {
    if !input.len().is_multiple_of(N as u64) {
        return Err(KernelError::Failed(format!("{kernel}: input of {} bytes is not a whole number of {N}-byte elements", input.len())));
    }
    let mut carry = [0u8; N];
    let mut have = 0;
    let mut n = 0u64;
    while let Some(mut chunk) = input.next_chunk()? {
        if have > 0 {
            let take = (N - have).min(chunk.len());
            carry[have..have + take].copy_from_slice(&chunk[..take]);
            have += take;
            chunk = &chunk[take..];
            if have < N {
                continue;
            }
            f(carry);
            n += 1;
        }
        let mut it = chunk.chunks_exact(N);
        for e in &mut it {
            f(e.try_into().expect("N bytes"));
            n += 1;
        }
        let rest = it.remainder();
        carry[..rest.len()].copy_from_slice(rest);
        have = rest.len();
    }
    Ok(n)
}

fn u64_of(b: [u8; 8]) -> u64 {
    u64::from_le_bytes(b)
}

/// Collects a whole input as u64 elements (merge needs random access to both sides).
fn all_u64(input: &mut dyn InputStream, kernel: &str) -> Result<Vec<u64>, KernelError> {
    let mut v = Vec::with_capacity(usize::try_from(input.len() / 8).unwrap_or(0));
    for_each::<8>(input, kernel, |e| v.push(u64_of(e)))?;
    Ok(v)
}

/// Writes u64/f64 elements to a sink in 64 KiB pieces.
fn write_elements(sink: &mut dyn OutputSink, elements: impl Iterator<Item = [u8; 8]>) -> Result<u64, KernelError> {
    let mut buf = Vec::with_capacity(64 << 10);
    for e in elements {
        buf.extend_from_slice(&e);
        if buf.len() >= 64 << 10 {
            sink.write(&buf)?;
            buf.clear();
        }
    }
    sink.write(&buf)?;
    sink.finish()
}

fn done(len: u64, extra: &[(&str, u64)]) -> Vec<Record> {
    let mut r: Record = vec![("output_length".into(), Value::U64(len))];
    r.extend(extra.iter().map(|(k, v)| ((*k).to_string(), Value::U64(*v))));
    vec![r]
}

/// `count`.
pub(crate) struct Count;

static COUNT_PARAMS: [Param; 2] = [
    Param { key: "min", ty: ParamType::U64, required: false, doc: "smallest value counted (default 0)" },
    Param { key: "max", ty: ParamType::U64, required: false, doc: "values below this are counted (default 2^64-1)" },
];

impl Kernel for Count {
    fn name(&self) -> &'static str {
        "count"
    }
    fn summary(&self) -> &'static str {
        "count the little-endian u64 elements of each input within [min, max)"
    }
    fn params(&self) -> &'static [Param] {
        &COUNT_PARAMS
    }
    fn prepare(&self, args: &Args<'_>) -> Result<Box<dyn Job>, KernelError> {
        args.check(self.params())?;
        Ok(Box::new(CountJob { min: args.u64_or("min", 0), max: args.u64_or("max", u64::MAX) }))
    }
}

struct CountJob {
    min: u64,
    max: u64,
}

impl Job for CountJob {
    fn run(self: Box<Self>, inputs: &mut [&mut dyn InputStream], outputs: &mut [&mut dyn OutputSink]) -> Result<Vec<Record>, KernelError> {
        check_shape("count", inputs, outputs, None, 0)?;
        let mut out = Vec::new();
        for input in inputs.iter_mut() {
            let mut count = 0u64;
            let n = for_each::<8>(&mut **input, "count", |e| count += u64::from((self.min..self.max).contains(&u64_of(e))))?;
            out.push(vec![("count".into(), Value::U64(count)), ("elements".into(), Value::U64(n))]);
        }
        Ok(out)
    }
}

/// `vector-add` and `array-merge`: two inputs, one output.
pub(crate) struct TwoArrays {
    merge: bool,
}

/// The `vector-add` kernel.
pub(crate) const VECTOR_ADD: TwoArrays = TwoArrays { merge: false };
/// The `array-merge` kernel.
pub(crate) const ARRAY_MERGE: TwoArrays = TwoArrays { merge: true };

impl Kernel for TwoArrays {
    fn name(&self) -> &'static str {
        if self.merge {
            "array-merge"
        } else {
            "vector-add"
        }
    }
    fn summary(&self) -> &'static str {
        if self.merge {
            "merge two ascending little-endian u64 arrays into one"
        } else {
            "element-wise wrapping sum of two little-endian u64 arrays"
        }
    }
    fn max_inputs(&self) -> usize {
        2
    }
    fn output_count(&self) -> usize {
        1
    }
    /// A merge writes every input element; a sum writes one per pair.
    fn output_capacity(&self, _args: &Args<'_>, input_len: u64) -> u64 {
        if self.merge {
            input_len
        } else {
            input_len / 2
        }
    }
    fn prepare(&self, args: &Args<'_>) -> Result<Box<dyn Job>, KernelError> {
        args.check(self.params())?;
        Ok(Box::new(TwoArraysJob { merge: self.merge }))
    }
}

struct TwoArraysJob {
    merge: bool,
}

impl Job for TwoArraysJob {
    fn run(self: Box<Self>, inputs: &mut [&mut dyn InputStream], outputs: &mut [&mut dyn OutputSink]) -> Result<Vec<Record>, KernelError> {
        let name = if self.merge { "array-merge" } else { "vector-add" };
        check_shape(name, inputs, outputs, Some(2), 1)?;
        let a = all_u64(&mut *inputs[0], name)?;
        let b = all_u64(&mut *inputs[1], name)?;
        let sink = &mut *outputs[0];
        if !self.merge {
            if a.len() != b.len() {
                return Err(KernelError::Failed(format!("vector-add: inputs hold {} and {} elements; they must be equally long", a.len(), b.len())));
            }
            let len = write_elements(sink, a.iter().zip(&b).map(|(x, y)| x.wrapping_add(*y).to_le_bytes()))?;
            return Ok(done(len, &[("elements", a.len() as u64)]));
        }
        if !a.is_sorted() || !b.is_sorted() {
            return Err(KernelError::Failed("array-merge: both inputs must be in ascending order".into()));
        }
        let (mut i, mut j) = (0, 0);
        let merged = std::iter::from_fn(|| {
            let next = match (a.get(i), b.get(j)) {
                (Some(x), Some(y)) if x <= y => {
                    i += 1;
                    *x
                }
                (_, Some(y)) => {
                    j += 1;
                    *y
                }
                (Some(x), None) => {
                    i += 1;
                    *x
                }
                (None, None) => return None,
            };
            Some(next.to_le_bytes())
        });
        let len = write_elements(sink, merged)?;
        Ok(done(len, &[("elements", (a.len() + b.len()) as u64)]))
    }
}

/// `pagerank`.
pub(crate) struct PageRank;

static PAGERANK_PARAMS: [Param; 2] = [
    Param { key: "nodes", ty: ParamType::U64, required: true, doc: "number of nodes; node IDs are 0..nodes" },
    Param { key: "iterations", ty: ParamType::U64, required: false, doc: "power iterations (default 20)" },
];

/// Largest graph accepted: the rank vectors must fit comfortably in memory.
const MAX_NODES: u64 = 1 << 27;

impl Kernel for PageRank {
    fn name(&self) -> &'static str {
        "pagerank"
    }
    fn summary(&self) -> &'static str {
        "PageRank of a graph of little-endian u32 (source, destination) edges"
    }
    fn params(&self) -> &'static [Param] {
        &PAGERANK_PARAMS
    }
    fn max_inputs(&self) -> usize {
        1
    }
    fn output_count(&self) -> usize {
        1
    }
    fn output_capacity(&self, args: &Args<'_>, _input_len: u64) -> u64 {
        args.u64_or("nodes", 0).saturating_mul(8)
    }
    fn prepare(&self, args: &Args<'_>) -> Result<Box<dyn Job>, KernelError> {
        args.check(self.params())?;
        let nodes = args.u64_or("nodes", 0);
        if nodes == 0 || nodes > MAX_NODES {
            return Err(KernelError::BadArgument { key: "nodes".into(), detail: format!("must be 1..={MAX_NODES}") });
        }
        let iterations = args.u64_or("iterations", 20);
        if iterations > 1000 {
            return Err(KernelError::BadArgument { key: "iterations".into(), detail: "at most 1000".into() });
        }
        Ok(Box::new(PageRankJob { nodes: nodes as usize, iterations }))
    }
}

struct PageRankJob {
    nodes: usize,
    iterations: u64,
}

impl Job for PageRankJob {
    fn run(self: Box<Self>, inputs: &mut [&mut dyn InputStream], outputs: &mut [&mut dyn OutputSink]) -> Result<Vec<Record>, KernelError> {
        check_shape("pagerank", inputs, outputs, Some(1), 1)?;
        let n = self.nodes;
        let mut edges: Vec<(u32, u32)> = Vec::new();
        let mut bad = None;
        for_each::<8>(&mut *inputs[0], "pagerank", |e| {
            let (s, d) = (u32::from_le_bytes([e[0], e[1], e[2], e[3]]), u32::from_le_bytes([e[4], e[5], e[6], e[7]]));
            if s as usize >= n || d as usize >= n {
                bad.get_or_insert((s, d));
            }
            edges.push((s, d));
        })?;
        if let Some((s, d)) = bad {
            return Err(KernelError::Failed(format!("pagerank: edge ({s}, {d}) names a node outside 0..{n}")));
        }
        let mut out_degree = vec![0u32; n];
        for (s, _) in &edges {
            out_degree[*s as usize] += 1;
        }
        let damping = 0.85f64;
        let mut rank = vec![1.0 / n as f64; n];
        let mut next = vec![0.0f64; n];
        for _ in 0..self.iterations {
            let dangling: f64 = rank.iter().zip(&out_degree).filter(|(_, d)| **d == 0).map(|(r, _)| *r).sum();
            let base = (1.0 - damping) / n as f64 + damping * dangling / n as f64;
            next.iter_mut().for_each(|x| *x = base);
            for (s, d) in &edges {
                next[*d as usize] += damping * rank[*s as usize] / f64::from(out_degree[*s as usize]);
            }
            std::mem::swap(&mut rank, &mut next);
        }
        let len = write_elements(&mut *outputs[0], rank.iter().map(|r| r.to_le_bytes()))?;
        Ok(done(len, &[("nodes", n as u64), ("edges", edges.len() as u64)]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SliceInput, VecSink};

    fn u64s(v: &[u64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn run(k: &dyn Kernel, args: &[(String, Value)], ins: &[&[u8]], chunk: usize, cap: u64) -> (Vec<Record>, Vec<u8>) {
        let job = k.prepare(&Args::new(args)).unwrap();
        let mut streams: Vec<SliceInput<'_>> = ins.iter().map(|d| SliceInput::new(d, chunk)).collect();
        let mut refs: Vec<&mut dyn InputStream> = streams.iter_mut().map(|s| s as &mut dyn InputStream).collect();
        let mut sink = VecSink::new(cap);
        let recs = if k.output_count() == 1 { job.run(&mut refs, &mut [&mut sink]).unwrap() } else { job.run(&mut refs, &mut []).unwrap() };
        (recs, sink.data)
    }

    #[test]
    fn count_is_independent_of_chunking() {
        let data = u64s(&(0..1000u64).map(|i| i * 7919 % 1000).collect::<Vec<_>>());
        let args = vec![("min".to_string(), Value::U64(100)), ("max".to_string(), Value::U64(200))];
        for chunk in [1, 3, 8, 13, 4096] {
            let (r, _) = run(&Count, &args, &[&data], chunk, 0);
            assert_eq!(r[0][0].1, Value::U64(100), "chunk {chunk}");
            assert_eq!(r[0][1].1, Value::U64(1000));
        }
        let job = Count.prepare(&Args::new(&[])).unwrap();
        let mut odd = SliceInput::new(&[1, 2, 3], 2);
        assert!(job.run(&mut [&mut odd], &mut []).is_err());
    }

    #[test]
    fn vector_add_and_merge() {
        let a = u64s(&[1, 5, u64::MAX, 9]);
        let b = u64s(&[2, 6, 2, 10]);
        let (r, out) = run(&VECTOR_ADD, &[], &[&a, &b], 5, 32);
        assert_eq!(out, u64s(&[3, 11, 1, 19]));
        assert_eq!(r[0][0].1, Value::U64(32));
        let (_, merged) = run(&ARRAY_MERGE, &[], &[&u64s(&[1, 4, 9]), &u64s(&[2, 3, 10, 11])], 7, 56);
        assert_eq!(merged, u64s(&[1, 2, 3, 4, 9, 10, 11]));
        let job = ARRAY_MERGE.prepare(&Args::new(&[])).unwrap();
        let (x, y) = (u64s(&[3, 1]), u64s(&[1]));
        let (mut p, mut q) = (SliceInput::new(&x, 8), SliceInput::new(&y, 8));
        assert!(job.run(&mut [&mut p, &mut q], &mut [&mut VecSink::new(100)]).is_err());
    }

    #[test]
    fn pagerank_of_a_cycle_is_uniform_and_ranks_sum_to_one() {
        let edges: Vec<u8> = [(0u32, 1u32), (1, 2), (2, 0)].iter().flat_map(|(s, d)| s.to_le_bytes().into_iter().chain(d.to_le_bytes())).collect();
        let args = vec![("nodes".to_string(), Value::U64(3))];
        let (_, out) = run(&PageRank, &args, &[&edges], 5, 24);
        let ranks: Vec<f64> = out.chunks(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect();
        assert!(ranks.iter().all(|r| (r - 1.0 / 3.0).abs() < 1e-9), "{ranks:?}");
        // A star: everything points at node 0, which is dangling.
        let star: Vec<u8> = (1..5u32).flat_map(|s| s.to_le_bytes().into_iter().chain(0u32.to_le_bytes())).collect();
        let (_, out) = run(&PageRank, &[("nodes".to_string(), Value::U64(5))], &[&star], 3, 40);
        let ranks: Vec<f64> = out.chunks(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect();
        assert!((ranks.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        assert!(ranks[0] > ranks[1] && (ranks[1] - ranks[4]).abs() < 1e-12);
        assert!(PageRank.prepare(&Args::new(&[])).is_err());
    }
}
