// SPDX-License-Identifier: Apache-2.0
//! Legacy links (`HostConfig.Links`, `docker run --link CONTAINER[:ALIAS]`), as Docker
//! keeps them on its default bridge: when the linking container (the *parent*) starts,
//! each linked container (the *child*) must be running; the parent then reaches it under
//! the alias, through `/etc/hosts` (`IP ALIAS CHILD SHORTID`), and finds it described in
//! environment variables (`ALIAS_NAME=/PARENT/ALIAS`, `ALIAS_ENV_VAR=...` for each of the
//! child's variables but `HOME` and `PATH`, `ALIAS_PORT_80_TCP=tcp://IP:80` and its
//! `_ADDR`, `_PORT`, `_PROTO` parts, and `ALIAS_PORT` for the lowest port).
//!
//! The default network here is a namespace with loopback only per container (see
//! [`ports`](super::ports)), so a link is a wire of its own: a veth pair between the two
//! containers' namespaces, `l-CHILD7` in the parent's and `p-PARENT7` in the child's, with
//! the two addresses of a /30 of 169.254.0.0/16 (link-local: nothing else in either
//! namespace uses them). The two reach each other over it and nothing more. The wire goes
//! when either container's run ends (its namespace takes its end with it), or when the
//! link is removed (`DELETE /containers/PARENT/ALIAS?link=1`).
//!
//! On a user-defined network, Docker's links only give aliases; they are added to the
//! container's endpoint links there (names in `/etc/hosts` and the network's DNS).

use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;

use super::{Container, NetworkMode, RunState, Runtime, RuntimeError};

/// One link of a container's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LegacyLink {
    /// The linked container: its name as the request gave it, until create resolves it
    /// to its id.
    pub target: String,
    /// The name the linking container finds it by.
    pub alias: String,
}

/// A link wired for a run.
#[derive(Debug, Clone)]
pub(super) struct Wire {
    parent: String,
    child: String,
    alias: String,
    /// Which /30 of 169.254.0.0/16 (1 to 16383).
    block: u32,
}

impl Wire {
    fn parent_ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(Ipv4Addr::new(169, 254, 0, 0)) + self.block * 4 + 1)
    }
    fn child_ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(Ipv4Addr::new(169, 254, 0, 0)) + self.block * 4 + 2)
    }
}

/// A container name or alias: `[a-zA-Z0-9][a-zA-Z0-9_.-]*`, at most 255 bytes.
fn valid(s: &str) -> bool {
    s.len() <= 255 && s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric()) && s.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
}

/// Parses `HostConfig.Links`: `NAME[:ALIAS]`, or the form inspect answers,
/// `/NAME:/PARENT/ALIAS` (the alias is then the last part). An alias given twice is
/// refused, as are names that are not container names.
pub fn parse_links(list: &[String]) -> Result<Vec<LegacyLink>, String> {
    let mut out: Vec<LegacyLink> = Vec::new();
    for l in list {
        let (name, alias) = l.split_once(':').unwrap_or((l, l));
        let name = name.strip_prefix('/').unwrap_or(name);
        let alias = alias.rsplit('/').next().unwrap_or(alias);
        if !valid(name) || !valid(alias) {
            return Err(format!("invalid link {l:?}: CONTAINER[:ALIAS], each [a-zA-Z0-9][a-zA-Z0-9_.-]"));
        }
        if out.iter().any(|x| x.alias == alias) {
            return Err(format!("invalid link {l:?}: the alias {alias} is given twice"));
        }
        out.push(LegacyLink { target: name.to_string(), alias: alias.to_string() });
    }
    Ok(out)
}

/// The variables a link gives the parent (`parent` and `child` are names without `/`;
/// `ports` the child's, sorted).
pub fn link_env(parent: &str, alias: &str, child_env: &[String], ip: Ipv4Addr, ports: &[super::PortKey]) -> Vec<String> {
    let a = alias.to_uppercase().replace(['-', '.'], "_");
    let mut env = vec![format!("{a}_NAME=/{parent}/{alias}")];
    if let Some(p) = ports.first() {
        env.push(format!("{a}_PORT={}://{ip}:{}", p.proto.name(), p.port));
    }
    for p in ports {
        let (proto, port) = (p.proto.name(), p.port);
        let key = format!("{a}_PORT_{port}_{}", proto.to_uppercase());
        env.push(format!("{key}={proto}://{ip}:{port}"));
        env.push(format!("{key}_ADDR={ip}"));
        env.push(format!("{key}_PORT={port}"));
        env.push(format!("{key}_PROTO={proto}"));
    }
    for e in child_env {
        let Some((k, v)) = e.split_once('=') else { continue };
        if k != "HOME" && k != "PATH" {
            env.push(format!("{a}_ENV_{k}={v}"));
        }
    }
    env
}

