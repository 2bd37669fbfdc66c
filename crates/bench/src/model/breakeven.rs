// SPDX-License-Identifier: Apache-2.0
//! The break-even benchmark: CSDPLAN's question for Count, Vector Addition, Array Merge and
//! PageRank — how many computational drives beat one host core pulling the data?
//!
//! Calibration, per kernel over the whole data set `D` in memory: its time on one host core,
//! and under the drive model's CPU budget (their ratio is the measured host/device compute
//! ratio). Then, for N = 1..=targets drives holding `D / N` each:
//!
//! * host: N threads pull every share over the one link (`Target::read`, paced by the
//!   drives' flash models and the link model), then one host core runs the kernel on each
//!   share (CSDPLAN's SSD(1): transfer, then compute);
//! * offload: each drive runs EXEC on its share at once; records and output objects must
//!   match the host's.
//!
//! The model ([`BreakEvenModel`]) takes the transfer terms from the drive and link models
//! and the compute terms from the measurements (`T_csd(1)` is the one-drive EXEC); its
//! break-even point is then checked against the measured N series.

use super::emu::Network;
use super::math::BreakEvenModel;
use super::meter::{run_in_memory, Meter};
use super::pull::{exec_remote, pull_all, PullStats};
use super::rig::{read_object, write_object, Drive, Placer};
use super::workload::{generate, paper_slowdown, place, Placed, Share, KERNELS};
use super::{ModelChoice, Models, ModelsReport};
use crate::common::{command, machine, median, with_utilization, Machine, Work, BUSY};
use crate::Error;
use insitu_offload::Record;
use insitu_proto::ExecResult;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

/// What [`break_even`](crate::break_even) measures.
#[derive(Debug, Clone)]
pub struct BreakEvenOptions {
    /// Drive and link models. Default: `newport` behind `40gbe`.
    pub model: ModelChoice,
    /// Largest number of drives measured (every count from 1 up to it). Default 8.
    pub targets: usize,
    /// Data per kernel in bytes for count, vector-add and array-merge, split over the
    /// drives. Default 256 MiB.
    pub size: u64,
    /// Edge data of the PageRank graph in bytes (8 bytes per edge, 8 edges per node).
    /// Default 32 MiB.
    pub graph_size: u64,
    /// Kernels to run, comma-separated, from count, vector-add, array-merge and pagerank.
    /// Default all four.
    pub kernels: String,
    /// Measurements of each kind; the median is reported. Default 3 (0 counts as 1).
    pub repeat: usize,
    /// Work directory for the images. Default `None`: a new directory in /dev/shm, removed
    /// afterwards.
    pub dir: Option<PathBuf>,
}

/// The report of [`break_even`](crate::break_even).
#[derive(Debug, Clone, Serialize)]
pub struct BreakEvenReport {
    /// `break-even`.
    pub benchmark: &'static str,
    /// The command line that ran it.
    pub command: String,
    /// The drive and link.
    pub models: ModelsReport,
    /// The data.
    pub data: BreakEvenData,
    /// How each figure is measured, in words.
    pub method: BreakEvenMethod,
    /// Measurements of each kind.
    pub repeat: usize,
    /// One entry per kernel, in the order run.
    pub kernels: Vec<KernelBreakEven>,
    /// The machine it ran on.
    pub machine: Machine,
}

/// The data of [`BreakEvenReport::data`].
#[derive(Debug, Clone, Serialize)]
pub struct BreakEvenData {
    /// Data per kernel for count, vector-add and array-merge, bytes.
    pub size_bytes: u64,
    /// Edge data of the PageRank graph, bytes.
    pub graph_bytes: u64,
    /// Largest number of drives measured.
    pub max_drives: usize,
    /// The work directory.
    pub work_dir: String,
}

/// The method of [`BreakEvenReport::method`], in words.
#[derive(Debug, Clone, Serialize)]
pub struct BreakEvenMethod {
    /// The host's path.
    pub host: &'static str,
    /// The drives' path.
    pub offload: &'static str,
    /// CSDPLAN's model and where its terms come from.
    pub model: &'static str,
    /// When a pass counts as machine-limited.
    pub machine_limited: &'static str,
}

