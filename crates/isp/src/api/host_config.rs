// SPDX-License-Identifier: Apache-2.0
//! The fields of a create request's `HostConfig` (and `Config`) beyond the command:
//! which are honoured and how they are read into [`Options`], which are refused and why.
//! [`super::create`] puts them together.

use serde_json::Value;
use std::collections::BTreeMap;

use crate::runtime::options::{Options, RestartPolicy, Ulimit, ULIMITS};
use crate::runtime::parse_bind;

/// Docker's default capabilities (what `CapAdd` may name, `CapDrop` take away).
pub(crate) const DEFAULT_CAPS: &[&str] = &[
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

/// Why `Dns`, `DnsOptions` and `DnsSearch` are refused.
const DNS_WHY: &str = "a container on the default network has loopback only, and one on a user-defined network asks that network's DNS server, \
                       which forwards to the target's resolvers: no other is configured";

/// `HostConfig` fields refused unless left at their default, and why.
pub(crate) const REFUSED_HOST: &[(&str, &str)] = &[
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
    ("DeviceRequests", "the target has no devices to hand out"),
    ("Dns", DNS_WHY),
    ("DnsOptions", DNS_WHY),
    ("DnsSearch", DNS_WHY),
    ("ExtraHosts", "containers have loopback only: there are no other hosts"),
    ("MaskedPaths", "the masked paths are the target's, fixed"),
    ("ReadonlyPaths", "the read-only paths are the target's, fixed"),
    ("Privileged", "a privileged container would own the drive"),
    ("PublishAllPorts", "publish ports one by one with PortBindings"),
    ("StorageOpt", "the overlay root has no per-container options"),
    ("Sysctls", "the kernel's settings are the target's"),
    ("UsernsMode", "user namespaces are not offered"),
];

/// `HostConfig` fields honoured (each parsed by [`create_spec`] and applied by the
/// runtime, or refused when asked for what cannot be done, as `PidMode: host`).
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) const HONOURED_HOST: &[&str] = &[
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
    "DeviceCgroupRules",
    "GroupAdd",
    "Init",
    "IpcMode",
    "Isolation",
    "Links",
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
    "VolumesFrom",
];

/// `Config` fields refused unless left at their default, and why.
pub(crate) const REFUSED_CONFIG: &[(&str, &str)] =
    &[("Domainname", "containers have loopback only: a domain name would name nothing"), ("OnBuild", "a build option")];

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

pub(crate) fn strings(v: &Value, field: &str) -> Result<Option<Vec<String>>, String> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(vec![s.clone()])),
        Some(Value::Array(a)) => {
            a.iter().map(|x| x.as_str().map(str::to_string).ok_or_else(|| format!("{field} must be a list of strings"))).collect::<Result<_, _>>().map(Some)
        }
        Some(_) => Err(format!("{field} must be a list of strings")),
    }
}

pub(crate) fn number(v: &Value, field: &str) -> Result<Option<i64>, String> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x.as_i64().map(Some).ok_or_else(|| format!("{field} must be an integer")),
    }
}

pub(crate) fn text(v: &Value, field: &str) -> Result<Option<String>, String> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone()).filter(|s| !s.is_empty())),
        Some(_) => Err(format!("{field} must be a string")),
    }
}

pub(crate) fn flag(v: &Value, field: &str) -> Result<bool, String> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(format!("{field} must be true or false")),
    }
}

