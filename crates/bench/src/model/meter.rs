// SPDX-License-Identifier: Apache-2.0
//! Metered kernels: the standard kernels, each run wrapped so that its thread's CPU time is
//! measured and charged to an offload engine's CPU budget, and the time it waits for input
//! is measured apart.
//!
//! The target's own budget hook (`Engine::with_compute_budget`) charges only inside
//! `next_chunk`, from a CPU stamp each input takes when it is created. That charges a
//! second input's first chunk with everything computed on the first input (vector-add and
//! array-merge pay for their first array twice) and never charges what a kernel computes
//! after its last read (the additions, the merge, PageRank's iterations). The wrapper here
//! keeps one stamp per run, shared by every input, and charges the tail when the kernel
//! returns. Only CPU time is charged: time waiting for the media is not.

use insitu_model::{thread_cpu_ns, ComputeBudget, ComputeConfig};
use insitu_offload::{Args, InputStream, Job, Kernel, KernelError, OutputSink, Param, Record, Registry};
use std::cell::Cell;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Counters of every metered run, and the CPU budget they are charged to (if any).
#[derive(Debug, Default)]
pub(crate) struct Meter {
    budget: Option<ComputeBudget>,
    /// Kernel thread CPU time, ns.
    pub(crate) cpu_ns: AtomicU64,
    /// Time the budget stalled kernels, ns.
    pub(crate) stall_ns: AtomicU64,
    /// Time kernels waited for input chunks, ns.
    pub(crate) input_wait_ns: AtomicU64,
    /// Time kernels spent in output writes (copies, write calls, media waits), ns.
    pub(crate) output_ns: AtomicU64,
    /// Oversleep not yet made up, ns: later stalls are shortened by it, so late wake-ups do
    /// not add up to a slower engine than the budget says.
    credit_ns: AtomicU64,
}

/// A snapshot of a [`Meter`], ns.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MeterReading {
    pub(crate) cpu_ns: u64,
    pub(crate) stall_ns: u64,
    pub(crate) input_wait_ns: u64,
    pub(crate) output_ns: u64,
}

impl std::ops::Sub for MeterReading {
    type Output = MeterReading;
    fn sub(self, o: MeterReading) -> MeterReading {
        MeterReading {
            cpu_ns: self.cpu_ns - o.cpu_ns,
            stall_ns: self.stall_ns - o.stall_ns,
            input_wait_ns: self.input_wait_ns - o.input_wait_ns,
            output_ns: self.output_ns - o.output_ns,
        }
    }
}

impl Meter {
    /// A meter charging `compute` (none: kernels run at host speed, only measured).
    pub(crate) fn new(compute: Option<&ComputeConfig>) -> Result<Arc<Meter>, String> {
        let budget = compute.map(|c| ComputeBudget::new(c.clone()).map_err(|e| format!("compute model: {e}"))).transpose()?;
        Ok(Arc::new(Meter { budget, ..Meter::default() }))
    }

    /// The current counters.
    pub(crate) fn read(&self) -> MeterReading {
        MeterReading {
            cpu_ns: self.cpu_ns.load(Relaxed),
            stall_ns: self.stall_ns.load(Relaxed),
            input_wait_ns: self.input_wait_ns.load(Relaxed),
            output_ns: self.output_ns.load(Relaxed),
        }
    }

    /// Charges the CPU used since `stamp` and stalls as the budget says; restamps.
    fn charge(&self, stamp: &Cell<u64>) {
        let used = thread_cpu_ns().saturating_sub(stamp.get());
        self.cpu_ns.fetch_add(used, Relaxed);
        if let Some(b) = &self.budget {
            let stall = b.charge(used).as_nanos() as u64;
            let credit = self.credit_ns.load(Relaxed);
            let want = stall.saturating_sub(credit);
            if want > 0 {
                let t = Instant::now();
                std::thread::sleep(Duration::from_nanos(want));
                let slept = t.elapsed().as_nanos() as u64;
                self.stall_ns.fetch_add(slept, Relaxed);
                self.credit_ns.store(slept - want.min(slept), Relaxed);
            } else {
                self.credit_ns.store(credit - stall, Relaxed);
            }
        }
        stamp.set(thread_cpu_ns());
    }
}

/// The standard kernels, each metered by `meter`.
pub(crate) fn registry(meter: &Arc<Meter>) -> Registry {
    let standard = Arc::new(Registry::standard());
    let mut r = Registry::empty();
    for k in standard.iter() {
        r.register(Box::new(Metered { name: k.name(), inner: standard.clone(), meter: meter.clone() }));
    }
    r
}

/// Runs `kernel` over in-memory `inputs` on this thread, metered by `meter` (so under its
/// budget, if any); returns the records and the output bytes.
pub(crate) fn run_in_memory(
    kernel: &str,
    args: &[(String, insitu_proto::Value)],
    inputs: &[&[u8]],
    meter: &Arc<Meter>,
) -> Result<(Vec<Record>, Vec<u8>), String> {
    let reg = registry(meter);
    let k = reg.get(kernel).ok_or_else(|| format!("no kernel {kernel:?}"))?;
    let job = k.prepare(&Args::new(args)).map_err(|e| format!("{kernel}: {e}"))?;
    let total: u64 = inputs.iter().map(|i| i.len() as u64).sum();
    let mut streams: Vec<insitu_offload::SliceInput<'_>> = inputs.iter().map(|d| insitu_offload::SliceInput::new(d, insitu_engine::CHUNK)).collect();
    let mut refs: Vec<&mut dyn InputStream> = streams.iter_mut().map(|s| s as &mut dyn InputStream).collect();
    let capacity = k.output_capacity(&Args::new(args), total);
    // The host knows how large the result can be: no reallocation while it grows.
    let mut sink = insitu_offload::VecSink { data: Vec::with_capacity(capacity as usize), ..insitu_offload::VecSink::new(capacity) };
    let records = if k.output_count() == 1 { job.run(&mut refs, &mut [&mut sink]) } else { job.run(&mut refs, &mut []) };
    Ok((records.map_err(|e| format!("{kernel}: {e}"))?, sink.data))
}

