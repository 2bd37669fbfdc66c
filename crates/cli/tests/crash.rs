// SPDX-License-Identifier: Apache-2.0
//! The `insitu target` daemon under abuse: killed with SIGKILL in the middle of a write
//! stream (everything a completed Flush acknowledged must survive the restart), and fed
//! hostile bytes (it must keep serving other hosts).

use insitu_initiator::{ConnectOptions, InitiatorError, Session};
use std::fs::File;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2024-01.io.insitu:crash-test";
const SECTOR: usize = 512;

/// An `insitu target start --foreground` child process; killed on drop.
struct Daemon {
    child: Child,
    addr: String,
    log: std::path::PathBuf,
}

impl Daemon {
    /// Starts the target on `port` over `image` and waits until it accepts connections.
    fn start(image: &Path, port: u16) -> Daemon {
        let addr = format!("127.0.0.1:{port}");
        let log = image.with_extension(format!("{port}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_insitu"))
            .args(["target", "start", "--foreground", "--listen", &addr, "--nqn", NQN, "--namespace"])
            .arg(image)
            .stdout(Stdio::null())
            .stderr(File::options().create(true).append(true).open(&log).expect("log file"))
            .spawn()
            .expect("spawn insitu target start");
        let mut d = Daemon { child, addr, log };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(&d.addr).is_err() {
            assert!(d.alive(), "the target exited at startup: {}", d.log_text());
            assert!(Instant::now() < deadline, "the target did not listen on {} within 10 s: {}", d.addr, d.log_text());
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn session(&self) -> Session {
        let opts = ConnectOptions { timeout: Duration::from_secs(5), ..ConnectOptions::new(self.addr.clone(), NQN) };
        Session::connect(opts).unwrap_or_else(|e| panic!("connect to {}: {e}\ntarget log:\n{}", self.addr, self.log_text()))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port()
}

/// A sparse image of `len` bytes.
fn image(dir: &Path, len: u64) -> std::path::PathBuf {
    let p = dir.join("ns.img");
    File::create(&p).and_then(|f| f.set_len(len)).expect("image");
    p
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The 512-byte sector `lba` as write number `k` fills it: (k, lba), then noise seeded by both.
fn sector(k: u64, lba: u64) -> [u8; SECTOR] {
    let mut s = [0u8; SECTOR];
    s[..8].copy_from_slice(&k.to_le_bytes());
    s[8..16].copy_from_slice(&lba.to_le_bytes());
    let mut seed = k << 40 ^ lba;
    for c in s[16..].chunks_mut(8) {
        c.copy_from_slice(&splitmix(&mut seed).to_le_bytes());
    }
    s
}

/// What write `k` of `len` bytes at `lba` writes.
fn pattern(k: u64, lba: u64, len: usize) -> Vec<u8> {
    (0..(len / SECTOR) as u64).flat_map(|i| sector(k, lba + i)).collect()
}

/// Reads `len` bytes at `lba` in 1 MiB commands.
fn read(s: &Session, lba: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    for (i, c) in out.chunks_mut(1 << 20).enumerate() {
        s.read_into(1, lba + (i << 20) as u64 / SECTOR as u64, c).expect("read back");
    }
    out
}

/// Every sector of `got` (write `k` at `lba`) is either untouched (zeros) or whole.
fn old_or_new(got: &[u8], k: u64, lba: u64, what: &str) -> usize {
    let mut new = 0;
    for (i, s) in got.chunks(SECTOR).enumerate() {
        let want = sector(k, lba + i as u64);
        if s == want {
            new += 1;
        } else {
            assert!(s.iter().all(|b| *b == 0), "{what}: sector {} is torn (neither old nor new)", lba + i as u64);
        }
    }
    new
}

const SMALL: usize = 256 << 10;
const FLUSH_EVERY: u64 = 4;
const KILL_AFTER_FLUSHES: u64 = 6;
const UNFLUSHED: u64 = 2;
const BIG: usize = 64 << 20;

#[test]
fn flushed_writes_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), 256 << 20);
    let port = free_port();
    let mut daemon = Daemon::start(&img, port);
    let pid = daemon.child.id() as i32;
    let s = daemon.session();
    let lba_of = |k: u64| k * (SMALL / SECTOR) as u64;
    let flushed = AtomicU64::new(0);
    let (go, kill_now) = mpsc::channel::<()>();
    let (big_k, big) = std::thread::scope(|scope| {
        scope.spawn(move || {
            kill_now.recv_timeout(Duration::from_secs(15)).expect("the writer asks for the kill");
            // Long enough for the first commands of the 64 MiB write to be sent, far shorter
            // than the whole write takes.
            std::thread::sleep(Duration::from_millis(5));
            // SAFETY: kill(2) with no memory arguments, on our own child.
            assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0, "kill -9 {pid}");
        });
        let mut k = 0u64;
        let mut flushes = 0;
        while flushes < KILL_AFTER_FLUSHES {
            s.write(1, lba_of(k), &pattern(k, lba_of(k), SMALL)).unwrap_or_else(|e| panic!("write {k} before the kill: {e}"));
            k += 1;
            if k.is_multiple_of(FLUSH_EVERY) {
                s.flush(1).unwrap_or_else(|e| panic!("flush after write {k} before the kill: {e}"));
                flushed.store(k, Ordering::SeqCst);
                flushes += 1;
            }
        }
        for _ in 0..UNFLUSHED {
            s.write(1, lba_of(k), &pattern(k, lba_of(k), SMALL)).expect("unflushed write before the kill");
            k += 1;
        }
        // The last write: 64 one-MiB commands, in flight when the target dies.
        let data = pattern(k, lba_of(k), BIG);
        go.send(()).unwrap();
        (k, s.write(1, lba_of(k), &data))
    });
    // In flight: OutcomeUnknown. Had the reader seen the connection die before the write
    // was sent, the write reconnects first, which fails: Connect, Handshake or
    // ConnectionLost. Never success, never a status from a target.
    match &big {
        Ok(()) => panic!("a write in flight when the target was killed reported success"),
        Err(
            InitiatorError::OutcomeUnknown { .. } | InitiatorError::Connect { .. } | InitiatorError::Handshake { .. } | InitiatorError::ConnectionLost { .. },
        ) => {}
        Err(e) => panic!("unexpected error for the write in flight at the kill: {e}"),
    }
    assert!(s.flush(1).is_err(), "a flush with the target dead reports an error");
    drop(s);
    let status = daemon.child.wait().expect("wait");
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
    drop(daemon);

