// SPDX-License-Identifier: Apache-2.0
//! `POST /containers/create`: the request checked field by field.
//!
//! Every field of `Config` and `HostConfig` that moby's API defines is either honoured
//! (parsed here into a [`CreateSpec`] the runtime applies) or, when given a value other
//! than its default, refused with a 400 that names it and says why. Nothing is accepted
//! and then ignored. The request's `Config` and `HostConfig` are kept as given, so that
//! `inspect` answers them back.

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

use super::body::{error, json, ApiBody};
use super::{read_json, Target};
use crate::runtime::options::{Options, RestartPolicy, Ulimit, ULIMITS};
use crate::runtime::{exposed_ports, parse_bind, port_bindings, CreateSpec, NetworkMode, Runtime, RuntimeError};

/// Docker's default capabilities (what `CapAdd` may name, `CapDrop` take away).
const DEFAULT_CAPS: &[&str] = &[
    "CHOWN",
    "DAC_OVERRIDE",
    "FSETID",
    "FOWNER",
    "MKNOD",
    "NET_RAW",
    "SETGID",
    "SETUID",
    "SETFCAP",
    "SETPCAP",
    "NET_BIND_SERVICE",
    "SYS_CHROOT",
    "KILL",
    "AUDIT_WRITE",
];

/// `HostConfig` fields refused unless left at their default, and why.
const REFUSED_HOST: &[(&str, &str)] = &[
    ("Annotations", "OCI annotations are not passed to the runtime"),
    ("BlkioWeight", "block I/O weights are not offered: the device's own model paces I/O"),
    ("BlkioWeightDevice", "block I/O weights are not offered: the device's own model paces I/O"),
    ("BlkioDeviceReadBps", "containers reach no block device of the target"),
    ("BlkioDeviceWriteBps", "containers reach no block device of the target"),
    ("BlkioDeviceReadIOps", "containers reach no block device of the target"),
    ("BlkioDeviceWriteIOps", "containers reach no block device of the target"),
    ("CgroupParent", "containers' cgroups are placed by the target"),
    ("Cgroup", "containers' cgroups are placed by the target"),
    ("CpuCount", "a Windows option"),
    ("CpuPercent", "a Windows option"),
    ("IOMaximumIOps", "a Windows option"),
    ("IOMaximumBandwidth", "a Windows option"),
    ("CpuRealtimePeriod", "real-time scheduling is not offered"),
    ("CpuRealtimeRuntime", "real-time scheduling is not offered"),
    ("Devices", "containers reach no device of the target"),
    ("DeviceCgroupRules", "containers reach no device of the target"),
    ("DeviceRequests", "the target has no devices to hand out"),
    ("Dns", "containers have loopback only: there is no DNS to configure"),
    ("DnsOptions", "containers have loopback only: there is no DNS to configure"),
    ("DnsSearch", "containers have loopback only: there is no DNS to configure"),
    ("ExtraHosts", "containers have loopback only: there are no other hosts"),
    ("Init", "the target has no init binary to run as the container's first process"),
    ("Links", "legacy links are not offered (the API's networks are not either)"),
    ("MaskedPaths", "the masked paths are the target's, fixed"),
    ("ReadonlyPaths", "the read-only paths are the target's, fixed"),
    ("Privileged", "a privileged container would own the drive"),
    ("PublishAllPorts", "publish ports one by one with PortBindings"),
    ("StorageOpt", "the overlay root has no per-container options"),
    ("Sysctls", "the kernel's settings are the target's"),
    ("UsernsMode", "user namespaces are not offered"),
    ("VolumesFrom", "sharing another container's volumes is not offered; bind a named volume"),
];

/// `HostConfig` fields honoured (each parsed by [`create_spec`] and applied by the
/// runtime, or refused when asked for what cannot be done, as `PidMode: host`).
#[cfg_attr(not(test), allow(dead_code))]
const HONOURED_HOST: &[&str] = &[
    "AutoRemove",
    "Binds",
    "CapAdd",
    "CapDrop",
    "CgroupnsMode",
    "ConsoleSize",
    "CpuPeriod",
    "CpuQuota",
    "CpuShares",
    "CpusetCpus",
    "CpusetMems",
    "GroupAdd",
    "IpcMode",
    "Isolation",
    "LogConfig",
    "Memory",
    "MemoryReservation",
    "MemorySwap",
    "MemorySwappiness",
    "Mounts",
    "NanoCpus",
    "NetworkMode",
    "OomKillDisable",
    "OomScoreAdj",
    "PidMode",
    "PidsLimit",
    "PortBindings",
    "ReadonlyRootfs",
    "RestartPolicy",
    "Runtime",
    "SecurityOpt",
    "ShmSize",
    "Tmpfs",
    "UTSMode",
    "Ulimits",
    "VolumeDriver",
];

