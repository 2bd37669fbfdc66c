// SPDX-License-Identifier: Apache-2.0
//! Connection failures: reconnection, transparent retry of reads, unknown outcome of writes.

mod common;

use common::*;
use insitu_initiator::{InitiatorError, Session};
use std::time::{Duration, Instant};

/// Waits until the session has seen its connections close.
fn settle(s: &Session) {
    let t = Instant::now();
    while s.connected() {
        assert!(t.elapsed() < Duration::from_secs(10), "the session did not notice the closed connections");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn read_after_the_target_drops_connections_reconnects() {
    let f = target(Vec::new());
    let s = connect(&f.addr);
    let data = pattern(256 << 10, 3);
    s.write(1, 0, &data).unwrap();
    let cntlid = s.cntlid();
    f.handle.drop_connections();
    settle(&s);
    assert!(!s.connected());
    assert!(s.read(1, 0, 512).unwrap() == data);
    assert!(s.connected());
    let st = s.stats();
    assert_eq!(st.reconnects, 1);
    assert_ne!(s.cntlid(), cntlid, "a new association gets a new controller");
    // Writes reconnect too when nothing was in flight.
    f.handle.drop_connections();
    settle(&s);
    s.write(1, 0, &data).unwrap();
    assert_eq!(s.stats().reconnects, 2);
    // Admin commands as well.
    s.break_queue(0);
    assert_eq!(s.identify_controller().unwrap().subnqn, NQN);
    assert_eq!(s.stats().reconnects, 3);
}

#[test]
fn read_in_flight_is_retried_on_a_new_connection() {
    let f = target(Vec::new());
    let p = Proxy::start(&f.addr);
    let s = Session::connect(opts(&p.addr)).unwrap();
    let data = pattern(3 << 20, 5);
    s.write(1, 0, &data).unwrap();
    p.cut_next(); // the Read capsule is lost and its connection dies
    assert!(s.read(1, 0, (data.len() / 512) as u32).unwrap() == data);
    assert_eq!(s.stats().reconnects, 1);
    p.cut_next();
    assert_eq!(s.identify_namespace(1).unwrap().lba_size, 512);
    assert_eq!(s.stats().reconnects, 2);
}

#[test]
fn write_in_flight_has_an_unknown_outcome() {
    let f = target(Vec::new());
    let p = Proxy::start(&f.addr);
    let s = Session::connect(opts(&p.addr)).unwrap();
    s.identify_namespace(1).unwrap(); // so that the Write is the next thing sent
    p.cut_next();
    let e = s.write(1, 0, &pattern(4096, 1)).unwrap_err();
    assert!(matches!(e, InitiatorError::OutcomeUnknown { command: "Write", .. }), "{e}");
    assert!(e.to_string().contains("may or may not have been written"), "{e}");
    // The next write reconnects and succeeds.
    s.write(1, 0, &pattern(4096, 2)).unwrap();
    assert_eq!(s.read(1, 0, 8).unwrap(), pattern(4096, 2));
    assert_eq!(s.stats().reconnects, 1);
}

#[test]
fn concurrent_readers_share_one_reconnect() {
    let f = target(Vec::new());
    let s = std::sync::Arc::new(connect(&f.addr));
    let data = pattern(64 << 10, 8);
    s.write(1, 0, &data).unwrap();
    f.handle.drop_connections();
    settle(&s);
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (s, data) = (s.clone(), data.clone());
            std::thread::spawn(move || assert!(s.read(1, 0, 128).unwrap() == data))
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(s.stats().reconnects, 1);
}

#[test]
fn keep_alive_keeps_an_idle_session() {
    let f = target(Vec::new());
    // The target closes the admin queue after 2 × KATO without a command.
    let o = insitu_initiator::ConnectOptions { kato_ms: 500, ..opts(&f.addr) };
    let s = Session::connect(o).unwrap();
    let t = Instant::now();
    std::thread::sleep(Duration::from_millis(2500));
    assert!(t.elapsed() >= Duration::from_millis(2500));
    assert_eq!(s.identify_controller().unwrap().subnqn, NQN);
    assert_eq!(s.stats().reconnects, 0, "keep-alive should have kept the association");
}

/// A read-only EXEC whose connection dies in flight is resent on a new association and
/// returns the right result; it is stateless, so running it twice is harmless.
#[test]
fn read_only_exec_in_flight_is_retried() {
    use insitu_proto::{Descriptor, ExecResult, Extent, Value, VirtualObject};
    let f = target(Vec::new());
    let p = Proxy::start(&f.addr);
    let s = Session::connect(opts(&p.addr)).unwrap();
    let data = pattern(1 << 20, 9);
    s.write(1, 0, &data).unwrap();
    let mut d = Descriptor::new("crc32c", vec![VirtualObject { offset: 0, length: data.len() as u64, extents: vec![Extent::data(0, 2048)] }]);
    d.result = Some(VirtualObject { offset: 0, length: 4096, extents: vec![Extent::data(8192, 8)] });
    p.cut_next(); // the EXEC capsule is lost and its connection dies
    let cqe = s.exec_idempotent(1, &d.encode()).unwrap();
    assert_eq!(s.stats().reconnects, 1);
    let result = s.read(1, 8192, 8).unwrap();
    let r = ExecResult::decode(&result[..cqe.dw0 as usize]).unwrap();
    assert_eq!(r.records[0][0].1, Value::Str(format!("{:08x}", crc32c::crc32c(&data))));
}
