// SPDX-License-Identifier: Apache-2.0
//! Container networking: the network modes a container may ask for, and published TCP
//! ports served by a userspace proxy in the target daemon (as docker-proxy does).
//!
//! A container runs in a network namespace of its own with loopback only (the default,
//! and `none`), or in the daemon's (`host`). A published port (`-p [IP:]HOSTPORT:PORT`)
//! is a listening socket of the daemon on `IP:HOSTPORT`; each connection accepted there
//! is carried to `127.0.0.1:PORT` *inside* the container's namespace by a socket opened
//! from a thread that entered that namespace with setns(2), and the two sockets are
//! spliced both ways. No bridge, no veth, no NAT: the container reaches nothing outside,
//! and nothing reaches it but through the ports it published.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::RuntimeError;

/// Most connections proxied at once per container.
const MAX_CONNECTIONS: usize = 256;
/// How long a connection waits to be connected inside the container.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The network a container gets (`HostConfig.NetworkMode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// Docker's `default` and `bridge`: a namespace of its own with loopback only,
    /// reachable through its published ports.
    #[default]
    Default,
    /// `none`: a namespace of its own with loopback only; nothing is published.
    None,
    /// `host`: the target daemon's own namespace; ports need no publishing.
    Host,
    /// A user-defined network (named in the container's endpoints): a namespace of its
    /// own linked to the network's bridge, reachable through published ports too.
    User,
}

impl NetworkMode {
    /// Parses `HostConfig.NetworkMode` (absent or empty: the default).
    pub fn parse(s: &str) -> Result<NetworkMode, String> {
        match s {
            "" | "default" | "bridge" => Ok(NetworkMode::Default),
            "none" => Ok(NetworkMode::None),
            "host" => Ok(NetworkMode::Host),
            other if other.len() <= 128 && !other.chars().any(|c| c.is_control() || c == '/' || c == ':') => Ok(NetworkMode::User),
            other => Err(format!(
                "network mode {other:?} is not supported by this target: use --network none, --network host, a user-defined \
                 network's name, or none at all (a namespace of the container's own, reachable through its published ports)"
            )),
        }
    }

    /// The name `inspect` reports (for [`NetworkMode::User`], the network's name is
    /// reported instead).
    pub fn name(self) -> &'static str {
        match self {
            NetworkMode::Default => "default",
            NetworkMode::None => "none",
            NetworkMode::Host => "host",
            NetworkMode::User => "user",
        }
    }
}

/// One published port: `host_ip:host_port` on the target carried to `container_port`
/// in the container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortBinding {
    /// The container's TCP port.
    pub container_port: u16,
    /// The address to listen on; `None`: the default (see [`Publisher`]).
    pub host_ip: Option<IpAddr>,
    /// The port to listen on; 0: one the kernel picks.
    pub host_port: u16,
}

/// Parses a port key of `ExposedPorts` or `PortBindings`: `PORT[/PROTO]`, TCP only.
pub fn parse_port_key(key: &str) -> Result<u16, String> {
    let (port, proto) = key.split_once('/').unwrap_or((key, "tcp"));
    match proto {
        "tcp" => {}
        "udp" | "sctp" => return Err(format!("cannot publish {key}: this target's port proxy carries TCP only; publish a TCP port, or use --network host")),
        _ => return Err(format!("invalid port {key:?}: PORT or PORT/tcp")),
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 && port.bytes().all(|b| b.is_ascii_digit()) => Ok(p),
        _ => Err(format!("invalid port {key:?}: the port is a number from 1 to 65535")),
    }
}

/// Parses a `HostPort`: empty or 0 for one the kernel picks, else 1 to 65535.
pub fn parse_host_port(s: &str) -> Result<u16, String> {
    if s.is_empty() {
        return Ok(0);
    }
    if !s.bytes().all(|b| b.is_ascii_digit()) || s.len() > 5 {
        return Err(format!("invalid host port {s:?}: a number from 1 to 65535 (or empty: any free port)"));
    }
    s.parse::<u16>().map_err(|_| format!("invalid host port {s:?}: a number from 1 to 65535 (or empty: any free port)"))
}

