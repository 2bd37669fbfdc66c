// SPDX-License-Identifier: Apache-2.0
//! Transport tests of [`Queue`] against a scripted fake controller.

use crate::queue::{Counters, QError, Queue};
use insitu_fabric::{opcode, Command, CommonHeader, Completion, Digests, Pdu, SGL_DATA_BLOCK_OFFSET, SGL_TRANSPORT_DATA_BLOCK};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

fn read_pdu(s: &mut TcpStream) -> Pdu {
    let mut h = [0u8; 8];
    s.read_exact(&mut h).unwrap();
    let ch = CommonHeader::parse(&h, 1 << 24).unwrap();
    let mut rest = vec![0u8; ch.plen as usize - 8];
    s.read_exact(&mut rest).unwrap();
    Pdu::decode(&ch, &rest, Digests::default()).unwrap()
}

fn send(s: &mut TcpStream, pdu: Pdu) {
    let mut b = Vec::new();
    pdu.encode(Digests::default(), 0, &mut b);
    s.write_all(&b).unwrap();
}

fn capsule(s: &mut TcpStream) -> (Command, Vec<u8>) {
    match read_pdu(s) {
        Pdu::CapsuleCmd { sqe, data } => (sqe, data),
        other => panic!("expected a command capsule, got {other:?}"),
    }
}

/// A controller that answers ICReq with `maxh2cdata`, then runs `script`; returns a queue
/// connected to it.
fn fake(maxh2cdata: u32, script: impl FnOnce(&mut TcpStream) + Send + 'static) -> (Queue, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        assert!(matches!(read_pdu(&mut s), Pdu::IcReq { pfv: 0, hpda: 0, maxr2t: 0, .. }));
        send(&mut s, Pdu::IcResp { pfv: 0, cpda: 0, digests: Digests::default(), maxh2cdata });
        script(&mut s);
    });
    let q = Queue::open(&addr, 1, Digests::default(), 4, Duration::from_secs(10), Arc::new(Counters::default())).unwrap();
    (q, t)
}

/// Runs one command: reserves an identifier, starts, waits.
fn run(q: &Queue, c: Command, out: &[u8], buf: &mut [u8]) -> Result<(Completion, usize), QError> {
    let cid = q.reserve(true)?.expect("blocking");
    q.start(cid, c, out, buf, false)?.wait()
}

fn ok(cid: u16) -> Pdu {
    Pdu::CapsuleResp { cqe: Completion { cid, sqid: 1, ..Completion::default() } }
}

fn read_cmd() -> Command {
    let mut c = Command::zeroed();
    c.set_opcode(opcode::READ).set_nsid(1);
    c
}

#[test]
fn c2h_data_lands_by_offset() {
    let (q, t) = fake(4096, |s| {
        let (sqe, _) = capsule(s);
        assert_eq!(sqe.sgl(), (0, 8192, SGL_TRANSPORT_DATA_BLOCK));
        send(s, Pdu::C2HData { cccid: sqe.cid(), datao: 4096, last: false, success: false, data: vec![2; 4096] });
        send(s, Pdu::C2HData { cccid: sqe.cid(), datao: 0, last: true, success: false, data: vec![1; 4096] });
        send(s, ok(sqe.cid()));
        // A second read completed by SUCCESS on the last data PDU, without a response.
        let (sqe, _) = capsule(s);
        send(s, Pdu::C2HData { cccid: sqe.cid(), datao: 0, last: true, success: true, data: vec![3; 512] });
    });
    let mut buf = vec![0u8; 8192];
    let (cqe, n) = run(&q, read_cmd(), &[], &mut buf).unwrap();
    assert_eq!((cqe.status, n), (0, 8192));
    assert!(buf[..4096].iter().all(|&b| b == 1) && buf[4096..].iter().all(|&b| b == 2));
    let mut buf = vec![0u8; 512];
    let (cqe, n) = run(&q, read_cmd(), &[], &mut buf).unwrap();
    assert_eq!((cqe.status, n), (0, 512));
    assert_eq!(buf, vec![3; 512]);
    t.join().unwrap();
}

