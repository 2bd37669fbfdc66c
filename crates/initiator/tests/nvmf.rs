// SPDX-License-Identifier: Apache-2.0
//! The initiator against the insitu NVMe/TCP target over 127.0.0.1.

mod common;

use common::*;
use insitu_initiator::{ConnectOptions, Digests, InitiatorError, Session, DISCOVERY_NQN};
use std::sync::Arc;

#[test]
fn connect_and_identify() {
    let f = target(Vec::new());
    let s = connect(&f.addr);
    let c = s.identify_controller().unwrap();
    assert_eq!(c.subnqn, NQN);
    assert_eq!(c.cntlid, s.cntlid());
    assert_eq!(c.mdts_bytes, Some(1 << 20));
    assert_eq!(c.in_capsule_bytes(), 32768);
    assert_eq!(c.nn, 1);
    assert_eq!(c.raw.len(), 4096);
    assert_eq!(s.controller().cntlid, s.cntlid());
    assert_eq!(s.io_queue_count(), 1);
    assert_eq!(s.active_namespaces().unwrap(), vec![1]);
    let ns = s.identify_namespace(1).unwrap();
    assert_eq!((ns.nsid, ns.lba_size, ns.nsze), (1, 512, NS_BYTES / 512));
    assert_eq!(ns.size_bytes(), NS_BYTES);
    assert!(matches!(s.identify_namespace(2), Err(InitiatorError::Status { .. } | InitiatorError::NoNamespace { .. })));
    assert_eq!(s.property_get(0x08, 4).unwrap(), u64::from(s.version()));
    assert_eq!(s.property_get(0x1C, 4).unwrap() & 1, 1, "CSTS.RDY");
    let cap = s.property_get(0x00, 8).unwrap();
    assert!(cap & 0xFFFF >= 31, "CAP.MQES {cap:#x}");
    let st = s.stats();
    assert!(st.bytes_sent > 1024 && st.bytes_received > 3 * 4096, "{st:?}");
    s.disconnect().unwrap();
    assert!(matches!(s.read(1, 0, 1), Err(InitiatorError::Disconnected { .. })));
}

#[test]
fn write_and_read_back_at_many_sizes() {
    for f in targets_on_disk() {
        write_and_read_back_at_many_sizes_on(&f);
    }
}

fn write_and_read_back_at_many_sizes_on(f: &Fixture) {
    let s = connect(&f.addr);
    let mut lba = 0u64;
    // In-capsule, exactly the in-capsule limit, R2T, exactly MDTS, beyond MDTS (split).
    for (i, len) in [512usize, 4096, 8192, 8704, 65536, 1 << 20, (3 << 20) + 512].into_iter().enumerate() {
        let data = pattern(len, i as u8);
        let before = s.stats();
        s.write(1, lba, &data).unwrap();
        let sent = s.stats().bytes_sent - before.bytes_sent;
        assert!(sent >= len as u64, "{len}-byte write sent only {sent} bytes");
        let back = s.read(1, lba, (len / 512) as u32).unwrap();
        assert!(back == data, "{len} bytes at LBA {lba} read back differently");
        let mut into = vec![0u8; len];
        s.read_into(1, lba, &mut into).unwrap();
        assert!(into == data);
        lba += (len as u64).div_ceil(512) + 7;
    }
    // Writes and reads must be whole blocks.
    assert!(matches!(s.write(1, 0, &[1, 2, 3]), Err(InitiatorError::InvalidArgument { .. })));
    // Beyond the end of the namespace.
    let e = s.read(1, NS_BYTES / 512 - 1, 2).unwrap_err();
    assert!(matches!(e, InitiatorError::Status { command: "Read", sct: 0, sc: 0x80, .. }), "{e}");
    assert_eq!(e.to_string(), "Read failed: LBA Out of Range (sct 0, sc 0x80)");
}

/// Host Read Commands and Host Write Commands from the SMART log (128-bit counters).
fn host_commands(s: &Session) -> (u128, u128) {
    let log = s.get_log_page(0x02, 512).unwrap();
    let at = |o: usize| u128::from_le_bytes(log[o..o + 16].try_into().unwrap());
    (at(64), at(80))
}