/// One kernel of [`BreakEvenReport::kernels`]. Times are seconds over the kernel's whole data.
#[derive(Debug, Clone, Serialize)]
pub struct KernelBreakEven {
    /// The kernel.
    pub kernel: String,
    /// Its data, bytes.
    pub data_bytes: u64,
    /// The kernel on one host core, data in memory (fastest of the repeats).
    pub host_compute_s: f64,
    /// Its CPU time.
    pub host_compute_cpu_s: f64,
    /// The kernel under the drive model's CPU budget.
    pub device_compute_s: f64,
    /// Its CPU time.
    pub device_compute_cpu_s: f64,
    /// `device_compute_s / device_compute_cpu_s`.
    pub device_wall_per_cpu: f64,
    /// `device_compute_s / host_compute_cpu_s`: the budget's own terms.
    pub device_to_host_compute_ratio: f64,
    /// `device_compute_s / host_compute_s`.
    pub device_to_host_wall_ratio: f64,
    /// What the drive model's CPU budget sets; `None` (null) without one.
    pub model_device_to_host_ratio: Option<f64>,
    /// What the paper measured for this drive; `None` (null) where it has no figure.
    pub paper_device_to_host_ratio: Option<f64>,
    /// One drive's EXEC over all the data (median).
    pub csd_one_s: f64,
    /// CSDPLAN's terms as measured here.
    pub model: BreakEvenTerms,
    /// The model's break-even number of drives; `None` (null) if it never breaks even.
    pub break_even_model: Option<u32>,
    /// The same with the transfer from the drive's specification.
    pub break_even_spec: Option<u32>,
    /// The fewest drives measured at which offloading was faster; `None` (null) if none was.
    pub break_even_measured: Option<usize>,
    /// One point per number of drives, from 1 up.
    pub series: Vec<SeriesPoint>,
}

/// CSDPLAN's terms of [`KernelBreakEven::model`], seconds.
#[derive(Debug, Clone, Serialize)]
pub struct BreakEvenTerms {
    /// One drive's pull of all the data (measured).
    pub transfer_one_s: f64,
    /// All the data over the link model; 0 for no link.
    pub transfer_link_s: f64,
    /// Drives beyond which the link limits the host's transfer; infinite (null) without a
    /// link.
    pub link_bound_from_drives: f64,
    /// The host's compute.
    pub host_compute_s: f64,
    /// One drive's EXEC.
    pub csd_one_s: f64,
    /// One drive's pull as its specification says.
    pub spec_transfer_one_s: f64,
}

/// One number of drives of [`KernelBreakEven::series`]. Times are medians, seconds.
#[derive(Debug, Clone, Serialize)]
pub struct SeriesPoint {
    /// Drives holding the data.
    pub drives: usize,
    /// The host's pull and compute.
    pub host_s: f64,
    /// The host's pull.
    pub host_pull_s: f64,
    /// The host's compute.
    pub host_compute_s: f64,
    /// Every drive's EXEC at once.
    pub offload_s: f64,
    /// Host cores the drives' CPU budgets ask for.
    pub engine_cores_demanded: f64,
    /// Most share of the cores an offload pass kept busy.
    pub offload_cpu_busy: f64,
    /// Most share of the cores a host pull kept busy.
    pub host_pull_cpu_busy: f64,
    /// The engines' budgets plus their reads outgrew this machine's cores.
    pub machine_limited: bool,
    /// The host's copies outgrew this machine's cores.
    pub host_machine_limited: bool,
    /// The model's host time at this many drives.
    pub model_host_s: f64,
    /// The model's CSD time at this many drives.
    pub model_csd_s: f64,
}

impl Default for BreakEvenOptions {
    fn default() -> Self {
        BreakEvenOptions { model: ModelChoice::default(), targets: 8, size: 256 << 20, graph_size: 32 << 20, kernels: KERNELS.join(","), repeat: 3, dir: None }
    }
}

fn seed(kernel: &str, n: usize, t: usize) -> u64 {
    kernel.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3)) ^ ((n as u64) << 32) ^ t as u64
}

fn ins(share: &Share) -> Vec<&[u8]> {
    share.inputs.iter().map(|v| v.as_slice()).collect()
}

/// Kernel times over the whole data set in memory, the fastest of `repeat` (this machine is
/// shared; the fastest run is the least disturbed): host wall and CPU seconds, and wall
/// seconds under the drive model's CPU budget.
struct Calibration {
    host_s: f64,
    host_cpu_s: f64,
    device_s: f64,
    /// CPU time the kernel used under the budget, in the fastest device run.
    device_cpu_s: f64,
}