/// `HostConfig.ConsoleSize`: `[rows, columns]`; absent, null or `[0, 0]` is no size.
pub(crate) fn console_size(hc: &Value) -> Result<Option<(u16, u16)>, String> {
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
pub(crate) fn own_namespace(hc: &Value, field: &str, allowed: &[&str]) -> Result<(), String> {
    match text(hc, field)? {
        None => Ok(()),
        Some(m) if allowed.contains(&m.as_str()) => Ok(()),
        Some(m) => Err(format!(
            "HostConfig.{field} {m:?} is not supported on this target: a container keeps namespaces of its own (use {})",
            allowed.iter().map(|a| format!("{a:?}")).collect::<Vec<_>>().join(" or ")
        )),
    }
}

pub(crate) fn cap_name(c: &str) -> String {
    let c = c.to_ascii_uppercase();
    c.strip_prefix("CAP_").map(str::to_string).unwrap_or(c)
}

/// `CpusetCpus`/`CpusetMems`: a list of numbers and ranges (`0-2,4`).
pub(crate) fn cpu_list(hc: &Value, field: &str) -> Result<Option<String>, String> {
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
pub(crate) fn options(body: &Value, hc: &Value) -> Result<Options, String> {
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
        device_rules: match strings(hc, "DeviceCgroupRules")? {
            Some(rules) => crate::runtime::devices::parse_rules(&rules, &crate::runtime::devices::storage_char_majors())?,
            None => Vec::new(),
        },
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
            const DOCKERS: &[&str] = &["syslog", "journald", "gelf", "fluentd", "awslogs", "splunk", "etwlogs", "gcplogs", "logentries"];
            if !matches!(ty, "" | "json-file" | "local" | "none") {
                if !DOCKERS.contains(&ty) {
                    // Docker's own words for a driver it does not know either.
                    return Err(format!("logger: no log driver named '{ty}' is registered"));
                }
                return Err(format!(
                    "HostConfig.LogConfig.Type {ty:?} is not supported on this target: use json-file, local or none (the target keeps each container's log itself)"
                ));
            }
            match l.get("Config") {
                None | Some(Value::Null) => {}
                Some(Value::Object(c)) if ty == "none" && !c.is_empty() => {
                    return Err("HostConfig.LogConfig.Config: the none driver takes no options".into());
                }
                Some(Value::Object(c)) => {
                    crate::runtime::log::Rotation::parse(c)?;
                }
                Some(_) => return Err("HostConfig.LogConfig.Config must be an object of strings".into()),
            }
        }
        Some(_) => return Err("HostConfig.LogConfig must be {\"Type\", \"Config\"}".into()),
    }
    if text(hc, "PidMode")?.as_deref() == Some("host") {
        return Err("HostConfig.PidMode \"host\" is not supported on this target: a container runs as root with CAP_KILL, so in the \
                    target's process namespace it could signal the target daemon and every other container on the drive; use \"private\""
            .into());
    }
    own_namespace(hc, "PidMode", &["private"])?;
    own_namespace(hc, "IpcMode", &["private", "shareable"])?;
    own_namespace(hc, "UTSMode", &["private", "host"])?;
    o.uts_host = text(hc, "UTSMode")?.as_deref() == Some("host");
    if o.uts_host && o.hostname.as_deref().is_some_and(|h| !h.is_empty()) {
        return Err("conflicting options: Config.Hostname and HostConfig.UTSMode \"host\" (the container has the target's hostname)".into());
    }
    o.init = match hc.get("Init") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err("HostConfig.Init must be true, false or null".into()),
    };
    own_namespace(hc, "CgroupnsMode", &["private"])?;
    for (field, allowed) in [("Runtime", "runc"), ("Isolation", "default"), ("VolumeDriver", "local")] {
        if let Some(v) = text(hc, field)?.filter(|v| v != allowed) {
            return Err(format!("HostConfig.{field} {v:?} is not supported on this target: only {allowed:?}"));
        }
    }
    Ok(o)
}

pub(crate) fn check_destination(dst: &str, field: &str) -> Result<(), String> {
    if !dst.starts_with('/') || dst.split('/').any(|c| c == "..") || dst == "/" {
        return Err(format!("invalid {field} destination {dst:?}: an absolute path without '..', not /"));
    }
    Ok(())
}

/// `HostConfig.Mounts` as binds (bind and volume mounts) and tmpfs mounts.
pub(crate) fn mounts(hc: &Value, binds: &mut Vec<String>, tmpfs: &mut BTreeMap<String, String>) -> Result<(), String> {
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
