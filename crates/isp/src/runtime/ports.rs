// SPDX-License-Identifier: Apache-2.0
//! Container networking: the network modes a container may ask for, and published TCP
//! and UDP ports served by a userspace proxy in the target daemon (as docker-proxy does).
//!
//! A container runs in a network namespace of its own with loopback only (the default,
//! and `none`), or in the daemon's (`host`). A published port (`-p [IP:]HOSTPORT:PORT`)
//! is a socket of the daemon on `IP:HOSTPORT`. For TCP, each connection accepted there
//! is carried to `127.0.0.1:PORT` *inside* the container's namespace by a socket opened
//! from a thread that entered that namespace with setns(2), and the two sockets are
//! spliced both ways. For UDP (`-p HOSTPORT:PORT/udp`), each client address gets a
//! socket of its own inside the namespace, connected to `127.0.0.1:PORT`: datagrams go
//! in through it and its answers go back to that client from the published port, and a
//! flow idle for [`UDP_FLOW_IDLE`] is forgotten (docker-proxy's connection tracking).
//! No bridge, no veth, no NAT: the container reaches nothing outside, and nothing reaches
//! it but through the ports it published.

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
/// How long a UDP flow (one client address) lives without a datagram either way, as
/// docker-proxy's `UDPConnTrackTimeout`.
pub const UDP_FLOW_IDLE: Duration = Duration::from_secs(90);
/// The largest datagram carried (UDP's own limit).
const UDP_MAX: usize = 65_535;

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

/// A port's transport protocol (the `/tcp` or `/udp` of `80/tcp`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    /// TCP, the default when a port names none.
    #[default]
    Tcp,
    /// UDP.
    Udp,
}

impl Proto {
    /// `tcp` or `udp`, as the API writes it.
    pub fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
}

/// A container's port with its protocol: `80/tcp`, the key of `ExposedPorts`,
/// `PortBindings` and `NetworkSettings.Ports`. Recorded as that text; a bare number (as
/// records of targets that published TCP only kept it) reads as TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortKey {
    /// The port, 1 to 65535.
    pub port: u16,
    /// Its protocol.
    pub proto: Proto,
}

impl PortKey {
    /// A TCP port.
    pub fn tcp(port: u16) -> PortKey {
        PortKey { port, proto: Proto::Tcp }
    }
}

impl std::fmt::Display for PortKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.port, self.proto.name())
    }
}

impl Serialize for PortKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PortKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<PortKey, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Stored {
            Bare(u16),
            Text(String),
        }
        match Stored::deserialize(d)? {
            Stored::Bare(port) => Ok(PortKey::tcp(port)),
            Stored::Text(t) => parse_port_key(&t).map_err(serde::de::Error::custom),
        }
    }
}

/// One published port: `host_ip:host_port` on the target carried to `container_port`
/// (over `proto`) in the container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortBinding {
    /// The container's port.
    pub container_port: u16,
    /// Its protocol (records without one are TCP).
    #[serde(default)]
    pub proto: Proto,
    /// The address to listen on; `None`: the default (see [`Publisher`]).
    pub host_ip: Option<IpAddr>,
    /// The port to listen on; 0: one the kernel picks.
    pub host_port: u16,
}