fn calibrate(kernel: &str, bytes: u64, models: &Models, repeat: usize) -> Result<Calibration, Error> {
    let share = generate(kernel, bytes, seed(kernel, 1, 0))?;
    let mut c = Calibration { host_s: f64::INFINITY, host_cpu_s: f64::INFINITY, device_s: f64::INFINITY, device_cpu_s: f64::NAN };
    for _ in 0..repeat {
        let (t, cpu) = (Instant::now(), insitu_model::thread_cpu_ns());
        run_in_memory(kernel, &share.args, &ins(&share), &Meter::new(None)?)?;
        c.host_s = c.host_s.min(t.elapsed().as_secs_f64());
        c.host_cpu_s = c.host_cpu_s.min((insitu_model::thread_cpu_ns() - cpu) as f64 * 1e-9);
        let budget = Meter::new(models.drive.as_ref().and_then(|d| d.compute.as_ref()))?;
        let t = Instant::now();
        run_in_memory(kernel, &share.args, &ins(&share), &budget)?;
        let secs = t.elapsed().as_secs_f64();
        if secs < c.device_s {
            (c.device_s, c.device_cpu_s) = (secs, budget.read().cpu_ns as f64 * 1e-9);
        }
    }
    Ok(c)
}

/// N drives holding one share each, with where the shares are.
struct Array {
    drives: Vec<Drive>,
    placed: Vec<Placed>,
    args: Vec<Vec<(String, insitu_proto::Value)>>,
}

fn build(work: &mut Work, kernel: &str, bytes: u64, n: usize, models: &Models) -> Result<Array, Error> {
    let (mut drives, mut placed, mut args) = (Vec::new(), Vec::new(), Vec::new());
    for t in 0..n {
        let share = generate(kernel, bytes / n as u64, seed(kernel, n, t))?;
        let mut placer = Placer::default();
        let p = place(kernel, &share, &mut placer);
        let path = work.file(&format!("{kernel}-n{n}-t{t}.img"));
        let f = std::fs::File::create(&path).map_err(|e| format!("cannot create the image {}: {e}", path.display()))?;
        f.set_len(placer.used() + (1 << 20)).map_err(|e| format!("{}: {e}", path.display()))?;
        for (obj, data) in p.inputs.iter().zip(&share.inputs) {
            write_object(&path, obj, data)?;
        }
        drives.push(Drive::open(&path, models.drive.as_ref())?);
        placed.push(p);
        args.push(share.args);
    }
    Ok(Array { drives, placed, args })
}

/// What a kernel returned for one share: its records and its output bytes.
type Outcome = (Vec<Record>, Vec<u8>);

/// What the host pass measured.
struct HostPass {
    pull_s: f64,
    /// Share of the cores busy while pulling.
    pull_busy: f64,
    compute_s: f64,
    outcomes: Vec<Outcome>,
}

/// The host pass: pull every share, then compute each on this core.
fn host_pass(a: &Array, kernel: &str, models: &Models) -> Result<HostPass, Error> {
    let net = Network::new(models.link.clone())?;
    let t = Instant::now();
    let (data, pull_busy) = with_utilization(|| {
        std::thread::scope(|s| {
            let hs: Vec<_> = a.drives.iter().zip(&a.placed).map(|(d, p)| s.spawn(|| pull_all(d, &net, &p.inputs, &PullStats::default()))).collect();
            hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(std::io::Error::other("a pull thread panicked")))).collect::<Result<Vec<_>, _>>()
        })
    });
    let data = data.map_err(|e| format!("pulling {kernel} data: {e}"))?;
    let pull_s = t.elapsed().as_secs_f64();
    let meter = Meter::new(None)?;
    let t = Instant::now();
    let mut results = Vec::new();
    for (share, args) in data.iter().zip(&a.args) {
        let inputs: Vec<&[u8]> = share.iter().map(|v| v.as_slice()).collect();
        results.push(run_in_memory(kernel, args, &inputs, &meter)?);
    }
    Ok(HostPass { pull_s, pull_busy, compute_s: t.elapsed().as_secs_f64(), outcomes: results })
}

/// The offload pass: EXEC on every drive at once. Returns seconds and records per share.
fn offload_pass(a: &Array, models: &Models) -> Result<(f64, Vec<Vec<Record>>), Error> {
    let net = Network::new(models.link.clone())?;
    let t = Instant::now();
    let out = std::thread::scope(|s| {
        let hs: Vec<_> = a.drives.iter().zip(&a.placed).map(|(d, p)| s.spawn(|| exec_remote(d, &net, &p.descriptor))).collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("an EXEC thread panicked".into()))).collect::<Result<Vec<_>, String>>()
    })?;
    let secs = t.elapsed().as_secs_f64();
    let records = out.iter().map(|o| ExecResult::decode(&o.result).map(|r| r.records).map_err(|e| format!("EXEC result: {e}"))).collect::<Result<_, _>>()?;
    Ok((secs, records))
}