/// `Config` fields refused unless left at their default, and why.
const REFUSED_CONFIG: &[(&str, &str)] = &[
    ("Domainname", "containers have loopback only: a domain name would name nothing"),
    ("MacAddress", "containers have no network interface of their own but loopback"),
    ("OnBuild", "a build option"),
];

/// Whether `v` is the default of a field: null, false, 0, "", an empty list or object,
/// or an object all of whose fields are defaults.
pub(crate) fn is_default(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(m) => m.values().all(is_default),
    }
}

fn strings(v: &Value, field: &str) -> Result<Option<Vec<String>>, String> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(vec![s.clone()])),
        Some(Value::Array(a)) => {
            a.iter().map(|x| x.as_str().map(str::to_string).ok_or_else(|| format!("{field} must be a list of strings"))).collect::<Result<_, _>>().map(Some)
        }
        Some(_) => Err(format!("{field} must be a list of strings")),
    }
}

fn number(v: &Value, field: &str) -> Result<Option<i64>, String> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x.as_i64().map(Some).ok_or_else(|| format!("{field} must be an integer")),
    }
}

fn text(v: &Value, field: &str) -> Result<Option<String>, String> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone()).filter(|s| !s.is_empty())),
        Some(_) => Err(format!("{field} must be a string")),
    }
}

fn flag(v: &Value, field: &str) -> Result<bool, String> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(format!("{field} must be true or false")),
    }
}

/// `HostConfig.ConsoleSize`: `[rows, columns]`; absent, null or `[0, 0]` is no size.
fn console_size(hc: &Value) -> Result<Option<(u16, u16)>, String> {
    let bad = || "HostConfig.ConsoleSize must be [height, width], two whole numbers from 0 to 65535".to_string();
    match hc.get("ConsoleSize") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) if a.len() == 2 => {
            let dim = |v: &Value| v.as_u64().and_then(|n| u16::try_from(n).ok()).ok_or_else(bad);
            let (rows, cols) = (dim(&a[0])?, dim(&a[1])?);
            Ok(Some((rows, cols)).filter(|_| rows > 0 && cols > 0))
        }
        Some(_) => Err(bad()),
    }
}

/// A mode field (`PidMode`, `IpcMode`, ...) that may only keep the container's own
/// namespace.
fn own_namespace(hc: &Value, field: &str, allowed: &[&str]) -> Result<(), String> {
    match text(hc, field)? {
        None => Ok(()),
        Some(m) if allowed.contains(&m.as_str()) => Ok(()),
        Some(m) => Err(format!(
            "HostConfig.{field} {m:?} is not supported on this target: a container keeps namespaces of its own (use {})",
            allowed.iter().map(|a| format!("{a:?}")).collect::<Vec<_>>().join(" or ")
        )),
    }
}

fn cap_name(c: &str) -> String {
    let c = c.to_ascii_uppercase();
    c.strip_prefix("CAP_").map(str::to_string).unwrap_or(c)
}

/// `CpusetCpus`/`CpusetMems`: a list of numbers and ranges (`0-2,4`).
fn cpu_list(hc: &Value, field: &str) -> Result<Option<String>, String> {
    let Some(s) = text(hc, field)? else { return Ok(None) };
    let ok = s.split(',').all(|part| {
        let mut r = part.splitn(2, '-');
        let a = r.next().and_then(|x| x.parse::<u32>().ok());
        let b = r.next().map(|x| x.parse::<u32>().ok());
        matches!((a, b), (Some(_), None)) || matches!((a, b), (Some(a), Some(Some(b))) if a <= b)
    });
    if !ok {
        return Err(format!("invalid HostConfig.{field} {s:?}: a list of numbers and ranges, as 0-2,4"));
    }
    Ok(Some(s))
}

