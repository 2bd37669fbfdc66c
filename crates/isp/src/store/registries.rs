// SPDX-License-Identifier: Apache-2.0
//! A target's registry settings, as dockerd's `--insecure-registry` and
//! `--registry-mirror`: which registries may be reached over plain HTTP, and which mirrors
//! are asked first for Docker Hub's images.
//!
//! Loopback (`127.0.0.0/8`, `::1/128`) is always insecure, as dockerd's default: that is
//! how a target reaches a registry on its own machine. Every other registry is HTTPS
//! unless named here, by `HOST[:PORT]` or by a CIDR its address falls in.

use ipnet::IpNet;
use serde_json::{json, Value};
use std::net::{IpAddr, ToSocketAddrs};

/// The ranges insecure on every target.
const DEFAULT_INSECURE: [&str; 2] = ["::1/128", "127.0.0.0/8"];

/// Docker Hub's name as an index.
pub const DOCKER_HUB: &str = "docker.io";

/// Insecure registries and Docker Hub mirrors of one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryConfig {
    cidrs: Vec<IpNet>,
    hosts: Vec<String>,
    mirrors: Vec<String>,
}

impl Default for RegistryConfig {
    /// Loopback insecure, nothing else; no mirrors.
    fn default() -> RegistryConfig {
        RegistryConfig { cidrs: DEFAULT_INSECURE.iter().map(|c| c.parse().expect("static CIDR")).collect(), hosts: Vec::new(), mirrors: Vec::new() }
    }
}

/// Splits `HOST[:PORT]` (`[V6]:PORT` too) into the host, without brackets.
fn host_of(index: &str) -> &str {
    if let Some(rest) = index.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match index.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => index,
    }
}

/// Checks `HOST[:PORT]`: a DNS name or IP address (IPv6 in brackets), an optional port.
fn check_index_name(s: &str) -> Result<(), String> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, tail) = rest.split_once(']').ok_or("an IPv6 address is written [ADDR]:PORT")?;
        h.parse::<std::net::Ipv6Addr>().map_err(|_| format!("{h:?} is not an IPv6 address"))?;
        (h, tail.strip_prefix(':'))
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    if let Some(p) = port {
        p.parse::<u16>().ok().filter(|&p| p > 0).ok_or_else(|| format!("port {p:?} is not a number from 1 to 65535"))?;
    }
    let label_ok =
        |l: &str| !l.is_empty() && l.len() <= 63 && !l.starts_with('-') && !l.ends_with('-') && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if !s.starts_with('[') && (host.is_empty() || host.len() > 253 || !host.split('.').all(label_ok)) {
        return Err(format!("{host:?} is not a host name or IP address"));
    }
    Ok(())
}

impl RegistryConfig {
    /// The settings of `--registry-mirror URL` (each `http[s]://HOST[:PORT][/]`) and
    /// `--insecure-registry HOST[:PORT]|CIDR` (each), over the defaults; an entry that is
    /// not one of these is refused with a message naming it. A mirror over plain HTTP must
    /// be on an insecure registry.
    pub fn new(mirrors: &[String], insecure: &[String]) -> Result<RegistryConfig, String> {
        let mut cfg = RegistryConfig::default();
        for entry in insecure {
            let bad = |why: String| format!("--insecure-registry {entry:?}: {why}; give HOST[:PORT] or a CIDR such as 10.0.0.0/8");
            if entry.contains("://") {
                return Err(bad("it names a registry, not a URL (no scheme)".into()));
            }
            if entry.contains('/') {
                let net: IpNet = entry.parse().map_err(|e| bad(format!("not a CIDR ({e})")))?;
                if !cfg.cidrs.contains(&net.trunc()) {
                    cfg.cidrs.push(net.trunc());
                }
                continue;
            }
            check_index_name(entry).map_err(bad)?;
            if entry == DOCKER_HUB || entry == "index.docker.io" || entry == "registry-1.docker.io" {
                return Err(bad("Docker Hub is always reached over HTTPS".into()));
            }
            if !cfg.hosts.contains(entry) {
                cfg.hosts.push(entry.clone());
            }
        }
        for m in mirrors {
            let mirror = normalise_mirror(m)?;
            let rest = mirror.split_once("://").map_or("", |(_, r)| r).trim_end_matches('/');
            if mirror.starts_with("http://") && !cfg.insecure(rest) {
                return Err(format!(
                    "--registry-mirror {m:?}: plain HTTP is used only for insecure registries; add --insecure-registry {rest} (or serve the mirror over HTTPS)"
                ));
            }
            if !cfg.mirrors.contains(&mirror) {
                cfg.mirrors.push(mirror);
            }
        }
        Ok(cfg)
    }