/// The records and output objects of the offload pass equal the host's.
fn check(a: &Array, kernel: &str, host: &[Outcome], dev: &[Vec<Record>]) -> Result<(), Error> {
    for (t, ((hr, hout), dr)) in host.iter().zip(dev).enumerate() {
        if hr != dr {
            return Err(format!("{kernel}: drive {t} returned {dr:?} but the host computed {hr:?}").into());
        }
        if let Some(obj) = &a.placed[t].output {
            if read_object(&a.drives[t].image, obj, hout.len() as u64)? != *hout {
                return Err(format!("{kernel}: drive {t}'s output object differs from the host's result").into());
            }
        }
    }
    Ok(())
}

fn kernel_result(
    kernel: &str,
    k: usize,
    bytes: u64,
    a: &BreakEvenOptions,
    models: &Models,
    work: &mut Work,
    progress: &mut dyn FnMut(&str),
) -> Result<KernelBreakEven, Error> {
    let repeat = a.repeat.max(1);
    let cal = calibrate(kernel, bytes, models, repeat)?;
    let host_compute = cal.host_s;
    let mut series = Vec::new();
    for n in 1..=a.targets {
        let array = build(work, kernel, bytes, n, models)?;
        let (mut pulls, mut comps, mut offs, mut busy, mut pull_busy) = (Vec::new(), Vec::new(), Vec::new(), 0.0f64, 0.0f64);
        for _ in 0..repeat {
            let host = host_pass(&array, kernel, models)?;
            let (r, b) = with_utilization(|| offload_pass(&array, models));
            let (o, dev) = r?;
            check(&array, kernel, &host.outcomes, &dev)?;
            pulls.push(host.pull_s);
            comps.push(host.compute_s);
            offs.push(o);
            busy = busy.max(b);
            pull_busy = pull_busy.max(host.pull_busy);
        }
        let (p, c, o) = (median(&mut pulls), median(&mut comps), median(&mut offs));
        let rate = models.drive.as_ref().and_then(|d| d.compute.as_ref()).map_or(1.0, |c| c.rate());
        series.push(SeriesPoint {
            drives: n,
            host_s: p + c,
            host_pull_s: p,
            host_compute_s: c,
            offload_s: o,
            engine_cores_demanded: n as f64 * rate,
            offload_cpu_busy: busy,
            host_pull_cpu_busy: pull_busy,
            // The engines' budgets plus their reads (or the host's copies) outgrew this
            // machine's cores.
            machine_limited: busy >= BUSY,
            host_machine_limited: pull_busy >= BUSY,
            // Filled in once the model is known.
            model_host_s: f64::NAN,
            model_csd_s: f64::NAN,
        });
        progress(&format!("  {kernel}, {n} drive(s): host {:.3} s (pull {p:.3} + compute {c:.3}), offload {o:.3} s", p + c));
        drop(array);
        for t in 0..n {
            let _ = std::fs::remove_file(work.root().join(format!("{kernel}-n{n}-t{t}.img")));
        }
    }
    let csd_one = series[0].offload_s;
    let mb = |r: Option<f64>| r.map_or(0.0, |r| bytes as f64 / (r * 1e6));
    // CSDPLAN's inputs as measured here: one drive's pull, the host's compute, one CSD.
    let model = BreakEvenModel {
        transfer_one_s: series[0].host_pull_s,
        transfer_link_s: mb(models.link.as_ref().map(|l| l.mb_s)),
        host_compute_s: host_compute,
        csd_one_s: csd_one,
    };
    // The same with the transfer as the drive's specification says.
    let spec = BreakEvenModel { transfer_one_s: mb(models.drive.as_ref().and_then(|d| d.host_read_mb_s())), ..model };
    for p in &mut series {
        let n = p.drives as u32;
        p.model_host_s = model.host_s(n);
        p.model_csd_s = model.csd_s(n);
    }
    let measured_be = series.iter().find(|p| p.offload_s < p.host_s).map(|p| p.drives);
    let paper = models.drive.as_ref().and_then(|d| paper_slowdown(&d.name)).map(|s| s[k]);
    Ok(KernelBreakEven {
        kernel: kernel.to_string(),
        data_bytes: bytes,
        host_compute_s: host_compute,
        host_compute_cpu_s: cal.host_cpu_s,
        device_compute_s: cal.device_s,
        device_compute_cpu_s: cal.device_cpu_s,
        device_wall_per_cpu: cal.device_s / cal.device_cpu_s,
        // The budget's own terms: device wall time per host CPU second.
        device_to_host_compute_ratio: cal.device_s / cal.host_cpu_s,
        device_to_host_wall_ratio: cal.device_s / host_compute,
        model_device_to_host_ratio: models.drive.as_ref().and_then(|d| d.compute.as_ref()).map(|c| 1.0 / c.rate()),
        paper_device_to_host_ratio: paper,
        csd_one_s: csd_one,
        model: BreakEvenTerms {
            transfer_one_s: model.transfer_one_s,
            transfer_link_s: model.transfer_link_s,
            link_bound_from_drives: model.link_bound_from(),
            host_compute_s: model.host_compute_s,
            csd_one_s: model.csd_one_s,
            spec_transfer_one_s: spec.transfer_one_s,
        },
        break_even_model: model.break_even(),
        break_even_spec: spec.break_even(),
        break_even_measured: measured_be,
        series,
    })
}