/// The options of `HostConfig` and `Config` beyond the basics (see [`Options`]).
fn options(body: &Value, hc: &Value) -> Result<Options, String> {
    let mut o = Options {
        user: text(body, "User")?,
        hostname: text(body, "Hostname")?,
        stop_signal: text(body, "StopSignal")?,
        stop_timeout: number(body, "StopTimeout")?,
        cpu_shares: number(hc, "CpuShares")?
            .filter(|&n| n != 0)
            .map(|n| u64::try_from(n).map_err(|_| "HostConfig.CpuShares must not be negative"))
            .transpose()?,
        cpuset_cpus: cpu_list(hc, "CpusetCpus")?,
        cpuset_mems: cpu_list(hc, "CpusetMems")?,
        memory_swap: number(hc, "MemorySwap")?.filter(|&n| n != 0),
        memory_reservation: number(hc, "MemoryReservation")?.filter(|&n| n > 0),
        oom_kill_disable: flag(hc, "OomKillDisable")?,
        pids_limit: number(hc, "PidsLimit")?.filter(|&n| n > 0),
        oom_score_adj: number(hc, "OomScoreAdj")?
            .filter(|&n| n != 0)
            .map(|n| i32::try_from(n).ok().filter(|n| (-1000..=1000).contains(n)).ok_or("HostConfig.OomScoreAdj must be from -1000 to 1000"))
            .transpose()?,
        shm_size: number(hc, "ShmSize")?.filter(|&n| n != 0),
        readonly_rootfs: flag(hc, "ReadonlyRootfs")?,
        group_add: strings(hc, "GroupAdd")?.unwrap_or_default(),
        ..Default::default()
    };
    if let Some(s) = &o.hostname {
        if s.len() > 63 || !s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.') {
            return Err(format!("invalid Config.Hostname {s:?}: letters, digits, '-' and '.', at most 63"));
        }
    }
    if let Some(s) = &o.stop_signal {
        let bare = s.strip_prefix("SIG").unwrap_or(s);
        if bare.is_empty() || !bare.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(format!("invalid Config.StopSignal {s:?}: give a name like SIGTERM or a number"));
        }
    }
    if let Some(u) = &o.user {
        if !u.chars().all(|c| c.is_ascii_alphanumeric() || "_.-:".contains(c)) {
            return Err(format!("invalid Config.User {u:?}: user[:group], names or numbers"));
        }
    }
    if matches!(o.shm_size, Some(n) if n < 0) {
        return Err("HostConfig.ShmSize must not be negative".into());
    }
    if matches!(o.memory_swap, Some(n) if n < -1) {
        return Err("HostConfig.MemorySwap must be -1 (unlimited) or a number of bytes".into());
    }
    let memory = number(hc, "Memory")?.filter(|&m| m > 0);
    if let (Some(swap), Some(mem)) = (o.memory_swap.filter(|&s| s > 0), memory) {
        if swap < mem {
            return Err("HostConfig.MemorySwap: minimum memoryswap limit should be larger than memory limit".into());
        }
    }
    if o.memory_swap.is_some_and(|s| s > 0) && memory.is_none() {
        return Err("HostConfig.MemorySwap needs HostConfig.Memory: you should always set the Memory limit when using Memoryswap limit".into());
    }
    match number(hc, "MemorySwappiness")? {
        None | Some(-1) => {}
        Some(n @ 0..=100) => o.memory_swappiness = Some(n as u64),
        Some(n) => return Err(format!("invalid HostConfig.MemorySwappiness {n}: a value from 0 to 100 (-1 for the default)")),
    }
    for g in &o.group_add {
        if g.is_empty() || !g.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)) {
            return Err(format!("invalid HostConfig.GroupAdd entry {g:?}: a group name or number"));
        }
    }
    for (field, list) in [("CapAdd", &mut o.cap_add), ("CapDrop", &mut o.cap_drop)] {
        for c in strings(hc, field)?.unwrap_or_default() {
            let name = cap_name(&c);
            if name == "ALL" && field == "CapDrop" {
                list.push("ALL".into());
                continue;
            }
            if !DEFAULT_CAPS.contains(&name.as_str()) {
                return Err(if field == "CapAdd" {
                    format!("HostConfig.CapAdd {c:?} is refused on this target: containers keep at most Docker's default capabilities")
                } else {
                    format!("HostConfig.CapDrop {c:?}: unknown capability")
                });
            }
            list.push(format!("CAP_{name}"));
        }
    }
    match hc.get("RestartPolicy") {
        None | Some(Value::Null) => {}
        Some(Value::Object(p)) => {
            let name = p.get("Name").and_then(Value::as_str).unwrap_or("");
            let max = p.get("MaximumRetryCount").and_then(Value::as_i64).unwrap_or(0);
            if !matches!(name, "" | "no" | "always" | "unless-stopped" | "on-failure") {
                return Err(format!("invalid restart policy {name:?}: use no, always, unless-stopped or on-failure"));
            }
            if max != 0 && name != "on-failure" {
                return Err(format!("invalid restart policy: maximum retry count can only be used with 'on-failure' (not {name:?})"));
            }
            if max < 0 {
                return Err("invalid restart policy: maximum retry count cannot be negative".into());
            }
            o.restart = RestartPolicy { name: if name == "no" { String::new() } else { name.into() }, max_retries: max };
        }
        Some(_) => return Err("HostConfig.RestartPolicy must be {\"Name\", \"MaximumRetryCount\"}".into()),
    }
    if !o.restart.name.is_empty() && flag(hc, "AutoRemove")? {
        return Err("HostConfig.RestartPolicy: can't create 'AutoRemove' container with restart policy".into());
    }
    match hc.get("Tmpfs") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            for (dst, opts) in m {
                let opts = opts.as_str().ok_or_else(|| format!("HostConfig.Tmpfs[{dst:?}] must be a string of mount options"))?;
                check_destination(dst, "HostConfig.Tmpfs")?;
                if !opts.chars().all(|c| c.is_ascii_alphanumeric() || "=,_-".contains(c)) {
                    return Err(format!("invalid HostConfig.Tmpfs options {opts:?} for {dst}: as size=64m,mode=1777"));
                }
                o.tmpfs.insert(dst.clone(), opts.to_string());
            }
        }
        Some(_) => return Err("HostConfig.Tmpfs must be an object of DESTINATION: OPTIONS".into()),
    }
    match hc.get("Ulimits") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) => {
            for u in a {
                let name = u.get("Name").and_then(Value::as_str).unwrap_or("");
                if !ULIMITS.contains(&name) {
                    return Err(format!("invalid HostConfig.Ulimits name {name:?}: one of {}", ULIMITS.join(", ")));
                }
                let lim = |k: &str| u.get(k).and_then(Value::as_i64).map(|n| if n < 0 { u64::MAX } else { n as u64 });
                let (Some(soft), Some(hard)) = (lim("Soft"), lim("Hard")) else {
                    return Err(format!("HostConfig.Ulimits {name}: give Soft and Hard as numbers"));
                };
                if soft > hard {
                    return Err(format!("ulimit soft limit must be less than or equal to hard limit: {soft} > {hard}"));
                }
                o.ulimits.push(Ulimit { name: name.into(), soft, hard });
            }
        }
        Some(_) => return Err("HostConfig.Ulimits must be a list of {\"Name\", \"Soft\", \"Hard\"}".into()),
    }
    for opt in strings(hc, "SecurityOpt")?.unwrap_or_default() {
        // No new privileges is every container's rule already.
        if !matches!(opt.as_str(), "no-new-privileges" | "no-new-privileges:true" | "no-new-privileges=true") {
            return Err(format!(
                "HostConfig.SecurityOpt {opt:?} is not supported on this target: every container runs with no-new-privileges and the target's seccomp profile"
            ));
        }
    }
    match hc.get("LogConfig") {
        None | Some(Value::Null) => {}
        Some(Value::Object(l)) => {
            let ty = l.get("Type").and_then(Value::as_str).unwrap_or("");
            if !matches!(ty, "" | "json-file" | "local") {
                return Err(format!(
                    "HostConfig.LogConfig.Type {ty:?} is not supported on this target: use json-file or local (the target keeps each container's log itself)"
                ));
            }
            if let Some(k) = l.get("Config").and_then(Value::as_object).and_then(|c| c.keys().next()) {
                return Err(format!("HostConfig.LogConfig.Config {k:?} is not supported on this target: the log is kept whole until the container is removed"));
            }
        }
        Some(_) => return Err("HostConfig.LogConfig must be {\"Type\", \"Config\"}".into()),
    }
    own_namespace(hc, "PidMode", &["private"])?;
    own_namespace(hc, "IpcMode", &["private", "shareable"])?;
    own_namespace(hc, "UTSMode", &["private"])?;
    own_namespace(hc, "CgroupnsMode", &["private"])?;
    for (field, allowed) in [("Runtime", "runc"), ("Isolation", "default"), ("VolumeDriver", "local")] {
        if let Some(v) = text(hc, field)?.filter(|v| v != allowed) {
            return Err(format!("HostConfig.{field} {v:?} is not supported on this target: only {allowed:?}"));
        }
    }
    Ok(o)
}

