// SPDX-License-Identifier: Apache-2.0
//! The Docker Engine API on a target, for the stock docker CLI and the Docker SDKs: what
//! each endpoint offers, refuses or does not offer yet is tabled in `docs/containers.md`.
//!
//! hyper does the HTTP; this module routes requests to the image store and the runtime
//! and speaks the protocol details the CLI depends on: version negotiation through
//! `/_ping` (API 1.47 advertised; newer CLIs refuse anything older than 1.24 and warn on
//! very old ones), `/containers/{id}/wait` answering its headers before `start`, hijacked
//! `attach` with the multiplexed stream framing (raw with a TTY), 404 at create for an
//! unknown image (the CLI then pulls and retries), JSON progress for pull, detach keys
//! on a TTY attach (see `detach`), and `{"message"}` errors with real status codes.
//!
//! The handlers: `create` (every `Config`/`HostConfig` field honoured or refused, with
//! `host_config`), `inspect`, `containers` (life cycle), `streams` (attach, logs),
//! `exec`, `manage` (rename, prune, top, stats, update, changes), `archive` (cp,
//! export), `images`, `image_io` (import, save, commit), `distribution` (push,
//! search), `build`, `volumes`, `networks`,
//! `system` (ping, version, info, events, df); `filters` reads the `filters` parameter.

pub(crate) mod archive;
mod attach_ws;
mod body;
pub(crate) mod build;
pub(crate) mod containers;
pub(crate) mod create;
pub(crate) mod detach;
pub(crate) mod distribution;
pub(crate) mod exec;
pub(crate) mod filters;
pub(crate) mod host_config;
pub(crate) mod image_io;
pub(crate) mod images;
pub(crate) mod inspect;
pub(crate) mod manage;
pub(crate) mod networks;
pub(crate) mod streams;
mod system;
pub(crate) mod volumes;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::runtime::Runtime;
use body::error;
pub use body::ApiBody;

/// The API version this server speaks.
pub const API_VERSION: &str = "1.47";
/// The oldest API version it accepts from clients.
pub const MIN_API_VERSION: &str = "1.24";
/// The endpoints of swarm mode, answered as by a Docker host that is not in a swarm.
const SWARM: &[&str] = &["swarm", "nodes", "services", "tasks", "secrets", "configs"];
/// Largest JSON request body (create).
const MAX_JSON: usize = 1 << 20;
/// Largest request head: hyper answers a bigger one with an error and closes.
const MAX_HEAD: usize = 64 << 10;

/// A running API server.
pub struct DockerServer {
    addr: SocketAddr,
    thread: Option<std::thread::JoinHandle<()>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl DockerServer {
    /// Binds `listen` now (so a bad address fails here, with a clear error) and serves the
    /// API from a thread of its own until [`DockerServer::stop`].
    pub fn spawn(listen: SocketAddr, runtime: Arc<Runtime>) -> std::io::Result<DockerServer> {
        let std_listener = std::net::TcpListener::bind(listen)?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        let parked = Arc::new(detach::ParkedStdins::default());
        let tokio_rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("insitu-docker").enable_all().build()?;
        let thread = std::thread::Builder::new().name("insitu-docker-api".into()).spawn(move || {
            tokio_rt.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(std_listener) else { return };
                loop {
                    tokio::select! {
                        _ = &mut stop_rx => break,
                        accepted = listener.accept() => {
                            let Ok((stream, _)) = accepted else { continue };
                            let (rt, parked) = (runtime.clone(), parked.clone());
                            tokio::spawn(async move {
                                let svc = service_fn(move |req| route(rt.clone(), parked.clone(), req));
                                let _ = http1::Builder::new().max_buf_size(MAX_HEAD).serve_connection(TokioIo::new(stream), svc).with_upgrades().await;
                            });
                        }
                    }
                }
                runtime.shutdown().await;
            });
        })?;
        Ok(DockerServer { addr, thread: Some(thread), stop: Some(stop_tx) })
    }

    /// The address served.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving and stops the containers.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for DockerServer {
    fn drop(&mut self) {
        self.halt();
    }
}

