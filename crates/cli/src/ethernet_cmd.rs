// SPDX-License-Identifier: Apache-2.0
//! `insitu ethernet up|down|status`: Ethernet over NVMe (Ether-oN) from the host. `up`
//! creates a TAP device with the host's address, connects to the target with insitu's
//! initiator and bridges the two (`insitu_etheron::HostBridge`), as a daemon unless
//! `--foreground`, with a pid file per address under `/run/insitu/`. The target's side is
//! `insitu target start ... --ether ADDR/PREFIX` (assembled by `insitu-daemon`).

use crate::Failure;
use insitu_attach::TargetUrl;
use insitu_etheron::{Cidr, EtherError, HostBridge, HostLink, Received, Tap, RECEIVE_BUFFER, RECEIVE_FRAME, TRANSMIT_FRAME};
use insitu_initiator::{Command, ConnectOptions, Session, DISCOVERY_NQN};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

const RUN_DIR: &str = "/run/insitu";

/// How long to wait for the connection and for each command; longer than the target's
/// idle receive (10 s), after which it completes a held receive empty.
const TIMEOUT: Duration = Duration::from_secs(30);

fn pid_file(addr: std::net::IpAddr) -> PathBuf {
    Path::new(RUN_DIR).join(format!("ethernet-{}.json", addr.to_string().replace(':', "_")))
}

/// The session's side of the bridge: frame commands on its I/O queue.
struct NvmeLink(Session);

fn status_error(command: &str, status: u16) -> EtherError {
    let (sct, sc) = (((status >> 8) & 7) as u8, (status & 0xFF) as u8);
    let what = insitu_etheron::status_message(status).map_or_else(|| insitu_initiator::status_name(command, sct, sc).to_string(), str::to_string);
    EtherError::Link(format!("{command} failed: {what} (sct {sct}, sc {sc:#04x})"))
}

impl HostLink for NvmeLink {
    fn transmit(&self, frames: &[&[u8]]) -> Result<(), EtherError> {
        let cmds: Vec<(Command, &[u8])> = frames
            .iter()
            .map(|f| {
                let mut c = Command::zeroed();
                c.set_opcode(TRANSMIT_FRAME).set_cdw(10, f.len() as u32);
                (c, *f)
            })
            .collect();
        let done = self.0.submit_batch(&cmds).map_err(|e| EtherError::Link(e.to_string()))?;
        match done.iter().find(|c| c.status != 0) {
            Some(c) => Err(status_error("TRANSMIT_FRAME", c.status)),
            None => Ok(()),
        }
    }

    fn receive(&self) -> Result<Received, EtherError> {
        let mut c = Command::zeroed();
        c.set_opcode(RECEIVE_FRAME);
        let (cqe, mut data) = self.0.submit(c, None, RECEIVE_BUFFER).map_err(|e| EtherError::Link(e.to_string()))?;
        if cqe.status != 0 {
            return Err(status_error("RECEIVE_FRAME", cqe.status));
        }
        data.truncate((cqe.dw0 as usize).min(RECEIVE_BUFFER));
        Ok(Received { frame: data, seq: cqe.dw1 })
    }
}

/// What `insitu ethernet up` was asked for.
pub(crate) struct UpArgs {
    pub(crate) url: String,
    pub(crate) address: String,
    pub(crate) hostnqn: Option<String>,
    pub(crate) foreground: bool,
}

/// Resolves the URL: `nvme-tcp://HOST:PORT/NQN`, or `nvme-tcp://HOST:PORT` for the one NVM
/// subsystem the target's discovery controller lists.
fn resolve(url: &str, hostnqn: Option<&String>) -> Result<TargetUrl, Failure> {
    if let Ok(u) = TargetUrl::parse(url) {
        if u.nqn != DISCOVERY_NQN {
            return Ok(u);
        }
    }
    let d = crate::nvme_cmd::discovery_url(url)?;
    let mut opts = ConnectOptions::new(d.address(), DISCOVERY_NQN);
    if let Some(h) = hostnqn {
        opts.hostnqn = h.clone();
    }
    (opts.io_queues, opts.kato_ms, opts.timeout) = (0, 0, Duration::from_secs(10));
    let s = Session::connect(opts).map_err(|e| format!("{url}: {e}"))?;
    let entries = s.discovery_log().map_err(|e| format!("{url}: {e}"))?;
    let _ = s.disconnect();
    let nqns: Vec<&String> = entries.iter().filter(|e| e.subnqn != DISCOVERY_NQN).map(|e| &e.subnqn).collect();
    match nqns.as_slice() {
        [one] => Ok(TargetUrl { nqn: (*one).clone(), ..d }),
        [] => Err(format!("{url}: the target offers this host no subsystem").into()),
        many => Err(format!(
            "{url}: the target offers several subsystems ({}); name one: nvme-tcp://{}/NQN",
            many.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
            d.address()
        )
        .into()),
    }
}