/// Parses a port key of `ExposedPorts` or `PortBindings`: `PORT[/tcp|/udp]` (TCP when
/// none is named); SCTP is refused by name.
pub fn parse_port_key(key: &str) -> Result<PortKey, String> {
    let (port, proto) = key.split_once('/').unwrap_or((key, "tcp"));
    let proto = match proto {
        "tcp" => Proto::Tcp,
        "udp" => Proto::Udp,
        "sctp" => return Err(format!("cannot publish or expose {key}: this target's port proxy carries TCP and UDP only; use --network host")),
        _ => return Err(format!("invalid port {key:?}: PORT, PORT/tcp or PORT/udp")),
    };
    match port.parse::<u16>() {
        Ok(p) if p > 0 && port.bytes().all(|b| b.is_ascii_digit()) => Ok(PortKey { port: p, proto }),
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
/// port the kernel picks). Refuses malformed entries and one host address bound twice
/// for one protocol.
pub fn port_bindings(body: &Value, hc: &Value) -> Result<Vec<PortBinding>, String> {
    let mut out: Vec<PortBinding> = Vec::new();
    match hc.get("PortBindings") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            for (key, list) in m {
                let PortKey { port: container_port, proto } = parse_port_key(key)?;
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
                    out.push(PortBinding { container_port, proto, host_ip, host_port });
                }
            }
        }
        Some(_) => return Err("HostConfig.PortBindings must be an object of PORT/PROTO: [{\"HostIp\", \"HostPort\"}]".into()),
    }
    let exposed = exposed_ports(body)?;
    if hc.get("PublishAllPorts").and_then(Value::as_bool).unwrap_or(false) {
        for p in exposed {
            if !out.iter().any(|b| b.key() == p) {
                out.push(PortBinding { container_port: p.port, proto: p.proto, host_ip: None, host_port: 0 });
            }
        }
    }
    for (i, a) in out.iter().enumerate() {
        if a.host_port != 0 && out[..i].iter().any(|b| b.host_port == a.host_port && b.host_ip == a.host_ip && b.proto == a.proto) {
            let ip = a.host_ip.map_or_else(|| "the default address".to_string(), |ip| ip.to_string());
            return Err(format!("host port {}/{} on {ip} is published twice: give each binding its own host port", a.host_port, a.proto.name()));
        }
    }
    Ok(out)
}

impl PortBinding {
    /// The container's port and protocol.
    pub fn key(&self) -> PortKey {
        PortKey { port: self.container_port, proto: self.proto }
    }
}

/// The ports of `ExposedPorts` (`{"8080/tcp": {}, "53/udp": {}}`), sorted.
pub fn exposed_ports(body: &Value) -> Result<Vec<PortKey>, String> {
    let mut v = match body.get("ExposedPorts") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(m)) => m.keys().map(|k| parse_port_key(k)).collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err("ExposedPorts must be an object of PORT/PROTO: {}".into()),
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
    /// Its protocol.
    pub proto: Proto,
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

/// A published port's socket on the target, bound before the container runs.
enum Listener {
    Tcp(std::net::TcpListener),
    Udp(std::net::UdpSocket),
}

/// Binds the sockets of `bindings` (those without an address on `default_ip`) and
/// starts carrying their traffic into the network namespace of container `id` once runc
/// (state under `runc_root`) reports its process. Binding happens now, so that a port in
/// use fails the start before the container runs (409 when the address is taken). Must
/// be called within a tokio runtime.
pub(crate) fn publish(bindings: &[PortBinding], default_ip: IpAddr, runc_root: &Path, id: &str) -> Result<Proxy, RuntimeError> {
    let mut listeners = Vec::new();
    let mut ports = Vec::new();
    for b in bindings {
        let addr = SocketAddr::new(b.host_ip.unwrap_or(default_ip), b.host_port);
        let bound = match b.proto {
            Proto::Tcp => std::net::TcpListener::bind(addr).and_then(|l| {
                l.set_nonblocking(true)?;
                Ok((l.local_addr()?, Listener::Tcp(l)))
            }),
            Proto::Udp => std::net::UdpSocket::bind(addr).and_then(|l| {
                l.set_nonblocking(true)?;
                Ok((l.local_addr()?, Listener::Udp(l)))
            }),
        };
        let (host, l) = bound.map_err(|e| {
            let what = format!("cannot publish port {} on {addr}", b.key());
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
        ports.push(Published { container_port: b.container_port, proto: b.proto, host });
        listeners.push((l, b.container_port));
    }
    let (root, id) = (runc_root.to_path_buf(), id.to_string());
    let task = tokio::spawn(async move {
        let Some(netns) = container_netns(&root, &id).await else { return };
        let netns = InNamespace::spawn(netns);
        let gate = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        // JoinSets abort their tasks when dropped: aborting this task ends every accept
        // loop, and each loop's end every connection it carries.
        let mut loops = tokio::task::JoinSet::new();
        for (l, port) in listeners {
            let (netns, gate) = (netns.clone(), gate.clone());
            match l {
                Listener::Tcp(l) => {
                    let Ok(l) = tokio::net::TcpListener::from_std(l) else { continue };
                    loops.spawn(carry_tcp(l, port, netns, gate));
                }
                Listener::Udp(l) => {
                    let Ok(l) = tokio::net::UdpSocket::from_std(l) else { continue };
                    loops.spawn(carry_udp(Arc::new(l), port, netns, gate));
                }
            }
        }
        while loops.join_next().await.is_some() {}
    });
    Ok(Proxy { ports, task })
}

/// Accepts connections on a published TCP port and splices each with one to `port`
/// inside the container.
async fn carry_tcp(l: tokio::net::TcpListener, port: u16, netns: InNamespace, gate: Arc<Semaphore>) {
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
        let netns = netns.clone();
        conns.spawn(async move {
            let _permit = permit;
            let upstream = netns
                .run(move || std::net::TcpStream::connect_timeout(&SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port), CONNECT_TIMEOUT))
                .await
                .and_then(|s| s.set_nonblocking(true).ok().map(|_| s))
                .and_then(|s| tokio::net::TcpStream::from_std(s).ok());
            // Nothing listens there: the client's connection is closed, as docker-proxy does.
            if let Some(upstream) = upstream {
                splice(client, upstream).await;
            }
        });
    }
}

