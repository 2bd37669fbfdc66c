// SPDX-License-Identifier: Apache-2.0
//! The `insitu` command line: offload functions to the storage that holds the files, scrub
//! for bitrot, make and mount images, run the demo and the benchmarks.
//!
//! [`run`] is the whole program; the `insitu` binary and the Python package's console
//! script both call it.
#![deny(missing_docs)]

mod bench_cmd;
mod demo;
mod ethernet_cmd;
mod kv_cmd;
mod lock_cmd;
mod model_cmd;
mod nvme_cmd;
mod pool_cmd;
mod target_cmd;

use clap::{Parser, Subcommand};
use insitu_host::{parse_args, scrub, Mode, OasError, Offloader, Report, Request};
use insitu_image::{create as create_image, human, mount as mount_image, parse_size, umount as umount_image};
use std::ffi::OsString;
use std::path::PathBuf;

/// Computational storage: run functions where the data is.
#[derive(Parser, Debug)]
#[command(name = "insitu", version, about, long_about = None, propagate_version = true)]
struct Cli {
    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run a function over files, offloaded to the target that holds their blocks.
    ///
    /// Each file becomes a virtual object (stat + FIEMAP) sent in a compute descriptor
    /// with one EXEC command; only the result comes back. Functions that write a result
    /// file (zstd, sort, csv-select) write it next to the input (PATH.zst, PATH.sorted,
    /// PATH.select.csv) or to --output. See `insitu functions` for the list.
    Exec {
        /// Function name, e.g. crc32c, grep, wc, zstd, sort, csv-select.
        function: String,
        /// Input files (on a loop-mounted image or insitu namespace).
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Function argument, KEY=VALUE (repeatable), e.g. --arg pattern=ERROR.
        #[arg(long = "arg", value_name = "KEY=VALUE")]
        args: Vec<String>,
        /// Compute on the host instead, reading through the file system (cold cache).
        #[arg(long)]
        conventional: bool,
        /// Where to write the result file (one input only).
        #[arg(long, short)]
        output: Option<PathBuf>,
        /// Replace existing result files.
        #[arg(long)]
        force: bool,
    },
    /// Count and locate lines matching PATTERN, offloaded (like grep -c / grep -n -b).
    Grep {
        /// Literal text, or a regular expression with -E.
        pattern: String,
        /// Files to search.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Treat PATTERN as a regular expression.
        #[arg(short = 'E', long)]
        regex: bool,
        /// Ignore case.
        #[arg(short, long)]
        ignore_case: bool,
        /// Print only the count per file.
        #[arg(short, long)]
        count: bool,
        /// Compute on the host instead.
        #[arg(long)]
        conventional: bool,
    },
    /// Count lines, words and bytes, offloaded (like wc).
    Wc {
        /// Files to count.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Compute on the host instead.
        #[arg(long)]
        conventional: bool,
    },
    /// Bitrot scrubbing: record checksums of every file under DIR, or verify them.
    ///
    /// With --create, writes the manifest. Without it, recomputes every checksum offloaded
    /// and lists corrupted and missing files; exits 1 if there are any.
    Scrub {
        /// Directory to scrub (recursively).
        dir: PathBuf,
        /// Manifest file (JSON).
        #[arg(long)]
        manifest: PathBuf,
        /// Record a new manifest instead of verifying.
        #[arg(long)]
        create: bool,
        /// Checksum function for --create.
        #[arg(long, default_value = "blake3")]
        function: String,
        /// Compute on the host instead.
        #[arg(long)]
        conventional: bool,
    },
    /// List the functions a target runs, with their arguments.
    Functions,
    /// Make, mount and unmount disk images.
    #[command(subcommand)]
    Image(ImageCmd),
    /// Build a demo image with a realistic data set, run every function offloaded and on
    /// the host, and compare results and data movement. Exits 1 if any result disagrees.
    Demo {
        /// Image size.
        #[arg(long, default_value = "256M")]
        size: String,
        /// File system of the image.
        #[arg(long, value_enum, default_value = "ext4")]
        fs: Fs,
        /// Work directory (default: a new directory under /var/tmp, removed afterwards).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCmd),
    /// LLM generation and evaluation with the KV cache on targets and decode attention
    /// computed there (`insitu llm generate|eval --help`). Runs in Python: needs the LLM
    /// extra (`pip install 'insitu[llm]'`, or `make test` in a checkout).
    #[command(disable_help_flag = true)]
    Llm {
        /// Arguments of the Python command.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Provisioning planner: how many computational drives beat a host for a kernel, an
    /// erasure code and hardware (`insitu plan ec|llm|calibrate --help`). Runs in Python.
    #[command(disable_help_flag = true)]
    Plan {
        /// Arguments of the Python command.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// An OpenStack Swift cluster with an erasure-coded policy on insitu targets
    /// (`insitu swift up|down|status|once --help`). `wc`, `grep` and `exec` take
    /// swift://ACCOUNT/CONTAINER/OBJECT with --swift-dir, and `scrub --swift-dir` audits a
    /// Swift store. Runs in Python.
    #[command(disable_help_flag = true)]
    Swift {
        /// Arguments of the Python command.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run an NVMe/TCP target serving files or block devices as namespaces.
    #[command(subcommand)]
    Target(TargetCmd),
    /// Look at an NVMe/TCP target with insitu's initiator: identify, list subsystems.
    #[command(subcommand)]
    Nvme(NvmeCmd),
    /// A target's key-value store (NVMe Key Value command set; `target start --kv-store`):
    /// put, get, rm, exists, ls. Keys are 1 to 16 bytes: text, or 0x and hex digits.
    #[command(subcommand)]
    Kv(kv_cmd::KvCmd),
    /// Ethernet over NVMe: reach a target's IP address (`target start --ether`) through
    /// its NVMe/TCP connection alone.
    #[command(subcommand)]
    Ethernet(ethernet_cmd::EthernetCmd),
    /// Mount a remote namespace's file system at DIR (FUSE file, loop device, mount).
    ///
    /// Afterwards exec, grep, wc and scrub on files under DIR send EXEC over the fabric to
    /// that target with no extra flags.
    Attach {
        /// nvme-tcp://HOST:PORT/NQN[/NSID] (namespace 1 if omitted).
        url: String,
        /// Mount point (created if missing).
        dir: PathBuf,
        /// Make a file system first (erases the namespace).
        #[arg(long, value_enum)]
        format: Option<Fs>,
        /// Host NQN to connect as (default: this host's stable NQN).
        #[arg(long)]
        hostnqn: Option<String>,
    },
    /// Lock a file or directory of an attached file system for containers on its target.
    ///
    /// DockerSSD's inode lock: while a container holds a path, the host cannot modify it.
    /// The lock is refused while a host process has the path open for writing. The file
    /// system is synced first (the target sees the host's latest data), the target refuses
    /// host writes to the path's blocks (a directory: itself and everything under it) and
    /// refreshes its containers' view, and the path turns read-only on the host (writers get
    /// "Read-only file system" at once). Locks are not persistent: nothing is written to
    /// disk for them, and restarting the target drops them (`insitu unlock` then releases
    /// the host side). Spec: docs/lock-commands.md.
    Lock {
        /// The path (under a mount made with `insitu attach`); omit with --list.
        #[arg(required_unless_present = "list", conflicts_with = "list")]
        path: Option<PathBuf>,
        /// List the locks this host holds (recorded in /run/insitu/locks).
        #[arg(long)]
        list: bool,
    },
    /// Release a lock taken with `insitu lock` (by any process): the path turns writable on
    /// the host, the target stops refusing writes to its blocks and drops its containers'
    /// cached view, so they see the host's changes from then on.
    Unlock {
        /// The locked path.
        path: PathBuf,
    },
    /// Unmount DIR, release its loop device and stop its FUSE daemon.
    Detach {
        /// The mount point given to attach.
        dir: PathBuf,
    },
    /// Device models a target can emulate: flash, link and compute of an SSD or CSD.
    #[command(subcommand)]
    Model(ModelCmd),
    /// Attach, detach or check several targets named in a JSON config.
    ///
    /// Config: {"targets": [{"url": "nvme-tcp://HOST:PORT/NQN/NSID", "dir": "/mnt/a"}, ...]}.
    /// With the pool up, exec/grep/wc/scrub over files under several of the directories fan
    /// out to every target holding them, in parallel, and merge results and stats.
    Pool {
        /// up, down or status.
        #[arg(value_enum)]
        action: PoolAction,
        /// The pool config file.
        config: PathBuf,
    },
}

/// File systems `insitu image create` can make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Fs {
    /// ext4 (mkfs.ext4 from e2fsprogs).
    Ext4,
    /// XFS (mkfs.xfs from xfsprogs; at least 300 MiB).
    Xfs,
}

impl From<Fs> for insitu_image::Fs {
    fn from(f: Fs) -> Self {
        match f {
            Fs::Ext4 => insitu_image::Fs::Ext4,
            Fs::Xfs => insitu_image::Fs::Xfs,
        }
    }
}

#[derive(Subcommand, Debug)]
enum ModelCmd {
    /// List the presets with their read rates.
    List,
    /// Show one model's parameters: a preset name, NAME@MBPS, or custom:MBPS.
    Show {
        /// The model.
        name: String,
    },
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum PoolAction {
    /// Attach every target (all or nothing).
    Up,
    /// Detach every target.
    Down,
    /// Show which targets are attached (exit 1 if any is not).
    Status,
}

#[derive(Subcommand, Debug)]
#[allow(clippy::large_enum_variant)] // parsed once per process; boxing would only add noise
enum TargetCmd {
    /// Start a target (as a daemon unless --foreground).
    ///
    /// Namespaces are numbered 1.. in the order given, --namespace ones first. Private
    /// namespaces are never listed to or readable by hosts. Without --allow-host any host
    /// may connect; the target listens on loopback unless --listen says otherwise.
    Start(target_cmd::StartArgs),
    /// Stop the target started on an address.
    Stop {
        /// The address it listens on.
        #[arg(long, default_value = "127.0.0.1:4420")]
        listen: std::net::SocketAddr,
    },
    /// List targets started with `insitu target start`.
    Status,
    /// Check, without changing it, the file system (accelfs) that holds the key-value store
    /// of a target started with `--private IMG --kv-store SIZE`; exit 1 if it has problems.
    /// Run it while the target is stopped.
    Fsck {
        /// The private namespace image.
        #[arg(long, value_name = "IMG")]
        private: PathBuf,
        /// The --kv-store size the target was started with.
        #[arg(long, value_name = "SIZE")]
        kv_store: String,
    },
}

#[derive(Subcommand, Debug)]
enum ImageCmd {
    /// Create a sparse image file holding a new file system.
    Create {
        /// Image file to create.
        path: PathBuf,
        /// Size, e.g. 1G.
        #[arg(long, default_value = "1G")]
        size: String,
        /// File system.
        #[arg(long, value_enum, default_value = "ext4")]
        fs: Fs,
        /// File-system block size in bytes (e.g. 1024 or 4096).
        #[arg(long)]
        block_size: Option<u32>,
        /// Overwrite an existing file.
        #[arg(long)]
        force: bool,
        /// Emulate this device when offloading to the image (see `insitu model list`).
        #[arg(long)]
        model: Option<String>,
    },
    /// Loop-mount an image at DIR.
    Mount {
        /// Image file.
        path: PathBuf,
        /// Mount point (created if missing).
        dir: PathBuf,
        /// Emulate this device when offloading to the image; `none` removes a model.
        #[arg(long)]
        model: Option<String>,
    },
    /// Unmount DIR (and release its loop device).
    Umount {
        /// Mount point.
        dir: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
enum BenchCmd {
    /// LLM decoding throughput and link bytes per token: host memory, FlexGen-style and
    /// in-storage attention (dense and SparF) over 1, 2 and 4 targets (Python, LLM extra).
    #[command(disable_help_flag = true)]
    Llm {
        /// Arguments of the Python benchmark.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// A program in a container on the target next to its data vs the same program on the
    /// host reading over the fabric (grep and sha256sum, device model on; Python, root).
    #[command(disable_help_flag = true)]
    Containers {
        /// Arguments of the Python benchmark.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Scan throughput: raw direct reads of a file's blocks vs an offloaded checksum over
    /// them (and the conventional host path), measured in one run with cold caches.
    Scan {
        /// Checksum function to offload.
        #[arg(long, default_value = "crc32c")]
        function: String,
        /// Size of the scanned file.
        #[arg(long, default_value = "512M")]
        size: String,
        /// Measurements of each kind (the median is reported).
        #[arg(long, default_value_t = 3)]
        repeat: usize,
        /// Work directory (default: a new directory under /var/tmp, removed afterwards).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// NVMe/TCP on loopback vs local: raw direct reads vs 128 KiB reads at queue depth 32
    /// over the fabric vs plain TCP on loopback with the same requests, and an embedded
    /// crc32c EXEC vs the same EXEC over the fabric.
    Fabric(bench_cmd::FileArgs),
    /// The offload kernels' I/O engine: an embedded crc32c EXEC (its read path: an io_uring
    /// read-ahead, four 2 MiB reads in flight) vs crc32c over the same bytes read on one
    /// thread through io_uring (direct I/O, registered buffers, several reads in flight,
    /// polled completions) at several depths and chunk sizes, from cold caches.
    IoEngine(bench_cmd::FileArgs),
    /// Concurrent EXECs on one memory-backed namespace: crc32c throughput with 1, 2, 4, 8
    /// EXECs at once, with the namespace's buffer pool and without, and the pool's memory.
    ExecScaling(bench_cmd::ExecScalingArgs),
    /// Emulated drives: checksum throughput of conventional vs offloaded scrubbing for
    /// 1..N targets behind one link, and the network traffic saved (virtual-objects paper,
    /// Figs. 3-4).
    ScrubScaling(bench_cmd::ScrubArgs),
    /// Emulated CSDs: host vs in-drive time of count, vector-add, array-merge and PageRank
    /// for 1..N drives, the host/device compute ratio and CSDPLAN's break-even point.
    BreakEven(bench_cmd::BreakEvenArgs),
    /// Emulated drive: one grep query, conventional vs offloaded, split into compute,
    /// media, link and protocol time.
    Latency(bench_cmd::LatencyArgs),
    /// Check that emulated drives and links deliver their configured rates (exit 1 if not).
    ModelCheck(bench_cmd::ModelCheckArgs),
    /// Key-value stacks (HAYAGUI): the same engine on the target's direct stack, on the
    /// host over an attached remote namespace (redirect), and over the kernel's file system
    /// on a loop device (syscall); YCSB A-F and db_bench fill/read, seq/random, 100 B and
    /// 4 KiB values; throughput and p50/p99 latency, every value read checked.
    Kv(bench_cmd::KvArgs),
}

#[derive(Subcommand, Debug)]
enum NvmeCmd {
    /// Identify the controller at URL and its namespaces (only NSID when the URL ends in
    /// /NSID).
    Identify {
        /// nvme-tcp://HOST:PORT/NQN[/NSID].
        url: String,
        /// Host NQN to connect as (default: this host's stable NQN).
        #[arg(long)]
        hostnqn: Option<String>,
    },
    /// List the subsystems the discovery controller at URL offers this host.
    ListSubsys {
        /// nvme-tcp://HOST:PORT (a discovery NQN after the port is accepted too).
        url: String,
        /// Host NQN to connect as (default: this host's stable NQN).
        #[arg(long)]
        hostnqn: Option<String>,
    },
}

/// A failure with the exit code it maps to.
pub(crate) struct Failure {
    pub(crate) code: i32,
    pub(crate) message: String,
}

impl From<OasError> for Failure {
    fn from(e: OasError) -> Self {
        Failure { code: 2, message: e.to_string() }
    }
}

impl From<insitu_bench::Error> for Failure {
    fn from(e: insitu_bench::Error) -> Self {
        Failure { code: 2, message: e.to_string() }
    }
}

impl From<insitu_image::Error> for Failure {
    fn from(e: insitu_image::Error) -> Self {
        Failure { code: 2, message: e.to_string() }
    }
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Failure { code: 2, message }
    }
}

/// Runs the command line `args` (program name first) and returns the exit code: 0 on
/// success, 1 when a check found a problem (scrub, demo), 2 on errors.
pub fn run<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    let json = cli.json;
    match dispatch(cli) {
        Ok(code) => code,
        Err(f) => {
            if json {
                println!("{}", serde_json::json!({"error": f.message}));
            }
            eprintln!("insitu: error: {}", f.message);
            f.code
        }
    }
}

fn mode(conventional: bool) -> Mode {
    if conventional {
        Mode::Conventional
    } else {
        Mode::Offload
    }
}

fn dispatch(cli: Cli) -> Result<i32, Failure> {
    let json = cli.json;
    let off = Offloader::new().with_local_targets(std::sync::Arc::new(insitu_daemon::LocalEngines));
    match cli.command {
        Cmd::Exec { function, paths, args, conventional, output, force } => {
            let args = parse_args(off.registry(), &function, &args)?;
            let report = off.exec(&Request { function, args, paths, output, mode: mode(conventional), force })?;
            print_report(&report, json);
        }
        Cmd::Grep { pattern, paths, regex, ignore_case, count, conventional } => {
            let args = vec![
                ("pattern".to_string(), insitu_proto::Value::Str(pattern)),
                ("regex".to_string(), insitu_proto::Value::Bool(regex)),
                ("ignore_case".to_string(), insitu_proto::Value::Bool(ignore_case)),
            ];
            let report = off.exec(&Request { function: "grep".into(), args, paths, output: None, mode: mode(conventional), force: false })?;
            if json {
                print_report(&report, true);
            } else {
                for r in &report.results {
                    println!("{}:{}", r.path, r.fields["count"]);
                    if !count {
                        for m in r.fields["matches"].as_array().into_iter().flatten() {
                            println!("  line {} at byte {}", m[0], m[1]);
                        }
                    }
                }
                print_stats(&report);
            }
        }
        Cmd::Wc { paths, conventional } => {
            let report = off.exec(&Request { function: "wc".into(), args: vec![], paths, output: None, mode: mode(conventional), force: false })?;
            if json {
                print_report(&report, true);
            } else {
                for r in &report.results {
                    println!("{:>8} {:>8} {:>10} {}", r.fields["lines"], r.fields["words"], r.fields["bytes"], r.path);
                }
                print_stats(&report);
            }
        }
        Cmd::Scrub { dir, manifest, create, function, conventional } => {
            let report = if create {
                scrub::create(&off, &dir, &manifest, &function, mode(conventional))?
            } else {
                scrub::verify(&off, &dir, &manifest, mode(conventional))?
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
            } else if create {
                println!("recorded {} files in {}", report.checked, manifest.display());
            } else {
                for f in &report.corrupted {
                    println!("CORRUPTED {f}");
                }
                for f in &report.missing {
                    println!("MISSING   {f}");
                }
                for f in &report.new {
                    println!("new       {f}");
                }
                println!(
                    "{} files checked, {} corrupted, {} missing; {} to host, target read {} in {:.2}s",
                    report.checked,
                    report.corrupted.len(),
                    report.missing.len(),
                    human(report.stats.bytes_to_host),
                    human(report.stats.media_bytes),
                    report.stats.seconds
                );
            }
            return Ok(if report.clean() { 0 } else { 1 });
        }
        Cmd::Functions => print_functions(&off, json),
        Cmd::Image(cmd) => match cmd {
            ImageCmd::Create { path, size, fs, block_size, force, model } => {
                if let Some(m) = &model {
                    insitu_model::parse(m).map_err(|e| e.to_string())?;
                }
                create_image(&path, parse_size(&size)?, fs.into(), block_size, force)?;
                model_cmd::set_image_model(&path, model.as_deref())?;
                done(json, &format!("created {} ({size}, {fs:?})", path.display()));
            }
            ImageCmd::Mount { path, dir, model } => {
                match model.as_deref() {
                    Some("none") => model_cmd::set_image_model(&path, None)?,
                    Some(m) => model_cmd::set_image_model(&path, Some(m))?,
                    None => {}
                }
                mount_image(&path, &dir)?;
                done(json, &format!("mounted {} at {}", path.display(), dir.display()));
            }
            ImageCmd::Umount { dir } => {
                umount_image(&dir)?;
                done(json, &format!("unmounted {}", dir.display()));
            }
        },
        Cmd::Demo { size, fs, dir } => return demo::run(&off, parse_size(&size)?, fs.into(), dir, json),
        Cmd::Target(TargetCmd::Start(args)) => {
            let foreground = args.foreground;
            return target_cmd::start(args.try_into()?, foreground, json);
        }
        Cmd::Target(TargetCmd::Stop { listen }) => return target_cmd::stop(listen, json),
        Cmd::Target(TargetCmd::Status) => return target_cmd::status(json),
        Cmd::Target(TargetCmd::Fsck { private, kv_store }) => {
            let bytes = parse_size(&kv_store).map_err(|e| format!("--kv-store: {e}"))?;
            return target_cmd::fsck(&private, bytes, json);
        }
        Cmd::Lock { list: true, .. } => return lock_cmd::list(json),
        Cmd::Lock { path, .. } => return lock_cmd::lock(&path.unwrap_or_default(), json),
        Cmd::Unlock { path } => return lock_cmd::unlock(&path, json),
        Cmd::Attach { url, dir, format, hostnqn } => {
            let format = format.map(|f| match f {
                Fs::Ext4 => insitu_attach::Format::Ext4,
                Fs::Xfs => insitu_attach::Format::Xfs,
            });
            let a = insitu_attach::attach(&url, &dir, format, hostnqn).map_err(|e| e.to_string())?;
            if json {
                println!("{}", serde_json::to_string_pretty(&a).unwrap_or_default());
            } else {
                println!("attached {} at {} ({}, {} via {})", a.url, a.dir.display(), human(a.size), a.loop_device, a.disk.display());
            }
        }
        Cmd::Model(ModelCmd::List) => return model_cmd::list(json),
        Cmd::Model(ModelCmd::Show { name }) => return model_cmd::show(&name, json),
        Cmd::Pool { action, config } => {
            let cfg = pool_cmd::load(&config)?;
            return match action {
                PoolAction::Up => pool_cmd::up(&cfg, json),
                PoolAction::Down => pool_cmd::down(&cfg, json),
                PoolAction::Status => pool_cmd::status(&cfg, json),
            };
        }
        Cmd::Detach { dir } => {
            let a = insitu_attach::detach(&dir).map_err(|e| lock_cmd::detach_hint(&dir, e.to_string()))?;
            done(json, &format!("detached {} from {}", a.url, a.dir.display()));
        }
        Cmd::Llm { .. } | Cmd::Plan { .. } | Cmd::Swift { .. } | Cmd::Bench(BenchCmd::Llm { .. } | BenchCmd::Containers { .. }) => {
            eprintln!("insitu: `llm`, `plan`, `swift`, `bench llm`, `bench containers` and offload on swift:// objects run in the Python entry point (the `insitu` command installed with the package); `llm` needs the LLM extra: `pip install 'insitu[llm]'`");
            return Ok(2);
        }
        Cmd::Bench(BenchCmd::Scan { function, size, repeat, dir }) => return bench_cmd::scan(function, &size, repeat, dir, json),
        Cmd::Bench(BenchCmd::Fabric(a)) => return bench_cmd::fabric(a, json),
        Cmd::Bench(BenchCmd::ExecScaling(a)) => return bench_cmd::exec_scaling(a, json),
        Cmd::Bench(BenchCmd::IoEngine(a)) => return bench_cmd::io_engine(a, json),
        Cmd::Bench(BenchCmd::ScrubScaling(a)) => return bench_cmd::scrub_scaling(a, json),
        Cmd::Bench(BenchCmd::BreakEven(a)) => return bench_cmd::break_even(a, json),
        Cmd::Bench(BenchCmd::Latency(a)) => return bench_cmd::latency(a, json),
        Cmd::Bench(BenchCmd::ModelCheck(a)) => return bench_cmd::model_check(a, json),
        Cmd::Bench(BenchCmd::Kv(a)) => return bench_cmd::kv(a, json),
        Cmd::Ethernet(c) => return ethernet_cmd::dispatch(c, json),
        Cmd::Kv(c) => return kv_cmd::dispatch(c, json),
        Cmd::Nvme(NvmeCmd::Identify { url, hostnqn }) => return nvme_cmd::identify(&url, hostnqn, json),
        Cmd::Nvme(NvmeCmd::ListSubsys { url, hostnqn }) => return nvme_cmd::list_subsys(&url, hostnqn, json),
    }
    Ok(0)
}

fn done(json: bool, msg: &str) {
    if json {
        println!("{}", serde_json::json!({"ok": true, "message": msg}));
    } else {
        println!("{msg}");
    }
}

fn print_report(report: &Report, json: bool) {
    if json {
        println!("{}", serde_json::to_string_pretty(report).unwrap_or_default());
        return;
    }
    for r in &report.results {
        let fields: Vec<String> = r.fields.iter().filter(|(k, _)| *k != "matches").map(|(k, v)| format!("{k}={v}")).collect();
        println!("{}: {}", r.path, fields.join(" "));
    }
    print_stats(report);
}

fn print_stats(report: &Report) {
    let s = &report.stats;
    eprintln!(
        "{} ({}): {} to host, {} from host, target read {}, {:.3}s",
        report.function,
        report.mode,
        human(s.bytes_to_host),
        human(s.bytes_from_host),
        human(s.media_bytes),
        s.seconds
    );
}

fn print_functions(off: &Offloader, json: bool) {
    let list: Vec<serde_json::Value> = off
        .registry()
        .iter()
        .map(|k| {
            let params: Vec<serde_json::Value> =
                k.params().iter().map(|p| serde_json::json!({"key": p.key, "type": p.ty.name(), "required": p.required, "doc": p.doc})).collect();
            serde_json::json!({"name": k.name(), "summary": k.summary(), "outputs": k.output_count(), "args": params})
        })
        .collect();
    if json {
        println!("{}", serde_json::to_string_pretty(&list).unwrap_or_default());
        return;
    }
    for k in off.registry().iter() {
        println!("{:<11} {}", k.name(), k.summary());
        for p in k.params() {
            let req = if p.required { "required" } else { "optional" };
            println!("{:<11}   {}={} ({req}): {}", "", p.key, p.ty.name(), p.doc);
        }
    }
}
