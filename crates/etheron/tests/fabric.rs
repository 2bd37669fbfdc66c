// SPDX-License-Identifier: Apache-2.0
//! TRANSMIT_FRAME and RECEIVE_FRAME over NVMe/TCP, served by the real target (insitu-nvmf)
//! on loopback and sent by the real initiator: a target without an interface refuses both
//! with its own status; bad lengths and small buffers are refused; at most 64 receives are
//! held; a frame the kernel sends out of the target's TAP device completes a held receive.
//!
//! The TAP device lives in a network namespace of its own, made by the thread that creates
//! it and gone with the test; nothing is sent anywhere else. Tests that need it are skipped
//! (with a message) when not root or without /dev/net/tun.

use insitu_daemon::{NamespaceSpec, ServerHandle, SubsystemConfig, Target, TargetConfig};
use insitu_etheron::{
    Tap, RECEIVE_BUFFER, RECEIVE_FRAME, STATUS_INVALID_FIELD, STATUS_NO_INTERFACE, STATUS_SGL_LENGTH_INVALID, STATUS_TOO_MANY_RECEIVES, TRANSMIT_FRAME,
};
use insitu_initiator::{Command, ConnectOptions, Session};
use std::fs::File;
use std::net::UdpSocket;
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2024-01.io.insitu:etheron-test";

fn bind(dir: &std::path::Path) -> Target {
    let img = dir.join("ns.img");
    File::create(&img).unwrap().set_len(4 << 20).unwrap();
    let cfg = TargetConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        subsystems: vec![SubsystemConfig { nqn: NQN.into(), namespaces: vec![NamespaceSpec::sharable(&img)], allow_hosts: vec![] }],
        ..TargetConfig::default()
    };
    Target::bind(cfg).unwrap()
}

fn connect(h: &ServerHandle) -> Session {
    let mut o = ConnectOptions::new(h.local_addr().to_string(), NQN);
    (o.io_queues, o.queue_depth, o.timeout) = (1, 100, Duration::from_secs(30));
    Session::connect(o).unwrap()
}

fn transmit(s: &Session, cdw10: u32, frame: &[u8]) -> u16 {
    let mut c = Command::zeroed();
    c.set_opcode(TRANSMIT_FRAME).set_cdw(10, cdw10);
    s.submit(c, Some(frame), 0).unwrap().0.status
}

/// Posts a receive with a `len`-byte buffer; (status, frame).
fn receive(s: &Session, len: usize) -> Result<(u16, Vec<u8>), String> {
    let mut c = Command::zeroed();
    c.set_opcode(RECEIVE_FRAME);
    let (cqe, mut data) = s.submit(c, None, len).map_err(|e| e.to_string())?;
    data.truncate(cqe.dw0 as usize);
    Ok((cqe.status, data))
}

/// A frame to the broadcast address with an EtherType no stack here speaks.
fn frame(len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[..6].fill(0xFF);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
    f[12..14].copy_from_slice(&[0x88, 0xB5]); // local experimental EtherType
    f
}

/// A TAP device with 10.250.0.1/24 in a new network namespace, the namespace (held open so
/// it lives as long as the test) and a UDP socket in it; `None` (after saying why) when
/// this machine cannot make one.
fn private_tap() -> Option<(Tap, File, UdpSocket)> {
    // SAFETY: geteuid has no arguments.
    if unsafe { libc::geteuid() } != 0 || !std::path::Path::new("/dev/net/tun").exists() {
        eprintln!("skipped: needs root and /dev/net/tun for a TAP device in a private network namespace");
        return None;
    }
    std::thread::spawn(|| {
        // SAFETY: unshare(2) with no memory arguments: only this thread moves to a new
        // network namespace (and the `ip` commands it starts).
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare(CLONE_NEWNET): {}", std::io::Error::last_os_error());
        let ns = File::open("/proc/thread-self/ns/net").unwrap();
        let tap = Tap::create(&"10.250.0.1/24".parse().unwrap(), Some("isn-test")).unwrap();
        let udp = UdpSocket::bind("10.250.0.1:0").unwrap();
        Some((tap, ns, udp))
    })
    .join()
    .unwrap()
}

