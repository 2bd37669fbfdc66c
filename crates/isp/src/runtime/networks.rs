// SPDX-License-Identifier: Apache-2.0
//! User-defined bridge networks: records in the private namespace (`networks/ID.json`,
//! with the containers on each and how they asked to be on it), and while a container
//! runs, its links to them (see [`bridge`](super::bridge)) and an `/etc/hosts` naming
//! every container it shares a network with, by name, aliases and short id, rewritten
//! whenever one of them comes or goes.
//!
//! Addresses are IPv4, from the network's subnet (given, or the first free of
//! 172.18.0.0/16 ... 172.31.0.0/16); the gateway is the bridge's own address in the hub.
//! A container gets the address it asked for or the lowest free one when it starts or
//! is connected while running, and gives it back when it stops or is disconnected.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::bridge::Plumbing;
use super::{Container, CreateSpec, NetworkMode, RunState, Runtime, RuntimeError};

/// How a container asked to be on a network (`EndpointSettings` of the API).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointConfig {
    /// More names it is found by on this network.
    #[serde(default)]
    pub aliases: Vec<String>,
    /// The address it asked for (`IPAMConfig.IPv4Address`).
    #[serde(default)]
    pub ipv4: Option<Ipv4Addr>,
    /// The MAC address it asked for.
    #[serde(default)]
    pub mac: Option<String>,
    /// More addresses of its interface on the network (`IPAMConfig.LinkLocalIPs`), each
    /// with a /16, as moby gives them.
    #[serde(default)]
    pub link_local_ips: Vec<Ipv4Addr>,
    /// `CONTAINER:ALIAS`: another container on the network, found by this container
    /// under `ALIAS` too.
    #[serde(default)]
    pub links: Vec<String>,
    /// Driver options, kept and shown (the bridge driver takes none per endpoint).
    #[serde(default)]
    pub driver_opts: BTreeMap<String, String>,
}

/// A user-defined network.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Network {
    /// 64 hex digits.
    pub id: String,
    /// Its name (unique).
    pub name: String,
    /// Seconds since the epoch.
    pub created: u64,
    /// Labels given at create.
    pub labels: BTreeMap<String, String>,
    /// `Internal` as asked (every network here is: none reaches outside the target).
    pub internal: bool,
    /// `Attachable` as asked.
    pub attachable: bool,
    /// The subnet's first address and prefix length.
    pub subnet: (Ipv4Addr, u8),
    /// The bridge's address.
    pub gateway: Ipv4Addr,
    /// Where addresses are handed out from (`IPRange`); `None`: the whole subnet.
    pub ip_range: Option<(Ipv4Addr, u8)>,
    /// Addresses kept out of the pool (`AuxiliaryAddresses`), by name.
    #[serde(default)]
    pub aux: BTreeMap<String, Ipv4Addr>,
    /// The containers on it, by id.
    pub members: BTreeMap<String, EndpointConfig>,
}

/// What `POST /networks/create` asks for, checked.
#[derive(Debug, Clone, Default)]
pub struct NetworkRequest {
    /// The name.
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// `Internal`.
    pub internal: bool,
    /// `Attachable`.
    pub attachable: bool,
    /// `IPAM.Config[0].Subnet`.
    pub subnet: Option<(Ipv4Addr, u8)>,
    /// `IPAM.Config[0].Gateway`.
    pub gateway: Option<Ipv4Addr>,
    /// `IPAM.Config[0].IPRange`.
    pub ip_range: Option<(Ipv4Addr, u8)>,
    /// `IPAM.Config[0].AuxiliaryAddresses`.
    pub aux: BTreeMap<String, Ipv4Addr>,
}

/// A container's link to a network while it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// Its address.
    pub ip: Ipv4Addr,
    /// Its MAC address.
    pub mac: String,
    /// The interface in the container (`eth0`, ...).
    pub ifname: String,
}

fn mask(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len))
    }
}

