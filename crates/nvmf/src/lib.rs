// SPDX-License-Identifier: Apache-2.0
//! The insitu NVMe/TCP transport: queues, PDUs, controllers, the admin command set and the
//! NVM I/O commands, so a stock Linux host can `nvme connect -t tcp` and mount a namespace.
//!
//! The transport knows no engine and no service. Whoever assembles a target gives each
//! [`NvmSubsystem`] its storage ([`BlockNamespaces`], and [`CommandSetNamespace`]s such as
//! a Key Value namespace) and registers a handler for every vendor command
//! ([`NvmSubsystem::handle`], SPDK's pattern); [`Server::bind`] opens the socket,
//! [`Server::run`] serves until the process ends and [`Server::spawn`] serves on a
//! background thread. Each connection is one queue with its own thread; I/O queues run
//! commands on a few worker threads so a queue can have many commands in flight. A
//! discovery subsystem (`nqn.2014-08.org.nvmexpress.discovery`) lists the NVM subsystems
//! each host may connect to.
#![deny(missing_docs)]

mod config;
mod connection;
mod controller;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod handler;
mod identify;
mod io;
mod jobs;
mod metrics;
mod namespaces;
mod sink;
mod subsystem;

pub use config::{HostLinks, LinkPacer, TransportConfig, DISCOVERY_NQN};
pub use handler::{ControllerRef, Deferred, IoContext, IoHandler, Outcome, Placement};
pub use metrics::{Metrics, MetricsSource};
pub use namespaces::{BlockNamespace, BlockNamespaces, CommandSetNamespace};
pub use subsystem::NvmSubsystem;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use subsystem::{Kind, Subsystem};

/// State shared by every connection of a server.
pub(crate) struct Shared {
    pub(crate) cfg: TransportConfig,
    pub(crate) subsystems: Vec<Arc<Subsystem>>,
    pub(crate) metrics: Arc<Metrics>,
    stopping: AtomicBool,
    connections: Mutex<std::collections::HashMap<u64, TcpStream>>,
    /// The key of the next connection in `connections`.
    next_connection: std::sync::atomic::AtomicU64,
    live: AtomicUsize,
}

/// Most connections served at once; more are closed on accept.
const MAX_CONNECTIONS: usize = 1024;

impl Shared {
    pub(crate) fn subsystem(&self, nqn: &str) -> Option<Arc<Subsystem>> {
        self.subsystems.iter().find(|s| s.nqn == nqn).cloned()
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }
}

/// A bound, not yet serving, NVMe/TCP target.
pub struct Server {
    listener: TcpListener,
    shared: Arc<Shared>,
}

impl Server {
    /// Binds the listen address (port 0 picks a free port) to serve `subsystems`.
    pub fn bind(mut cfg: TransportConfig, subsystems: Vec<NvmSubsystem>) -> std::io::Result<Server> {
        let invalid = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, m);
        if subsystems.is_empty() {
            return Err(invalid("no subsystem configured: give at least one --nqn with a --namespace".into()));
        }
        let mut served: Vec<Arc<Subsystem>> = Vec::new();
        for s in subsystems {
            if s.nqn == DISCOVERY_NQN || !s.nqn.starts_with("nqn.") || s.nqn.len() > 223 {
                return Err(invalid(format!("{:?} is not a usable subsystem NQN (expected nqn.YYYY-MM.reverse.domain:name, at most 223 bytes)", s.nqn)));
            }
            if served.iter().any(|x| x.nqn == s.nqn) {
                return Err(invalid(format!("subsystem {} is configured twice", s.nqn)));
            }
            let (nqn, hosts) = (s.nqn.clone(), s.allow_hosts.clone());
            served.push(Arc::new(Subsystem::new(&nqn, Kind::Nvm(s), hosts)));
        }
        served.push(Arc::new(Subsystem::new(DISCOVERY_NQN, Kind::Discovery, Vec::new())));
        let listener = TcpListener::bind(cfg.listen)?;
        cfg.listen = listener.local_addr()?;
        let shared = Arc::new(Shared {
            cfg,
            subsystems: served,
            metrics: Arc::new(Metrics::default()),
            stopping: AtomicBool::new(false),
            connections: Mutex::new(Default::default()),
            next_connection: Default::default(),
            live: AtomicUsize::new(0),
        });
        Ok(Server { listener, shared })
    }

    /// Tells whether this server still serves, without keeping it alive: a service thread
    /// beside it (an interface reader, say) ends when it stops.
    pub fn stop_token(&self) -> StopToken {
        StopToken(Arc::downgrade(&self.shared))
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.cfg.listen
    }

    /// The server's metrics.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.shared.metrics.clone()
    }

    /// Serves connections until [`ServerHandle::shutdown`] (or forever).
    pub fn run(self) -> std::io::Result<()> {
        loop {
            let accepted = self.listener.accept();
            if self.shared.stopping() {
                break;
            }
            let Ok((stream, peer)) = accepted else {
                // Out of descriptors, say: give the closing connections a moment.
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            };
            let live = self.shared.live.fetch_add(1, Ordering::Relaxed);
            if live >= MAX_CONNECTIONS {
                self.shared.live.fetch_sub(1, Ordering::Relaxed);
                tracing::warn!("refusing a connection: {MAX_CONNECTIONS} are open");
                continue;
            }
            // A second descriptor of each connection, for drop_connections and shutdown;
            // it goes when its connection ends, so a client that vanishes leaves none.
            let key = self.shared.next_connection.fetch_add(1, Ordering::Relaxed);
            if let Ok(c) = stream.try_clone() {
                self.shared.connections.lock().unwrap_or_else(|e| e.into_inner()).insert(key, c);
            }
            let shared = self.shared.clone();
            let spawned = std::thread::Builder::new().name("nvmf-queue".into()).spawn(move || {
                connection::serve(shared.clone(), stream, peer);
                shared.connections.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
                shared.live.fetch_sub(1, Ordering::Relaxed);
            });
            if spawned.is_err() {
                // No thread for it (the process is at its limit): refuse this one, keep serving.
                self.shared.connections.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
                self.shared.live.fetch_sub(1, Ordering::Relaxed);
                tracing::warn!("refusing a connection: cannot start a thread for it");
            }
        }
        Ok(())
    }

    /// Serves on a background thread.
    pub fn spawn(self) -> ServerHandle {
        let shared = self.shared.clone();
        let addr = self.local_addr();
        let thread = std::thread::spawn(move || {
            let _ = self.run();
        });
        ServerHandle { shared, addr, thread: Some(thread) }
    }
}

/// Whether a [`Server`] still serves.
#[derive(Clone)]
pub struct StopToken(Weak<Shared>);

impl StopToken {
    /// True once the server has stopped (or is gone).
    pub fn stopped(&self) -> bool {
        self.0.upgrade().is_none_or(|s| s.stopping())
    }
}

/// A server running on a background thread.
pub struct ServerHandle {
    shared: Arc<Shared>,
    addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
}

impl ServerHandle {
    /// The address served.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server's metrics.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.shared.metrics.clone()
    }

    /// Drops every connection, as if the network failed (for reconnect tests).
    pub fn drop_connections(&self) {
        for (_, c) in self.shared.connections.lock().unwrap_or_else(|e| e.into_inner()).drain() {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Stops accepting, closes every connection and waits for the accept loop to end.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
        self.drop_connections();
        let _ = TcpStream::connect(self.addr); // wakes the accept loop
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop();
        }
    }
}
