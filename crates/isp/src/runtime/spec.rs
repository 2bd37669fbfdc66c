// SPDX-License-Identifier: Apache-2.0
//! The OCI runtime configuration (`config.json`) of a container's runc bundle.
//!
//! runc's own defaults (namespaces, masked and read-only kernel paths, the standard
//! devices) plus what a storage target must add: no new privileges, Docker's default
//! capability set, a seccomp profile that refuses the system calls a container has no
//! business making on a drive (mounting, loading modules, tracing, keyrings, clocks), no
//! block devices, cgroup limits for CPU, memory and processes, and the target's sharable
//! namespace at `/data`, read-only.

use serde_json::{json, Value};
use std::path::Path;

/// What the configuration is made from.
pub struct SpecInput<'a> {
    /// The overlayfs mount that becomes the root file system.
    pub rootfs: &'a Path,
    /// argv of the container's process.
    pub args: &'a [String],
    /// Environment, `NAME=value`.
    pub env: &'a [String],
    /// Working directory inside the container (absolute).
    pub cwd: &'a str,
    /// Host name (the short id, as Docker does).
    pub hostname: &'a str,
    /// Bind mounts: (source on the target, destination in the container, read-only).
    pub binds: &'a [(String, String, bool)],
    /// CPU limit in CPUs (e.g. 1.5); `None`: unlimited.
    pub cpus: Option<f64>,
    /// Memory limit in bytes; `None`: unlimited.
    pub memory: Option<i64>,
    /// Most processes (the pids cgroup).
    pub pids: i64,
    /// The cgroup path (cgroupfs driver), e.g. `/insitu/<id>`.
    pub cgroup: &'a str,
    /// Whether the process gets a terminal on its standard streams (runc then sends the
    /// terminal's master over the console socket it is given).
    pub tty: bool,
    /// The terminal's first size, (rows, columns); `None`: the kernel's 0x0 until resized.
    pub console_size: Option<(u16, u16)>,
    /// The block device behind `/data` (major, minor) and the bytes per second the
    /// container may read from it: the device model's internal read rate, so that a
    /// container reads its data no faster than the modelled drive delivers it.
    pub data_read_bps: Option<(u32, u32, u64)>,
    /// Whether the container shares the target daemon's network namespace
    /// (`--network host`) instead of having one of its own with loopback only.
    pub host_network: bool,
    /// A network namespace made for the container to join (on a user-defined network, or
    /// one that may be connected to one); `None`: runc makes one with loopback only.
    pub netns: Option<&'a Path>,
}

/// Docker's default capabilities: enough for ordinary programs, nothing that administers
/// the machine (no CAP_SYS_ADMIN, CAP_SYS_MODULE, CAP_SYS_RAWIO, CAP_NET_ADMIN, ...).
const CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// System calls refused with EPERM. Most already need a capability the container lacks;
/// refusing them here too keeps a kernel bug in one of them from becoming an escape.
const DENIED_SYSCALLS: &[&str] = &[
    "acct",
    "add_key",
    "bpf",
    "clock_adjtime",
    "clock_settime",
    "create_module",
    "delete_module",
    "finit_module",
    "fsconfig",
    "fsmount",
    "fsopen",
    "fspick",
    "get_kernel_syms",
    "init_module",
    "ioperm",
    "iopl",
    "kcmp",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "lookup_dcookie",
    "mount",
    "mount_setattr",
    "move_mount",
    "name_to_handle_at",
    "nfsservctl",
    "open_by_handle_at",
    "open_tree",
    "perf_event_open",
    "pivot_root",
    "process_vm_readv",
    "process_vm_writev",
    "ptrace",
    "query_module",
    "quotactl",
    "reboot",
    "request_key",
    "setns",
    "settimeofday",
    "stime",
    "swapoff",
    "swapon",
    "syslog",
    "umount",
    "umount2",
    "unshare",
    "uselib",
    "userfaultfd",
    "ustat",
    "vhangup",
    "vm86",
    "vm86old",
];