/// Parses `A.B.C.D/N` (the address is put to its network's first).
pub fn parse_cidr(s: &str) -> Result<(Ipv4Addr, u8), String> {
    let bad = || format!("invalid subnet {s:?}: an IPv4 CIDR such as 172.28.0.0/16 (IPv6 networks are not offered)");
    let (a, n) = s.split_once('/').ok_or_else(bad)?;
    let a: Ipv4Addr = a.parse().map_err(|_| bad())?;
    let n: u8 = n.parse().ok().filter(|n| (8..=30).contains(n)).ok_or_else(|| format!("invalid subnet {s:?}: the prefix length must be 8 to 30"))?;
    Ok((Ipv4Addr::from(u32::from(a) & mask(n)), n))
}

fn contains((net, len): (Ipv4Addr, u8), a: Ipv4Addr) -> bool {
    u32::from(a) & mask(len) == u32::from(net)
}

fn overlaps(a: (Ipv4Addr, u8), b: (Ipv4Addr, u8)) -> bool {
    contains(a, b.0) || contains(b, a.0)
}

/// The MAC address of an endpoint with address `ip`, as Docker made them: 02:42 and the
/// address's four bytes.
fn mac_of(ip: Ipv4Addr) -> String {
    let o = ip.octets();
    format!("02:42:{:02x}:{:02x}:{:02x}:{:02x}", o[0], o[1], o[2], o[3])
}

/// Checks a MAC address (six pairs of hex digits, not multicast).
pub fn parse_mac(s: &str) -> Result<String, String> {
    let parts: Vec<&str> = s.split(':').collect();
    let ok = parts.len() == 6 && parts.iter().all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()));
    let first = u8::from_str_radix(parts.first().copied().unwrap_or(""), 16).unwrap_or(1);
    if !ok || first & 1 == 1 {
        return Err(format!("invalid MAC address {s:?}: six pairs of hex digits, not a multicast one (e.g. 02:42:ac:11:00:02)"));
    }
    Ok(s.to_ascii_lowercase())
}

struct State {
    nets: BTreeMap<String, Network>,
    /// (container id, network id) → its link while the container runs.
    live: BTreeMap<(String, String), Attachment>,
}

/// The target's user-defined networks.
pub struct Networks {
    dir: PathBuf,
    plumbing: Plumbing,
    state: Mutex<State>,
}