struct Metered {
    name: &'static str,
    inner: Arc<Registry>,
    meter: Arc<Meter>,
}

impl Metered {
    fn kernel(&self) -> &dyn Kernel {
        self.inner.get(self.name).expect("the wrapped kernel is registered")
    }
}

impl Kernel for Metered {
    fn name(&self) -> &'static str {
        self.name
    }
    fn summary(&self) -> &'static str {
        self.kernel().summary()
    }
    fn params(&self) -> &'static [Param] {
        self.kernel().params()
    }
    fn output_count(&self) -> usize {
        self.kernel().output_count()
    }
    fn max_inputs(&self) -> usize {
        self.kernel().max_inputs()
    }
    fn output_capacity(&self, args: &Args<'_>, input_len: u64) -> u64 {
        self.kernel().output_capacity(args, input_len)
    }
    fn prepare(&self, args: &Args<'_>) -> Result<Box<dyn Job>, KernelError> {
        Ok(Box::new(MeteredJob { inner: self.kernel().prepare(args)?, meter: self.meter.clone() }))
    }
}

struct MeteredJob {
    inner: Box<dyn Job>,
    meter: Arc<Meter>,
}

impl Job for MeteredJob {
    fn run(self: Box<Self>, inputs: &mut [&mut dyn InputStream], outputs: &mut [&mut dyn OutputSink]) -> Result<Vec<Record>, KernelError> {
        let stamp = Cell::new(thread_cpu_ns());
        let meter = &*self.meter;
        let mut ins: Vec<MeteredInput<'_, '_>> = inputs.iter_mut().map(|i| MeteredInput { inner: &mut **i, stamp: &stamp, meter }).collect();
        let mut outs: Vec<MeteredOutput<'_, '_>> = outputs.iter_mut().map(|o| MeteredOutput { inner: &mut **o, meter }).collect();
        let mut in_refs: Vec<&mut dyn InputStream> = ins.iter_mut().map(|i| i as &mut dyn InputStream).collect();
        let mut out_refs: Vec<&mut dyn OutputSink> = outs.iter_mut().map(|o| o as &mut dyn OutputSink).collect();
        let result = self.inner.run(&mut in_refs, &mut out_refs);
        meter.charge(&stamp);
        result
    }
}

struct MeteredInput<'a, 'b> {
    inner: &'a mut dyn InputStream,
    stamp: &'b Cell<u64>,
    meter: &'b Meter,
}

impl InputStream for MeteredInput<'_, '_> {
    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn next_chunk(&mut self) -> io::Result<Option<&[u8]>> {
        self.meter.charge(self.stamp);
        let t = Instant::now();
        let chunk = self.inner.next_chunk();
        self.meter.input_wait_ns.fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
        // Waiting for the media is not compute.
        self.stamp.set(thread_cpu_ns());
        chunk
    }
}

struct MeteredOutput<'a, 'b> {
    inner: &'a mut dyn OutputSink,
    meter: &'b Meter,
}

impl MeteredOutput<'_, '_> {
    /// Runs an output operation, timing it. Its CPU time (copying into the output buffer,
    /// the write calls) is compute like any other; waiting for the media is not CPU time.
    fn media<T>(&mut self, f: impl FnOnce(&mut dyn OutputSink) -> T) -> T {
        let t = Instant::now();
        let out = f(&mut *self.inner);
        self.meter.output_ns.fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
        out
    }
}

impl OutputSink for MeteredOutput<'_, '_> {
    fn capacity(&self) -> u64 {
        self.inner.capacity()
    }
    fn write(&mut self, data: &[u8]) -> Result<(), KernelError> {
        self.media(|o| o.write(data))
    }
    fn finish(&mut self) -> Result<u64, KernelError> {
        self.media(|o| o.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use insitu_proto::Value;

    fn u64s(n: u64) -> Vec<u8> {
        (0..n).flat_map(|i| (i * 2).to_le_bytes()).collect()
    }

    #[test]
    fn metered_kernels_give_the_same_results_and_count_cpu() {
        let (a, b) = (u64s(1 << 16), u64s(1 << 16));
        let free = Meter::new(None).unwrap();
        let (rec, out) = run_in_memory("vector-add", &[], &[&a, &b], &free).unwrap();
        assert_eq!(rec[0][0], ("output_length".to_string(), Value::U64(8 << 16)));
        assert_eq!(&out[8..16], &4u64.to_le_bytes());
        assert!(free.read().cpu_ns > 0 && free.read().stall_ns == 0);
    }

    #[test]
    fn a_budget_slows_compute_by_its_rate() {
        let data = u64s(1 << 21); // 16 MiB
        let args = vec![("min".to_string(), Value::U64(10))];
        // A quarter of a host core: at least four times the CPU time, in wall time.
        let slow = Meter::new(Some(&ComputeConfig { workers: 1, cpu_share: 0.25 })).unwrap();
        let t = Instant::now();
        let (rec, _) = run_in_memory("count", &args, &[&data], &slow).unwrap();
        let wall = t.elapsed().as_nanos() as f64;
        assert_eq!(rec[0][0], ("count".to_string(), Value::U64((1 << 21) - 5)));
        let cpu = slow.read().cpu_ns as f64;
        assert!(wall >= 3.6 * cpu, "wall {wall} ns for {cpu} ns of CPU");
        assert!(slow.read().stall_ns > 0);
    }
}
