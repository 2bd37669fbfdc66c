// SPDX-License-Identifier: Apache-2.0
//! The create options a container honours beyond its command, binds, ports and basic
//! limits: its user and groups, host name, stop signal and timeout, restart policy, the
//! finer cgroup limits, tmpfs mounts, capabilities, rlimits and a read-only root. The API
//! checks them (`api::create`); the runc configuration applies them
//! ([`Options::apply`]); the runtime's stop and supervisor read them.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;

use super::devices::DeviceRule;

/// `HostConfig.RestartPolicy`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartPolicy {
    /// `""`/`no`, `always`, `unless-stopped` or `on-failure`.
    pub name: String,
    /// Most restarts with `on-failure` (0: no bound).
    pub max_retries: i64,
}

impl RestartPolicy {
    /// Whether a run that ended with `code` is restarted after `restarts` restarts, the
    /// container not having been stopped by a client.
    pub fn restarts_after(&self, code: i32, restarts: u32) -> bool {
        match self.name.as_str() {
            "always" | "unless-stopped" => true,
            "on-failure" => code != 0 && (self.max_retries <= 0 || i64::from(restarts) < self.max_retries),
            _ => false,
        }
    }
}

/// One `HostConfig.Ulimits` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ulimit {
    /// `nofile`, `nproc`, ... (without `RLIMIT_`).
    pub name: String,
    /// Soft limit.
    pub soft: u64,
    /// Hard limit.
    pub hard: u64,
}

/// The rlimits `Ulimits` may name.
pub const ULIMITS: &[&str] =
    &["core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile", "nproc", "rss", "rtprio", "rttime", "sigpending", "stack", "as"];

/// Options of `docker create` honoured by the runtime (absent in records of older
/// targets: all default).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Options {
    /// `Config.User`: `user[:group]`, names or numbers (the image's when not given).
    pub user: Option<String>,
    /// `Config.Hostname` (the short id when not given).
    pub hostname: Option<String>,
    /// `Config.StopSignal` (TERM when not given).
    pub stop_signal: Option<String>,
    /// `Config.StopTimeout`, seconds (10 when not given).
    pub stop_timeout: Option<i64>,
    /// `HostConfig.RestartPolicy`.
    pub restart: RestartPolicy,
    /// `HostConfig.CpuShares` (relative weight).
    pub cpu_shares: Option<u64>,
    /// `HostConfig.CpusetCpus`, e.g. `0-1`.
    pub cpuset_cpus: Option<String>,
    /// `HostConfig.CpusetMems`.
    pub cpuset_mems: Option<String>,
    /// `HostConfig.MemorySwap`: memory plus swap, bytes; -1 unlimited.
    pub memory_swap: Option<i64>,
    /// `HostConfig.MemoryReservation`, bytes (soft limit).
    pub memory_reservation: Option<i64>,
    /// `HostConfig.MemorySwappiness`, 0 to 100.
    pub memory_swappiness: Option<u64>,
    /// `HostConfig.OomKillDisable`.
    pub oom_kill_disable: bool,
    /// `HostConfig.PidsLimit` (the target's own limit when not given).
    pub pids_limit: Option<i64>,
    /// `HostConfig.OomScoreAdj`.
    pub oom_score_adj: Option<i32>,
    /// `HostConfig.ShmSize`, bytes (64 MiB when not given).
    pub shm_size: Option<i64>,
    /// `HostConfig.Tmpfs`: destination → mount options.
    pub tmpfs: BTreeMap<String, String>,
    /// `HostConfig.ReadonlyRootfs`.
    pub readonly_rootfs: bool,
    /// `HostConfig.CapAdd`, `CAP_` names (from Docker's default set only).
    pub cap_add: Vec<String>,
    /// `HostConfig.CapDrop`, `CAP_` names (`ALL` drops every one).
    pub cap_drop: Vec<String>,
    /// `HostConfig.GroupAdd`: group names or numbers.
    pub group_add: Vec<String>,
    /// `HostConfig.Ulimits`.
    pub ulimits: Vec<Ulimit>,
    /// `HostConfig.DeviceCgroupRules`, checked (see [`super::devices`]): allow entries
    /// after the target's own device rules.
    pub device_rules: Vec<DeviceRule>,
    /// `HostConfig.UTSMode` `host`: the target's hostname, no UTS namespace of its own.
    pub uts_host: bool,
    /// `HostConfig.Init`: [`INIT_BINARY`] runs as the container's first process, with the
    /// command as its child (signals forwarded, orphans reaped), as Docker's docker-init.
    pub init: bool,
}