/// Builds `config.json` for runc.
pub fn runtime_config(s: &SpecInput) -> Value {
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc"}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}),
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
        json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]}),
    ];
    for (src, dst, ro) in s.binds {
        // rslave: a refreshed view of the sharable namespace, mounted over the source on
        // the target, reaches running containers too.
        let mut options = vec!["rbind", "rslave", "nosuid", "nodev"];
        if *ro {
            options.push("ro");
        }
        mounts.push(json!({"destination": dst, "type": "bind", "source": src, "options": options}));
    }
    let mut resources = json!({
        // Deny every device, then allow what runc creates by default (null, zero, full,
        // random, urandom, tty, ptmx/pts): no block device is ever reachable.
        "devices": [
            {"allow": false, "access": "rwm"},
            {"allow": true, "type": "c", "major": 1, "minor": 3, "access": "rwm"},
            {"allow": true, "type": "c", "major": 1, "minor": 5, "access": "rwm"},
            {"allow": true, "type": "c", "major": 1, "minor": 7, "access": "rwm"},
            {"allow": true, "type": "c", "major": 1, "minor": 8, "access": "rwm"},
            {"allow": true, "type": "c", "major": 1, "minor": 9, "access": "rwm"},
            {"allow": true, "type": "c", "major": 5, "minor": 0, "access": "rwm"},
            {"allow": true, "type": "c", "major": 5, "minor": 2, "access": "rwm"},
            {"allow": true, "type": "c", "major": 136, "access": "rwm"},
        ],
        "pids": {"limit": s.pids},
    });
    if let Some(cpus) = s.cpus {
        let period: u64 = 100_000;
        resources["cpu"] = json!({"quota": (cpus * period as f64).round() as i64, "period": period});
    }
    if let Some(mem) = s.memory {
        resources["memory"] = json!({"limit": mem, "swap": mem});
    }
    if let Some((major, minor, rate)) = s.data_read_bps {
        resources["blockIO"] = json!({"throttleReadBpsDevice": [{"major": major, "minor": minor, "rate": rate}]});
    }
    let caps: Vec<&str> = CAPS.to_vec();
    let mut namespaces = vec![
        json!({"type": "pid"}),
        json!({"type": "network"}),
        json!({"type": "ipc"}),
        json!({"type": "uts"}),
        json!({"type": "mount"}),
        json!({"type": "cgroup"}),
    ];
    if s.host_network {
        namespaces.retain(|n| n["type"] != "network");
    } else if let Some(p) = s.netns {
        namespaces[1] = json!({"type": "network", "path": p});
    }
    let mut config = json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": s.tty,
            "user": {"uid": 0, "gid": 0},
            "args": s.args,
            "env": s.env,
            "cwd": s.cwd,
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": true,
        },
        "root": {"path": s.rootfs, "readonly": false},
        "hostname": s.hostname,
        "mounts": mounts,
        "linux": {
            "cgroupsPath": s.cgroup,
            "resources": resources,
            "namespaces": namespaces,
            "rootfsPropagation": "rslave",
            "seccomp": {
                "defaultAction": "SCMP_ACT_ALLOW",
                "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32", "SCMP_ARCH_AARCH64"],
                "syscalls": [{"names": DENIED_SYSCALLS, "action": "SCMP_ACT_ERRNO", "errnoRet": 1}],
            },
            "maskedPaths": ["/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
                            "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi", "/sys/devices/virtual/powercap"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
        },
    });
    if let Some((rows, cols)) = s.console_size.filter(|&(r, c)| s.tty && r > 0 && c > 0) {
        // runc sizes the terminal before the process starts, so its first output fits.
        config["process"]["consoleSize"] = json!({"height": rows, "width": cols});
    }
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input<'a>(binds: &'a [(String, String, bool)]) -> SpecInput<'a> {
        SpecInput {
            rootfs: Path::new("/x/rootfs"),
            args: &[],
            env: &[],
            cwd: "/",
            hostname: "h",
            binds,
            cpus: Some(1.5),
            memory: Some(64 << 20),
            pids: 256,
            cgroup: "/insitu/c",
            tty: false,
            console_size: None,
            data_read_bps: None,
            host_network: false,
            netns: None,
        }
    }

    #[test]
    fn limits_and_hardening_are_set() {
        let binds = [("/v/data".to_string(), "/data".to_string(), true)];
        let c = runtime_config(&input(&binds));
        assert_eq!(c["linux"]["resources"]["cpu"]["quota"], 150_000);
        assert_eq!(c["linux"]["resources"]["memory"]["limit"], 64 << 20);
        assert_eq!(c["linux"]["resources"]["pids"]["limit"], 256);
        assert!(c["linux"]["resources"].get("blockIO").is_none(), "no model, no throttle");
        let paced = runtime_config(&SpecInput { data_read_bps: Some((7, 3, 500_000_000)), ..input(&binds) });
        let rule = &paced["linux"]["resources"]["blockIO"]["throttleReadBpsDevice"][0];
        assert_eq!((rule["major"].as_u64(), rule["minor"].as_u64(), rule["rate"].as_u64()), (Some(7), Some(3), Some(500_000_000)));
        assert_eq!(c["process"]["noNewPrivileges"], true);
        let caps = c["process"]["capabilities"]["bounding"].as_array().unwrap();
        assert!(!caps.iter().any(|x| x == "CAP_SYS_ADMIN"));
        let denied = c["linux"]["seccomp"]["syscalls"][0]["names"].as_array().unwrap();
        assert!(denied.iter().any(|x| x == "mount"));
        let data = c["mounts"].as_array().unwrap().iter().find(|m| m["destination"] == "/data").unwrap();
        assert!(data["options"].as_array().unwrap().iter().any(|o| o == "ro"));
        // The first device rule denies everything; no block ("b") device is allowed after it.
        let devs = c["linux"]["resources"]["devices"].as_array().unwrap();
        assert_eq!(devs[0]["allow"], false);
        assert!(devs.iter().skip(1).all(|d| d["type"] == "c"));
        assert_eq!(c["process"]["terminal"], false);
        let own_net = |c: &Value| c["linux"]["namespaces"].as_array().unwrap().iter().any(|n| n["type"] == "network");
        assert!(own_net(&c), "a network namespace of its own by default");
        assert!(!own_net(&runtime_config(&SpecInput { host_network: true, ..input(&binds) })), "--network host shares the target's");
    }

    #[test]
    fn a_writable_bind_such_as_kv_has_no_ro_but_keeps_nosuid_nodev() {
        let binds = [("/run/insitu/kv-x".to_string(), "/kv".to_string(), false)];
        let c = runtime_config(&input(&binds));
        let kv = c["mounts"].as_array().unwrap().iter().find(|m| m["destination"] == "/kv").unwrap();
        let opts: Vec<&str> = kv["options"].as_array().unwrap().iter().filter_map(|o| o.as_str()).collect();
        assert_eq!((kv["source"].as_str(), kv["type"].as_str()), (Some("/run/insitu/kv-x"), Some("bind")));
        assert!(!opts.contains(&"ro") && opts.contains(&"nosuid") && opts.contains(&"nodev"), "{opts:?}");
    }

    #[test]
    fn a_terminal_is_asked_of_runc_with_its_first_size() {
        let c = runtime_config(&SpecInput { tty: true, console_size: Some((40, 120)), ..input(&[]) });
        assert_eq!(c["process"]["terminal"], true);
        assert_eq!((c["process"]["consoleSize"]["height"].as_u64(), c["process"]["consoleSize"]["width"].as_u64()), (Some(40), Some(120)));
        // The character devices of terminals stay allowed (ptmx 5:2, pts 136:*).
        let devs = c["linux"]["resources"]["devices"].as_array().unwrap();
        assert!(devs.iter().any(|d| d["major"] == 136 && d["allow"] == true));
        let no_size = runtime_config(&SpecInput { tty: true, console_size: Some((0, 0)), ..input(&[]) });
        assert!(no_size["process"].get("consoleSize").is_none());
        let no_tty = runtime_config(&SpecInput { console_size: Some((40, 120)), ..input(&[]) });
        assert!(no_tty["process"].get("consoleSize").is_none());
    }
}