fn check_destination(dst: &str, field: &str) -> Result<(), String> {
    if !dst.starts_with('/') || dst.split('/').any(|c| c == "..") || dst == "/" {
        return Err(format!("invalid {field} destination {dst:?}: an absolute path without '..', not /"));
    }
    Ok(())
}

/// `HostConfig.Mounts` as binds (bind and volume mounts) and tmpfs mounts.
fn mounts(hc: &Value, binds: &mut Vec<String>, tmpfs: &mut BTreeMap<String, String>) -> Result<(), String> {
    let list = match hc.get("Mounts") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Array(a)) => a,
        Some(_) => return Err("HostConfig.Mounts must be a list of mounts".into()),
    };
    for m in list {
        let ty = m.get("Type").and_then(Value::as_str).unwrap_or("");
        let target = m.get("Target").and_then(Value::as_str).unwrap_or("");
        check_destination(target, "HostConfig.Mounts")?;
        let ro = m.get("ReadOnly").and_then(Value::as_bool).unwrap_or(false);
        let source = m.get("Source").and_then(Value::as_str).unwrap_or("");
        for (k, what) in [("BindOptions", "bind options"), ("VolumeOptions", "volume options")] {
            if m.get(k).is_some_and(|v| !is_default(v)) {
                return Err(format!("HostConfig.Mounts {target}: {what} ({k}) are not supported on this target"));
            }
        }
        match ty {
            "bind" | "volume" => {
                if source.is_empty() {
                    return Err(format!("HostConfig.Mounts {target}: a {ty} mount needs a Source (anonymous volumes are not supported on this target)"));
                }
                if (ty == "bind") != source.starts_with('/') {
                    return Err(format!("HostConfig.Mounts {target}: a bind mount's Source is an absolute path, a volume's a name ({source:?})"));
                }
                let b = format!("{source}:{target}{}", if ro { ":ro" } else { "" });
                parse_bind(&b)?;
                binds.push(b);
            }
            "tmpfs" => {
                let mut opts = Vec::new();
                if let Some(t) = m.get("TmpfsOptions") {
                    if let Some(n) = t.get("SizeBytes").and_then(Value::as_i64).filter(|&n| n > 0) {
                        opts.push(format!("size={n}"));
                    }
                    if let Some(n) = t.get("Mode").and_then(Value::as_u64).filter(|&n| n > 0) {
                        opts.push(format!("mode={n:o}"));
                    }
                }
                if ro {
                    opts.push("ro".into());
                }
                tmpfs.insert(target.to_string(), opts.join(","));
            }
            other => return Err(format!("HostConfig.Mounts {target}: mount type {other:?} is not supported on this target: bind, volume or tmpfs")),
        }
    }
    Ok(())
}