/// The init `HostConfig.Init` runs, Debian's tini-static (static, so it runs in any
/// image), bound read-only at [`INIT_PATH`] in the container.
pub const INIT_BINARY: &str = "/usr/bin/tini-static";
/// Where the init is bound, as Docker binds its docker-init.
pub const INIT_PATH: &str = "/sbin/docker-init";

/// The user a container's process runs as, resolved against its root file system.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct User {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
    /// Supplementary groups.
    pub additional: Vec<u32>,
}

/// Looks `name` up in a `/etc/passwd` or `/etc/group` style file: the numeric fields of
/// its line (id in field 3, for passwd the group in field 4).
fn lookup(file: &Path, name: &str) -> Option<(u32, Option<u32>)> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 3 && f[0] == name).then(|| (f[2].parse().ok(), f.get(3).and_then(|g| g.parse().ok()))).and_then(|(id, g)| id.map(|id| (id, g)))
    })
}

/// Resolves `user[:group]` and `groups` (names or numbers) against the root file system
/// `rootfs` (its `/etc/passwd` and `/etc/group`), as Docker does when it starts a
/// container. A name the image does not know is an error naming it.
pub fn resolve_user(rootfs: &Path, user: Option<&str>, groups: &[String]) -> Result<User, String> {
    let (passwd, group) = (rootfs.join("etc/passwd"), rootfs.join("etc/group"));
    let mut u = User::default();
    if let Some(spec) = user.filter(|s| !s.is_empty()) {
        let (name, grp) = spec.split_once(':').map_or((spec, None), |(a, b)| (a, Some(b)));
        match name.parse::<u32>() {
            Ok(uid) => {
                u.uid = uid;
                // A number may still have a passwd line that gives its group.
                let line = std::fs::read_to_string(&passwd).ok().and_then(|t| {
                    t.lines().find_map(|l| {
                        let f: Vec<&str> = l.split(':').collect();
                        (f.len() >= 4 && f[2] == name).then(|| f[3].parse::<u32>().ok()).flatten()
                    })
                });
                u.gid = line.unwrap_or(0);
            }
            Err(_) => {
                let (uid, gid) = lookup(&passwd, name).ok_or_else(|| format!("unable to find user {name}: no matching entries in passwd file"))?;
                u.uid = uid;
                u.gid = gid.unwrap_or(0);
            }
        }
        if let Some(g) = grp {
            u.gid = match g.parse::<u32>() {
                Ok(n) => n,
                Err(_) => lookup(&group, g).ok_or_else(|| format!("unable to find group {g}: no matching entries in group file"))?.0,
            };
        }
    }
    for g in groups {
        let id = match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => lookup(&group, g).ok_or_else(|| format!("unable to find group {g}: no matching entries in group file"))?.0,
        };
        u.additional.push(id);
    }
    Ok(u)
}

