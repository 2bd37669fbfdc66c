// SPDX-License-Identifier: Apache-2.0
//! `HostConfig.DeviceCgroupRules`: extra entries of a container's device cgroup, as
//! `docker run --device-cgroup-rule 'c 42:* rm'` gives them.
//!
//! A rule is `TYPE MAJOR:MINOR ACCESS`, read with moby's own expression
//! (`^([acb]) ([0-9]+|\*):([0-9]+|\*) ([rwm]{1,3})$`), and becomes one allow entry of the
//! runc configuration's `linux.resources.devices`, after the target's deny-all and its
//! defaults (runc writes them to the devices controller on cgroup v1, and builds the eBPF
//! device program from them on cgroup v2). A rule only permits: the container still makes
//! the node itself (`mknod`: runc lets every container make any node, `m` on `*:*`) and
//! the rule decides whether it may read or write it.
//!
//! Where moby honours every rule, a target keeps its storage out of reach: a rule for
//! block devices (`b`, or `a`, which covers them) and one for a character device through
//! which storage is reached (a wildcard major, or a major the kernel lists in
//! `/proc/devices` for one of [`STORAGE_CHAR_DRIVERS`]) is refused, since the namespaces of
//! the target, its private one included, live on those devices.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::sync::LazyLock;

/// moby's expression for a device cgroup rule (`daemon/oci_linux.go`).
static RULE: LazyLock<regex::Regex> = LazyLock::new(|| regex::Regex::new(r"^([acb]) ([0-9]+|\*):([0-9]+|\*) ([rwm]{1,3})$").expect("a valid expression"));

/// Character device drivers (as `/proc/devices` names them) that reach storage: SCSI
/// generic and its block-layer twin, NVMe controllers and their generic namespace nodes
/// (I/O passthrough), SCSI tapes and raw flash.
pub const STORAGE_CHAR_DRIVERS: &[&str] = &["sg", "bsg", "nvme", "nvme-generic", "st", "mtd", "ubi", "raw"];

/// One device cgroup rule, as given and checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceRule {
    /// `c` (character), `b` (block) or `a` (all).
    pub kind: char,
    /// Major number; `None` for `*`.
    pub major: Option<u32>,
    /// Minor number; `None` for `*`.
    pub minor: Option<u32>,
    /// Some of `r` (read), `w` (write), `m` (mknod), each once, in that order.
    pub access: String,
}

impl DeviceRule {
    /// Reads a rule strictly (moby's expression, numbers that fit 32 bits); the error
    /// names the rule and gives the syntax.
    pub fn parse(rule: &str) -> Result<DeviceRule, String> {
        let bad = || {
            format!("invalid HostConfig.DeviceCgroupRules entry {rule:?}: give TYPE MAJOR:MINOR ACCESS, as \"c 42:* rwm\" (TYPE a, b or c; * for any number; ACCESS of r, w and m)")
        };
        let caps = RULE.captures(rule).ok_or_else(bad)?;
        let number = |i: usize| match &caps[i] {
            "*" => Ok(None),
            n => n.parse::<u32>().map(Some).map_err(|_| bad()),
        };
        let (major, minor) = (number(2)?, number(3)?);
        let access: String = "rwm".chars().filter(|c| caps[4].contains(*c)).collect();
        Ok(DeviceRule { kind: caps[1].chars().next().unwrap_or('a'), major, minor, access })
    }

    /// Whether the target lets a container have this rule; `storage` lists the majors of
    /// the character drivers that reach storage here (see [`storage_char_majors`]), with
    /// their names. The error names the rule and says why.
    pub fn check_reach(&self, rule: &str, storage: &[(u32, String)]) -> Result<(), String> {
        let refuse = |why: String| Err(format!("HostConfig.DeviceCgroupRules entry {rule:?} is not supported on this target: {why}"));
        match (self.kind, self.major) {
            ('b' | 'a', _) => refuse(
                "block devices hold the target's namespaces, its private one included; a container reaches the data through /data \
                 (give a rule of type c for a character device)"
                    .into(),
            ),
            (_, None) => refuse(
                "a wildcard major reaches the character devices through which the target's storage is reached (SCSI generic, NVMe); \
                 name the major"
                    .into(),
            ),
            (_, Some(m)) => match storage.iter().find(|(major, _)| *major == m) {
                Some((_, name)) => refuse(format!("major {m} is the target's {name} driver, which reaches its storage")),
                None => Ok(()),
            },
        }
    }

    /// The allow entry of `linux.resources.devices` (OCI runtime spec) for the rule.
    pub fn to_oci(&self) -> Value {
        let mut d = json!({"allow": true, "type": self.kind.to_string(), "access": self.access});
        if let Some(m) = self.major {
            d["major"] = json!(m);
        }
        if let Some(m) = self.minor {
            d["minor"] = json!(m);
        }
        d
    }
}