#[test]
fn r2t_is_answered_in_maxh2cdata_pieces() {
    let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
    let expect = data.clone();
    let (q, t) = fake(4096, move |s| {
        let (sqe, inline) = capsule(s);
        assert_eq!(sqe.sgl(), (0, 10_000, SGL_TRANSPORT_DATA_BLOCK));
        assert!(inline.is_empty());
        send(s, Pdu::R2T { cccid: sqe.cid(), ttag: 7, r2to: 0, r2tl: 10_000 });
        let mut got = Vec::new();
        for (i, size) in [4096usize, 4096, 1808].into_iter().enumerate() {
            match read_pdu(s) {
                Pdu::H2CData { cccid, ttag: 7, datao, last, data } => {
                    assert_eq!((cccid, datao as usize, data.len(), last), (sqe.cid(), got.len(), size, i == 2));
                    got.extend(data);
                }
                other => panic!("expected H2CData, got {other:?}"),
            }
        }
        assert_eq!(got, expect);
        send(s, ok(sqe.cid()));
    });
    let mut c = Command::zeroed();
    c.set_opcode(opcode::WRITE);
    let (cqe, _) = run(&q, c, &data, &mut []).unwrap();
    assert_eq!(cqe.status, 0);
    t.join().unwrap();
}

#[test]
fn small_writes_travel_in_capsule() {
    let (q, t) = fake(4096, |s| {
        let (sqe, data) = capsule(s);
        assert_eq!(sqe.sgl(), (0, 100, SGL_DATA_BLOCK_OFFSET));
        assert_eq!(data, vec![9; 100]);
        send(s, ok(sqe.cid()));
    });
    q.set_in_capsule(8192);
    let mut c = Command::zeroed();
    c.set_opcode(opcode::WRITE);
    run(&q, c, &[9; 100], &mut []).unwrap();
    t.join().unwrap();
}

fn fails_with(script: impl FnOnce(&mut TcpStream, u16) + Send + 'static, want: &str) {
    let (q, t) = fake(4096, move |s| {
        let (sqe, _) = capsule(s);
        script(s, sqe.cid());
        let _ = s.read(&mut [0u8; 1]); // until the host closes
    });
    let mut buf = vec![0u8; 4096];
    let e = run(&q, read_cmd(), &[], &mut buf).unwrap_err();
    let QError::Lost(reason) = e else { panic!("{e:?}") };
    assert!(reason.contains(want), "{reason:?} should mention {want:?}");
    assert!(q.is_closed());
    assert!(matches!(run(&q, read_cmd(), &[], &mut buf), Err(QError::NotSent(_))));
    drop(q);
    t.join().unwrap();
}

#[test]
fn c2h_term_req_fails_outstanding_commands() {
    fails_with(|s, _| send(s, Pdu::TermReq { from_host: false, fes: 1, fei: 0, data: Vec::new() }), "invalid PDU header field");
}

#[test]
fn data_beyond_the_buffer_closes_the_queue() {
    fails_with(|s, cid| send(s, Pdu::C2HData { cccid: cid, datao: 4000, last: true, success: false, data: vec![0; 200] }), "overruns");
}

#[test]
fn response_for_an_unknown_cid_closes_the_queue() {
    fails_with(|s, cid| send(s, ok(cid + 1)), "no command outstanding");
}

#[test]
fn garbage_closes_the_queue() {
    fails_with(|s, _| s.write_all(&[0x42; 64]).unwrap(), "invalid PDU header");
}

#[test]
fn host_pdus_from_the_controller_close_the_queue() {
    fails_with(|s, cid| send(s, Pdu::H2CData { cccid: cid, ttag: 0, datao: 0, last: true, data: vec![1] }), "unexpected PDU");
}

#[test]
fn a_closed_connection_fails_the_command() {
    fails_with(|s, _| s.shutdown(std::net::Shutdown::Both).unwrap(), "closed the connection");
}

