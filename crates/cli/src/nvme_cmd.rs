// SPDX-License-Identifier: Apache-2.0
//! `insitu nvme identify|list-subsys`: look at an NVMe/TCP target from the host with
//! insitu's user-space initiator, without `nvme-cli` or the kernel's nvme-tcp module.
//!
//! URLs are `nvme-tcp://HOST:PORT/NQN[/NSID]`. `list-subsys` talks to the discovery
//! controller, so its URL may stop after the port.

use crate::Failure;
use insitu_attach::TargetUrl;
use insitu_image::human;
use insitu_initiator::{CommandSet, ConnectOptions, ControllerInfo, DiscoveryEntry, InitiatorError, KvNamespaceInfo, NamespaceInfo, Session, DISCOVERY_NQN};
use serde_json::{json, Value};
use std::time::Duration;

/// How long to wait for the connection and each command.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Turns an initiator error into a message that says what to do; a refused connection
/// names the address and how to start a target there.
fn failure(url: &TargetUrl, e: InitiatorError) -> Failure {
    let message = match &e {
        InitiatorError::Connect { addr, source } if source.kind() == std::io::ErrorKind::ConnectionRefused => format!(
            "nothing listens on {addr} (connection refused); start a target there with `insitu target start --listen {addr} --namespace PATH`, or check the URL {url}"
        ),
        _ => format!("{url}: {e}"),
    };
    Failure { code: 2, message }
}

/// Connects the admin queue only (no I/O queues: these commands are all admin commands).
fn connect(url: &TargetUrl, hostnqn: Option<String>) -> Result<Session, Failure> {
    let mut opts = ConnectOptions::new(url.address(), url.nqn.clone());
    if let Some(h) = hostnqn {
        opts.hostnqn = h;
    }
    opts.io_queues = 0;
    opts.kato_ms = 0;
    opts.timeout = TIMEOUT;
    Session::connect(opts).map_err(|e| failure(url, e))
}

/// Parses a URL for `list-subsys`: `nvme-tcp://HOST:PORT`, `nvme-tcp://HOST:PORT/` and
/// `nvme-tcp://HOST:PORT/nqn.2014-08.org.nvmexpress.discovery` all name the discovery
/// controller at HOST:PORT.
pub(crate) fn discovery_url(url: &str) -> Result<TargetUrl, Failure> {
    let full = match url.strip_prefix("nvme-tcp://") {
        Some(rest) if !rest.contains('/') => format!("{url}/{DISCOVERY_NQN}"),
        Some(rest) if rest.ends_with('/') && rest.matches('/').count() == 1 => format!("{url}{DISCOVERY_NQN}"),
        _ => url.to_string(),
    };
    let u = TargetUrl::parse(&full).map_err(|e| e.to_string())?;
    if u.nqn != DISCOVERY_NQN || u.nsid.is_some() {
        return Err(format!(
            "{url}: list-subsys asks the discovery controller, so the URL names only the address: nvme-tcp://{}; use `insitu nvme identify {url}` to look at that subsystem",
            u.address()
        )
        .into());
    }
    Ok(u)
}

/// The VS property as `major.minor.tertiary`.
fn version(vs: u32) -> String {
    format!("{}.{}.{}", vs >> 16, (vs >> 8) & 0xFF, vs & 0xFF)
}

fn controller_json(c: &ControllerInfo, s: &Session) -> Value {
    let d = s.digests();
    json!({
        "cntlid": c.cntlid, "vid": c.vid, "serial": c.serial, "model": c.model, "firmware": c.firmware,
        "version": version(s.version()), "mdts_bytes": c.mdts_bytes, "nn": c.nn, "subnqn": c.subnqn,
        "ioccsz": c.ioccsz, "in_capsule_bytes": c.in_capsule_bytes(), "iorcsz": c.iorcsz, "maxcmd": c.maxcmd,
        "kas_100ms": c.kas, "sgls": c.sgls, "header_digest": d.header, "data_digest": d.data,
    })
}

/// One active namespace as its own command set describes it.
enum Described {
    Nvm(NamespaceInfo),
    KeyValue(KvNamespaceInfo),
    Other(u32, CommandSet),
}

