// SPDX-License-Identifier: Apache-2.0
//! `insitu bench`: the flags of every benchmark, turned into `insitu_bench` options, and
//! the reports printed as text or JSON.

use crate::Failure;
use insitu_bench::{
    BreakEvenOptions, ExecScalingOptions, ExecScalingRow, FabricOptions, IoEngineOptions, KvBenchOptions, LatencyOptions, ModelCheckOptions, ModelChoice,
    ScanOptions, ScrubScalingOptions,
};
use insitu_image::{human, parse_size};
use serde::Serialize;
use std::path::PathBuf;

/// The drive and link flags every emulated-drive benchmark takes.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct ModelFlags {
    /// Drive model: a preset (samsung-980pro, intel-p4600, daisyplus-openssd, newport,
    /// smartssd), PRESET@MB_S (re-timed to that internal read rate), custom:MB_S, or none
    /// (real speed). See `insitu model list`.
    #[arg(long, value_name = "SPEC", conflicts_with = "drive_mb_s")]
    drive: Option<String>,
    /// A generic drive whose offload engine reads sequentially at MB_S (= --drive custom:MB_S).
    #[arg(long, value_name = "MB_S")]
    drive_mb_s: Option<f64>,
    /// The one link between the targets and the host: 10gbe, 25gbe, 40gbe, 100gbe,
    /// pcie-gen3-x4, pcie-gen4-x4, a payload rate in MB/s, or none (not paced).
    #[arg(long, value_name = "LINK")]
    link: Option<String>,
}

impl From<ModelFlags> for ModelChoice {
    fn from(f: ModelFlags) -> Self {
        ModelChoice { drive: f.drive, drive_mb_s: f.drive_mb_s, link: f.link }
    }
}