    /// Whether the registry `index` (`HOST[:PORT]`) may be reached over plain HTTP: named
    /// as insecure, or an address of its host (resolved, as dockerd does) in an insecure
    /// range.
    pub fn insecure(&self, index: &str) -> bool {
        if self.hosts.iter().any(|h| h == index) {
            return true;
        }
        let host = host_of(index);
        let addrs: Vec<IpAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => vec![ip],
            Err(_) => (host, 0).to_socket_addrs().map(|it| it.map(|a| a.ip()).collect()).unwrap_or_default(),
        };
        addrs.iter().any(|ip| self.cidrs.iter().any(|n| n.contains(ip)))
    }

    /// Docker Hub's mirrors, in the order given, each `http[s]://HOST[:PORT]/`.
    pub fn mirrors(&self) -> &[String] {
        &self.mirrors
    }

    /// `RegistryConfig` of `GET /info`, in moby's shape.
    pub fn to_json(&self) -> Value {
        let mut index = serde_json::Map::new();
        index.insert(DOCKER_HUB.into(), json!({"Name": DOCKER_HUB, "Mirrors": self.mirrors, "Secure": true, "Official": true}));
        for h in &self.hosts {
            index.insert(h.clone(), json!({"Name": h, "Mirrors": [], "Secure": false, "Official": false}));
        }
        let cidrs: Vec<String> = self.cidrs.iter().map(IpNet::to_string).collect();
        json!({"InsecureRegistryCIDRs": cidrs, "IndexConfigs": index, "Mirrors": self.mirrors})
    }
}

/// A mirror as `scheme://HOST[:PORT]/`; refused unless it is an http(s) URL of a host
/// without credentials, path, query or fragment.
fn normalise_mirror(m: &str) -> Result<String, String> {
    let bad = |why: &str| format!("--registry-mirror {m:?}: {why}; give http[s]://HOST[:PORT]");
    let (scheme, rest) = m.split_once("://").ok_or_else(|| bad("no scheme"))?;
    if scheme != "http" && scheme != "https" {
        return Err(bad("the scheme must be http or https"));
    }
    let host = rest.strip_suffix('/').unwrap_or(rest);
    if host.contains(['/', '?', '#', '@']) {
        return Err(bad("a mirror has no path, query, fragment or credentials"));
    }
    check_index_name(host).map_err(|e| bad(&e))?;
    Ok(format!("{scheme}://{host}/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn loopback_is_insecure_by_default_and_nothing_else() {
        let c = RegistryConfig::default();
        for h in ["127.0.0.1:5000", "127.9.9.9", "[::1]:5000", "localhost:5000"] {
            assert!(c.insecure(h), "{h}");
        }
        for h in ["10.0.0.1:5000", "[2001:db8::1]:80", "registry.invalid:5000"] {
            assert!(!c.insecure(h), "{h}");
        }
    }

    #[test]
    fn flags_add_hosts_ranges_and_mirrors_in_mobys_shape() {
        let c = RegistryConfig::new(&s(&["http://127.0.0.1:5001", "https://mirror.example.com/"]), &s(&["10.1.2.3/16", "reg.example.com:5000"])).unwrap();
        assert!(c.insecure("10.1.200.7:5000") && c.insecure("reg.example.com:5000") && !c.insecure("reg.example.com:5001"));
        assert_eq!(c.mirrors(), ["http://127.0.0.1:5001/", "https://mirror.example.com/"]);
        let j = c.to_json();
        assert_eq!(j["InsecureRegistryCIDRs"], json!(["::1/128", "127.0.0.0/8", "10.1.0.0/16"]));
        assert_eq!(j["IndexConfigs"]["docker.io"]["Mirrors"], j["Mirrors"]);
        assert_eq!(j["IndexConfigs"]["reg.example.com:5000"], json!({"Name": "reg.example.com:5000", "Mirrors": [], "Secure": false, "Official": false}));
    }

    #[test]
    fn bad_entries_are_refused_by_name() {
        for bad in ["http://x:5000", "10.0.0.0/33", "a b", "x:0", "x:99999", "-x.example", "docker.io", "[zz]:1", ""] {
            let e = RegistryConfig::new(&[], &s(&[bad])).unwrap_err();
            assert!(e.contains("--insecure-registry"), "{bad}: {e}");
        }
        for bad in ["mirror.example.com", "ftp://m", "https://m/path", "https://u:p@m", "https://m/?q", "http://10.0.0.1:5000"] {
            let e = RegistryConfig::new(&s(&[bad]), &[]).unwrap_err();
            assert!(e.contains("--registry-mirror"), "{bad}: {e}");
        }
        assert!(RegistryConfig::new(&s(&["http://10.0.0.1:5000"]), &s(&["10.0.0.0/8"])).is_ok());
    }

    proptest::proptest! {
        #[test]
        fn random_settings_never_panic(m in ".{0,40}", i in ".{0,40}") {
            let _ = RegistryConfig::new(&[m], &[i]);
        }
    }
}