#[test]
fn max_io_bytes_splits_reads_and_writes_on_disk_and_in_memory() {
    for f in [target(Vec::new()), target_with_direct_reads(), target_in_memory()] {
        for digests in [Digests::default(), Digests { header: true, data: true }] {
            let s = Session::connect(ConnectOptions { max_io_bytes: Some(16 << 10), queue_depth: 4, digests, ..opts(&f.addr) }).unwrap();
            let data = pattern(200 << 10, 9);
            let (r0, w0) = host_commands(&s);
            s.write(1, 2048, &data).unwrap();
            let mut back = vec![0u8; data.len()];
            s.read_into(1, 2048, &mut back).unwrap();
            assert!(back == data, "a split read returned other bytes");
            let (r1, w1) = host_commands(&s);
            // 200 KiB in 16 KiB commands: 13 of each.
            assert_eq!((r1 - r0, w1 - w0), (13, 13));
            // Passthrough is held to MDTS, not to the split size.
            let mut c = insitu_initiator::Command::zeroed();
            c.set_opcode(0x02).set_nsid(1).set_cdw(10, 2048).set_cdw(12, 255);
            let (cqe, got) = s.submit(c, None, 128 << 10).unwrap();
            assert_eq!(cqe.status, 0);
            assert!(got[..] == data[..128 << 10]);
        }
    }
    // A split size above MDTS is held to MDTS.
    let f = target(Vec::new());
    let s = Session::connect(ConnectOptions { max_io_bytes: Some(64 << 20), ..opts(&f.addr) }).unwrap();
    let (r0, _) = host_commands(&s);
    s.read(1, 0, 8192).unwrap();
    assert_eq!(host_commands(&s).0 - r0, 4, "4 MiB in 1 MiB (MDTS) reads");
}

#[test]
fn scattered_runs_are_read_into_one_buffer_in_the_order_given() {
    let f = target_in_memory();
    let s = Session::connect(ConnectOptions { max_io_bytes: Some(16 << 10), queue_depth: 4, ..opts(&f.addr) }).unwrap();
    let data = pattern(256 << 10, 5);
    s.write(1, 0, &data).unwrap();
    // Out of order, one run longer than a command, one of a single block.
    let runs = [(300u64, 8u64), (0, 40), (100, 1)];
    let mut got = vec![0u8; 49 * 512];
    let (r0, _) = host_commands(&s);
    s.read_runs_into(1, &runs, &mut got).unwrap();
    let want: Vec<u8> = runs.iter().flat_map(|&(lba, n)| data[lba as usize * 512..][..n as usize * 512].to_vec()).collect();
    assert!(got == want, "the runs came back in another order or with other bytes");
    assert_eq!(host_commands(&s).0 - r0, 4, "40 blocks split in two 16 KiB commands, and one each for the others");
    let mut short = vec![0u8; 48 * 512];
    assert!(matches!(s.read_runs_into(1, &runs, &mut short), Err(InitiatorError::InvalidArgument { .. })));
    s.read_runs_into(1, &[], &mut []).unwrap();
}

#[test]
fn scattered_runs_spread_over_every_queue_come_back_in_the_order_given() {
    let f = target_in_memory();
    let s = Session::connect(ConnectOptions { max_io_bytes: Some(8 << 10), queue_depth: 4, io_queues: 3, ..opts(&f.addr) }).unwrap();
    let data = pattern(512 << 10, 11);
    s.write(1, 0, &data).unwrap();
    // Fewer runs than queues, as many, and many more (shares of uneven length, runs split
    // into several commands, the same blocks twice, out of order).
    let mut x = 7u64;
    for count in [2usize, 3, 5, 17, 64] {
        let runs: Vec<(u64, u64)> = (0..count)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let nlb = 1 + (x >> 33) % 40;
                ((x >> 13) % (1024 - nlb), nlb)
            })
            .collect();
        let mut got = vec![0u8; runs.iter().map(|&(_, n)| n as usize * 512).sum()];
        let (r0, _) = host_commands(&s);
        s.read_runs_into(1, &runs, &mut got).unwrap();
        let want: Vec<u8> = runs.iter().flat_map(|&(lba, n)| data[lba as usize * 512..][..n as usize * 512].to_vec()).collect();
        assert!(got == want, "{count} runs over 3 queues came back in another order or with other bytes");
        let commands: u64 = runs.iter().map(|&(_, n)| n.div_ceil(16)).sum();
        assert_eq!(host_commands(&s).0 - r0, u128::from(commands), "one command per 8 KiB of each run");
    }
}