#[test]
fn without_an_interface_both_commands_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let h = bind(dir.path()).spawn();
    let s = connect(&h);
    assert_eq!(transmit(&s, 60, &frame(60)), STATUS_NO_INTERFACE);
    assert_eq!(receive(&s, RECEIVE_BUFFER).unwrap().0, STATUS_NO_INTERFACE);
    assert!(insitu_etheron::status_message(STATUS_NO_INTERFACE).unwrap().contains("--ether ADDR/PREFIX"));
}

#[test]
fn frames_cross_and_bad_commands_are_refused() {
    let Some((tap, _ns, udp)) = private_tap() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = bind(dir.path());
    server.attach_ether(tap).unwrap();
    let metrics = server.metrics();
    let h = server.spawn();
    let s = connect(&h);

    // Transmit: the length in CDW10 must be the data's, and a frame's.
    assert_eq!(transmit(&s, 60, &frame(60)), 0);
    assert_eq!(transmit(&s, 61, &frame(60)), STATUS_INVALID_FIELD);
    assert_eq!(transmit(&s, 10, &[0u8; 10]), STATUS_INVALID_FIELD);
    assert_eq!(transmit(&s, 1519, &frame(1519)), STATUS_INVALID_FIELD);
    // Receive: the buffer must hold 2048 bytes.
    assert_eq!(receive(&s, 1518).unwrap().0, STATUS_SGL_LENGTH_INVALID);

    // A held receive is completed by the next frame the kernel sends out of the device:
    // a datagram to a neighbour on the link makes it ask for its address (ARP).
    std::thread::scope(|sc| {
        let rx = sc.spawn(|| loop {
            let (status, f) = receive(&s, RECEIVE_BUFFER).unwrap();
            assert_eq!(status, 0);
            if f.len() >= 14 && f[12..14] == [0x08, 0x06] {
                return f;
            }
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        while !rx.is_finished() && Instant::now() < deadline {
            let _ = udp.send_to(b"hello", "10.250.0.2:9");
            std::thread::sleep(Duration::from_millis(200));
        }
        let arp = rx.join().unwrap();
        assert_eq!(&arp[..6], &[0xFF; 6], "an ARP request is a broadcast");
        assert_eq!(&arp[38..42], &[10, 250, 0, 2], "asking for 10.250.0.2");
    });
    let text = metrics.render();
    assert!(text.contains("insitu_etheron_frames_total{direction=\"to_target\"} 1"), "{text}");
    assert!(!text.contains("insitu_etheron_frames_total{direction=\"to_host\"} 0"), "{text}");
}

#[test]
fn at_most_64_receives_are_held() {
    let Some((tap, _ns, _udp)) = private_tap() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = bind(dir.path());
    server.attach_ether(tap).unwrap();
    let h = server.spawn();
    let s = connect(&h);
    // 70 receives at once: 64 are held, 6 refused at once. Frames the kernel sends out of
    // the fresh device (IPv6 link-local chatter) may complete a few held ones early; those
    // threads post again, so exactly 6 end refused either way.
    let refused = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|sc| {
        for _ in 0..70 {
            sc.spawn(|| loop {
                match receive(&s, RECEIVE_BUFFER) {
                    Ok((STATUS_TOO_MANY_RECEIVES, _)) => {
                        refused.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        return;
                    }
                    Ok((0, f)) if !f.is_empty() => continue,
                    _ => return, // the connection closed at the end of the test, or idle
                }
            });
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while refused.load(std::sync::atomic::Ordering::SeqCst) < 6 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(refused.load(std::sync::atomic::Ordering::SeqCst), 6);
        h.drop_connections(); // ends the held receives
    });
}