/// The `Config` fields a create request may carry, besides `HostConfig` and
/// `NetworkingConfig`.
const CONFIG_FIELDS: &[&str] = &[
    "Hostname",
    "Domainname",
    "User",
    "AttachStdin",
    "AttachStdout",
    "AttachStderr",
    "ExposedPorts",
    "Tty",
    "OpenStdin",
    "StdinOnce",
    "Env",
    "Cmd",
    "Healthcheck",
    "ArgsEscaped",
    "Image",
    "Volumes",
    "WorkingDir",
    "Entrypoint",
    "NetworkDisabled",
    "MacAddress",
    "OnBuild",
    "Labels",
    "StopSignal",
    "StopTimeout",
    "Shell",
];

/// The parts of a create request the runtime honours, type-checked; an option that
/// cannot be honoured is an error naming it.
pub(crate) fn create_spec(body: &Value) -> Result<CreateSpec, String> {
    if !body.is_object() {
        return Err("the create request must be a JSON object".into());
    }
    let image = body.get("Image").and_then(Value::as_str).filter(|s| !s.is_empty()).ok_or("Image is required")?.to_string();
    let hc = body.get("HostConfig").cloned().unwrap_or(Value::Null);
    if !hc.is_object() && !hc.is_null() {
        return Err("HostConfig must be an object".into());
    }
    for (field, why) in REFUSED_HOST {
        if hc.get(field).is_some_and(|v| !is_default(v)) {
            return Err(format!("HostConfig.{field} is not supported on this target: {why}"));
        }
    }
    for (field, why) in REFUSED_CONFIG {
        if body.get(field).is_some_and(|v| !is_default(v)) {
            return Err(format!("Config.{field} is not supported on this target: {why}"));
        }
    }
    if let Some(h) = body.get("Healthcheck").filter(|v| !is_default(v)) {
        let none = h.get("Test").and_then(Value::as_array).is_some_and(|t| t.first().and_then(Value::as_str) == Some("NONE"));
        if !none {
            return Err("Config.Healthcheck is not supported on this target: health checks are not run".into());
        }
    }
    let nano = number(&hc, "NanoCpus")?.filter(|&n| n > 0);
    let quota = number(&hc, "CpuQuota")?.filter(|&n| n > 0);
    let period = number(&hc, "CpuPeriod")?.filter(|&n| n > 0).unwrap_or(100_000);
    if nano.is_some() && quota.is_some() {
        return Err("conflicting options: NanoCpus and CpuQuota cannot both be set".into());
    }
    let cpus = nano.map(|n| n as f64 / 1e9).or(quota.map(|q| q as f64 / period as f64));
    let labels = match body.get("Labels") {
        None | Some(Value::Null) => Default::default(),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())).ok_or_else(|| format!("label {k:?} must be a string")))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("Labels must be an object of strings".into()),
    };
    let mut options = options(body, &hc)?;
    let mut binds = strings(&hc, "Binds")?.unwrap_or_default();
    mounts(&hc, &mut binds, &mut options.tmpfs)?;
    // Config.Volumes lists mount points; each must be bound (anonymous volumes are not
    // made), which is what clients send along with their binds.
    if let Some(Value::Object(v)) = body.get("Volumes") {
        for dst in v.keys() {
            let bound = binds.iter().any(|b| b.split(':').nth(1) == Some(dst.as_str())) || options.tmpfs.contains_key(dst);
            if !bound {
                return Err(format!("Config.Volumes {dst:?}: anonymous volumes are not supported on this target; bind a named volume (NAME:{dst})"));
            }
        }
    }
    let network_disabled = flag(body, "NetworkDisabled")?;
    let mut network = NetworkMode::parse(match hc.get("NetworkMode") {
        None | Some(Value::Null) => "",
        Some(Value::String(s)) => s,
        Some(_) => return Err("HostConfig.NetworkMode must be a string".into()),
    })?;
    if network_disabled {
        network = NetworkMode::None;
    }
    let config: Map<String, Value> = CONFIG_FIELDS.iter().filter_map(|k| body.get(*k).map(|v| (k.to_string(), v.clone()))).collect();
    Ok(CreateSpec {
        image,
        cmd: strings(body, "Cmd")?,
        entrypoint: strings(body, "Entrypoint")?,
        env: strings(body, "Env")?.unwrap_or_default(),
        working_dir: text(body, "WorkingDir")?,
        tty: flag(body, "Tty")?,
        open_stdin: flag(body, "OpenStdin")?,
        console_size: console_size(&hc)?,
        binds,
        cpus,
        memory: number(&hc, "Memory")?.filter(|&m| m > 0),
        auto_remove: flag(&hc, "AutoRemove")?,
        labels,
        network,
        ports: port_bindings(body, &hc)?,
        exposed: exposed_ports(body)?,
        options,
        config: Value::Object(config),
        host_config: hc,
    })
}

