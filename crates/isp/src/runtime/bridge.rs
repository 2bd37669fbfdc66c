// SPDX-License-Identifier: Apache-2.0
//! The kernel side of user-defined networks, done with iproute2's `ip`: a *hub* network
//! namespace of the target's own holds one Linux bridge per network; each container on a
//! network runs in a namespace the target made for it (`ip netns add`), joined to the
//! network's bridge by a veth pair. Nothing is added to the target's own namespace, so a
//! container reaches the containers on its networks and nothing else: the hub forwards
//! nothing and has no way out. Deleting a container's namespace deletes its veth ends,
//! and the peers on the bridges with them; deleting the hub deletes the bridges.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;

use super::RuntimeError;

/// Where `ip netns add` keeps its namespaces.
const NETNS_DIR: &str = "/run/netns";

/// Runs `ip ARGS`; its error output names what failed.
fn ip(args: &[&str]) -> Result<(), RuntimeError> {
    let out = Command::new("ip").args(args).output().map_err(|e| RuntimeError::Setup(format!("ip: {e} (is iproute2 installed?)")))?;
    if out.status.success() {
        return Ok(());
    }
    Err(RuntimeError::Setup(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim())))
}

/// The namespaces and links of one target's networks, all named from `prefix` (unique
/// per target, at most 15 bytes so that a bridge's name fits the kernel's 15).
#[derive(Debug, Clone)]
pub struct Plumbing {
    prefix: String,
}

impl Plumbing {
    /// Plumbing whose namespaces are named `PREFIX` (the hub) and `PREFIX-ID` (a
    /// container's).
    pub fn new(prefix: &str) -> Plumbing {
        Plumbing { prefix: prefix.into() }
    }

    fn hub(&self) -> &str {
        &self.prefix
    }

    /// The path of container `cid`'s namespace, as runc joins it.
    pub fn sandbox_path(&self, cid: &str) -> PathBuf {
        PathBuf::from(NETNS_DIR).join(self.sandbox(cid))
    }

    /// The path of the hub namespace.
    pub fn hub_path(&self) -> PathBuf {
        PathBuf::from(NETNS_DIR).join(self.hub())
    }

    fn sandbox(&self, cid: &str) -> String {
        format!("{}-{}", self.prefix, &cid[..12.min(cid.len())])
    }

    /// A network's bridge (in the hub): `br-` and 12 digits of its id.
    fn bridge(nid: &str) -> String {
        format!("br-{}", &nid[..12.min(nid.len())])
    }

    /// The hub's end of container `cid`'s link to network `nid`.
    fn veth(cid: &str, nid: &str) -> String {
        format!("v{}{}", &cid[..7.min(cid.len())], &nid[..7.min(nid.len())])
    }

    fn exists(&self, name: &str) -> bool {
        PathBuf::from(NETNS_DIR).join(name).exists()
    }

    /// Makes the hub and the bridge of network `nid` with the gateway's address on it
    /// (both kept if there already).
    pub fn bridge_up(&self, nid: &str, gateway: Ipv4Addr, prefix_len: u8) -> Result<(), RuntimeError> {
        if !self.exists(self.hub()) {
            ip(&["netns", "add", self.hub()])?;
            ip(&["-n", self.hub(), "link", "set", "lo", "up"])?;
        }
        let br = Self::bridge(nid);
        if ip(&["-n", self.hub(), "link", "show", &br]).is_ok() {
            return Ok(());
        }
        ip(&["-n", self.hub(), "link", "add", &br, "type", "bridge"])?;
        ip(&["-n", self.hub(), "addr", "add", &format!("{gateway}/{prefix_len}"), "dev", &br])?;
        ip(&["-n", self.hub(), "link", "set", &br, "up"])
    }

    /// Removes network `nid`'s bridge (its links go with it).
    pub fn bridge_down(&self, nid: &str) {
        if self.exists(self.hub()) {
            let _ = ip(&["-n", self.hub(), "link", "del", &Self::bridge(nid)]);
        }
    }

    /// Removes the hub (when no network is left).
    pub fn hub_down(&self) {
        if self.exists(self.hub()) {
            let _ = ip(&["netns", "del", self.hub()]);
        }
    }

    /// Makes container `cid`'s namespace (loopback up); an old one of that name is
    /// replaced.
    pub fn sandbox_up(&self, cid: &str) -> Result<PathBuf, RuntimeError> {
        let name = self.sandbox(cid);
        if self.exists(&name) {
            let _ = ip(&["netns", "del", &name]);
        }
        ip(&["netns", "add", &name])?;
        ip(&["-n", &name, "link", "set", "lo", "up"])?;
        Ok(self.sandbox_path(cid))
    }