/// Creates the TAP device and connects: everything that can fail before the bridge runs.
fn setup(u: &TargetUrl, cidr: &Cidr, hostnqn: Option<String>) -> Result<(HostBridge, u16), Failure> {
    let mut opts = ConnectOptions::new(u.address(), u.nqn.clone());
    if let Some(h) = hostnqn {
        opts.hostnqn = h;
    }
    (opts.io_queues, opts.queue_depth, opts.timeout) = (1, 64, TIMEOUT);
    let tap = Tap::create(cidr, None).map_err(|e| e.to_string())?;
    let s = Session::connect(opts).map_err(|e| format!("{u}: {e}"))?;
    let cntlid = s.cntlid();
    Ok((HostBridge::new(tap, Arc::new(NvmeLink(s))), cntlid))
}

pub(crate) fn up(a: UpArgs, json_out: bool) -> Result<i32, Failure> {
    let cidr: Cidr = a.address.parse().map_err(|e: EtherError| format!("--address: {e}"))?;
    let device = Tap::name_for(cidr.addr);
    let file = pid_file(cidr.addr);
    if let Some(pid) = running(&file) {
        return Err(
            format!("Ether-oN is already up with address {} (pid {pid}); stop it with `insitu ethernet down --address {}`", cidr.addr, cidr.addr).into()
        );
    }
    if a.foreground {
        let u = resolve(&a.url, a.hostnqn.as_ref())?;
        let (bridge, cntlid) = setup(&u, &cidr, a.hostnqn)?;
        eprintln!("insitu-ethernet: {device} {cidr} bridged to {u} (controller {cntlid})");
        bridge.run().map_err(|e| e.to_string())?;
        return Ok(0);
    }
    std::fs::create_dir_all(RUN_DIR).map_err(|e| format!("{RUN_DIR}: {e}"))?;
    let log = Path::new(RUN_DIR).join(format!("ethernet-{}.log", cidr.addr.to_string().replace(':', "_")));
    // This process has started no thread: the child sets itself up from scratch (URL,
    // TAP device, connection) and reports.
    let (url, hostnqn) = (a.url.clone(), a.hostnqn.clone());
    let child = insitu_detach::spawn(|ready| bridge_daemon(&url, &cidr, hostnqn, &log, ready))?;
    let pid = child.pid;
    let url = child.wait(&format!("the bridge exited during setup; see {}", log.display()))?;
    let mut rec = json!({"url": url, "address": cidr.to_string(), "device": device});
    rec["pid"] = json!(pid);
    rec["log"] = json!(log);
    std::fs::write(&file, rec.to_string()).map_err(|e| format!("{}: {e}", file.display()))?;
    if json_out {
        println!("{}", serde_json::to_string_pretty(&rec).unwrap_or_default());
    } else {
        println!("Ether-oN up: {device} {cidr} bridged to {url} (pid {pid}, log {})", log.display());
    }
    Ok(0)
}

/// The bridge as a daemon: sets up, reports, and runs until its connection ends; returns
/// the exit code.
fn bridge_daemon(url: &str, cidr: &Cidr, hostnqn: Option<String>, log: &Path, ready: insitu_detach::Ready) -> i32 {
    let _ = insitu_detach::to_log(log);
    let set_up = resolve(url, hostnqn.as_ref()).and_then(|u| setup(&u, cidr, hostnqn).map(|b| (u, b)));
    match set_up {
        Ok((u, (bridge, cntlid))) => {
            eprintln!("insitu-ethernet: {} {cidr} bridged to {u} (controller {cntlid})", bridge.tap().name());
            ready.ok(&u.to_string());
            match bridge.run() {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("insitu-ethernet: {e}");
                    1
                }
            }
        }
        Err(e) => {
            ready.fail(&e.message);
            1
        }
    }
}

/// The pid recorded in `file`, if that process is alive.
fn running(file: &Path) -> Option<i32> {
    let rec: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(file).ok()?).ok()?;
    let pid = rec["pid"].as_i64()? as i32;
    (pid > 0 && insitu_detach::alive(pid)).then_some(pid)
}