/// A request's path split into segments (after the `/vX.Y` prefix) and its query.
pub(crate) struct Target {
    pub segs: Vec<String>,
    pub query: HashMap<String, String>,
    /// The API version of the path's `/vMAJOR.MINOR` prefix; `None`: none given (the
    /// newest).
    pub version: Option<(u32, u32)>,
}

impl Target {
    pub(crate) fn parse(uri: &hyper::Uri) -> Target {
        Target::from_parts(uri.path(), uri.query())
    }

    /// A request target from its path and query, as they came (percent-encoded).
    pub(crate) fn from_parts(path: &str, raw_query: Option<&str>) -> Target {
        let mut path = path;
        let mut version = None;
        if let Some(rest) = path.strip_prefix("/v") {
            if let Some(i) = rest.find('/') {
                if rest[..i].split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())) {
                    let mut parts = rest[..i].split('.').map(|p| p.parse::<u32>().unwrap_or(u32::MAX));
                    version = Some((parts.next().unwrap_or(0), parts.next().unwrap_or(0)));
                    path = &rest[i..];
                }
            }
        }
        let segs =
            path.split('/').filter(|s| !s.is_empty()).map(|s| urlencoding::decode(s).map(|c| c.into_owned()).unwrap_or_else(|_| s.to_string())).collect();
        let mut query = HashMap::new();
        for kv in raw_query.unwrap_or("").split('&').filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            let dec = |s: &str| urlencoding::decode(&s.replace('+', " ")).map(|c| c.into_owned()).unwrap_or_default();
            query.insert(dec(k), dec(v));
        }
        Target { segs, query, version }
    }

    /// Checks a `platform` parameter: containers on a target run linux/amd64 images only
    /// (an empty or absent one is that).
    pub fn platform(&self) -> Result<(), String> {
        match self.get("platform") {
            None | Some("linux") | Some("linux/amd64") | Some("linux/x86_64") => Ok(()),
            Some(p) => Err(format!("platform {p:?} is not supported on this target: it runs linux/amd64 images")),
        }
    }

    /// Whether the request speaks API `major.minor` or later (one without a version
    /// speaks the newest).
    pub fn at_least(&self, major: u32, minor: u32) -> bool {
        self.version.is_none_or(|v| v >= (major, minor))
    }

    /// A boolean query parameter (`1`, `true`, or present without a value).
    pub fn flag(&self, k: &str) -> bool {
        self.query.get(k).is_some_and(|v| matches!(v.as_str(), "1" | "true" | "True" | ""))
    }

    /// A query parameter.
    pub fn get(&self, k: &str) -> Option<&str> {
        self.query.get(k).map(String::as_str).filter(|s| !s.is_empty())
    }
}

/// Reads a JSON request body of at most [`MAX_JSON`] bytes (an empty body reads as `{}`).
pub(crate) async fn read_json(req: Request<Incoming>) -> Result<serde_json::Value, Response<ApiBody>> {
    let bytes: Bytes = Limited::new(req.into_body(), MAX_JSON)
        .collect()
        .await
        .map_err(|e| error(400, &format!("request body: {e} (at most {MAX_JSON} bytes of JSON)")))?
        .to_bytes();
    json_body(&bytes).map_err(|m| error(400, &m))
}

/// A JSON request body's bytes as a value (blank reads as `{}`, as the CLI sends none
/// for some requests).
pub(crate) fn json_body(bytes: &[u8]) -> Result<serde_json::Value, String> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::json!({}));
    }
    serde_json::from_slice(bytes).map_err(|e| format!("malformed JSON body: {e}"))
}