impl Runtime {
    /// At create: each link's container resolved to its id (400 when there is none, or
    /// when either side is on the target's own network, as Docker refuses it); on a
    /// user-defined network the links become endpoint links there.
    pub(super) fn resolve_links(&self, spec: &mut super::CreateSpec) -> Result<(), RuntimeError> {
        if spec.links.is_empty() {
            return Ok(());
        }
        if matches!(spec.network, NetworkMode::Host | NetworkMode::None) {
            return Err(RuntimeError::BadRequest(format!(
                "conflicting options: HostConfig.Links can't be used with --network {}: a linked container is reached over a network",
                spec.network.name()
            )));
        }
        for l in &mut spec.links {
            let child = self
                .get(&l.target)
                .map_err(|_| RuntimeError::BadRequest(format!("HostConfig.Links: could not get container for {}: no such container", l.target)))?;
            if child.spec.network == NetworkMode::Host {
                return Err(RuntimeError::BadRequest(format!(
                    "conflicting options: HostConfig.Links names container {}, which uses host networking and can't be linked to",
                    child.name()
                )));
            }
            l.target = child.id.clone();
        }
        if spec.network == NetworkMode::User {
            let links: Vec<String> = spec.links.iter().filter_map(|l| self.get(&l.target).ok().map(|c| format!("{}:{}", c.name(), l.alias))).collect();
            if let Some(ep) = spec.endpoints.iter_mut().find(|(n, _)| !super::networks::PREDEFINED.contains(&n.as_str())).map(|(_, e)| e) {
                ep.links.extend(links);
            }
        }
        Ok(())
    }

    /// The links container `c` has now: as created, less those `DELETE ?link=1` removed.
    pub fn links_of(&self, c: &Container) -> Vec<LegacyLink> {
        let kept = c.updates().get("Links").cloned();
        match kept.as_ref().and_then(|v| v.as_array()) {
            Some(list) => {
                let aliases: Vec<&str> = list.iter().filter_map(|v| v.as_str()).filter_map(|s| s.rsplit('/').next()).collect();
                c.spec.links.iter().filter(|l| aliases.contains(&l.alias.as_str())).cloned().collect()
            }
            None => c.spec.links.clone(),
        }
    }

    /// `HostConfig.Links` as inspect shows them: `/CHILD:/PARENT/ALIAS`, current names.
    pub fn links_shown(&self, c: &Container) -> Vec<String> {
        self.links_of(c)
            .iter()
            .map(|l| {
                format!("/{}:/{}/{}", self.get(&l.target).map(|x| x.name()).unwrap_or_else(|_| l.target[..12.min(l.target.len())].into()), c.name(), l.alias)
            })
            .collect()
    }

    /// The names other containers' links give container `c` (`/PARENT/ALIAS`), as
    /// Docker lists them in `ps`.
    pub fn link_names(&self, c: &Container) -> Vec<String> {
        let all: Vec<_> = self.all().values().cloned().collect();
        all.iter()
            .flat_map(|p| self.links_of(p).into_iter().filter(|l| l.target == c.id).map(|l| format!("/{}/{}", p.name(), l.alias)).collect::<Vec<_>>())
            .collect()
    }

    /// When container `c` starts on the default network (its namespace made): a wire to
    /// each linked container, which must be running in a namespace of ours (409 if not,
    /// in Docker's words). The variables the links give it.
    pub(super) fn links_up(&self, c: &Container) -> Result<Vec<String>, RuntimeError> {
        let links = self.links_of(c);
        if links.is_empty() || c.spec.network != NetworkMode::Default {
            return Ok(Vec::new());
        }
        let mut env = Vec::new();
        for l in links {
            let child = self.get(&l.target).ok().filter(|x| matches!(x.state(), RunState::Running { .. }) && self.networks.has_sandbox(&x.id));
            let Some(child) = child else {
                self.links_down(&c.id);
                let name = self.get(&l.target).map(|x| x.name()).unwrap_or_else(|_| l.target.clone());
                return Err(RuntimeError::Conflict(format!(
                    "Cannot link to a non running container: /{name} AS /{}/{} (start it first; it must run on the default or a user-defined network)",
                    c.name(),
                    l.alias
                )));
            };
            let wire = {
                let mut wires = self.wires.lock().unwrap_or_else(|e| e.into_inner());
                let block = (1..16384u32).find(|b| !wires.iter().any(|w| w.block == *b));
                let Some(block) = block else {
                    drop(wires);
                    self.links_down(&c.id);
                    return Err(RuntimeError::Conflict("too many links are wired on this target (16383)".into()));
                };
                let w = Wire { parent: c.id.clone(), child: child.id.clone(), alias: l.alias.clone(), block };
                wires.push(w.clone());
                w
            };
            if let Err(e) = self.networks.wire(&c.id, &child.id, wire.parent_ip(), wire.child_ip()) {
                self.links_down(&c.id);
                return Err(e);
            }
            let mut ports: Vec<super::PortKey> = child.spec.exposed.iter().copied().chain(child.spec.ports.iter().map(|p| p.key())).collect();
            ports.sort_unstable();
            ports.dedup();
            env.extend(link_env(&c.name(), &l.alias, &child.env, wire.child_ip(), &ports));
        }
        Ok(env)
    }