#[test]
fn r2ts_are_answered_in_the_order_the_controller_asks() {
    // Two writes in flight; the controller asks for the second one's data first and
    // completes nothing until both have arrived. Answering only the command the caller
    // waits on (the first) would stall here.
    let (q, t) = fake(4096, |s| {
        let (a, _) = capsule(s);
        let (b, _) = capsule(s);
        send(s, Pdu::R2T { cccid: b.cid(), ttag: 2, r2to: 0, r2tl: 5000 });
        send(s, Pdu::R2T { cccid: a.cid(), ttag: 1, r2to: 0, r2tl: 5000 });
        let mut got = std::collections::HashMap::<u16, Vec<u8>>::new();
        while got.values().map(Vec::len).sum::<usize>() < 10_000 {
            match read_pdu(s) {
                Pdu::H2CData { cccid, data, .. } => got.entry(cccid).or_default().extend(data),
                other => panic!("expected H2CData, got {other:?}"),
            }
        }
        assert_eq!((got[&a.cid()].clone(), got[&b.cid()].clone()), (vec![1; 5000], vec![2; 5000]));
        send(s, ok(b.cid()));
        send(s, ok(a.cid()));
    });
    let mut c = Command::zeroed();
    c.set_opcode(opcode::WRITE);
    let (one, two) = (vec![1u8; 5000], vec![2u8; 5000]);
    let ta = q.start(q.reserve(true).unwrap().unwrap(), c, &one, &mut [], false).unwrap();
    let tb = q.start(q.reserve(true).unwrap().unwrap(), c, &two, &mut [], false).unwrap();
    assert_eq!(ta.wait().unwrap().0.status, 0);
    assert_eq!(tb.wait().unwrap().0.status, 0);
    t.join().unwrap();
}

#[test]
fn many_threads_waiting_on_one_queue_all_get_their_completions() {
    // Eight threads share a queue of depth 4, so most of the time one thread reads the
    // socket for the others and hands it on when its own command completes. They start each
    // round together and the queue drains at its end, where a waiter left without a reader
    // would hang until the timeout. Each command carries its own data (the CID and a
    // sequence number), so a completion or data routed to the wrong waiter shows.
    const THREADS: usize = 8;
    const EACH: usize = 2000;
    let round = std::sync::Barrier::new(THREADS);
    let (q, t) = fake(4096, |s| loop {
        s.set_nodelay(true).unwrap();
        let mut h = [0u8; 8];
        if s.read_exact(&mut h).is_err() {
            return; // the host closed the queue
        }
        let ch = CommonHeader::parse(&h, 1 << 24).unwrap();
        let mut rest = vec![0u8; ch.plen as usize - 8];
        s.read_exact(&mut rest).unwrap();
        let Pdu::CapsuleCmd { sqe, .. } = Pdu::decode(&ch, &rest, Digests::default()).unwrap() else { panic!("expected a command") };
        let mut data = vec![0u8; 64];
        data[..2].copy_from_slice(&sqe.cid().to_le_bytes());
        data[2..6].copy_from_slice(&sqe.cdw(10).to_le_bytes());
        // Data and response in one write: no waiting on delayed acknowledgements.
        let mut b = Vec::new();
        Pdu::C2HData { cccid: sqe.cid(), datao: 0, last: true, success: false, data }.encode(Digests::default(), 0, &mut b);
        ok(sqe.cid()).encode(Digests::default(), 0, &mut b);
        s.write_all(&b).unwrap();
    });
    // A failing thread goes on meeting the others at each round, so that none waits forever.
    let failed = std::sync::Mutex::new(None);
    std::thread::scope(|scope| {
        for thread in 0..THREADS {
            let (q, round, failed) = (&q, &round, &failed);
            scope.spawn(move || {
                for i in 0..EACH {
                    round.wait();
                    if failed.lock().unwrap().is_some() {
                        continue;
                    }
                    let seq = (thread * EACH + i) as u32;
                    if let Err(e) = one_read(q, seq) {
                        failed.lock().unwrap().get_or_insert(format!("thread {thread}, command {i}: {e}"));
                    }
                }
            });
        }
    });
    assert_eq!(failed.into_inner().unwrap(), None);
    drop(q);
    t.join().unwrap();
}

/// Reads 64 bytes with `seq` in dword 10 and checks that the data is that command's.
fn one_read(q: &Queue, seq: u32) -> Result<(), String> {
    let mut c = read_cmd();
    c.set_cdw(10, seq);
    let mut buf = [0u8; 64];
    let cid = q.reserve(true).map_err(|e| format!("{e:?}"))?.expect("blocking");
    let (cqe, n) = q.start(cid, c, &[], &mut buf, false).and_then(|t| t.wait()).map_err(|e| format!("{e:?}"))?;
    if (cqe.status, n) != (0, 64) {
        return Err(format!("status {:#x}, {n} bytes", cqe.status));
    }
    if u16::from_le_bytes([buf[0], buf[1]]) != cqe.cid || u32::from_le_bytes(buf[2..6].try_into().unwrap()) != seq {
        return Err("data of another command".into());
    }
    Ok(())
}