    let daemon = Daemon::start(&img, port);
    let s = daemon.session();
    let durable = flushed.load(Ordering::SeqCst);
    assert_eq!(durable, KILL_AFTER_FLUSHES * FLUSH_EVERY);
    for k in 0..durable {
        let got = read(&s, lba_of(k), SMALL);
        assert!(got == pattern(k, lba_of(k), SMALL), "write {k} was acknowledged by a completed Flush but reads back different after the restart");
    }
    for k in durable..big_k {
        old_or_new(&read(&s, lba_of(k), SMALL), k, lba_of(k), &format!("unflushed write {k}"));
    }
    let landed = old_or_new(&read(&s, lba_of(big_k), BIG), big_k, lba_of(big_k), "the write in flight");
    eprintln!("in-flight write: {big:?}; {landed} of {} sectors landed", BIG / SECTOR);
    s.disconnect().expect("disconnect");
}

/// Sends `bytes` on a fresh connection, then waits (up to 2 s) for the target to hang up
/// unless `hold`; returns the socket.
fn hostile(addr: &str, bytes: &[u8], close_write: bool) -> TcpStream {
    let mut c = TcpStream::connect(addr).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let _ = c.write_all(bytes);
    if close_write {
        let _ = c.shutdown(Shutdown::Write);
    }
    c
}

/// Reads until the target closes the connection (or 2 s pass).
fn drain(mut c: TcpStream) {
    let mut buf = [0u8; 4096];
    while matches!(c.read(&mut buf), Ok(n) if n > 0) {}
}

fn ic_req() -> Vec<u8> {
    let mut b = vec![0u8; 128];
    b[2] = 128; // HLEN
    b[4..8].copy_from_slice(&128u32.to_le_bytes()); // PLEN
    b
}

/// A command capsule header claiming `plen` bytes, with `sqe` as its command.
fn capsule(plen: u32, sqe: [u8; 64]) -> Vec<u8> {
    let mut b = vec![0x04, 0, 72, if plen > 72 { 72 } else { 0 }];
    b.extend_from_slice(&plen.to_le_bytes());
    b.extend_from_slice(&sqe);
    b
}

#[test]
fn hostile_bytes_do_not_stop_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("ns.img");
    let content = pattern(7, 0, 1 << 20);
    std::fs::write(&img, &content).unwrap();
    let mut daemon = Daemon::start(&img, free_port());
    let addr = daemon.addr.clone();
    let mut seed = 1u64;
    let garbage: Vec<u8> = (0..8192).map(|_| splitmix(&mut seed) as u8).collect();
    let mut connect_sqe = [0u8; 64];
    connect_sqe[0] = 0x7F; // Fabrics
    connect_sqe[4] = 0x01; // Connect
    let mut held = Vec::new();
    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        ("random garbage", garbage.clone(), true),
        ("garbage after a valid ICReq", [ic_req(), garbage].concat(), true),
        ("a capsule with a 4 GiB PDU length", [ic_req(), capsule(0xFFFF_FFF0, connect_sqe)].concat(), true),
        ("a capsule with PDU length 1 MiB, then silence", [ic_req(), capsule(1 << 20, connect_sqe)].concat(), false),
        ("a capsule before ICReq", capsule(72, connect_sqe), true),
        ("a truncated ICReq", ic_req()[..50].to_vec(), true),
        ("a truncated capsule, then EOF", [ic_req(), capsule(72, connect_sqe)[..40].to_vec()].concat(), true),
        ("a truncated capsule, held open", [ic_req(), capsule(72, connect_sqe)[..40].to_vec()].concat(), false),
        ("a Connect with garbage data", [ic_req(), capsule(72 + 1024, connect_sqe), vec![0xFF; 1024]].concat(), true),
        ("H2CData for no command", [ic_req(), vec![0x06, 0x04, 24, 24], 1048u32.to_le_bytes().to_vec(), vec![0; 16], vec![0xAB; 1024]].concat(), true),
        ("nothing at all", Vec::new(), true),
    ];
    for (what, bytes, close) in cases {
        let c = hostile(&addr, &bytes, close);
        if close {
            drain(c);
        } else {
            held.push(c); // keeps a connection thread waiting for bytes that never come
        }
        assert!(daemon.alive(), "the target died after {what}:\n{}", daemon.log_text());
        let s = daemon.session();
        let got = s.read(1, 64, 8).unwrap_or_else(|e| panic!("read after {what}: {e}"));
        assert!(got == content[64 * SECTOR..72 * SECTOR], "wrong data after {what}");
        s.disconnect().unwrap_or_else(|e| panic!("disconnect after {what}: {e}"));
    }
    drop(held);
    assert!(daemon.alive());
}