    /// `/etc/hosts` lines of container `cid`'s wired links.
    pub(super) fn link_hosts(&self, cid: &str) -> String {
        let wires: Vec<Wire> = self.wires.lock().unwrap_or_else(|e| e.into_inner()).iter().filter(|w| w.parent == cid).cloned().collect();
        let mut out = String::new();
        for w in wires {
            let name = self.get(&w.child).map(|x| x.name()).unwrap_or_default();
            out.push_str(&format!("{}\t{} {} {}\n", w.child_ip(), w.alias, name, &w.child[..12.min(w.child.len())]));
        }
        out
    }

    /// After container `cid`'s run: its wires, as parent or child, are forgotten (their
    /// ends went with its namespace); the parents' `/etc/hosts` drop the child.
    pub(super) fn links_down(&self, cid: &str) -> Vec<String> {
        let mut wires = self.wires.lock().unwrap_or_else(|e| e.into_inner());
        let parents: Vec<String> = wires.iter().filter(|w| w.child == cid).map(|w| w.parent.clone()).collect();
        wires.retain(|w| w.parent != cid && w.child != cid);
        parents
    }

    /// `DELETE /containers/PARENT/ALIAS?link=1`: the parent's link goes (its wire too,
    /// while it runs); both containers stay.
    pub fn remove_link(&self, name: &str) -> Result<(), RuntimeError> {
        let name = name.trim_start_matches('/');
        let Some((parent, alias)) = name.rsplit_once('/') else {
            return Err(RuntimeError::BadRequest(format!("Conflict, cannot remove the default link name of the container {name}: give PARENT/ALIAS")));
        };
        let p = self.get(parent).map_err(|_| RuntimeError::Missing(format!("Cannot get parent {parent} for link name /{name}")))?;
        let links = self.links_of(&p);
        if !links.iter().any(|l| l.alias == alias) {
            return Err(RuntimeError::Missing(format!("Could not find entity for /{name}: container {parent} has no link {alias}")));
        }
        let kept: Vec<String> = self.links_shown(&p).into_iter().filter(|s| s.rsplit('/').next() != Some(alias)).collect();
        let mut changes = serde_json::Map::new();
        changes.insert("Links".into(), serde_json::json!(kept));
        p.record_updates(&changes)?;
        let gone: Vec<Wire> = {
            let mut wires = self.wires.lock().unwrap_or_else(|e| e.into_inner());
            let gone = wires.iter().filter(|w| w.parent == p.id && w.alias == alias).cloned().collect();
            wires.retain(|w| !(w.parent == p.id && w.alias == alias));
            gone
        };
        for w in gone {
            self.networks.unwire(&w.parent, &w.child);
        }
        self.write_hosts(std::slice::from_ref(&p.id));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{PortKey, Proto};
    use proptest::prelude::*;

    #[test]
    fn links_parse_in_both_forms_and_bad_ones_are_refused() {
        let l = parse_links(&["db:store".into(), "/web:/me/front".into(), "cache".into()]).unwrap();
        let pairs: Vec<(&str, &str)> = l.iter().map(|l| (l.target.as_str(), l.alias.as_str())).collect();
        assert_eq!(pairs, [("db", "store"), ("web", "front"), ("cache", "cache")]);
        for bad in ["", ":x", "db:", "d b:x", "db:a:b", "-db:x"] {
            assert!(parse_links(&[bad.into()]).is_err(), "{bad}");
        }
        assert!(parse_links(&["a:x".into(), "b:x".into()]).unwrap_err().contains("twice"));
    }

    #[test]
    fn link_variables_are_dockers() {
        let ports = [PortKey::tcp(80), PortKey { port: 53, proto: Proto::Udp }];
        let mut ports = ports.to_vec();
        ports.sort_unstable();
        let env = link_env("me", "my-db", &["FOO=1".into(), "PATH=/bin".into(), "HOME=/root".into(), "BARE".into()], Ipv4Addr::new(169, 254, 0, 6), &ports);
        assert_eq!(
            env,
            [
                "MY_DB_NAME=/me/my-db",
                "MY_DB_PORT=udp://169.254.0.6:53",
                "MY_DB_PORT_53_UDP=udp://169.254.0.6:53",
                "MY_DB_PORT_53_UDP_ADDR=169.254.0.6",
                "MY_DB_PORT_53_UDP_PORT=53",
                "MY_DB_PORT_53_UDP_PROTO=udp",
                "MY_DB_PORT_80_TCP=tcp://169.254.0.6:80",
                "MY_DB_PORT_80_TCP_ADDR=169.254.0.6",
                "MY_DB_PORT_80_TCP_PORT=80",
                "MY_DB_PORT_80_TCP_PROTO=tcp",
                "MY_DB_ENV_FOO=1",
            ]
        );
        let w = Wire { parent: "p".into(), child: "c".into(), alias: "a".into(), block: 16383 };
        assert_eq!((w.parent_ip(), w.child_ip()), (Ipv4Addr::new(169, 254, 255, 253), Ipv4Addr::new(169, 254, 255, 254)));
    }

    proptest! {
        #[test]
        fn accepted_links_name_containers(s in "[/a-z0-9:._ -]{0,30}") {
            if let Ok(l) = parse_links(&[s]) {
                prop_assert!(valid(&l[0].target) && valid(&l[0].alias));
            }
        }
    }
}