impl Described {
    fn json(&self) -> Value {
        match self {
            Described::Nvm(n) => json!({
                "nsid": n.nsid, "command_set": "nvm", "size_bytes": n.size_bytes(), "nsze": n.nsze, "ncap": n.ncap,
                "nuse": n.nuse, "lba_size": n.lba_size,
            }),
            Described::KeyValue(k) => json!({
                "nsid": k.nsid, "command_set": "key-value", "size_bytes": k.capacity_bytes, "max_key_bytes": k.max_key_bytes,
                "max_value_bytes": k.max_value_bytes,
            }),
            Described::Other(nsid, set) => json!({"nsid": nsid, "command_set": set.name()}),
        }
    }
}

/// Identifies namespace `nsid` with the Identify structure of its command set: a
/// key-value namespace has no NVM structure (CNS 00h reads as zeros there).
fn describe_namespace(s: &Session, nsid: u32) -> Result<Described, InitiatorError> {
    match s.namespace_command_set(nsid)? {
        CommandSet::Nvm => s.identify_namespace(nsid).map(Described::Nvm),
        CommandSet::KeyValue => s.identify_kv_namespace(nsid).map(Described::KeyValue),
        other => Ok(Described::Other(nsid, other)),
    }
}

/// `insitu nvme identify URL`: the controller and its active namespaces (or the one NSID
/// of the URL).
pub(crate) fn identify(url: &str, hostnqn: Option<String>, json_out: bool) -> Result<i32, Failure> {
    let u = TargetUrl::parse(url).map_err(|e| e.to_string())?;
    let s = connect(&u, hostnqn)?;
    let c = s.controller();
    let nsids = match u.nsid {
        Some(n) => vec![n],
        None if u.nqn == DISCOVERY_NQN => Vec::new(),
        None => s.active_namespaces().map_err(|e| failure(&u, e))?,
    };
    let namespaces = nsids.iter().map(|&n| describe_namespace(&s, n)).collect::<Result<Vec<_>, _>>().map_err(|e| match (&e, u.nsid) {
        (InitiatorError::NoNamespace { .. } | InitiatorError::Status { sct: 0, sc: 0x0B, .. }, Some(n)) => {
            let active = s.active_namespaces().unwrap_or_default();
            let list = active.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
            Failure { code: 2, message: format!("namespace {n} is not active on {} at {}; its active namespaces are: {list}", u.nqn, u.address()) }
        }
        _ => failure(&u, e),
    })?;
    if json_out {
        let out = json!({
            "url": u.to_string(), "address": u.address(), "hostnqn": s.options().hostnqn,
            "controller": controller_json(&c, &s), "namespaces": namespaces.iter().map(Described::json).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    } else {
        let d = s.digests();
        let mdts = c.mdts_bytes.map_or("no limit".to_string(), |b| format!("{b} bytes ({})", human(b)));
        println!("controller {} of {} at {}", c.cntlid, c.subnqn, u.address());
        println!("  serial       {}", c.serial);
        println!("  model        {}", c.model);
        println!("  firmware     {}", c.firmware);
        println!("  version      NVMe {}", version(s.version()));
        println!("  vid          {:#06x}", c.vid);
        println!("  mdts         {mdts}");
        println!("  nn           {}", c.nn);
        println!("  maxcmd       {}", c.maxcmd);
        println!("  ioccsz       {} ({} bytes in-capsule)", c.ioccsz, c.in_capsule_bytes());
        println!("  iorcsz       {}", c.iorcsz);
        println!("  kas          {} ms", u32::from(c.kas) * 100);
        println!("  sgls         {:#010x}", c.sgls);
        println!("  digests      header {}, data {}", on(d.header), on(d.data));
        if u.nqn != DISCOVERY_NQN {
            println!("namespaces ({}):", namespaces.len());
        }
        for n in &namespaces {
            match n {
                Described::Nvm(n) => println!("  nsid {:<5} {:>10}  nvm        {} blocks of {} bytes", n.nsid, human(n.size_bytes()), n.nsze, n.lba_size),
                Described::KeyValue(k) => println!(
                    "  nsid {:<5} {:>10}  key-value  keys up to {} bytes, values up to {}",
                    k.nsid,
                    human(k.capacity_bytes),
                    k.max_key_bytes,
                    human(u64::from(k.max_value_bytes))
                ),
                Described::Other(nsid, set) => println!("  nsid {nsid:<5} {:>10}  {}", "-", set.name()),
            }
        }
    }
    let _ = s.disconnect();
    Ok(0)
}

fn on(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

fn subtype(t: u8) -> &'static str {
    match t {
        1 => "referral",
        2 => "nvm",
        3 => "discovery",
        _ => "unknown",
    }
}

fn entry_url(e: &DiscoveryEntry) -> Option<String> {
    let port = e.trsvcid.parse().ok()?;
    Some(TargetUrl { host: e.traddr.clone(), port, nqn: e.subnqn.clone(), nsid: None }.to_string())
}

/// `insitu nvme list-subsys URL`: the discovery log of the target at URL's address.
pub(crate) fn list_subsys(url: &str, hostnqn: Option<String>, json_out: bool) -> Result<i32, Failure> {
    let u = discovery_url(url)?;
    let s = connect(&u, hostnqn)?;
    let entries = s.discovery_log().map_err(|e| failure(&u, e))?;
    if json_out {
        let list: Vec<Value> = entries
            .iter()
            .map(|e| {
                json!({
                    "subnqn": e.subnqn, "subtype": subtype(e.subtype), "trtype": if e.trtype == 3 { "tcp" } else { "other" },
                    "adrfam": match e.adrfam { 1 => "ipv4", 2 => "ipv6", _ => "other" }, "traddr": e.traddr, "trsvcid": e.trsvcid,
                    "portid": e.portid, "cntlid": e.cntlid, "url": entry_url(e),
                })
            })
            .collect();
        let out = json!({"address": u.address(), "hostnqn": s.options().hostnqn, "entries": list});
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    } else {
        println!("discovery log of {} for {}: {} entr{}", u.address(), s.options().hostnqn, entries.len(), if entries.len() == 1 { "y" } else { "ies" });
        for e in &entries {
            let cntlid = if e.cntlid == 0xFFFF { "dynamic".to_string() } else { e.cntlid.to_string() };
            let url = entry_url(e).unwrap_or_else(|| format!("{}:{} {}", e.traddr, e.trsvcid, e.subnqn));
            println!("  {:<9} {url}  (port {}, controller {cntlid})", subtype(e.subtype), e.portid);
        }
    }
    let _ = s.disconnect();
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_urls() {
        for ok in [
            "nvme-tcp://127.0.0.1:4420",
            "nvme-tcp://127.0.0.1:4420/",
            "nvme-tcp://127.0.0.1:4420/nqn.2014-08.org.nvmexpress.discovery",
            "nvme-tcp://[::1]:4421",
        ] {
            let u = discovery_url(ok).unwrap_or_else(|f| panic!("{ok}: {}", f.message));
            assert_eq!(u.nqn, DISCOVERY_NQN);
        }
        assert_eq!(discovery_url("nvme-tcp://h").map(|u| u.port).ok(), Some(4420));
        let e = discovery_url("nvme-tcp://127.0.0.1:4420/nqn.2024-01.io.insitu:target").err().unwrap();
        assert!(e.message.contains("insitu nvme identify"), "{}", e.message);
        assert!(discovery_url("http://x").is_err());
        assert!(discovery_url("nvme-tcp://h:1//").is_err());
    }

    #[test]
    fn versions_and_names() {
        assert_eq!(version(0x0001_0400), "1.4.0");
        assert_eq!(version(0x0002_0001), "2.0.1");
        assert_eq!((subtype(2), subtype(3), subtype(9)), ("nvm", "discovery", "unknown"));
    }

    #[test]
    fn refused_connections_say_how_to_start_a_target() {
        // Port 1 on loopback: nothing listens there in a test environment.
        let u = TargetUrl::parse("nvme-tcp://127.0.0.1:1/nqn.2024-01.io.insitu:target").unwrap();
        let f = connect(&u, None).err().expect("nothing listens on port 1");
        assert!(f.message.contains("127.0.0.1:1") && f.message.contains("insitu target start"), "{}", f.message);
    }
}