/// Parses a `HostIp`: empty for the default, else an IPv4 or IPv6 address (no names).
pub fn parse_host_ip(s: &str) -> Result<Option<IpAddr>, String> {
    if s.is_empty() {
        return Ok(None);
    }
    let bare = s.strip_prefix('[').and_then(|x| x.strip_suffix(']')).unwrap_or(s);
    bare.parse::<IpAddr>().map(Some).map_err(|_| format!("invalid host IP {s:?}: an IPv4 or IPv6 address, e.g. 127.0.0.1"))
}

/// The published ports of a create request: `HostConfig.PortBindings`, and with
/// `HostConfig.PublishAllPorts` every port of `ExposedPorts` not bound otherwise (on a
/// port the kernel picks). Refuses malformed entries, UDP, and one host address bound
/// twice.
pub fn port_bindings(body: &Value, hc: &Value) -> Result<Vec<PortBinding>, String> {
    let mut out: Vec<PortBinding> = Vec::new();
    match hc.get("PortBindings") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            for (key, list) in m {
                let container_port = parse_port_key(key)?;
                let list = match list {
                    Value::Null => continue,
                    Value::Array(a) => a,
                    _ => return Err(format!("PortBindings[{key:?}] must be a list of {{\"HostIp\", \"HostPort\"}}")),
                };
                for b in list {
                    if !b.is_object() {
                        return Err(format!("PortBindings[{key:?}] must be a list of {{\"HostIp\", \"HostPort\"}}"));
                    }
                    let field = |f: &str| match b.get(f) {
                        None | Some(Value::Null) => Ok(""),
                        Some(Value::String(s)) => Ok(s.as_str()),
                        Some(_) => Err(format!("PortBindings[{key:?}].{f} must be a string")),
                    };
                    let host_ip = parse_host_ip(field("HostIp")?)?;
                    let host_port = parse_host_port(field("HostPort")?)?;
                    out.push(PortBinding { container_port, host_ip, host_port });
                }
            }
        }
        Some(_) => return Err("HostConfig.PortBindings must be an object of PORT/tcp: [{\"HostIp\", \"HostPort\"}]".into()),
    }
    let exposed = exposed_ports(body)?;
    if hc.get("PublishAllPorts").and_then(Value::as_bool).unwrap_or(false) {
        for p in exposed {
            if !out.iter().any(|b| b.container_port == p) {
                out.push(PortBinding { container_port: p, host_ip: None, host_port: 0 });
            }
        }
    }
    for (i, a) in out.iter().enumerate() {
        if a.host_port != 0 && out[..i].iter().any(|b| b.host_port == a.host_port && b.host_ip == a.host_ip) {
            let ip = a.host_ip.map_or_else(|| "the default address".to_string(), |ip| ip.to_string());
            return Err(format!("host port {} on {ip} is published twice: give each binding its own host port", a.host_port));
        }
    }
    Ok(out)
}

/// The TCP ports of `ExposedPorts` (`{"8080/tcp": {}}`), sorted.
pub fn exposed_ports(body: &Value) -> Result<Vec<u16>, String> {
    let mut v = match body.get("ExposedPorts") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(m)) => m.keys().map(|k| parse_port_key(k)).collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err("ExposedPorts must be an object of PORT/tcp: {}".into()),
    };
    v.sort_unstable();
    v.dedup();
    Ok(v)
}

/// A port published for one run: where it listens now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// The container's port.
    pub container_port: u16,
    /// The address the daemon listens on.
    pub host: SocketAddr,
}