    /// Deletes container `cid`'s namespace, and with it its links.
    pub fn sandbox_down(&self, cid: &str) {
        let name = self.sandbox(cid);
        if self.exists(&name) {
            let _ = ip(&["netns", "del", &name]);
        }
    }

    /// Whether container `cid` has a namespace of ours.
    pub fn has_sandbox(&self, cid: &str) -> bool {
        self.exists(&self.sandbox(cid))
    }

    /// Joins container `cid`'s namespace to network `nid`'s bridge as interface `ifname`
    /// with `addr/prefix_len` and MAC `mac`; `link_local` are more addresses of it, each
    /// with a /16 (moby's mask for link-local addresses).
    pub fn link(&self, cid: &str, nid: &str, ifname: &str, (addr, prefix_len): (Ipv4Addr, u8), mac: &str, link_local: &[Ipv4Addr]) -> Result<(), RuntimeError> {
        let (sb, veth, br) = (self.sandbox(cid), Self::veth(cid, nid), Self::bridge(nid));
        let _ = ip(&["-n", self.hub(), "link", "del", &veth]);
        ip(&["-n", self.hub(), "link", "add", &veth, "type", "veth", "peer", "name", ifname, "netns", &sb])?;
        let rest = (|| {
            ip(&["-n", self.hub(), "link", "set", &veth, "master", &br, "up"])?;
            ip(&["-n", &sb, "link", "set", ifname, "address", mac])?;
            ip(&["-n", &sb, "addr", "add", &format!("{addr}/{prefix_len}"), "dev", ifname])?;
            for a in link_local {
                ip(&["-n", &sb, "addr", "add", &format!("{a}/16"), "dev", ifname])?;
            }
            ip(&["-n", &sb, "link", "set", ifname, "up"])
        })();
        if rest.is_err() {
            let _ = ip(&["-n", self.hub(), "link", "del", &veth]);
        }
        rest
    }

    /// A wire between containers `parent`'s and `child`'s namespaces: `l-CHILD7` with
    /// `parent_ip/30` in the parent's, `p-PARENT7` with `child_ip/30` in the child's.
    pub fn wire(&self, parent: &str, child: &str, parent_ip: Ipv4Addr, child_ip: Ipv4Addr) -> Result<(), RuntimeError> {
        let (psb, csb) = (self.sandbox(parent), self.sandbox(child));
        let (pend, cend) = (format!("l-{}", &child[..7.min(child.len())]), format!("p-{}", &parent[..7.min(parent.len())]));
        let _ = ip(&["-n", &psb, "link", "del", &pend]);
        ip(&["link", "add", &pend, "netns", &psb, "type", "veth", "peer", "name", &cend, "netns", &csb])?;
        let rest = (|| {
            ip(&["-n", &psb, "addr", "add", &format!("{parent_ip}/30"), "dev", &pend])?;
            ip(&["-n", &csb, "addr", "add", &format!("{child_ip}/30"), "dev", &cend])?;
            ip(&["-n", &psb, "link", "set", &pend, "up"])?;
            ip(&["-n", &csb, "link", "set", &cend, "up"])
        })();
        if rest.is_err() {
            let _ = ip(&["-n", &psb, "link", "del", &pend]);
        }
        rest
    }

    /// Cuts the wire between `parent` and `child` (both ends go).
    pub fn unwire(&self, parent: &str, child: &str) {
        let psb = self.sandbox(parent);
        if self.exists(&psb) {
            let _ = ip(&["-n", &psb, "link", "del", &format!("l-{}", &child[..7.min(child.len())])]);
        }
    }

    /// Cuts container `cid`'s link to network `nid` (both ends go).
    pub fn unlink(&self, cid: &str, nid: &str) {
        if self.exists(self.hub()) {
            let _ = ip(&["-n", self.hub(), "link", "del", &Self::veth(cid, nid)]);
        }
    }

    /// Deletes every namespace of this target's (at shutdown, and at start for those a
    /// crash left).
    pub fn sweep(&self) {
        let Ok(rd) = std::fs::read_dir(NETNS_DIR) else { return };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name == self.prefix || name.strip_prefix(&self.prefix).is_some_and(|r| r.starts_with('-')) {
                let _ = ip(&["netns", "del", &name]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Plumbing;

    #[test]
    fn link_names_fit_the_kernels_fifteen_bytes() {
        let (cid, nid) = ("a".repeat(64), "b".repeat(64));
        assert!(Plumbing::bridge(&nid).len() <= 15 && Plumbing::veth(&cid, &nid).len() <= 15);
        let p = Plumbing::new("isn-0123456789");
        assert!(p.sandbox_path(&cid).ends_with("isn-0123456789-aaaaaaaaaaaa"));
    }
}
