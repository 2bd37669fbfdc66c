// SPDX-License-Identifier: Apache-2.0
//! Shared fixtures: an insitu NVMe/TCP target over a temporary file on 127.0.0.1, and a
//! TCP proxy that can cut connections.
#![allow(dead_code)]

use insitu_daemon::{NamespaceSpec, ServerHandle, SubsystemConfig, Target, TargetConfig};
use insitu_initiator::{ConnectOptions, Session};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The subsystem every fixture serves.
pub const NQN: &str = "nqn.2024-01.io.insitu:test";
/// Namespace size.
pub const NS_BYTES: u64 = 64 << 20;

/// A running target and what it serves.
pub struct Fixture {
    pub handle: ServerHandle,
    pub addr: String,
    _dir: tempfile::TempDir,
}

/// A target with one 64 MiB namespace (512-byte blocks) admitting `allow_hosts` (empty:
/// any host).
pub fn target(allow_hosts: Vec<String>) -> Fixture {
    target_in(tempfile::tempdir().unwrap(), allow_hosts)
}

/// [`target`] with its namespace in memory (tmpfs), where the target reads for itself
/// instead of handing reads to a worker.
pub fn target_in_memory() -> Fixture {
    target_in(tempfile::tempdir_in("/dev/shm").unwrap(), Vec::new())
}

/// [`target`] reading host data with direct I/O into its buffers (`--direct-reads`)
/// instead of sending it from the page cache.
pub fn target_with_direct_reads() -> Fixture {
    target_configured(tempfile::tempdir().unwrap(), Vec::new(), true)
}

/// The disk-backed target both ways: host reads through the page cache (the default) and
/// with direct I/O.
pub fn targets_on_disk() -> [Fixture; 2] {
    [target(Vec::new()), target_with_direct_reads()]
}

fn target_in(dir: tempfile::TempDir, allow_hosts: Vec<String>) -> Fixture {
    target_configured(dir, allow_hosts, false)
}

fn target_configured(dir: tempfile::TempDir, allow_hosts: Vec<String>, direct_reads: bool) -> Fixture {
    let img = dir.path().join("ns.img");
    std::fs::File::create(&img).unwrap().set_len(NS_BYTES).unwrap();
    let cfg = TargetConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        subsystems: vec![SubsystemConfig { nqn: NQN.into(), namespaces: vec![NamespaceSpec::sharable(&img)], allow_hosts }],
        direct_reads,
        ..TargetConfig::default()
    };
    let handle = Target::bind(cfg).unwrap().spawn();
    let addr = handle.local_addr().to_string();
    Fixture { handle, addr, _dir: dir }
}

/// Options for the test subsystem at `addr`, with a short timeout.
pub fn opts(addr: &str) -> ConnectOptions {
    ConnectOptions { timeout: Duration::from_secs(20), ..ConnectOptions::new(addr, NQN) }
}

/// Connects with default options.
pub fn connect(addr: &str) -> Session {
    Session::connect(opts(addr)).unwrap()
}

/// Recognizable bytes: position-dependent, seeded.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed).collect()
}

/// A TCP proxy in front of a target; `cut_next` makes the next host→target bytes vanish
/// and that connection close, as if the network failed with a command in flight.
pub struct Proxy {
    pub addr: String,
    cut: Arc<AtomicBool>,
    /// Bytes sent to the host on each connection, in the order they were accepted.
    to_host: Arc<std::sync::Mutex<Vec<Arc<std::sync::atomic::AtomicU64>>>>,
}

impl Proxy {
    pub fn start(upstream: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let cut = Arc::new(AtomicBool::new(false));
        let to_host = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (up, cut2, counters) = (upstream.to_string(), cut.clone(), to_host.clone());
        std::thread::spawn(move || {
            for host in listener.incoming() {
                let Ok(host) = host else { continue };
                let Ok(target) = TcpStream::connect(&up) else { continue };
                let clone = |s: &TcpStream| s.try_clone().unwrap();
                let up_pair = (clone(&host), clone(&target), Some(cut2.clone()), (clone(&host), clone(&target)));
                std::thread::spawn(move || pump(up_pair.0, up_pair.1, up_pair.2, up_pair.3));
                let both = (clone(&host), clone(&target));
                let counter = Arc::new(std::sync::atomic::AtomicU64::new(0));
                counters.lock().unwrap().push(counter.clone());
                std::thread::spawn(move || pump_counted(target, host, None, both, Some(counter)));
            }
        });
        Proxy { addr, cut, to_host }
    }

    /// Bytes the target has sent to the host on each connection so far, in the order the
    /// connections were made (the admin queue first).
    pub fn bytes_to_host(&self) -> Vec<u64> {
        self.to_host.lock().unwrap().iter().map(|c| c.load(Ordering::SeqCst)).collect()
    }

    /// The next bytes the host sends on any connection are dropped and that connection is
    /// closed.
    pub fn cut_next(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }
}

fn pump(from: TcpStream, to: TcpStream, cut: Option<Arc<AtomicBool>>, both: (TcpStream, TcpStream)) {
    pump_counted(from, to, cut, both, None)
}

fn pump_counted(
    mut from: TcpStream,
    mut to: TcpStream,
    cut: Option<Arc<AtomicBool>>,
    both: (TcpStream, TcpStream),
    count: Option<Arc<std::sync::atomic::AtomicU64>>,
) {
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if cut.as_ref().is_some_and(|c| c.swap(false, Ordering::SeqCst)) {
            break;
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        if let Some(c) = &count {
            c.fetch_add(n as u64, Ordering::SeqCst);
        }
    }
    let _ = both.0.shutdown(Shutdown::Both);
    let _ = both.1.shutdown(Shutdown::Both);
}