async fn route(rt: Arc<Runtime>, parked: Arc<detach::ParkedStdins>, req: Request<Incoming>) -> Result<Response<ApiBody>, std::convert::Infallible> {
    let t = Target::parse(req.uri());
    let m = req.method().clone();
    let segs: Vec<&str> = t.segs.iter().map(String::as_str).collect();
    let resp = match (&m, segs.as_slice()) {
        (&Method::GET | &Method::HEAD, ["_ping"]) => system::ping(&m),
        (&Method::GET, ["version"]) => system::version(),
        (&Method::GET, ["info"]) => system::info(&rt),
        (&Method::GET, ["events"]) => system::events(&rt, &t),
        (&Method::GET, ["system", "df"]) => system::df(&rt),
        (&Method::POST, ["images", "create"]) => images::create(&rt, &t, req).await,
        (&Method::POST, ["images", "load"]) => images::load(&rt, req).await,
        (&Method::POST, ["commit"]) => image_io::commit(&rt, &t, req).await,
        (&Method::POST, ["images", "prune"]) => images::prune(&rt, &t),
        (&Method::POST, ["build"]) => build::build(&rt, &t, req).await,
        (&Method::GET, ["images", "search"]) => distribution::search(&rt, &t, req.headers()).await,
        (&Method::POST, ["images", name @ .., "push"]) if !name.is_empty() => distribution::push(&rt, &name.join("/"), &t, req.headers()),
        (&Method::GET, ["images", "get"]) => image_io::save(&rt, image_io::names_of(req.uri().query())).await,
        (&Method::GET, ["images", name @ .., "get"]) if !name.is_empty() => image_io::save(&rt, vec![name.join("/")]).await,
        (&Method::GET, ["images", "json"]) => images::list(&rt, &t),
        (&Method::POST, ["images", name @ .., "tag"]) if !name.is_empty() => images::tag(&rt, &name.join("/"), &t),
        (&Method::GET, ["images", name @ .., "history"]) if !name.is_empty() => images::history(&rt, &name.join("/")),
        (&Method::GET, ["images", name @ .., "json"]) if !name.is_empty() => images::inspect(&rt, &name.join("/")),
        (&Method::DELETE, ["images", name @ ..]) if !name.is_empty() => images::remove(&rt, &name.join("/"), t.flag("force")),
        (&Method::POST, ["containers", "create"]) => create::create(&rt, &t, req).await,
        (&Method::GET, ["containers", "json"]) => containers::list(&rt, &t),
        (&Method::GET, ["containers", id, "json"]) => inspect::inspect(&rt, id),
        (&Method::POST, ["containers", id, "start"]) => containers::start(&rt, id).await,
        (&Method::POST, ["containers", id, "stop"]) => containers::stop(&rt, id, &t).await,
        (&Method::POST, ["containers", id, "restart"]) => containers::restart(&rt, id, &t).await,
        (&Method::POST, ["containers", id, "exec"]) => exec::create(&rt, id, req).await,
        (&Method::POST, ["exec", id, "start"]) => exec::start(&rt, id, req).await,
        (&Method::GET, ["exec", id, "json"]) => exec::inspect(&rt, id),
        (&Method::POST, ["exec", id, "resize"]) => exec::resize(&rt, id, &t),
        (&Method::HEAD, ["containers", id, "archive"]) => archive::head(&rt, id, &t),
        (&Method::GET, ["containers", id, "archive"]) => archive::get(&rt, id, &t).await,
        (&Method::PUT, ["containers", id, "archive"]) => archive::put(&rt, id, &t, req).await,
        (&Method::GET, ["networks"]) => networks::list(&rt, &t),
        (&Method::POST, ["networks", "create"]) => networks::create(&rt, req).await,
        (&Method::POST, ["networks", "prune"]) => networks::prune(&rt, &t),
        (&Method::GET, ["networks", id]) => networks::inspect(&rt, id),
        (&Method::POST, ["networks", id, "connect"]) => networks::connect(&rt, id, req).await,
        (&Method::POST, ["networks", id, "disconnect"]) => networks::disconnect(&rt, id, req).await,
        (&Method::DELETE, ["networks", id]) => networks::remove(&rt, id),
        (&Method::GET, ["volumes"]) => volumes::list(&rt, &t),
        (&Method::POST, ["volumes", "create"]) => volumes::create(&rt, req).await,
        (&Method::POST, ["volumes", "prune"]) => volumes::prune(&rt, &t),
        (&Method::GET, ["volumes", name]) => volumes::inspect(&rt, name),
        (&Method::DELETE, ["volumes", name]) => volumes::remove(&rt, name, &t),
        (&Method::GET, ["containers", id, "export"]) => archive::export(&rt, id).await,
        (&Method::POST, ["containers", "prune"]) => manage::prune(&rt, &t).await,
        (&Method::POST, ["containers", id, "rename"]) => manage::rename(&rt, id, &t),
        (&Method::POST, ["containers", id, "update"]) => manage::update(&rt, id, req).await,
        (&Method::GET, ["containers", id, "changes"]) => manage::changes(&rt, id),
        (&Method::GET, ["containers", id, "top"]) => manage::top(&rt, id, &t).await,
        (&Method::GET, ["containers", id, "stats"]) => manage::stats(&rt, id, &t).await,
        (&Method::POST, ["containers", id, "pause"]) => containers::pause(&rt, id, true).await,
        (&Method::POST, ["containers", id, "unpause"]) => containers::pause(&rt, id, false).await,
        (&Method::POST, ["containers", id, "kill"]) => containers::kill(&rt, id, &t).await,
        (&Method::POST, ["containers", id, "wait"]) => containers::wait(&rt, id, &t),
        (&Method::POST, ["containers", id, "attach"]) => streams::attach(&rt, &parked, id, &t, req),
        (&Method::GET, ["containers", id, "attach", "ws"]) => attach_ws::attach_ws(&rt, &parked, id, &t, req),
        (&Method::POST, ["containers", id, "resize"]) => containers::resize(&rt, id, &t),
        (&Method::GET, ["containers", id, "logs"]) => streams::logs(&rt, id, &t).await,
        (&Method::DELETE, ["containers", id]) if t.flag("link") => containers::remove_link(&rt, id),
        (&Method::DELETE, ["containers", parent, alias]) if t.flag("link") => containers::remove_link(&rt, &format!("{parent}/{alias}")),
        (&Method::DELETE, ["containers", id]) => containers::remove(&rt, id, t.flag("force"), t.flag("v")).await,
        // As a Docker host that is no swarm member answers them.
        (_, [first, ..]) if SWARM.contains(first) => error(
            503,
            "This node is not part of a swarm: a drive is not a cluster member, so swarm, nodes, services, tasks, secrets and configs are not offered",
        ),
        _ => error(404, &format!("page not found: {} {} is not part of the API this target serves", m, req_path(&t))),
    };
    Ok(resp)
}

fn req_path(t: &Target) -> String {
    format!("/{}", t.segs.join("/"))
}

#[cfg(test)]
mod tests {
    use super::Target;

    #[test]
    fn version_prefix_and_query_are_parsed() {
        let t = Target::parse(&"/v1.47/containers/abc/wait?condition=next-exit&x=a%20b".parse().unwrap());
        assert_eq!(t.segs, ["containers", "abc", "wait"]);
        assert_eq!(t.get("condition"), Some("next-exit"));
        assert_eq!(t.get("x"), Some("a b"));
        let t = Target::parse(&"/images/127.0.0.1:5000%2Fbusybox/json".parse().unwrap());
        assert_eq!(t.segs, ["images", "127.0.0.1:5000/busybox", "json"]);
        let t = Target::parse(&"/vx/_ping".parse().unwrap());
        assert_eq!(t.segs, ["vx", "_ping"]);
    }
}