impl Networks {
    /// The networks recorded under `dir`, their namespaces named from `prefix`; what an
    /// earlier run of the target left in the kernel is removed.
    pub fn open(dir: &Path, prefix: &str) -> Result<Networks, RuntimeError> {
        std::fs::create_dir_all(dir).map_err(|e| RuntimeError::io(dir, e))?;
        let mut nets = BTreeMap::new();
        for e in std::fs::read_dir(dir).map_err(|e| RuntimeError::io(dir, e))?.flatten() {
            let Ok(text) = std::fs::read(e.path()) else { continue };
            if let Ok(n) = serde_json::from_slice::<Network>(&text) {
                nets.insert(n.id.clone(), n);
            }
        }
        let plumbing = Plumbing::new(prefix);
        plumbing.sweep();
        Ok(Networks { dir: dir.into(), plumbing, state: Mutex::new(State { nets, live: BTreeMap::new() }) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn save(&self, n: &Network) -> Result<(), RuntimeError> {
        let path = self.dir.join(format!("{}.json", n.id));
        let tmp = self.dir.join(format!("{}.json.tmp", n.id));
        std::fs::write(&tmp, serde_json::to_vec(n).unwrap_or_default()).map_err(|e| RuntimeError::io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| RuntimeError::io(&path, e))
    }

    /// Every network, by name.
    pub fn list(&self) -> Vec<Network> {
        let mut v: Vec<Network> = self.lock().nets.values().cloned().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    fn find_in<'a>(s: &'a State, key: &str) -> Option<&'a Network> {
        s.nets.get(key).or_else(|| s.nets.values().find(|n| n.name == key)).or_else(|| {
            let mut hits = s.nets.values().filter(|n| key.len() >= 3 && n.id.starts_with(key));
            match (hits.next(), hits.next()) {
                (Some(n), None) => Some(n),
                _ => None,
            }
        })
    }

    /// The network `key` names (its id, name, or a unique prefix of its id).
    pub fn find(&self, key: &str) -> Option<Network> {
        Self::find_in(&self.lock(), key).cloned()
    }

    /// A container's attachment to a network, while it runs.
    pub fn attachment(&self, cid: &str, nid: &str) -> Option<Attachment> {
        self.lock().live.get(&(cid.to_string(), nid.to_string())).cloned()
    }

    /// The networks container `cid` is on, with how it asked.
    pub fn of_container(&self, cid: &str) -> Vec<(Network, EndpointConfig)> {
        self.lock().nets.values().filter_map(|n| n.members.get(cid).map(|e| (n.clone(), e.clone()))).collect()
    }

    /// Makes a network (409 if the name is taken, 400 for a subnet that overlaps one).
    pub fn create(&self, req: NetworkRequest, id: String, now: u64) -> Result<Network, RuntimeError> {
        let mut s = self.lock();
        if s.nets.values().any(|n| n.name == req.name) {
            return Err(RuntimeError::Conflict(format!("network with name {} already exists", req.name)));
        }
        let subnet = match req.subnet {
            Some(sn) => {
                if let Some(o) = s.nets.values().find(|n| overlaps(n.subnet, sn)) {
                    return Err(RuntimeError::BadRequest(format!(
                        "invalid pool request: subnet {}/{} overlaps with network {}'s {}/{}",
                        sn.0, sn.1, o.name, o.subnet.0, o.subnet.1
                    )));
                }
                sn
            }
            None => (18u8..=31)
                .map(|b| (Ipv4Addr::new(172, b, 0, 0), 16))
                .chain((0u8..16).map(|k| (Ipv4Addr::new(192, 168, k * 16, 0), 20)))
                .find(|c| !s.nets.values().any(|n| overlaps(n.subnet, *c)))
                .ok_or_else(|| RuntimeError::Conflict("all predefined address pools have been fully subnetted; give a subnet".into()))?,
        };
        if let Some((k, a)) = req.aux.iter().find(|(_, a)| !contains(subnet, **a)) {
            return Err(RuntimeError::BadRequest(format!("auxiliary address {k}={a} is not within subnet {}/{}", subnet.0, subnet.1)));
        }
        if let Some(r) = req.ip_range {
            if !contains(subnet, r.0) || r.1 < subnet.1 {
                return Err(RuntimeError::BadRequest(format!("IPRange {}/{} is not within subnet {}/{}", r.0, r.1, subnet.0, subnet.1)));
            }
        }
        let gateway = match req.gateway {
            Some(g) if !contains(subnet, g) => {
                return Err(RuntimeError::BadRequest(format!("gateway {g} is not within subnet {}/{}", subnet.0, subnet.1)));
            }
            Some(g) => g,
            None => Ipv4Addr::from(u32::from(subnet.0) + 1),
        };
        let n = Network {
            id,
            name: req.name,
            created: now,
            labels: req.labels,
            internal: req.internal,
            attachable: req.attachable,
            subnet,
            gateway,
            ip_range: req.ip_range,
            aux: req.aux,
            members: BTreeMap::new(),
        };
        self.save(&n)?;
        s.nets.insert(n.id.clone(), n.clone());
        Ok(n)
    }

    /// Removes network `key`; refused (403) while a container on it runs, and its
    /// stopped containers leave it.
    pub fn remove(&self, key: &str) -> Result<Network, RuntimeError> {
        let mut s = self.lock();
        let n = Self::find_in(&s, key).cloned().ok_or_else(|| RuntimeError::Missing(format!("network {key} not found")))?;
        if let Some((cid, _)) = s.live.keys().find(|(_, nid)| *nid == n.id) {
            return Err(RuntimeError::Forbidden(format!("error while removing network: network {} has active endpoints (container {})", n.name, &cid[..12])));
        }
        let path = self.dir.join(format!("{}.json", n.id));
        std::fs::remove_file(&path).map_err(|e| RuntimeError::io(&path, e))?;
        self.plumbing.bridge_down(&n.id);
        s.nets.remove(&n.id);
        if s.nets.is_empty() && s.live.is_empty() {
            self.plumbing.hub_down();
        }
        Ok(n)
    }

    /// Puts container `cid` on network `nid` with `cfg` (recorded; linked at once when
    /// `running`). 409 if it is on it already.
    pub fn join(&self, cid: &str, nid: &str, cfg: EndpointConfig, running: bool) -> Result<(), RuntimeError> {
        let mut s = self.lock();
        let n = s.nets.get(nid).cloned().ok_or_else(|| RuntimeError::Missing(format!("network {nid} not found")))?;
        if n.members.contains_key(cid) {
            return Err(RuntimeError::Forbidden(format!("endpoint with name already exists in network {}", n.name)));
        }
        if let Some(a) = cfg.ipv4 {
            if !contains(n.subnet, a) {
                return Err(RuntimeError::BadRequest(format!("address {a} is not within network {}'s subnet {}/{}", n.name, n.subnet.0, n.subnet.1)));
            }
        }
        let mut updated = n.clone();
        updated.members.insert(cid.to_string(), cfg.clone());
        if running {
            self.attach(&mut s, cid, &updated, &cfg)?;
        }
        if let Err(e) = self.save(&updated) {
            self.detach(&mut s, cid, nid);
            return Err(e);
        }
        s.nets.insert(nid.to_string(), updated);
        Ok(())
    }

    /// Takes container `cid` off network `nid` (its link goes at once).
    pub fn leave(&self, cid: &str, nid: &str) -> Result<(), RuntimeError> {
        let mut s = self.lock();
        let mut n = s.nets.get(nid).cloned().ok_or_else(|| RuntimeError::Missing(format!("network {nid} not found")))?;
        if n.members.remove(cid).is_none() {
            return Err(RuntimeError::Forbidden(format!("container {} is not connected to network {}", &cid[..12.min(cid.len())], n.name)));
        }
        self.save(&n)?;
        self.detach(&mut s, cid, nid);
        s.nets.insert(nid.to_string(), n);
        Ok(())
    }

    /// Takes a removed container off every network.
    pub fn forget(&self, cid: &str) {
        let ids: Vec<String> = self.lock().nets.values().filter(|n| n.members.contains_key(cid)).map(|n| n.id.clone()).collect();
        for nid in ids {
            let _ = self.leave(cid, &nid);
        }
        self.plumbing.sandbox_down(cid);
    }

    fn attach(&self, s: &mut State, cid: &str, n: &Network, cfg: &EndpointConfig) -> Result<(), RuntimeError> {
        self.plumbing.bridge_up(&n.id, n.gateway, n.subnet.1)?;
        let mut taken: Vec<Ipv4Addr> = s.live.iter().filter(|((_, nid), _)| *nid == n.id).map(|(_, a)| a.ip).collect();
        taken.extend(n.aux.values());
        let ip = match cfg.ipv4 {
            Some(a) if taken.contains(&a) || a == n.gateway => {
                return Err(RuntimeError::Conflict(format!("address {a} is already in use on network {}", n.name)));
            }
            Some(a) => a,
            None => {
                let pool = n.ip_range.unwrap_or(n.subnet);
                let first = u32::from(pool.0).max(u32::from(n.subnet.0) + 1);
                let last = (u32::from(pool.0) | !mask(pool.1)).min((u32::from(n.subnet.0) | !mask(n.subnet.1)) - 1);
                (first..=last)
                    .map(Ipv4Addr::from)
                    .find(|a| *a != n.gateway && !taken.contains(a))
                    .ok_or_else(|| RuntimeError::Conflict(format!("no address is left on network {}", n.name)))?
            }
        };
        let used: Vec<String> = s.live.iter().filter(|((c, _), _)| c == cid).map(|(_, a)| a.ifname.clone()).collect();
        let ifname = (0..).map(|i| format!("eth{i}")).find(|n| !used.contains(n)).unwrap_or_default();
        let mac = cfg.mac.clone().unwrap_or_else(|| mac_of(ip));
        self.plumbing.link(cid, &n.id, &ifname, (ip, n.subnet.1), &mac, &cfg.link_local_ips)?;
        s.live.insert((cid.to_string(), n.id.clone()), Attachment { ip, mac, ifname });
        Ok(())
    }

    fn detach(&self, s: &mut State, cid: &str, nid: &str) {
        if s.live.remove(&(cid.to_string(), nid.to_string())).is_some() {
            self.plumbing.unlink(cid, nid);
        }
    }

    /// Before container `cid` starts: its namespace, linked to every network it is on.
    /// The namespace's path, for runc to join.
    pub fn sandbox_up(&self, cid: &str) -> Result<PathBuf, RuntimeError> {
        let path = self.plumbing.sandbox_up(cid)?;
        let mut s = self.lock();
        let mine: Vec<Network> = s.nets.values().filter(|n| n.members.contains_key(cid)).cloned().collect();
        for n in mine {
            let cfg = n.members.get(cid).cloned().unwrap_or_default();
            if let Err(e) = self.attach(&mut s, cid, &n, &cfg) {
                drop(s);
                self.sandbox_down(cid);
                return Err(e);
            }
        }
        Ok(path)
    }

    /// After container `cid`'s run: its links and namespace go.
    pub fn sandbox_down(&self, cid: &str) {
        let mut s = self.lock();
        s.live.retain(|(c, _), _| c != cid);
        drop(s);
        self.plumbing.sandbox_down(cid);
    }

    /// Whether container `cid` runs in a namespace of ours (so it can be linked).
    pub fn has_sandbox(&self, cid: &str) -> bool {
        self.plumbing.has_sandbox(cid)
    }

    /// The running containers that share a network with `cid` (and `cid`).
    pub fn neighbours(&self, cid: &str) -> Vec<String> {
        let s = self.lock();
        let mut out: Vec<String> = s
            .nets
            .values()
            .filter(|n| n.members.contains_key(cid))
            .flat_map(|n| n.members.keys().cloned())
            .filter(|c| s.live.keys().any(|(lc, _)| lc == c))
            .collect();
        out.push(cid.to_string());
        out.sort();
        out.dedup();
        out
    }

    /// The running containers on container `cid`'s networks with their names there
    /// (itself named `own`): name, aliases, the names `cid`'s links give it, short id.
    /// What `/etc/hosts` lists and the networks' DNS servers answer.
    pub fn entries(&self, cid: &str, own: &[String], name_of: &dyn Fn(&str) -> Option<String>) -> Vec<(Ipv4Addr, Vec<String>)> {
        let s = self.lock();
        let mut out = Vec::new();
        for n in s.nets.values().filter(|n| n.members.contains_key(cid)) {
            let links: Vec<(String, String)> =
                n.members[cid].links.iter().filter_map(|l| l.split_once(':').map(|(a, b)| (a.to_string(), b.to_string()))).collect();
            for (peer, cfg) in &n.members {
                let Some(a) = s.live.get(&(peer.clone(), n.id.clone())) else { continue };
                let mut names: Vec<String> = if peer == cid { own.to_vec() } else { name_of(peer).into_iter().collect() };
                names.extend(cfg.aliases.iter().cloned());
                let peer_names = names.clone();
                names.extend(
                    links
                        .iter()
                        .filter(|(target, _)| peer_names.contains(target) || (target.len() >= 12 && peer.starts_with(target.as_str())))
                        .map(|(_, alias)| alias.clone()),
                );
                names.push(peer[..12.min(peer.len())].to_string());
                names.dedup();
                out.push((a.ip, names));
            }
        }
        out
    }

    /// `/etc/hosts` for container `cid` (named `own` names): itself, then each running
    /// container on its networks by name, aliases, links and short id.
    pub fn hosts(&self, cid: &str, own: &[String], name_of: &dyn Fn(&str) -> Option<String>) -> String {
        let mut out = String::from("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n");
        for (ip, names) in self.entries(cid, own, name_of) {
            out.push_str(&format!("{ip}\t{}\n", names.join(" ")));
        }
        out
    }

    /// The container that has address `ip` on network `nid` now.
    pub fn member_at(&self, nid: &str, ip: Ipv4Addr) -> Option<String> {
        self.lock().live.iter().find(|((_, n), a)| n == nid && a.ip == ip).map(|((c, _), _)| c.clone())
    }

    /// A legacy link's wire between two running containers' namespaces (see
    /// [`links`](super::links)).
    pub fn wire(&self, parent: &str, child: &str, parent_ip: Ipv4Addr, child_ip: Ipv4Addr) -> Result<(), RuntimeError> {
        self.plumbing.wire(parent, child, parent_ip, child_ip)
    }

    /// Cuts a legacy link's wire.
    pub fn unwire(&self, parent: &str, child: &str) {
        self.plumbing.unwire(parent, child)
    }

    /// The hub namespace's path (where the networks' bridges and DNS servers live).
    pub fn hub_path(&self) -> PathBuf {
        self.plumbing.hub_path()
    }

    /// Removes every namespace of this target's (at shutdown).
    pub fn shutdown(&self) {
        self.lock().live.clear();
        self.plumbing.sweep();
    }
}

/// The files a container's run gets from its networks.
#[derive(Debug, Default)]
pub(super) struct NetworkFiles {
    /// The network namespace runc joins (the default network and user-defined ones).
    pub netns: Option<PathBuf>,
    /// `/etc/hosts`, when it is on a user-defined network or has legacy links.
    pub hosts: Option<PathBuf>,
    /// `/etc/resolv.conf`, naming its networks' DNS server, likewise.
    pub resolv: Option<PathBuf>,
    /// The variables its legacy links give it.
    pub env: Vec<String>,
}

/// The predefined networks' names: endpoints that name one join nothing (their settings
/// are kept and shown).
pub const PREDEFINED: &[&str] = &["bridge", "host", "none", "default"];

impl Runtime {
    /// The user-defined networks.
    pub fn networks(&self) -> &Networks {
        &self.networks
    }

    /// The user-defined networks a create request's endpoints name, by id (404 for one
    /// that is not there).
    pub(super) fn endpoint_networks(&self, spec: &CreateSpec) -> Result<Vec<(String, EndpointConfig)>, RuntimeError> {
        spec.endpoints
            .iter()
            .filter(|(name, _)| !PREDEFINED.contains(&name.as_str()))
            .map(|(name, cfg)| self.networks.find(name).map(|n| (n.id, cfg.clone())).ok_or_else(|| RuntimeError::Missing(format!("network {name} not found"))))
            .collect()
    }

    /// `POST /networks/{id}/connect`: a running container is linked at once, and the
    /// containers it now shares the network with find it by name.
    pub fn network_connect(self: &Arc<Self>, net: &str, container: &str, cfg: EndpointConfig) -> Result<(), RuntimeError> {
        let c = self.get(container)?;
        if PREDEFINED.contains(&net) {
            return Err(RuntimeError::BadRequest(format!(
                "connecting a container to the predefined network {net} is not supported on this target: connect it to a user-defined network"
            )));
        }
        let n = self.networks.find(net).ok_or_else(|| RuntimeError::Missing(format!("network {net} not found")))?;
        if matches!(c.spec.network, NetworkMode::Host | NetworkMode::None) {
            return Err(RuntimeError::BadRequest(format!(
                "container {} is on network {}, which cannot be combined with another: create it on the default network or a user-defined one",
                c.name(),
                c.spec.network.name()
            )));
        }
        let running = matches!(c.state(), RunState::Running { .. }) && self.networks.has_sandbox(&c.id);
        self.networks.join(&c.id, &n.id, cfg, running)?;
        if running {
            // Its names are served from now on; a DNS server that cannot start leaves the
            // link (the container has /etc/hosts) and says so.
            if let Err(e) = self.dns_up(&n) {
                eprintln!("insitu-isp: {e}");
            }
        }
        self.write_hosts(&self.networks.neighbours(&c.id));
        Ok(())
    }

    /// `POST /networks/{id}/disconnect`: the link goes at once, and with it the names.
    pub fn network_disconnect(&self, net: &str, container: &str) -> Result<(), RuntimeError> {
        let n = self.networks.find(net).ok_or_else(|| RuntimeError::Missing(format!("network {net} not found")))?;
        let c = self.get(container)?;
        let before = self.networks.neighbours(&c.id);
        self.networks.leave(&c.id, &n.id)?;
        self.write_hosts(&before);
        Ok(())
    }

    /// Before container `c` runs: its namespace, linked to its networks, and, when it is
    /// on one, the `/etc/hosts` and `/etc/resolv.conf` to bind (the latter naming the DNS
    /// server of its first network, started here if it is not yet).
    pub(super) fn network_up(self: &Arc<Self>, c: &Container) -> Result<NetworkFiles, RuntimeError> {
        if !matches!(c.spec.network, NetworkMode::Default | NetworkMode::User) {
            return Ok(NetworkFiles::default());
        }
        let netns = self.networks.sandbox_up(&c.id)?;
        let env = self.links_up(c).inspect_err(|_| self.networks.sandbox_down(&c.id))?;
        let mine = self.networks.of_container(&c.id);
        if mine.is_empty() && env.is_empty() {
            return Ok(NetworkFiles { netns: Some(netns), ..Default::default() });
        }
        let (hosts, resolv) = (c.dir.join("hosts"), c.dir.join("resolv.conf"));
        let written = (|| {
            for (n, _) in &mine {
                self.dns_up(n)?;
            }
            std::fs::write(&hosts, self.hosts_text(c)).map_err(|e| RuntimeError::io(&hosts, e))?;
            match mine.first() {
                Some((n, _)) => {
                    std::fs::write(&resolv, super::dns::resolv_conf(n.gateway)).map(|_| Some(resolv.clone())).map_err(|e| RuntimeError::io(&resolv, e))
                }
                None => Ok(None),
            }
        })();
        match written {
            Ok(resolv) => Ok(NetworkFiles { netns: Some(netns), hosts: Some(hosts), resolv, env }),
            Err(e) => {
                self.links_down(&c.id);
                self.networks.sandbox_down(&c.id);
                Err(e)
            }
        }
    }

    /// Starts network `n`'s DNS server (port 53 of its gateway address, UDP and TCP, in
    /// the hub namespace) unless it runs.
    fn dns_up(self: &Arc<Self>, n: &Network) -> Result<(), RuntimeError> {
        let mut servers = self.dns.lock().unwrap_or_else(|e| e.into_inner());
        if servers.get(&n.id).is_some_and(|t| !t.is_finished()) {
            return Ok(());
        }
        let hub = self.networks.hub_path();
        let ns = std::fs::File::open(&hub).map_err(|e| RuntimeError::io(&hub, e))?;
        let gateway = n.gateway;
        // A thread that entered the hub opens the sockets, so that they listen there only.
        let bound = std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: setns(2) with a descriptor owned by `ns`, open for the call; it
                // changes the network namespace of this scoped thread only, which opens
                // two sockets and ends.
                if unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&ns), libc::CLONE_NEWNET) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let udp = std::net::UdpSocket::bind((gateway, 53))?;
                udp.set_nonblocking(true)?;
                let tcp = std::net::TcpListener::bind((gateway, 53))?;
                tcp.set_nonblocking(true)?;
                Ok((udp, tcp))
            })
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the thread binding the DNS sockets panicked")))
        });
        let (udp, tcp) = bound
            .and_then(|(u, t)| Ok((tokio::net::UdpSocket::from_std(u)?, tokio::net::TcpListener::from_std(t)?)))
            .map_err(|e| RuntimeError::Setup(format!("network {}'s DNS server on {gateway}:53: {e}", n.name)))?;
        let task = tokio::spawn(super::dns::serve(udp, tcp, n.id.clone(), Arc::downgrade(self)));
        servers.insert(n.id.clone(), task);
        Ok(())
    }

    /// What the DNS server of network `nid` answers a container at `src` from: the names
    /// on every network of the container's (none for an address no container holds), and
    /// whether the network is `Internal` (nothing is forwarded then).
    pub(super) fn dns_view(&self, nid: &str, src: Ipv4Addr) -> (super::dns::View, bool) {
        let internal = self.networks.find(nid).is_some_and(|n| n.internal);
        let Some(c) = self.networks.member_at(nid, src).and_then(|cid| self.get(&cid).ok()) else {
            return (super::dns::View { entries: Vec::new() }, internal);
        };
        let mut entries = self.networks.entries(&c.id, &self.own_names(&c), &|id| self.get(id).ok().map(|p| p.name()));
        for (_, names) in &mut entries {
            for n in names.iter_mut() {
                n.make_ascii_lowercase();
            }
        }
        (super::dns::View { entries }, internal)
    }

    /// `DELETE /networks/{id}` (and prune): the network, its bridge and its DNS server go.
    pub fn network_remove(&self, key: &str) -> Result<Network, RuntimeError> {
        let n = self.networks.remove(key)?;
        if let Some(t) = self.dns.lock().unwrap_or_else(|e| e.into_inner()).remove(&n.id) {
            t.abort();
        }
        Ok(n)
    }

    /// Stops every network's DNS server (at shutdown).
    pub(super) fn dns_down_all(&self) {
        for (_, t) in std::mem::take(&mut *self.dns.lock().unwrap_or_else(|e| e.into_inner())) {
            t.abort();
        }
    }

    /// After container `cid`'s run, or when its start failed: its namespace goes, and
    /// the containers it shared networks with forget it.
    pub(super) fn network_down(&self, cid: &str) {
        let mut before = self.networks.neighbours(cid);
        before.extend(self.links_down(cid));
        self.networks.sandbox_down(cid);
        self.write_hosts(&before);
    }

    /// Once container `cid` runs: the containers it shares networks with learn its name.
    pub(super) fn network_announce(&self, cid: &str) {
        self.write_hosts(&self.networks.neighbours(cid));
    }

    fn own_names(&self, c: &Container) -> Vec<String> {
        let mut own = vec![c.name()];
        if let Some(h) = c.spec.options.hostname.clone().filter(|h| !h.is_empty()) {
            own.push(h);
        }
        own
    }

    fn hosts_text(&self, c: &Container) -> String {
        self.networks.hosts(&c.id, &self.own_names(c), &|id| self.get(id).ok().map(|p| p.name())) + &self.link_hosts(&c.id)
    }

    /// Rewrites, in place (the file is bound into the container), the `/etc/hosts` of
    /// each running container of `cids` that has one of ours.
    pub(super) fn write_hosts(&self, cids: &[String]) {
        for id in cids {
            let Ok(c) = self.get(id) else { continue };
            let path = c.dir.join("hosts");
            if matches!(c.state(), RunState::Running { .. }) && path.exists() {
                let _ = std::fs::write(&path, self.hosts_text(&c));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnets_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_cidr("172.28.5.9/16").unwrap(), (Ipv4Addr::new(172, 28, 0, 0), 16));
        for bad in ["", "172.28.0.0", "2001:db8::/64", "1.2.3.4/33", "1.2.3.4/4", "a.b.c.d/16", "1.2.3.4/x"] {
            assert!(parse_cidr(bad).is_err(), "{bad}");
        }
        assert!(overlaps((Ipv4Addr::new(10, 0, 0, 0), 8), (Ipv4Addr::new(10, 1, 0, 0), 16)));
        assert!(!overlaps((Ipv4Addr::new(10, 0, 0, 0), 16), (Ipv4Addr::new(10, 1, 0, 0), 16)));
        assert_eq!(mac_of(Ipv4Addr::new(172, 18, 0, 2)), "02:42:ac:12:00:02");
        assert!(parse_mac("02:42:AC:11:00:02").is_ok() && parse_mac("01:00:5e:00:00:01").is_err() && parse_mac("02:42").is_err());
    }

    #[test]
    fn records_persist_and_names_are_unique() {
        let d = tempfile::tempdir().unwrap();
        let nets = Networks::open(d.path(), "isn-test-records").unwrap();
        let req = NetworkRequest { name: "a".into(), ..Default::default() };
        let a = nets.create(req.clone(), "1".repeat(64), 1).unwrap();
        assert_eq!((a.subnet, a.gateway), ((Ipv4Addr::new(172, 18, 0, 0), 16), Ipv4Addr::new(172, 18, 0, 1)));
        assert!(matches!(nets.create(req, "2".repeat(64), 1), Err(RuntimeError::Conflict(_))));
        let b = nets.create(NetworkRequest { name: "b".into(), ..Default::default() }, "3".repeat(64), 1).unwrap();
        assert_eq!(b.subnet.0, Ipv4Addr::new(172, 19, 0, 0));
        let clash = NetworkRequest { name: "c".into(), subnet: Some((Ipv4Addr::new(172, 19, 3, 0), 24)), ..Default::default() };
        assert!(matches!(nets.create(clash, "4".repeat(64), 1), Err(RuntimeError::BadRequest(_))));
        nets.join("c".repeat(64).as_str(), &a.id, EndpointConfig::default(), false).unwrap();
        let again = Networks::open(d.path(), "isn-test-records").unwrap();
        assert_eq!(again.find("a").unwrap().members.len(), 1);
        assert!(again.find("111").is_some() && again.find("zz").is_none());
        again.remove("a").unwrap();
        assert!(Networks::open(d.path(), "isn-test-records").unwrap().find("a").is_none());
    }
}