/// `POST /containers/create?name=NAME`.
pub async fn create(rt: &Arc<Runtime>, t: &Target, req: Request<Incoming>) -> Response<ApiBody> {
    let body = match read_json(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let spec = match create_spec(&body) {
        Ok(s) => s,
        Err(m) => return error(400, &m),
    };
    let image = spec.image.clone();
    match rt.create(t.get("name"), spec) {
        Ok(c) => json(StatusCode::CREATED, &json!({"Id": c.id, "Warnings": []})),
        // The CLI pulls on a 404 at create and tries again.
        Err(RuntimeError::NotFound(_)) => error(404, &format!("No such image: {image}")),
        Err(e) => error(e.http_status(), &e.to_string()),
    }
}

/// The fields of moby's `HostConfig` (API 1.47), for tests that go through every one.
#[cfg(test)]
pub(crate) mod tests_support {
    /// Every field name.
    pub(crate) const HOST_CONFIG_FIELDS: &[&str] = &[
        "Annotations",
        "AutoRemove",
        "Binds",
        "BlkioDeviceReadBps",
        "BlkioDeviceReadIOps",
        "BlkioDeviceWriteBps",
        "BlkioDeviceWriteIOps",
        "BlkioWeight",
        "BlkioWeightDevice",
        "CapAdd",
        "CapDrop",
        "Cgroup",
        "CgroupParent",
        "CgroupnsMode",
        "ConsoleSize",
        "ContainerIDFile",
        "CpuCount",
        "CpuPercent",
        "CpuPeriod",
        "CpuQuota",
        "CpuRealtimePeriod",
        "CpuRealtimeRuntime",
        "CpuShares",
        "CpusetCpus",
        "CpusetMems",
        "DeviceCgroupRules",
        "DeviceRequests",
        "Devices",
        "Dns",
        "DnsOptions",
        "DnsSearch",
        "ExtraHosts",
        "GroupAdd",
        "IOMaximumBandwidth",
        "IOMaximumIOps",
        "Init",
        "IpcMode",
        "Isolation",
        "Links",
        "LogConfig",
        "MaskedPaths",
        "Memory",
        "MemoryReservation",
        "MemorySwap",
        "MemorySwappiness",
        "Mounts",
        "NanoCpus",
        "NetworkMode",
        "OomKillDisable",
        "OomScoreAdj",
        "PidMode",
        "PidsLimit",
        "PortBindings",
        "Privileged",
        "PublishAllPorts",
        "ReadonlyPaths",
        "ReadonlyRootfs",
        "RestartPolicy",
        "Runtime",
        "SecurityOpt",
        "ShmSize",
        "StorageOpt",
        "Sysctls",
        "Tmpfs",
        "UTSMode",
        "Ulimits",
        "UsernsMode",
        "VolumeDriver",
        "VolumesFrom",
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_requests_are_type_checked() {
        let ok = create_spec(&json!({"Image": "busybox", "Cmd": ["sh", "-c", "exit 3"], "HostConfig": {"NanoCpus": 1500000000, "Memory": 1048576, "AutoRemove": true, "Binds": ["/d:/in:ro"]}})).unwrap();
        assert_eq!(ok.cmd.unwrap(), ["sh", "-c", "exit 3"]);
        assert_eq!(ok.cpus, Some(1.5));
        assert!(ok.auto_remove);
        assert!(create_spec(&json!({"Cmd": ["x"]})).unwrap_err().contains("Image"));
        assert!(create_spec(&json!({"Image": "b", "Cmd": 3})).unwrap_err().contains("Cmd"));
        assert!(create_spec(&json!({"Image": "b", "HostConfig": {"Memory": "lots"}})).unwrap_err().contains("Memory"));
        assert!(create_spec(&json!([1, 2])).is_err());
        let tty = create_spec(&json!({"Image": "b", "Tty": true, "OpenStdin": true, "HostConfig": {"ConsoleSize": [40, 120]}})).unwrap();
        assert!(tty.tty && tty.open_stdin);
        assert_eq!(tty.console_size, Some((40, 120)));
        assert_eq!(create_spec(&json!({"Image": "b", "HostConfig": {"ConsoleSize": [0, 0]}})).unwrap().console_size, None);
        let net = create_spec(&json!({"Image": "b", "ExposedPorts": {"80/tcp": {}}, "HostConfig": {"NetworkMode": "default", "PortBindings": {"80/tcp": [{"HostIp": "127.0.0.1", "HostPort": "18080"}]}}})).unwrap();
        assert_eq!((net.network, net.ports.len(), net.exposed.clone()), (NetworkMode::Default, 1, vec![80]));
        assert_eq!(create_spec(&json!({"Image": "b", "HostConfig": {"NetworkMode": "host"}})).unwrap().network, NetworkMode::Host);
        assert!(create_spec(&json!({"Image": "b", "HostConfig": {"NetworkMode": "mynet"}})).unwrap_err().contains("not supported"));
        assert!(create_spec(&json!({"Image": "b", "HostConfig": {"PortBindings": {"53/udp": [{"HostPort": "53"}]}}})).unwrap_err().contains("TCP only"));
        assert!(create_spec(&json!({"Image": "b", "ExposedPorts": {"x/tcp": {}}})).unwrap_err().contains("invalid port"));
        for bad in [json!([1]), json!([1, -1]), json!([70000, 1]), json!("40x120"), json!([1.5, 2])] {
            let e = create_spec(&json!({"Image": "b", "HostConfig": {"ConsoleSize": bad}})).unwrap_err();
            assert!(e.contains("ConsoleSize"), "{e}");
        }
    }

    #[test]
    fn defaults_pass_and_every_refused_option_is_named() {
        // What the docker CLI and the SDK send for options left alone.
        let defaults = json!({"Image": "b", "HostConfig": {"CpuShares": 0, "Dns": [], "Privileged": false, "LogConfig": {"Type": "", "Config": {}},
            "RestartPolicy": {"Name": "no", "MaximumRetryCount": 0}, "CgroupnsMode": "", "IpcMode": "", "MemorySwappiness": -1, "Isolation": "",
            "Mounts": null, "Init": null, "OomKillDisable": false, "PidsLimit": 0}});
        create_spec(&defaults).unwrap();
        for (field, _) in REFUSED_HOST {
            let e = create_spec(&json!({"Image": "b", "HostConfig": {*field: [1]}})).unwrap_err();
            assert!(e.contains(field), "{field}: {e}");
        }
        for (field, v) in [
            ("PidMode", json!("host")),
            ("CapAdd", json!(["SYS_ADMIN"])),
            ("SecurityOpt", json!(["seccomp=unconfined"])),
            ("LogConfig", json!({"Type": "syslog"})),
        ] {
            let e = create_spec(&json!({"Image": "b", "HostConfig": {field: v}})).unwrap_err();
            assert!(e.contains(field), "{field}: {e}");
        }
    }

    #[test]
    fn every_host_config_field_is_honoured_or_refused_by_name() {
        // ContainerIDFile is the client's own (the CLI writes the file): the server only keeps it.
        for f in tests_support::HOST_CONFIG_FIELDS.iter().filter(|f| **f != "ContainerIDFile") {
            let handled = REFUSED_HOST.iter().any(|(r, _)| r == f) || HONOURED_HOST.contains(f);
            assert!(handled, "HostConfig.{f} is neither honoured nor refused");
        }
    }

    #[test]
    fn honoured_options_are_parsed() {
        let s = create_spec(&json!({"Image": "b", "User": "nobody", "Hostname": "box", "StopSignal": "SIGINT", "StopTimeout": 3,
            "HostConfig": {"CpuShares": 512, "CpusetCpus": "0", "Memory": 8388608, "MemorySwap": 16777216, "Tmpfs": {"/t": "size=1m"},
                           "RestartPolicy": {"Name": "on-failure", "MaximumRetryCount": 2}, "GroupAdd": ["wheel"], "CapDrop": ["NET_RAW"],
                           "Ulimits": [{"Name": "nofile", "Soft": 100, "Hard": 200}],
                           "Mounts": [{"Type": "volume", "Source": "vol", "Target": "/v"}, {"Type": "tmpfs", "Target": "/m", "TmpfsOptions": {"SizeBytes": 1024}}]}}))
        .unwrap();
        let o = &s.options;
        assert_eq!(
            (o.user.as_deref(), o.hostname.as_deref(), o.stop_signal.as_deref(), o.stop_timeout),
            (Some("nobody"), Some("box"), Some("SIGINT"), Some(3))
        );
        assert_eq!((o.cpu_shares, o.memory_swap, o.restart.max_retries), (Some(512), Some(16777216), 2));
        assert_eq!(o.cap_drop, ["CAP_NET_RAW"]);
        assert_eq!(s.binds, ["vol:/v"]);
        assert_eq!(o.tmpfs.get("/m").map(String::as_str), Some("size=1024"));
        assert_eq!(s.host_config["CpuShares"], 512);
        for bad in [
            json!({"HostConfig": {"MemorySwap": 1, "Memory": 2}}),
            json!({"HostConfig": {"RestartPolicy": {"Name": "always"}, "AutoRemove": true}}),
            json!({"HostConfig": {"RestartPolicy": {"Name": "sometimes"}}}),
            json!({"HostConfig": {"Tmpfs": {"rel": ""}}}),
            json!({"HostConfig": {"CpusetCpus": "a-b"}}),
            json!({"HostConfig": {"Ulimits": [{"Name": "nofile", "Soft": 3, "Hard": 2}]}}),
            json!({"Volumes": {"/anon": {}}}),
            json!({"Healthcheck": {"Test": ["CMD", "true"]}}),
        ] {
            let mut b = bad.clone();
            b["Image"] = json!("b");
            assert!(create_spec(&b).is_err(), "{bad}");
        }
    }

    proptest::proptest! {
        #[test]
        fn random_create_bodies_never_panic(s in ".{0,200}") {
            if let Ok(v) = serde_json::from_str::<Value>(&s) {
                let _ = create_spec(&v);
            }
        }

        #[test]
        fn random_host_configs_never_panic(k in "[A-Za-z]{1,20}", v in "[-0-9a-z\\[\\]{}\":,]{0,40}") {
            if let Ok(v) = serde_json::from_str::<Value>(&v) {
                let _ = create_spec(&json!({"Image": "b", "HostConfig": {k: v}}));
            }
        }
    }
}