#[test]
fn pipelined_commands_on_several_sessions_are_answered_each_in_its_own_order() {
    let (f1, f2) = (target_in_memory(), target_in_memory());
    let (s1, s2, gone) = (connect(&f1.addr), connect(&f2.addr), connect(&f2.addr));
    let (d1, d2) = (pattern(64 << 10, 21), pattern(64 << 10, 22));
    s1.write(1, 0, &d1).unwrap();
    s2.write(1, 0, &d2).unwrap();
    gone.disconnect().unwrap();
    let read = |slba: u64, nlb: u32| (insitu_initiator::cmd::rw(0x02, 1, slba, nlb), &[][..], nlb as usize * 512);
    let first = [read(8, 4), read(0, 2)];
    let second = [read(100, 16)];
    let both_ways = [(insitu_initiator::cmd::rw(0x02, 1, 0, 1), &[0u8; 512][..], 512)];
    let jobs = [(&s1, &first[..]), (&gone, &second[..]), (&s2, &second[..]), (&s1, &both_ways[..])];
    let mut done = insitu_initiator::submit_pipelined_all(&jobs).into_iter();
    let one = done.next().unwrap().unwrap();
    assert_eq!(one.len(), 2);
    assert!(one[0].1 == d1[8 * 512..12 * 512] && one[1].1 == d1[..2 * 512], "session 1's reads in the order sent");
    assert!(matches!(done.next().unwrap(), Err(InitiatorError::Disconnected { .. })), "a closed session fails alone");
    let three = done.next().unwrap().unwrap();
    assert!(three[0].0.status == 0 && three[0].1 == d2[100 * 512..116 * 512], "session 2's read");
    assert!(matches!(done.next().unwrap(), Err(InitiatorError::InvalidArgument { .. })), "data both ways is refused before sending");
    assert!(done.next().is_none());
}

#[test]
fn flush_write_zeroes_and_deallocate() {
    for f in targets_on_disk() {
        flush_write_zeroes_and_deallocate_on(&f);
    }
}

fn flush_write_zeroes_and_deallocate_on(f: &Fixture) {
    let s = connect(&f.addr);
    let data = pattern(64 << 10, 9);
    s.write(1, 1000, &data).unwrap();
    s.flush(1).unwrap();
    // Zero blocks 1010..1020 and check the neighbours are untouched.
    s.write_zeroes(1, 1010, 10).unwrap();
    let back = s.read(1, 1000, 128).unwrap();
    assert!(back[..10 * 512] == data[..10 * 512]);
    assert!(back[10 * 512..20 * 512].iter().all(|&b| b == 0));
    assert!(back[20 * 512..] == data[20 * 512..]);
    // Deallocate two ranges; deallocated blocks read as zeroes on this target (DLFEAT).
    s.deallocate(1, &[(1030, 4), (1100, 8)]).unwrap();
    let back = s.read(1, 1000, 128).unwrap();
    assert!(back[30 * 512..34 * 512].iter().all(|&b| b == 0));
    assert!(back[34 * 512..100 * 512] == data[34 * 512..100 * 512]);
    assert!(back[100 * 512..108 * 512].iter().all(|&b| b == 0));
    // More than 256 ranges take several commands.
    let ranges: Vec<(u64, u32)> = (0..300).map(|i| (2000 + 2 * i, 1)).collect();
    s.deallocate(1, &ranges).unwrap();
    // Write Zeroes beyond 65536 blocks takes several commands.
    s.write_zeroes(1, 0, 70_000).unwrap();
    assert!(s.read(1, 1000, 128).unwrap().iter().all(|&b| b == 0));
    let e = s.write_zeroes(1, NS_BYTES / 512, 1).unwrap_err();
    assert!(matches!(e, InitiatorError::Status { command: "Write Zeroes", sc: 0x80, .. }), "{e}");
}