fn records() -> Vec<(PathBuf, serde_json::Value)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(RUN_DIR).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("ethernet-") && name.ends_with(".json") {
            if let Some(rec) = std::fs::read_to_string(e.path()).ok().and_then(|t| serde_json::from_str(&t).ok()) {
                out.push((e.path(), rec));
            }
        }
    }
    out
}

/// `insitu ethernet down --address ADDR | --device NAME`.
pub(crate) fn down(address: Option<String>, device: Option<String>, json_out: bool) -> Result<i32, Failure> {
    let want_addr = address.as_deref().map(|a| a.split('/').next().unwrap_or(a).to_string());
    let found = records().into_iter().find(|(_, r)| {
        let addr = r["address"].as_str().unwrap_or("").split('/').next().unwrap_or("");
        want_addr.as_deref() == Some(addr) || (device.is_some() && r["device"].as_str() == device.as_deref())
    });
    let what = address.or(device).unwrap_or_default();
    let Some((file, rec)) = found else {
        return Err(format!("no Ether-oN bridge started by insitu has {what}; `insitu ethernet status` lists them").into());
    };
    let pid = rec["pid"].as_i64().unwrap_or(0) as i32;
    if pid > 0 {
        insitu_detach::terminate(pid, Duration::from_secs(10));
    }
    let _ = std::fs::remove_file(&file);
    if json_out {
        println!("{}", json!({"stopped": rec["address"], "device": rec["device"], "pid": pid}));
    } else {
        println!("Ether-oN down: {} {} (pid {pid})", rec["device"].as_str().unwrap_or(""), rec["address"].as_str().unwrap_or(""));
    }
    Ok(0)
}

/// `insitu ethernet status`.
pub(crate) fn status(json_out: bool) -> Result<i32, Failure> {
    let list: Vec<serde_json::Value> = records()
        .into_iter()
        .map(|(file, mut r)| {
            r["running"] = json!(running(&file).is_some());
            r
        })
        .collect();
    if json_out {
        println!("{}", serde_json::to_string_pretty(&json!({"bridges": list})).unwrap_or_default());
    } else if list.is_empty() {
        println!("no Ether-oN bridges started by insitu");
    } else {
        for r in &list {
            let state = if r["running"] == json!(true) { "running" } else { "NOT RUNNING" };
            println!(
                "{} {} {} pid {} {state}",
                r["device"].as_str().unwrap_or(""),
                r["address"].as_str().unwrap_or(""),
                r["url"].as_str().unwrap_or(""),
                r["pid"]
            );
        }
    }
    Ok(0)
}

/// `insitu ethernet ...`.
#[derive(clap::Subcommand, Debug)]
pub(crate) enum EthernetCmd {
    /// Create a TAP device with ADDRESS on this host and bridge it to the target at URL:
    /// Ethernet frames travel in vendor NVMe commands (TRANSMIT_FRAME 0xE1, RECEIVE_FRAME
    /// 0xE2), so the target's `--ether` address is reachable over the storage link alone.
    /// Runs as a daemon unless --foreground.
    Up {
        /// nvme-tcp://HOST:PORT[/NQN] (without NQN: the one subsystem the target offers).
        url: String,
        /// This host's address on the Ether-oN link, ADDR/PREFIX (e.g. 10.77.0.1/24).
        #[arg(long, value_name = "ADDR/PREFIX")]
        address: String,
        /// Host NQN to connect as (default: this host's stable NQN).
        #[arg(long)]
        hostnqn: Option<String>,
        /// Stay in the foreground (logs to stderr).
        #[arg(long)]
        foreground: bool,
    },
    /// Stop a bridge started with `insitu ethernet up` (its TAP device goes with it).
    Down {
        /// Its address (the prefix may be left out).
        #[arg(long, value_name = "ADDR", required_unless_present = "device")]
        address: Option<String>,
        /// Or its device name (isn-...).
        #[arg(long, conflicts_with = "address")]
        device: Option<String>,
    },
    /// List bridges started with `insitu ethernet up`.
    Status,
}

pub(crate) fn dispatch(c: EthernetCmd, json_out: bool) -> Result<i32, Failure> {
    match c {
        EthernetCmd::Up { url, address, hostnqn, foreground } => up(UpArgs { url, address, hostnqn, foreground }, json_out),
        EthernetCmd::Down { address, device } => down(address, device, json_out),
        EthernetCmd::Status => status(json_out),
    }
}