/// The majors of [`STORAGE_CHAR_DRIVERS`] in a `/proc/devices` text (its character
/// section), with their driver names.
pub fn storage_char_majors_in(proc_devices: &str) -> Vec<(u32, String)> {
    proc_devices
        .lines()
        .skip_while(|l| !l.starts_with("Character devices:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty() && !l.starts_with("Block devices:"))
        .filter_map(|l| {
            let (major, name) = l.trim().split_once(' ')?;
            let name = name.trim();
            STORAGE_CHAR_DRIVERS.contains(&name).then(|| major.parse().ok().map(|m| (m, name.to_string()))).flatten()
        })
        .collect()
}

/// [`storage_char_majors_in`] this machine's `/proc/devices` (none if it cannot be read).
pub fn storage_char_majors() -> Vec<(u32, String)> {
    std::fs::read_to_string("/proc/devices").map(|t| storage_char_majors_in(&t)).unwrap_or_default()
}

/// Reads `HostConfig.DeviceCgroupRules` (a list of rules) and checks each against the
/// target's storage majors; the first bad one is the error, naming it.
pub fn parse_rules(rules: &[String], storage: &[(u32, String)]) -> Result<Vec<DeviceRule>, String> {
    rules
        .iter()
        .map(|r| {
            let d = DeviceRule::parse(r)?;
            d.check_reach(r, storage)?;
            Ok(d)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_are_read_as_moby_reads_them() {
        let r = DeviceRule::parse("c 1:3 mr").unwrap();
        assert_eq!(r, DeviceRule { kind: 'c', major: Some(1), minor: Some(3), access: "rm".into() });
        assert_eq!(r.to_oci(), json!({"allow": true, "type": "c", "major": 1, "minor": 3, "access": "rm"}));
        let any_minor = DeviceRule::parse("c 42:* rwm").unwrap();
        assert_eq!(any_minor.to_oci(), json!({"allow": true, "type": "c", "major": 42, "access": "rwm"}));
        assert_eq!(DeviceRule::parse("b 7:* rwm").unwrap().kind, 'b');
        assert_eq!(DeviceRule::parse("a *:* rwm").unwrap().major, None);
        for bad in ["", "c 1:3", "c 1:3 rwx", "c 1:3 rwmr", "x 1:3 r", "c -1:3 r", "c 1 r", "c 1:3  r", " c 1:3 r", "c 1:3 r\n", "c 4294967296:1 r", "C 1:3 r"]
        {
            let e = DeviceRule::parse(bad).unwrap_err();
            assert!(e.contains("DeviceCgroupRules") && e.contains(&format!("{bad:?}")), "{bad:?}: {e}");
        }
    }

    #[test]
    fn storage_stays_out_of_reach() {
        let devices = "Character devices:\n  1 mem\n  5 /dev/tty\n 21 sg\n248 bsg\n\nBlock devices:\n  7 loop\n259 blkext\n";
        let storage = storage_char_majors_in(devices);
        assert_eq!(storage, [(21, "sg".to_string()), (248, "bsg".to_string())]);
        assert!(parse_rules(&["c 42:* rm".into(), "c 1:3 r".into()], &storage).is_ok());
        for (rule, why) in [("b 7:* rwm", "block devices"), ("a *:* rwm", "block devices"), ("c *:* m", "wildcard major"), ("c 21:0 r", "sg driver")] {
            let e = parse_rules(&["c 42:1 r".into(), rule.into()], &storage).unwrap_err();
            assert!(e.contains(rule) && e.contains(why), "{rule}: {e}");
        }
    }

    proptest::proptest! {
        /// Every rule of moby's grammar reads back to itself; anything after it spoils it.
        #[test]
        fn the_grammar_is_moby_s(kind in "[abc]", major in proptest::option::of(0u32..5000), minor in proptest::option::of(0u32..1 << 20),
                                 access in "[rwm]{1,3}", junk in "([^rwm].{0,11})?") {
            let num = |n: Option<u32>| n.map_or("*".to_string(), |n| n.to_string());
            let text = format!("{kind} {}:{} {access}", num(major), num(minor));
            let r = DeviceRule::parse(&text).unwrap();
            proptest::prop_assert_eq!((r.kind.to_string(), r.major, r.minor), (kind, major, minor));
            proptest::prop_assert!(r.access.chars().all(|c| access.contains(c)) && access.chars().all(|c| r.access.contains(c)));
            let noisy = format!("{text}{junk}");
            proptest::prop_assert_eq!(DeviceRule::parse(&noisy).is_ok(), junk.is_empty());
        }
    }
}