#[test]
fn thirty_two_threads_share_a_session() {
    let f = target(Vec::new());
    let o = ConnectOptions { io_queues: 2, queue_depth: 8, ..opts(&f.addr) };
    let s = Arc::new(Session::connect(o).unwrap());
    assert_eq!(s.io_queue_count(), 2);
    let threads: Vec<_> = (0..32u8)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                let lba = u64::from(t) * 512; // 256 KiB apart
                let data = pattern(96 << 10, t);
                s.write(1, lba, &data).unwrap();
                for _ in 0..20 {
                    assert!(s.read(1, lba, (data.len() / 512) as u32).unwrap() == data, "thread {t} read back other data");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // One large read split into several commands in flight at once.
    let all = s.read(1, 0, 32 * 512).unwrap();
    for t in 0..32usize {
        assert!(all[t * (256 << 10)..][..96 << 10] == pattern(96 << 10, t as u8)[..]);
    }
}

#[test]
fn digests_on() {
    let f = target(Vec::new());
    let both = Digests { header: true, data: true };
    let s = Session::connect(ConnectOptions { digests: both, ..opts(&f.addr) }).unwrap();
    assert_eq!(s.digests(), both);
    for (i, len) in [512usize, 8192, 100 << 10, (2 << 20) + 4096].into_iter().enumerate() {
        let data = pattern(len, 40 + i as u8);
        s.write(1, 64, &data).unwrap();
        assert!(s.read(1, 64, (len / 512) as u32).unwrap() == data);
    }
    let h = Session::connect(ConnectOptions { digests: Digests { header: true, data: false }, ..opts(&f.addr) }).unwrap();
    assert_eq!(h.digests(), Digests { header: true, data: false });
    assert_eq!(h.read(1, 64, 1).unwrap(), pattern(512, 43));
}

#[test]
fn host_not_in_allow_list_is_refused() {
    let f = target(vec!["nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001".into()]);
    let e = Session::connect(opts(&f.addr)).err().expect("refused");
    assert!(matches!(e, InitiatorError::ConnectRefused { qid: 0, sct: 1, sc: 0x84, .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("Host Not Allowed") && msg.contains(&insitu_initiator::default_hostnqn()), "{msg}");
    // The admitted host gets in.
    let o = ConnectOptions { hostnqn: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001".into(), ..opts(&f.addr) };
    Session::connect(o).unwrap();
}

#[test]
fn unknown_subsystem_is_refused_naming_the_nqn() {
    let f = target(Vec::new());
    let e = Session::connect(ConnectOptions { subnqn: "nqn.2024-01.io.insitu:nope".into(), ..opts(&f.addr) }).err().expect("refused");
    assert!(matches!(e, InitiatorError::ConnectRefused { sct: 1, sc: 0x82, .. }), "{e}");
    assert!(e.to_string().contains("rejected the subsystem NQN"), "Connect Invalid Parameters should point at the Connect data's SUBNQN: {e}");
}

#[test]
fn discovery_log_lists_the_subsystem() {
    let f = target(Vec::new());
    let d = Session::connect(ConnectOptions { subnqn: DISCOVERY_NQN.into(), ..opts(&f.addr) }).unwrap();
    assert_eq!(d.io_queue_count(), 0);
    assert!(matches!(d.read(1, 0, 1), Err(InitiatorError::InvalidArgument { .. })));
    let entries = d.discovery_log().unwrap();
    let e =
        entries.iter().find(|e| e.subnqn == NQN).unwrap_or_else(|| panic!("{NQN} not listed (SUBNQN is at byte 256 of an entry, TRADDR at 512): {entries:?}"));
    let port = f.addr.rsplit(':').next().unwrap();
    assert_eq!((e.trtype, e.adrfam, e.subtype), (3, 1, 2));
    assert_eq!((e.traddr.as_str(), e.trsvcid.as_str()), ("127.0.0.1", port));
    // And the entry is enough to connect.
    let s = Session::connect(ConnectOptions::new(format!("{}:{}", e.traddr, e.trsvcid), e.subnqn.clone())).unwrap();
    assert_eq!(s.active_namespaces().unwrap(), vec![1]);
}

#[test]
fn exec_errors_carry_the_status() {
    let f = target(Vec::new());
    let s = connect(&f.addr);
    let e = s.exec(1, b"definitely not a compute descriptor, but long enough").unwrap_err();
    let InitiatorError::Status { command, sct, sc, .. } = &e else { panic!("{e}") };
    assert_eq!(*command, "Exec");
    assert!(*sct != 0 || *sc != 0);
    assert!(e.status_field().is_some());
    // A passthrough command returns its completion whatever the status.
    let mut c = insitu_initiator::Command::zeroed();
    c.set_opcode(0x7E).set_nsid(1);
    let (cqe, _) = s.submit(c, None, 0).unwrap();
    assert_eq!(cqe.status & 0x7FF, 0x001, "Invalid Command Opcode");
}

/// A host asking for a huge log page must get an error, not make the target allocate it
/// (regression: NUMD was trusted).
#[test]
fn oversized_log_page_requests_are_refused() {
    let f = target(Vec::new());
    let s = connect(&f.addr);
    let mut c = insitu_initiator::Command::zeroed();
    c.set_opcode(0x02).set_nsid(0xFFFF_FFFF).set_cdw(10, 0x02 | (0xFFFF << 16)).set_cdw(11, 0xFFFF);
    let (cqe, data) = s.submit_admin(c, None, 4096).unwrap();
    assert_eq!(cqe.status & 0x7FF, 0x002, "Invalid Field in Command");
    assert!(data.len() <= 4096);
    // A request within limits still works, and the target is alive.
    let smart = s.get_log_page(0x02, 512).unwrap();
    assert_eq!(smart.len(), 512);
    assert_eq!(s.read(1, 0, 1).unwrap().len(), 512);
}

#[test]
fn commands_rotate_over_every_io_queue() {
    let f = common::target(vec![]);
    let proxy = common::Proxy::start(&f.addr);
    let s = Session::connect(ConnectOptions { io_queues: 4, ..common::opts(&proxy.addr) }).unwrap();
    assert_eq!(s.io_queue_count(), 4);
    let before = proxy.bytes_to_host();
    let mut buf = vec![0u8; 65536];
    for i in 0..8u64 {
        s.read_into(1, i * 128, &mut buf).unwrap(); // one at a time
    }
    let after = proxy.bytes_to_host();
    let io: Vec<u64> = after.iter().zip(before.iter().chain(std::iter::repeat(&0))).skip(1).map(|(a, b)| a - b).collect();
    assert_eq!(io.len(), 4, "an admin connection and four I/O connections: {after:?}");
    assert!(io.iter().all(|&b| b >= 2 * 65536), "every I/O queue carried two of the eight reads: {io:?}");
}

#[test]
fn one_scattered_read_uses_every_io_queue() {
    let f = common::target(vec![]);
    let proxy = common::Proxy::start(&f.addr);
    let s = Session::connect(ConnectOptions { io_queues: 3, ..common::opts(&proxy.addr) }).unwrap();
    let before = proxy.bytes_to_host();
    // Six runs of 64 KiB in one call: two to each queue.
    let runs: Vec<(u64, u64)> = (0..6u64).map(|i| (i * 300, 128)).collect();
    let mut buf = vec![0u8; 6 * 65536];
    s.read_runs_into(1, &runs, &mut buf).unwrap();
    let after = proxy.bytes_to_host();
    let io: Vec<u64> = after.iter().zip(before.iter().chain(std::iter::repeat(&0))).skip(1).map(|(a, b)| a - b).collect();
    assert_eq!(io.len(), 3, "an admin connection and three I/O connections: {after:?}");
    assert!(io.iter().all(|&b| b >= 2 * 65536), "every I/O queue carried two of the six runs: {io:?}");
}

#[test]
fn consecutive_reads_of_a_disk_are_merged_yet_answered_one_by_one() {
    let f = target_with_direct_reads();
    let s = Session::connect(ConnectOptions { max_io_bytes: Some(128 << 10), queue_depth: 8, io_queues: 1, ..opts(&f.addr) }).unwrap();
    let data = pattern(5 << 20, 4);
    s.write(1, 64, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    let (r0, _) = host_commands(&s);
    s.read_into(1, 64, &mut back).unwrap();
    assert!(back == data, "merged reads returned other bytes");
    assert_eq!(host_commands(&s).0 - r0, 40, "every command is answered");
    // A run that crosses the end of the namespace: the commands inside it still read, the
    // ones past the end fail with their own status.
    let last = NS_BYTES / 512;
    let mut tail = vec![0u8; 1 << 20];
    match s.read_into(1, last - 1024, &mut tail) {
        Err(InitiatorError::Status { sc, .. }) => assert_eq!(sc, 0x80, "LBA Out of Range"),
        other => panic!("a read past the end must fail with a status, got {other:?}"),
    }
    let mut inside = vec![0u8; 512 << 10];
    s.read_into(1, last - 1024, &mut inside).unwrap();
}

#[test]
fn reads_from_the_page_cache_see_every_write_before_them() {
    for f in targets_on_disk() {
        let s = connect(&f.addr);
        // Read first, so that the pages are cached; then overwrite them three ways (a direct
        // write of whole 4 KiB pages, a 512-byte write through the page cache, zeroes) and
        // read again each time.
        let old = pattern(256 << 10, 1);
        s.write(1, 4096, &old).unwrap();
        assert!(s.read(1, 4096, 512).unwrap() == old);
        let new = pattern(128 << 10, 2);
        s.write(1, 4096 + 64, &new).unwrap();
        let mut want = old.clone();
        want[64 * 512..64 * 512 + new.len()].copy_from_slice(&new);
        assert!(s.read(1, 4096, 512).unwrap() == want, "a direct write over cached pages");
        s.write(1, 4096 + 3, &[7u8; 512]).unwrap();
        want[3 * 512..4 * 512].fill(7);
        assert!(s.read(1, 4096, 512).unwrap() == want, "a 512-byte write");
        s.write_zeroes(1, 4096 + 100, 50).unwrap();
        want[100 * 512..150 * 512].fill(0);
        assert!(s.read(1, 4096, 512).unwrap() == want, "write zeroes over cached pages");
    }
}