/// The published ports of one run. Dropping it closes the listeners and the proxied
/// connections.
pub(crate) struct Proxy {
    ports: Vec<Published>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Where the ports listen.
    pub(crate) fn ports(&self) -> &[Published] {
        &self.ports
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Binds the listeners of `bindings` (those without an address on `default_ip`) and
/// starts carrying their connections into the network namespace of container `id` once
/// runc (state under `runc_root`) reports its process. Binding happens now, so that a
/// port in use fails the start before the container runs (409 when the address is
/// taken). Must be called within a tokio runtime.
pub(crate) fn publish(bindings: &[PortBinding], default_ip: IpAddr, runc_root: &Path, id: &str) -> Result<Proxy, RuntimeError> {
    let mut listeners = Vec::new();
    let mut ports = Vec::new();
    for b in bindings {
        let addr = SocketAddr::new(b.host_ip.unwrap_or(default_ip), b.host_port);
        let l = std::net::TcpListener::bind(addr).map_err(|e| {
            let what = format!("cannot publish port {}/tcp on {addr}", b.container_port);
            match e.kind() {
                std::io::ErrorKind::AddrInUse => RuntimeError::Conflict(format!(
                    "{what}: the address is already in use (another container or program listens there); choose another host port"
                )),
                std::io::ErrorKind::AddrNotAvailable => {
                    RuntimeError::BadRequest(format!("{what}: the target has no such address; use one of its own (e.g. 127.0.0.1)"))
                }
                _ => RuntimeError::Setup(format!("{what}: {e}")),
            }
        })?;
        l.set_nonblocking(true).map_err(|e| RuntimeError::Setup(format!("port {addr}: {e}")))?;
        let host = l.local_addr().map_err(|e| RuntimeError::Setup(format!("port {addr}: {e}")))?;
        ports.push(Published { container_port: b.container_port, host });
        listeners.push((l, b.container_port));
    }
    let (root, id) = (runc_root.to_path_buf(), id.to_string());
    let task = tokio::spawn(async move {
        let Some(netns) = container_netns(&root, &id).await else { return };
        let connector = Connector::spawn(netns);
        let gate = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        // JoinSets abort their tasks when dropped: aborting this task ends every accept
        // loop, and each loop's end every connection it carries.
        let mut loops = tokio::task::JoinSet::new();
        for (l, port) in listeners {
            let Ok(l) = tokio::net::TcpListener::from_std(l) else { continue };
            let (connector, gate) = (connector.clone(), gate.clone());
            loops.spawn(async move {
                let mut conns = tokio::task::JoinSet::new();
                loop {
                    while conns.try_join_next().is_some() {}
                    let client = match l.accept().await {
                        Ok((c, _)) => c,
                        // Out of descriptors, most likely: wait rather than spin.
                        Err(_) => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let Ok(permit) = gate.clone().acquire_owned().await else { return };
                    let connector = connector.clone();
                    conns.spawn(async move {
                        let _permit = permit;
                        if let Some(upstream) = connector.connect(port).await {
                            splice(client, upstream).await;
                        }
                    });
                }
            });
        }
        while loops.join_next().await.is_some() {}
    });
    Ok(Proxy { ports, task })
}

/// The network namespace of a container's process, once runc reports it running (10 s
/// at most). Held open, so that it stays the container's even if the process is gone.
async fn container_netns(runc_root: &Path, id: &str) -> Option<File> {
    for _ in 0..200 {
        let out = tokio::process::Command::new("runc").arg("--root").arg(runc_root).args(["state", id]).output().await.ok();
        let state = out.filter(|o| o.status.success()).and_then(|o| serde_json::from_slice::<Value>(&o.stdout).ok());
        let pid = state.as_ref().filter(|s| matches!(s["status"].as_str(), Some("running" | "created"))).and_then(|s| s["pid"].as_i64()).filter(|&p| p > 0);
        if let Some(f) = pid.and_then(|p| File::open(format!("/proc/{p}/ns/net")).ok()) {
            return Some(f);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// A thread living in a container's network namespace that opens connections there.
#[derive(Clone)]
struct Connector {
    tx: std::sync::mpsc::Sender<(u16, tokio::sync::oneshot::Sender<std::io::Result<std::net::TcpStream>>)>,
}

impl Connector {
    fn spawn(netns: File) -> Connector {
        let (tx, rx) = std::sync::mpsc::channel::<(u16, tokio::sync::oneshot::Sender<std::io::Result<std::net::TcpStream>>)>();
        let _ = std::thread::Builder::new().name("insitu-port-proxy".into()).spawn(move || {
            // SAFETY: setns(2) with a descriptor owned by `netns`, open for the call; it
            // changes the network namespace of this thread only, which does nothing else
            // but open sockets for this container.
            let entered = unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } == 0;
            let why = (!entered).then(std::io::Error::last_os_error);
            drop(netns);
            while let Ok((port, reply)) = rx.recv() {
                let r = match &why {
                    Some(e) => Err(std::io::Error::new(e.kind(), format!("entering the container's network namespace: {e}"))),
                    None => std::net::TcpStream::connect_timeout(&SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port), CONNECT_TIMEOUT),
                };
                let _ = reply.send(r);
            }
        });
        Connector { tx }
    }

    /// A connection to `127.0.0.1:port` in the container; `None` when nothing listens
    /// there (the client's connection is then closed, as docker-proxy does).
    async fn connect(&self, port: u16) -> Option<tokio::net::TcpStream> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.tx.send((port, reply)).ok()?;
        let s = rx.await.ok()?.ok()?;
        s.set_nonblocking(true).ok()?;
        tokio::net::TcpStream::from_std(s).ok()
    }
}

/// Copies both ways until both directions end; a half-close is passed on.
async fn splice(mut a: tokio::net::TcpStream, mut b: tokio::net::TcpStream) {
    let _ = a.set_nodelay(true);
    let _ = b.set_nodelay(true);
    let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn modes_parse() {
        assert_eq!(NetworkMode::parse(""), Ok(NetworkMode::Default));
        assert_eq!(NetworkMode::parse("bridge"), Ok(NetworkMode::Default));
        assert_eq!(NetworkMode::parse("none"), Ok(NetworkMode::None));
        assert_eq!(NetworkMode::parse("host"), Ok(NetworkMode::Host));
        assert!(NetworkMode::parse("container:x").unwrap_err().contains("not supported"));
    }

    #[test]
    fn port_specs_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_port_key("8080/tcp"), Ok(8080));
        assert_eq!(parse_port_key("80"), Ok(80));
        assert!(parse_port_key("53/udp").unwrap_err().contains("TCP only"));
        for bad in ["0/tcp", "65536/tcp", "x/tcp", "+80/tcp", "80/tcpx", "", "/tcp", "80-90/tcp"] {
            assert!(parse_port_key(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_host_port(""), Ok(0));
        assert_eq!(parse_host_port("18080"), Ok(18080));
        for bad in ["x", "70000", "-1", "1-2", "000000080"] {
            assert!(parse_host_port(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_host_ip(""), Ok(None));
        assert_eq!(parse_host_ip("127.0.0.1"), Ok(Some(IpAddr::V4(Ipv4Addr::LOCALHOST))));
        assert_eq!(parse_host_ip("[::1]"), Ok(Some("::1".parse().unwrap())));
        assert!(parse_host_ip("localhost").is_err());

        let body = json!({"ExposedPorts": {"8080/tcp": {}, "9090/tcp": {}}});
        let hc = json!({"PortBindings": {"8080/tcp": [{"HostIp": "127.0.0.1", "HostPort": "18080"}, {"HostIp": "", "HostPort": ""}]}, "PublishAllPorts": true});
        let b = port_bindings(&body, &hc).unwrap();
        assert_eq!(b.len(), 3);
        assert_eq!(b[0], PortBinding { container_port: 8080, host_ip: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)), host_port: 18080 });
        assert_eq!(b[2], PortBinding { container_port: 9090, host_ip: None, host_port: 0 });
        let twice = json!({"PortBindings": {"80/tcp": [{"HostPort": "1"}], "81/tcp": [{"HostPort": "1"}]}});
        assert!(port_bindings(&json!({}), &twice).unwrap_err().contains("twice"));
        for bad in [
            json!({"PortBindings": []}),
            json!({"PortBindings": {"80/tcp": {}}}),
            json!({"PortBindings": {"80/tcp": [{"HostPort": 80}]}}),
            json!({"PortBindings": {"80/tcp": [3]}}),
            json!({"PortBindings": {"80/udp": [{"HostPort": "80"}]}}),
        ] {
            assert!(port_bindings(&json!({}), &bad).is_err(), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn port_keys_accept_exactly_tcp_ports(s in "[0-9a-z/+-]{0,12}") {
            if let Ok(p) = parse_port_key(&s) {
                prop_assert!(p > 0);
                let bare = s.strip_suffix("/tcp").unwrap_or(&s);
                prop_assert_eq!(bare.parse::<u16>().ok(), Some(p));
            }
        }

        #[test]
        fn host_ports_round_trip(p in 1u16..) {
            prop_assert_eq!(parse_host_port(&p.to_string()), Ok(p));
            prop_assert_eq!(parse_port_key(&format!("{p}/tcp")), Ok(p));
        }

        #[test]
        fn random_binding_objects_never_panic(s in ".{0,120}") {
            if let Ok(v) = serde_json::from_str::<Value>(&s) {
                let _ = port_bindings(&v, &json!({"PortBindings": v.clone(), "PublishAllPorts": true}));
                let _ = port_bindings(&json!({"ExposedPorts": v.clone()}), &json!({"PublishAllPorts": true}));
            }
        }
    }
}