/// Flags of `insitu bench scrub-scaling`.
#[derive(clap::Args, Debug)]
pub(crate) struct ScrubArgs {
    /// Drive and link models (default: --drive-mb-s 500 --link 10gbe).
    #[command(flatten)]
    model: ModelFlags,
    /// Largest number of targets; every count from 1 up to it is measured.
    #[arg(long, default_value_t = 8)]
    targets: usize,
    /// Files per target.
    #[arg(long, default_value_t = 100)]
    files: usize,
    /// Size of each file.
    #[arg(long, default_value = "16M")]
    file_size: String,
    /// Extents per file: 1 is contiguous; more is lightly fragmented (64 KiB of other data
    /// between extents).
    #[arg(long, default_value_t = 1)]
    extents: u32,
    /// Checksum function.
    #[arg(long, default_value = "crc32c")]
    function: String,
    /// Measurements per point (the median is reported).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Also measure every point with no models: this machine's own ceiling.
    #[arg(long)]
    ceiling: bool,
    /// Work directory for the images (default: a new directory in /dev/shm, removed
    /// afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// Flags of `insitu bench break-even`.
#[derive(clap::Args, Debug)]
pub(crate) struct BreakEvenArgs {
    /// Drive and link models (default: --drive newport --link 40gbe).
    #[command(flatten)]
    model: ModelFlags,
    /// Largest number of drives measured (every count from 1 up to it).
    #[arg(long, default_value_t = 8)]
    targets: usize,
    /// Data per kernel for count, vector-add and array-merge, split over the drives.
    #[arg(long, default_value = "256M")]
    size: String,
    /// Edge data of the PageRank graph (8 bytes per edge, 8 edges per node).
    #[arg(long, default_value = "32M")]
    graph_size: String,
    /// Kernels to run, comma-separated.
    #[arg(long, default_value = "count,vector-add,array-merge,pagerank")]
    kernels: String,
    /// Measurements of each kind (the median is reported).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Work directory for the images (default: a new directory in /dev/shm, removed
    /// afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// Flags of `insitu bench latency`.
#[derive(clap::Args, Debug)]
pub(crate) struct LatencyArgs {
    /// Drive and link models (default: --drive newport --link 10gbe).
    #[command(flatten)]
    model: ModelFlags,
    /// Size of the scanned file.
    #[arg(long, default_value = "64M")]
    size: String,
    /// Literal text to grep for (about 1 % of the generated log lines contain ERROR).
    #[arg(long, default_value = "ERROR")]
    pattern: String,
    /// Queries of each kind (the one with the median total is reported).
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// Work directory for the image (default: a new directory in /dev/shm, removed
    /// afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// Flags of `insitu bench model-check`.
#[derive(clap::Args, Debug)]
pub(crate) struct ModelCheckArgs {
    /// Drive models to check, comma-separated (presets, PRESET@MB_S or custom:MB_S).
    #[arg(long, default_value = "custom:500,custom:1000,custom:2000,newport,smartssd,intel-p4600")]
    drives: String,
    /// Links to check, comma-separated (names or MB/s).
    #[arg(long, default_value = "10gbe,25gbe,40gbe")]
    links: String,
    /// Bytes scanned per measurement.
    #[arg(long, default_value = "1G")]
    size: String,
    /// Largest accepted deviation from the configured rate, as a fraction.
    #[arg(long, default_value_t = 0.10)]
    tolerance: f64,
    /// The same for the scans through `image --model` and `target --model`.
    #[arg(long, default_value_t = 0.03)]
    path_tolerance: f64,
    /// Measurements per check (the median is reported).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Work directory for the image (default: a new directory in /dev/shm, removed
    /// afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// Prints the report `out` as JSON, or `text` otherwise.
fn emit<R: Serialize>(json_out: bool, out: &R, text: impl FnOnce()) {
    if json_out {
        println!("{}", serde_json::to_string_pretty(out).unwrap_or_default());
    } else {
        text();
    }
}

/// Progress lines go to stderr, and only with text output.
fn progress(json_out: bool) -> impl FnMut(&str) {
    move |line| {
        if !json_out {
            eprintln!("{line}");
        }
    }
}

/// A value for a table cell, or `-` where there is none.
fn or_dash<T>(v: Option<T>, f: impl FnOnce(T) -> String) -> String {
    v.map_or_else(|| "-".to_string(), f)
}

/// `insitu bench scan`.
pub(crate) fn scan(function: String, size: &str, repeat: usize, dir: Option<PathBuf>, json_out: bool) -> Result<i32, Failure> {
    let out = insitu_bench::scan(&ScanOptions { function, size: parse_size(size)?, repeat, dir })?;
    emit(json_out, &out, || {
        let (function, repeat) = (&out.function, out.repeat);
        let (r, o, c) = (out.raw_read_gbps, out.offload_gbps, out.conventional_gbps);
        println!("scan of {} MiB, {function}, median of {repeat}:", out.size_bytes >> 20);
        println!("  raw direct read   {r:>7.3} GB/s");
        println!("  offloaded {function:<7} {o:>7.3} GB/s  ({:.1}% of raw)", 100.0 * o / r);
        println!("  conventional      {c:>7.3} GB/s");
    });
    Ok(0)
}

/// Flags of the benchmarks over one scratch file (`fabric`, `io-engine`).
#[derive(clap::Args, Debug)]
pub(crate) struct FileArgs {
    /// Size of the data.
    #[arg(long, default_value = "1G")]
    size: String,
    /// Measurements of each kind (the median is reported).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Work directory (default: a new directory under /var/tmp, removed afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// `insitu bench fabric`.
pub(crate) fn fabric(a: FileArgs, json_out: bool) -> Result<i32, Failure> {
    let out = insitu_bench::fabric(&FabricOptions { size: parse_size(&a.size)?, repeat: a.repeat, dir: a.dir })?;
    emit(json_out, &out, || {
        let (size, repeat, q) = (human(out.size_bytes), out.repeat, &out.requests);
        let (r, fr, e, fe) = (out.raw_read_gbps, out.fabric_read_gbps, out.embedded_exec_gbps, out.fabric_exec_gbps);
        let (qd, queues, wire) = (q.fabric_queue_depth, q.io_queues, out.fabric_exec_wire_bytes);
        println!("fabric benchmark over {size}, median of {repeat}, cold caches, NVMe/TCP on loopback:");
        println!("  raw direct read, 1 MiB requests           {r:>7.3} GB/s");
        let (tcp, cached) = (out.tcp_loopback_gbps, out.tcp_loopback_cached_gbps);
        println!("  fabric read, 128 KiB at QD{qd}, {queues} queues    {fr:>7.3} GB/s  ({:.1}% of raw, {:.1}% of TCP)", 100.0 * fr / r, 100.0 * fr / tcp);
        println!("  plain TCP on loopback serving the file    {tcp:>7.3} GB/s");
        println!("  plain TCP on loopback from cache          {cached:>7.3} GB/s  (fabric: {:.1}% of it)", 100.0 * fr / cached);
        println!("  embedded EXEC crc32c                      {e:>7.3} GB/s");
        println!("  fabric EXEC crc32c + result read          {fe:>7.3} GB/s  ({:.1}% of embedded)", 100.0 * fe / e);
        println!("  fabric EXEC bytes on the wire             {wire:>7} B     (for {size} of data)");
    });
    insitu_bench::fabric_wire_check(&out)?;
    Ok(0)
}

/// `insitu bench io-engine`.
pub(crate) fn io_engine(a: FileArgs, json_out: bool) -> Result<i32, Failure> {
    let out = insitu_bench::io_engine(&IoEngineOptions { size: parse_size(&a.size)?, repeat: a.repeat, dir: a.dir })?;
    emit(json_out, &out, || {
        println!("I/O engine for offload kernels over {}, median of {}, cold caches, crc32c:", human(out.size_bytes), out.repeat);
        for r in &out.results {
            let (chunk, depth) = (human(r.chunk_bytes as u64), r.depth);
            println!("  {:<30} {chunk:>6} x {depth:<3} {:>7.3} GB/s", r.engine, r.gbps);
        }
        println!("  best io_uring scan / EXEC: {:.2}x", out.best_uring_to_exec);
    });
    Ok(0)
}

/// Flags of `insitu bench exec-scaling`.
#[derive(clap::Args, Debug)]
pub(crate) struct ExecScalingArgs {
    /// Bytes per EXEC (one object each).
    #[arg(long, default_value = "4M")]
    object_size: String,
    /// Objects in the file.
    #[arg(long, default_value_t = 64)]
    objects: usize,
    /// Passes over all objects per measurement.
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// Numbers of concurrent EXECs to measure, comma-separated.
    #[arg(long, default_value = "1,2,4,8", value_delimiter = ',')]
    streams: Vec<usize>,
    /// Measurements of each configuration (the median is reported).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Work directory (default: a new directory in /dev/shm, removed afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// `insitu bench exec-scaling`.
pub(crate) fn exec_scaling(a: ExecScalingArgs, json_out: bool) -> Result<i32, Failure> {
    let opts =
        ExecScalingOptions { object_size: parse_size(&a.object_size)?, objects: a.objects, rounds: a.rounds, streams: a.streams, repeat: a.repeat, dir: a.dir };
    let out = insitu_bench::exec_scaling(&opts)?;
    emit(json_out, &out, || {
        println!("concurrent EXECs, crc32c over {} objects, median of {}:", human(out.object_size_bytes), out.repeat);
        println!("  EXECs at once   pooled GB/s   no pool GB/s   pool peak");
        for &n in &out.streams {
            let row = |pooled: bool| out.results.iter().find(|r| r.streams == n && r.pooled == pooled);
            let gbps = |r: Option<&ExecScalingRow>| r.map_or(f64::NAN, |r| r.gbps);
            let (p, u) = (row(true), row(false));
            println!("  {:>13}   {:>11.3}   {:>12.3}   {:>9}", n, gbps(p), gbps(u), human(p.map_or(0, |p| p.pool_peak_bytes)));
        }
        let s = &out.scaling;
        println!(
            "  {} EXECs vs {}: {:.2}x with the pool, {:.2}x without; the pool is {:.2}x as fast at {}",
            s.to_streams, s.from_streams, s.pooled_max_to_one, s.unpooled_max_to_one, s.pooled_to_unpooled_at_max, s.to_streams
        );
    });
    Ok(0)
}

/// `insitu bench scrub-scaling`.
pub(crate) fn scrub_scaling(a: ScrubArgs, json_out: bool) -> Result<i32, Failure> {
    let file_size = parse_size(&a.file_size)?;
    let opts = ScrubScalingOptions {
        model: a.model.into(),
        targets: a.targets,
        files: a.files,
        file_size,
        extents: a.extents,
        function: a.function,
        repeat: a.repeat,
        ceiling: a.ceiling,
        dir: a.dir,
    };
    let out = insitu_bench::scrub_scaling(&opts, &mut progress(json_out))?;
    emit(json_out, &out, || {
        println!(
            "scrub scaling, {} x {} files of {} per target, drive {}, link {}, {} cores:",
            opts.targets,
            opts.files,
            human(file_size),
            out.models.drive_name(),
            out.models.link.name,
            out.machine.cpus
        );
        println!("{:>7} {:>12} {:>12} {:>7} {:>10}", "targets", "conv GB/s", "offload GB/s", "ratio", "traffic -%");
        for p in &out.points {
            println!(
                "{:>7} {:>12.3} {:>12.3} {:>7.2} {:>10.4}",
                p.targets,
                p.conventional_gbps,
                p.offload_gbps,
                p.offload_to_conventional,
                100.0 * p.traffic_reduction
            );
        }
    });
    Ok(0)
}

/// `insitu bench break-even`.
pub(crate) fn break_even(a: BreakEvenArgs, json_out: bool) -> Result<i32, Failure> {
    let (size, graph) = (parse_size(&a.size)?, parse_size(&a.graph_size)?);
    let opts = BreakEvenOptions { model: a.model.into(), targets: a.targets, size, graph_size: graph, kernels: a.kernels, repeat: a.repeat, dir: a.dir };
    let out = insitu_bench::break_even(&opts, &mut progress(json_out))?;
    emit(json_out, &out, || {
        let link = &out.models.link.name;
        println!("break-even, drive {}, link {link}, {} of data ({} graph), {} cores:", out.models.drive_name(), human(size), human(graph), out.machine.cpus);
        println!("{:<12} {:>9} {:>9} {:>7} {:>7} {:>9} {:>9} {:>9}", "kernel", "host s", "csd(1) s", "ratio", "paper", "BEP model", "BEP spec", "BEP meas.");
        for r in &out.kernels {
            println!(
                "{:<12} {:>9.3} {:>9.3} {:>7.2} {:>7} {:>9} {:>9} {:>9}",
                r.kernel,
                r.host_compute_s,
                r.csd_one_s,
                r.device_to_host_compute_ratio,
                or_dash(r.paper_device_to_host_ratio, |p| format!("{p:.1}")),
                or_dash(r.break_even_model, |v| v.to_string()),
                or_dash(r.break_even_spec, |v| v.to_string()),
                or_dash(r.break_even_measured, |v| v.to_string()),
            );
        }
    });
    Ok(0)
}

/// `insitu bench latency`.
pub(crate) fn latency(a: LatencyArgs, json_out: bool) -> Result<i32, Failure> {
    let size = parse_size(&a.size)?;
    let out = insitu_bench::latency(&LatencyOptions { model: a.model.into(), size, pattern: a.pattern.clone(), repeat: a.repeat, dir: a.dir })?;
    emit(json_out, &out, || {
        println!("latency of grep {:?} over {}, drive {}, link {}:", a.pattern, human(size), out.models.drive_name(), out.models.link.name);
        println!("{:<13} {:>9} {:>9} {:>9} {:>9} {:>9}", "", "total ms", "compute", "media", "link", "protocol");
        for (name, q) in [("conventional", &out.conventional), ("offload", &out.offload)] {
            let ms = |s: f64| 1e3 * s;
            println!("{name:<13} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}", ms(q.total_s), ms(q.compute_s), ms(q.media_s), ms(q.link_s), ms(q.protocol_s));
        }
    });
    Ok(0)
}

/// `insitu bench model-check`; exits 1 if a check failed.
pub(crate) fn model_check(a: ModelCheckArgs, json_out: bool) -> Result<i32, Failure> {
    let opts = ModelCheckOptions {
        drives: a.drives,
        links: a.links,
        size: parse_size(&a.size)?,
        tolerance: a.tolerance,
        path_tolerance: a.path_tolerance,
        repeat: a.repeat,
        dir: a.dir,
    };
    let out = insitu_bench::model_check(&opts, &mut progress(json_out))?;
    emit(json_out, &out, || {
        let (scan, reads) = (out.ceilings.offload_scan_gbps, out.ceilings.conventional_read_gbps);
        println!(
            "model check over {} (tolerance ±{:.0}%, ±{:.0}% for image and target scans), ceilings: scan {scan:.3} GB/s, reads {reads:.3} GB/s",
            human(opts.size),
            100.0 * opts.tolerance,
            100.0 * opts.path_tolerance
        );
        for c in &out.checks {
            let f = |v: Option<f64>| or_dash(v.filter(|v| v.is_finite()), |v| format!("{v:.3}"));
            println!("  {:<20} {:<16} configured {:>7} GB/s measured {:>7} GB/s  {}", c.kind, c.name, f(c.configured_gbps), f(c.measured_gbps), c.status);
        }
    });
    Ok(if out.failed > 0 { 1 } else { 0 })
}

/// Flags of `insitu bench kv`.
#[derive(clap::Args, Debug)]
pub(crate) struct KvArgs {
    /// YCSB records loaded before the YCSB workloads (10 fields of 100 B each).
    #[arg(long, default_value_t = 50_000)]
    records: u64,
    /// Operations per workload; also the entries of each db_bench fill.
    #[arg(long, default_value_t = 2_000)]
    operations: u64,
    /// Workloads, comma-separated: a,b,c,d,e,f (YCSB), fillseq, fillrandom, readseq,
    /// readrandom (db_bench, each with 100 B and 4 KiB values) and genome (index a reference
    /// sequence, then match a target sequence of short reads against it).
    #[arg(long, value_delimiter = ',', default_value = "a,b,c,f,d,e,fillseq,fillrandom,readseq,readrandom,genome")]
    workloads: Vec<String>,
    /// Size of the genome job's reference sequence, in bases.
    #[arg(long, default_value = "4M")]
    genome_reference: String,
    /// Size of the genome job's target sequence (100-base reads, one per line).
    #[arg(long, default_value = "256M")]
    genome_target: String,
    /// Stacks, comma-separated: direct, redirect, syscall.
    #[arg(long, value_delimiter = ',', default_value = "direct,redirect,syscall")]
    systems: Vec<String>,
    /// The fabric link of the redirection stack: 10gbe, 25gbe, 40gbe, 100gbe,
    /// pcie-gen3-x4, pcie-gen4-x4, a payload rate in MB/s, or none.
    #[arg(long, default_value = "25gbe")]
    link: String,
    /// The drive model every stack runs on: a preset (samsung-980pro, intel-p4600,
    /// daisyplus-openssd, newport, smartssd), PRESET@MB_S, custom:MB_S, or none (real
    /// speed). The direct and redirection stacks book every transfer on it; the system-call
    /// stack's loop device gets the kernel's block throttle at its rates.
    #[arg(long, value_name = "SPEC", default_value = insitu_bench::KV_DEFAULT_DRIVE)]
    drive: String,
    /// Work directory for the images (default: a new directory under /var/tmp, removed
    /// afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// `insitu bench kv`.
pub(crate) fn kv(a: KvArgs, json_out: bool) -> Result<i32, Failure> {
    let opts = KvBenchOptions {
        records: a.records,
        operations: a.operations,
        workloads: a.workloads,
        systems: a.systems,
        link: Some(a.link),
        drive: Some(a.drive),
        dir: a.dir,
        genome_reference_bases: parse_size(&a.genome_reference).map_err(|e| format!("--genome-reference: {e}"))? as usize,
        genome_target_bytes: parse_size(&a.genome_target).map_err(|e| format!("--genome-target: {e}"))? as usize,
        ..KvBenchOptions::default()
    };
    let out = insitu_bench::kv(&opts, &mut progress(json_out))?;
    emit(json_out, &out, || {
        println!(
            "key-value stacks on drive model {}, {} records, {} operations per workload, redirect over {}:",
            out.drive, out.records, out.operations, out.link
        );
        println!("{:<16} {:<9} {:>10} {:>9} {:>9}", "workload", "system", "ops/s", "p50 µs", "p99 µs");
        for r in &out.results {
            println!("{:<16} {:<9} {:>10.0} {:>9.1} {:>9.1}", r.workload, r.system, r.ops_per_s, r.p50_us, r.p99_us);
        }
        for g in &out.genome {
            println!("genome job on {:<9} {:>8.2} s, {} of {} reads matched", g.system, g.seconds, g.matched, g.reads);
        }
        for (w, r) in &out.ratios {
            let f = |v: Option<f64>| or_dash(v.filter(|v| v.is_finite()), |v| format!("{v:.2}x"));
            println!("  {w:<16} direct/redirect {:>7}  direct/syscall {:>7}", f(r.direct_to_redirect), f(r.direct_to_syscall));
        }
    });
    Ok(0)
}