impl Options {
    /// Applies the options to a runc configuration made by
    /// [`runtime_config`](super::spec::runtime_config), with the process's resolved user.
    pub fn apply(&self, config: &mut Value, user: &User) {
        config["process"]["user"] = json!({"uid": user.uid, "gid": user.gid});
        if !user.additional.is_empty() {
            config["process"]["user"]["additionalGids"] = json!(user.additional);
        }
        if let Some(h) = &self.hostname {
            config["hostname"] = json!(h);
        }
        if self.uts_host {
            // No UTS namespace: the target's hostname, which runc may not set.
            if let Some(ns) = config["linux"]["namespaces"].as_array_mut() {
                ns.retain(|n| n["type"] != "uts");
            }
            if let Some(c) = config.as_object_mut() {
                c.remove("hostname");
            }
        }
        if self.init {
            if let Some(args) = config["process"]["args"].as_array_mut() {
                args.splice(0..0, [json!(INIT_PATH), json!("--")]);
            }
        }
        if let Some(adj) = self.oom_score_adj {
            config["process"]["oomScoreAdj"] = json!(adj);
        }
        if self.readonly_rootfs {
            config["root"]["readonly"] = json!(true);
        }
        let caps = &mut config["process"]["capabilities"];
        let mut set: Vec<String> = caps["bounding"].as_array().map(|a| a.iter().filter_map(|c| c.as_str().map(str::to_string)).collect()).unwrap_or_default();
        if self.cap_drop.iter().any(|c| c == "ALL") {
            set.clear();
        }
        set.retain(|c| !self.cap_drop.contains(c));
        for c in &self.cap_add {
            if !set.contains(c) {
                set.push(c.clone());
            }
        }
        for k in ["bounding", "effective", "permitted"] {
            caps[k] = json!(set);
        }
        if !self.ulimits.is_empty() {
            let mut rl: Vec<Value> = config["process"]["rlimits"].as_array().cloned().unwrap_or_default();
            for u in &self.ulimits {
                let ty = format!("RLIMIT_{}", u.name.to_ascii_uppercase());
                rl.retain(|r| r["type"] != ty.as_str());
                rl.push(json!({"type": ty, "soft": u.soft, "hard": u.hard}));
            }
            config["process"]["rlimits"] = json!(rl);
        }
        let res = &mut config["linux"]["resources"];
        if let Some(devices) = res["devices"].as_array_mut() {
            // After the deny-all and the defaults: runc applies the entries in order.
            devices.extend(self.device_rules.iter().map(DeviceRule::to_oci));
        }
        if let Some(n) = self.pids_limit.filter(|&n| n > 0) {
            res["pids"] = json!({"limit": n});
        }
        let cpu_set = [
            ("shares", self.cpu_shares.map(Value::from)),
            ("cpus", self.cpuset_cpus.clone().map(Value::from)),
            ("mems", self.cpuset_mems.clone().map(Value::from)),
        ];
        for (k, v) in cpu_set {
            if let Some(v) = v {
                if !res["cpu"].is_object() {
                    res["cpu"] = json!({});
                }
                res["cpu"][k] = v;
            }
        }
        let mem_set = [
            ("swap", self.memory_swap.map(Value::from)),
            ("reservation", self.memory_reservation.map(Value::from)),
            ("swappiness", self.memory_swappiness.map(Value::from)),
            ("disableOOMKiller", self.oom_kill_disable.then_some(Value::Bool(true))),
        ];
        for (k, v) in mem_set {
            if let Some(v) = v {
                if !res["memory"].is_object() {
                    res["memory"] = json!({});
                }
                res["memory"][k] = v;
            }
        }
        if let Some(mounts) = config["mounts"].as_array_mut() {
            if let Some(size) = self.shm_size.filter(|&s| s > 0) {
                for m in mounts.iter_mut().filter(|m| m["destination"] == "/dev/shm") {
                    m["options"] = json!(["nosuid", "noexec", "nodev", "mode=1777", format!("size={size}")]);
                }
            }
            for (dst, opts) in &self.tmpfs {
                // Docker's defaults for --tmpfs, then what was asked for.
                let mut o: Vec<String> = vec!["nosuid".into(), "nodev".into(), "noexec".into()];
                o.extend(opts.split(',').filter(|s| !s.is_empty()).map(str::to_string));
                mounts.retain(|m| m["destination"] != dst.as_str());
                mounts.push(json!({"destination": dst, "type": "tmpfs", "source": "tmpfs", "options": o}));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_and_groups_resolve_against_the_image() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("etc")).unwrap();
        std::fs::write(d.path().join("etc/passwd"), "root:x:0:0::/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n").unwrap();
        std::fs::write(d.path().join("etc/group"), "root:x:0:\nwheel:x:10:\nnogroup:x:65534:\n").unwrap();
        let r = |u: Option<&str>, g: &[&str]| resolve_user(d.path(), u, &g.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(r(None, &[]).unwrap(), User::default());
        assert_eq!(r(Some("nobody"), &["wheel", "77"]).unwrap(), User { uid: 65534, gid: 65534, additional: vec![10, 77] });
        assert_eq!(r(Some("1000:wheel"), &[]).unwrap(), User { uid: 1000, gid: 10, additional: vec![] });
        assert_eq!(r(Some("65534"), &[]).unwrap().gid, 65534);
        assert!(r(Some("ghost"), &[]).unwrap_err().contains("ghost"));
        assert!(r(None, &["ghosts"]).unwrap_err().contains("ghosts"));
    }

    #[test]
    fn restart_policies_decide() {
        let p = |n: &str, m| RestartPolicy { name: n.into(), max_retries: m };
        assert!(!p("no", 0).restarts_after(1, 0));
        assert!(p("always", 0).restarts_after(0, 99));
        assert!(p("on-failure", 2).restarts_after(1, 1) && !p("on-failure", 2).restarts_after(1, 2));
        assert!(!p("on-failure", 0).restarts_after(0, 0));
    }

    #[test]
    fn uts_host_init_and_device_rules_reach_the_runc_configuration() {
        let mut cfg = json!({"process": {"args": ["sleep", "9"]}, "hostname": "abc",
                             "linux": {"namespaces": [{"type": "pid"}, {"type": "uts"}], "resources": {"devices": [{"allow": false, "access": "rwm"}]}}});
        let device_rules = vec![DeviceRule::parse("c 42:* rm").unwrap()];
        Options { uts_host: true, init: true, device_rules, ..Default::default() }.apply(&mut cfg, &User::default());
        assert_eq!(cfg["linux"]["namespaces"], json!([{"type": "pid"}]));
        let devices = &cfg["linux"]["resources"]["devices"];
        assert_eq!(devices[devices.as_array().unwrap().len() - 1], json!({"allow": true, "type": "c", "major": 42, "access": "rm"}));
        assert!(cfg.get("hostname").is_none());
        assert_eq!(cfg["process"]["args"], json!([INIT_PATH, "--", "sleep", "9"]));
    }

    #[test]
    fn options_reach_the_runc_configuration() {
        let mut cfg = json!({"process": {"capabilities": {"bounding": ["CAP_CHOWN", "CAP_KILL"]}, "rlimits": [{"type": "RLIMIT_NOFILE", "soft": 1024, "hard": 1024}]},
                             "root": {}, "linux": {"resources": {"pids": {"limit": 1024}}}, "mounts": [{"destination": "/dev/shm", "options": []}]});
        let o = Options {
            hostname: Some("box".into()),
            cpu_shares: Some(512),
            cpuset_cpus: Some("0".into()),
            memory_swap: Some(-1),
            pids_limit: Some(64),
            shm_size: Some(1 << 20),
            tmpfs: [("/scratch".to_string(), "size=1m".to_string())].into(),
            readonly_rootfs: true,
            cap_drop: vec!["CAP_KILL".into()],
            ulimits: vec![Ulimit { name: "nofile".into(), soft: 10, hard: 20 }],
            ..Default::default()
        };
        o.apply(&mut cfg, &User { uid: 5, gid: 6, additional: vec![7] });
        assert_eq!(cfg["process"]["user"], json!({"uid": 5, "gid": 6, "additionalGids": [7]}));
        assert_eq!(cfg["hostname"], "box");
        assert_eq!(cfg["linux"]["resources"]["cpu"], json!({"shares": 512, "cpus": "0"}));
        assert_eq!(cfg["linux"]["resources"]["memory"]["swap"], -1);
        assert_eq!(cfg["linux"]["resources"]["pids"]["limit"], 64);
        assert_eq!(cfg["root"]["readonly"], true);
        assert_eq!(cfg["process"]["capabilities"]["effective"], json!(["CAP_CHOWN"]));
        assert_eq!(cfg["process"]["rlimits"], json!([{"type": "RLIMIT_NOFILE", "soft": 10, "hard": 20}]));
        let m = cfg["mounts"].as_array().unwrap();
        assert!(m.iter().any(|m| m["destination"] == "/scratch" && m["type"] == "tmpfs"));
        assert!(m[0]["options"].as_array().unwrap().iter().any(|o| o == "size=1048576"));
    }
}