/// Runs the break-even benchmark: calibrates every kernel in memory, then measures host and
/// offload for 1..=`targets` drives, checking every offloaded result against the host's,
/// and calls `progress` with a line per kernel and drive count.
///
/// The report has one entry in `kernels` per kernel: the compute ratios, CSDPLAN's model
/// terms, `break_even_model`, `break_even_spec`, `break_even_measured` and the measured
/// `series`.
pub fn run(a: &BreakEvenOptions, progress: &mut dyn FnMut(&str)) -> Result<BreakEvenReport, Error> {
    let models = a.model.resolve("newport", "40gbe")?;
    let (size, graph) = (a.size, a.graph_size);
    let kernels: Vec<&str> = a.kernels.split(',').map(str::trim).filter(|k| !k.is_empty()).collect();
    if let Some(bad) = kernels.iter().find(|k| !KERNELS.contains(k)) {
        return Err(format!("--kernels: unknown kernel {bad:?}; choose from {}", KERNELS.join(", ")).into());
    }
    if a.targets == 0 || size < 64 || graph < 64 {
        return Err("--targets must be at least 1 and --size and --graph-size at least 64 bytes".to_string().into());
    }
    // The largest kernel (array-merge) needs its inputs and an equally large output.
    let mut work = Work::new(a.dir.clone(), "break-even", 2 * size.max(graph) + (64 << 20))?;
    let mut results = Vec::new();
    for kernel in &kernels {
        let k = KERNELS.iter().position(|x| x == kernel).unwrap_or(0);
        let bytes = if *kernel == "pagerank" { graph } else { size };
        results.push(kernel_result(kernel, k, bytes, a, &models, &mut work, progress)?);
    }
    Ok(BreakEvenReport {
        benchmark: "break-even",
        command: command(),
        models: ModelsReport::new(&models),
        data: BreakEvenData { size_bytes: size, graph_bytes: graph, max_drives: a.targets, work_dir: work.root().display().to_string() },
        method: BreakEvenMethod {
            host: "N threads pull every share over the shared link (flash and link paced), then one host core runs the kernel on each share",
            offload: "every drive runs EXEC on its share at once under its own CPU budget; results and output objects are checked against the host's",
            model: "CSDPLAN: T_host(M) = max(T_tx/M, T_link) + T_host_compute; T_csd(M) = T_csd(1)/M, with T_tx the measured one-drive pull, T_link = data / link rate, T_host_compute the host kernel in memory (fastest of the repeats), T_csd(1) the one-drive EXEC (median); break_even_spec takes T_tx from the drive's host read rate instead",
            machine_limited: "the offload pass (machine_limited) or the host's pull (host_machine_limited) kept at least 85 % of the cores busy",
        },
        repeat: a.repeat.max(1),
        kernels: results,
        machine: machine(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_unpaced_run_gets_the_hosts_results_from_every_drive() {
        let dir = tempfile::tempdir().unwrap();
        let a = BreakEvenOptions {
            model: ModelChoice { drive: Some("none".into()), link: Some("none".into()), ..Default::default() },
            targets: 2,
            size: 1 << 20,
            graph_size: 256 << 10,
            kernels: "count,vector-add,array-merge,pagerank".into(),
            repeat: 1,
            dir: Some(dir.path().to_path_buf()),
        };
        // Every record and output object is compared with the host's inside.
        let out = run(&a, &mut |_| {}).unwrap();
        assert_eq!(out.kernels.len(), 4);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "images are removed");
        let bad = BreakEvenOptions { kernels: "count,sort".into(), targets: 1, size: 1 << 20, graph_size: 1 << 20, repeat: 1, ..Default::default() };
        assert!(run(&bad, &mut |_| {}).unwrap_err().to_string().contains("sort"));
    }
}