/// Carries datagrams between a published UDP port and `port` inside the container: one
/// flow per client address, each with a socket of its own in the container's namespace
/// (so the container's answers find their way back), gone after [`UDP_FLOW_IDLE`]
/// without traffic. At most the gate's permits of flows live at once; datagrams of
/// further clients are dropped, as an overloaded docker-proxy drops them.
async fn carry_udp(l: Arc<tokio::net::UdpSocket>, port: u16, netns: InNamespace, gate: Arc<Semaphore>) {
    type Flows = std::collections::HashMap<SocketAddr, Arc<tokio::net::UdpSocket>>;
    let flows: Arc<std::sync::Mutex<Flows>> = Arc::default();
    let mut tasks = tokio::task::JoinSet::new();
    let mut buf = vec![0u8; UDP_MAX];
    loop {
        while tasks.try_join_next().is_some() {}
        let (n, client) = recv_from(&l, &mut buf).await;
        let known = flows.lock().unwrap_or_else(|e| e.into_inner()).get(&client).cloned();
        let upstream = match known {
            Some(u) => u,
            None => {
                let Ok(permit) = gate.clone().try_acquire_owned() else { continue };
                let opened = netns
                    .run(move || {
                        let s = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
                        s.connect((Ipv4Addr::LOCALHOST, port))?;
                        s.set_nonblocking(true)?;
                        Ok(s)
                    })
                    .await
                    .and_then(|s| tokio::net::UdpSocket::from_std(s).ok());
                let Some(u) = opened else { continue };
                let u = Arc::new(u);
                flows.lock().unwrap_or_else(|e| e.into_inner()).insert(client, u.clone());
                let (l, u2, flows) = (l.clone(), u.clone(), flows.clone());
                tasks.spawn(async move {
                    let _permit = permit;
                    let mut back = vec![0u8; UDP_MAX];
                    // Answers go back to the client until the flow idles out.
                    while let Ok(Ok(n)) = tokio::time::timeout(UDP_FLOW_IDLE, u2.recv(&mut back)).await {
                        let _ = l.send_to(&back[..n], client).await;
                    }
                    flows.lock().unwrap_or_else(|e| e.into_inner()).remove(&client);
                });
                u
            }
        };
        // A container port with nothing listening answers ICMP; the datagram is lost,
        // as it would be on the wire.
        let _ = upstream.send(&buf[..n]).await;
    }
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

/// The next datagram on `sock`; an error (out of buffers or descriptors, most likely)
/// waits a little rather than spin.
pub(crate) async fn recv_from(sock: &tokio::net::UdpSocket, buf: &mut [u8]) -> (usize, SocketAddr) {
    loop {
        match sock.recv_from(buf).await {
            Ok(x) => return x,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// A thread living in a network namespace (a container's, a network's hub) that runs
/// what is sent to it there: a socket it opens belongs to that namespace for good, and
/// may then be used from anywhere.
#[derive(Clone)]
pub(crate) struct InNamespace {
    tx: std::sync::mpsc::Sender<Job>,
}

/// What [`InNamespace`]'s thread runs: given why the namespace could not be entered, if
/// it could not.
type Job = Box<dyn FnOnce(Option<&std::io::Error>) + Send>;

impl InNamespace {
    /// Starts the thread, which enters `netns` (an open `/proc/PID/ns/net` or
    /// `/run/netns/NAME`) and lives while a handle does.
    pub(crate) fn spawn(netns: File) -> InNamespace {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let _ = std::thread::Builder::new().name("insitu-netns".into()).spawn(move || {
            // SAFETY: setns(2) with a descriptor owned by `netns`, open for the call; it
            // changes the network namespace of this thread only, which does nothing else
            // but run the jobs sent to it.
            let entered = unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } == 0;
            let why = (!entered).then(std::io::Error::last_os_error);
            drop(netns);
            while let Ok(job) = rx.recv() {
                job(why.as_ref());
            }
        });
        InNamespace { tx }
    }

    /// Runs `f` in the namespace; `None` when it fails, or the namespace could not be
    /// entered (nothing is then opened in the daemon's own namespace by mistake).
    pub(crate) async fn run<T: Send + 'static>(&self, f: impl FnOnce() -> std::io::Result<T> + Send + 'static) -> Option<T> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        let job = move |failed: Option<&std::io::Error>| {
            let _ = reply.send(if failed.is_some() { None } else { f().ok() });
        };
        self.tx.send(Box::new(job)).ok()?;
        rx.await.ok()?
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
        assert_eq!(parse_port_key("8080/tcp"), Ok(PortKey::tcp(8080)));
        assert_eq!(parse_port_key("80"), Ok(PortKey::tcp(80)));
        assert_eq!(parse_port_key("53/udp"), Ok(PortKey { port: 53, proto: Proto::Udp }));
        assert_eq!(parse_port_key("53/udp").unwrap().to_string(), "53/udp");
        assert!(parse_port_key("53/sctp").unwrap_err().contains("TCP and UDP only"));
        for bad in ["0/tcp", "65536/tcp", "x/tcp", "+80/tcp", "80/tcpx", "", "/tcp", "80-90/tcp", "80/UDP"] {
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
        assert_eq!(b[0], PortBinding { container_port: 8080, proto: Proto::Tcp, host_ip: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)), host_port: 18080 });
        assert_eq!(b[2], PortBinding { container_port: 9090, proto: Proto::Tcp, host_ip: None, host_port: 0 });
        let twice = json!({"PortBindings": {"80/tcp": [{"HostPort": "1"}], "81/tcp": [{"HostPort": "1"}]}});
        assert!(port_bindings(&json!({}), &twice).unwrap_err().contains("twice"));
        // One host port for TCP and UDP both, as Docker allows.
        let both = json!({"PortBindings": {"53/tcp": [{"HostPort": "5353"}], "53/udp": [{"HostPort": "5353"}]}});
        let b = port_bindings(&json!({}), &both).unwrap();
        assert_eq!(b.iter().map(|b| b.proto).collect::<Vec<_>>(), [Proto::Tcp, Proto::Udp]);
        for bad in [
            json!({"PortBindings": []}),
            json!({"PortBindings": {"80/tcp": {}}}),
            json!({"PortBindings": {"80/tcp": [{"HostPort": 80}]}}),
            json!({"PortBindings": {"80/tcp": [3]}}),
            json!({"PortBindings": {"80/sctp": [{"HostPort": "80"}]}}),
        ] {
            assert!(port_bindings(&json!({}), &bad).is_err(), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn port_keys_accept_exactly_tcp_and_udp_ports(s in "[0-9a-z/+-]{0,12}") {
            if let Ok(p) = parse_port_key(&s) {
                prop_assert!(p.port > 0);
                let bare = s.strip_suffix("/tcp").or_else(|| s.strip_suffix("/udp")).unwrap_or(&s);
                prop_assert_eq!(bare.parse::<u16>().ok(), Some(p.port));
                prop_assert_eq!(p.proto == Proto::Udp, s.ends_with("/udp"));
            }
        }

        #[test]
        fn host_ports_round_trip(p in 1u16..) {
            prop_assert_eq!(parse_host_port(&p.to_string()), Ok(p));
            prop_assert_eq!(parse_port_key(&format!("{p}/tcp")), Ok(PortKey::tcp(p)));
            let udp = PortKey { port: p, proto: Proto::Udp };
            prop_assert_eq!(serde_json::from_value::<PortKey>(serde_json::to_value(udp).unwrap()).unwrap(), udp);
            // Records that kept bare numbers read back as TCP.
            prop_assert_eq!(serde_json::from_value::<PortKey>(json!(p)).unwrap(), PortKey::tcp(p));
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
