// SPDX-License-Identifier: Apache-2.0
//! The key-value service end to end over NVMe/TCP on loopback: a randomized sequence of
//! Store/Retrieve/Delete/Exist/List against a `BTreeMap` model, bad input refused with its
//! NVMe status and leaving data intact, Identify of the KV namespace, and a restart.

mod common;

use common::NQN;
use insitu_daemon::{NamespaceSpec, ServerHandle, SubsystemConfig, Target, TargetConfig};
use insitu_fabric::{Command, SGL_TRANSPORT_DATA_BLOCK};
use insitu_initiator::{ConnectOptions, InitiatorError, Session, StoreMode};
use insitu_kvstore::wire::{opcode, status, Key, KvCommand};
use std::collections::BTreeMap;
use std::path::Path;

/// NSID of the KV namespace: after the sharable and the private one.
const KV_NSID: u32 = 3;

fn serve(dir: &Path, kv_bytes: Option<u64>) -> std::io::Result<ServerHandle> {
    serve_modelled(dir, kv_bytes, None)
}

fn serve_modelled(dir: &Path, kv_bytes: Option<u64>, model: Option<insitu_model::DeviceModel>) -> std::io::Result<ServerHandle> {
    let shared = dir.join("shared.img");
    let private = dir.join("private.img");
    for (p, len) in [(&shared, 4u64 << 20), (&private, 64 << 20)] {
        let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(p).unwrap();
        if f.metadata().unwrap().len() == 0 {
            f.set_len(len).unwrap();
        }
    }
    let cfg = TargetConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        subsystems: vec![SubsystemConfig {
            nqn: NQN.into(),
            namespaces: vec![NamespaceSpec::sharable(&shared), NamespaceSpec::private(&private)],
            allow_hosts: vec![],
        }],
        kv_store: kv_bytes,
        model,
        ..TargetConfig::default()
    };
    Ok(Target::bind(cfg)?.spawn())
}

fn connect(h: &ServerHandle) -> Session {
    Session::connect(ConnectOptions::new(h.local_addr().to_string(), NQN)).unwrap()
}

/// xorshift64*: deterministic, dependency-free randomness.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Key `i` of the test's key space: 1 to 16 bytes, sharing short prefixes.
fn key(i: u64) -> Vec<u8> {
    let len = 1 + (i * 7 % 16) as usize;
    let mut k = format!("{:02x}{i:x}", i % 16).into_bytes();
    k.resize(len.clamp(3, 16), b'.');
    k.truncate(len.max(3));
    k
}

fn status_of(e: &InitiatorError) -> Option<(u16, u8)> {
    e.status_field().map(|s| ((s >> 8) & 7, (s & 0xFF) as u8))
}

/// Sends raw dwords to the KV namespace (for malformed commands).
fn raw(s: &Session, nsid: u32, op: u8, cdw: &[(usize, u32)], out: Option<&[u8]>, data_in: usize) -> (u16, u8, Vec<u8>) {
    let mut c = Command::zeroed();
    c.set_opcode(op).set_nsid(nsid);
    for (i, v) in cdw {
        c.set_cdw(*i, *v);
    }
    let len = out.map_or(data_in, |d| d.len());
    c.set_sgl(0, len as u32, SGL_TRANSPORT_DATA_BLOCK);
    let (cqe, data) = s.submit(c, out, data_in).unwrap();
    ((cqe.status >> 8) & 7, (cqe.status & 0xFF) as u8, data)
}

#[test]
fn randomized_operations_match_a_model() {
    // tmpfs when there is one: the test is about semantics, and each Store is an fsync.
    let dir = if Path::new("/dev/shm").is_dir() { tempfile::tempdir_in("/dev/shm").unwrap() } else { tempfile::tempdir().unwrap() };
    let h = serve(dir.path(), Some(48 << 20)).unwrap();
    let s = connect(&h);
    let ops: u64 = std::env::var("KV_MODEL_OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(200_000);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut counts = [0u64; 5];
    for step in 0..ops {
        let k = key(rng.below(3000));
        match rng.below(100) {
            0..=34 => {
                counts[0] += 1;
                let len = match rng.below(10) {
                    0 => rng.below(20_000),
                    1 => 0,
                    _ => rng.below(300),
                } as usize;
                let v: Vec<u8> = (0..len).map(|i| (i as u64 ^ step) as u8).collect();
                let mode = match rng.below(10) {
                    0 => StoreMode::MustExist,
                    1 => StoreMode::MustNotExist,
                    _ => StoreMode::Upsert,
                };
                let got = s.kv_store(KV_NSID, &k, &v, mode);
                let present = model.contains_key(&k);
                match (mode, present) {
                    (StoreMode::MustExist, false) => assert!(matches!(got, Err(InitiatorError::KeyNotFound { .. })), "step {step}: {got:?}"),
                    (StoreMode::MustNotExist, true) => assert!(matches!(got, Err(InitiatorError::KeyExists { .. })), "step {step}: {got:?}"),
                    _ => {
                        got.unwrap();
                        model.insert(k, v);
                    }
                }
            }
            35..=64 => {
                counts[1] += 1;
                match (s.kv_retrieve(KV_NSID, &k), model.get(&k)) {
                    (Ok(v), Some(m)) => assert_eq!(&v, m, "step {step}: value of {k:?}"),
                    (Err(InitiatorError::KeyNotFound { .. }), None) => {}
                    (got, want) => panic!("step {step}: retrieve {k:?}: {got:?}, model {want:?}"),
                }
            }
            65..=79 => {
                counts[2] += 1;
                let got = s.kv_delete(KV_NSID, &k);
                if model.remove(&k).is_some() {
                    got.unwrap();
                } else {
                    assert!(matches!(got, Err(InitiatorError::KeyNotFound { .. })), "step {step}: {got:?}");
                }
            }
            80..=96 => {
                counts[3] += 1;
                assert_eq!(s.kv_exist(KV_NSID, &k).unwrap(), model.contains_key(&k), "step {step}: exist {k:?}");
            }
            _ => {
                counts[4] += 1;
                let prefix = &k[..(rng.below(3) as usize + 1).min(k.len())];
                let want: Vec<Vec<u8>> = model.range(prefix.to_vec()..).map(|(k, _)| k.clone()).take_while(|k| k.starts_with(prefix)).collect();
                assert_eq!(s.kv_list(KV_NSID, prefix).unwrap(), want, "step {step}: list {prefix:?}");
            }
        }
    }
    // And at the end, all of it.
    let all = s.kv_list(KV_NSID, b"").unwrap();
    assert_eq!(all, model.keys().cloned().collect::<Vec<_>>());
    for (k, v) in &model {
        assert_eq!(&s.kv_retrieve(KV_NSID, k).unwrap(), v);
    }
    eprintln!(
        "{ops} operations (store {}, retrieve {}, delete {}, exist {}, list {}), {} keys at the end: no difference",
        counts[0],
        counts[1],
        counts[2],
        counts[3],
        counts[4],
        model.len()
    );
}

#[test]
fn bad_input_gets_its_status_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let h = serve(dir.path(), Some(16 << 20)).unwrap();
    let s = connect(&h);
    s.kv_store(KV_NSID, b"keep", b"safe", StoreMode::Upsert).unwrap();
    let check_intact = || {
        assert_eq!(s.kv_retrieve(KV_NSID, b"keep").unwrap(), b"safe");
        assert_eq!(s.kv_list(KV_NSID, b"").unwrap(), vec![b"keep".to_vec()]);
    };
    // Keys of 0 and 17 bytes: Invalid Key Size.
    for kl in [0u32, 17] {
        let (sct, sc, _) = raw(&s, KV_NSID, opcode::STORE, &[(10, 3), (11, kl)], Some(b"abc"), 0);
        assert_eq!((sct, sc), (0, status::INVALID_KEY_SIZE), "store, key length {kl}");
        let (sct, sc, _) = raw(&s, KV_NSID, opcode::RETRIEVE, &[(10, 16), (11, kl)], None, 16);
        assert_eq!((sct, sc), (0, status::INVALID_KEY_SIZE), "retrieve, key length {kl}");
        let (sct, sc, _) = raw(&s, KV_NSID, opcode::DELETE, &[(11, kl)], None, 0);
        assert_eq!((sct, sc), (0, status::INVALID_KEY_SIZE), "delete, key length {kl}");
    }
    // The host library refuses such keys before sending.
    assert!(matches!(s.kv_store(KV_NSID, &[7; 17], b"x", StoreMode::Upsert), Err(InitiatorError::InvalidArgument { .. })));
    check_intact();
    // A value over the limit: Invalid Value Size, whatever data follows.
    let (op, cdw) = KvCommand::Store { key: Key::new(b"keep").unwrap(), value_size: (1 << 20) + 1, mode: StoreMode::Upsert }.encode();
    let dw: Vec<(usize, u32)> = [2, 3, 10, 11, 14, 15].iter().map(|&i| (i, cdw[i])).collect();
    let (sct, sc, _) = raw(&s, KV_NSID, op, &dw, Some(b"xyz"), 0);
    assert_eq!((sct, sc), (0, status::INVALID_VALUE_SIZE));
    // A value size that does not match the data sent.
    let (op, cdw) = KvCommand::Store { key: Key::new(b"keep").unwrap(), value_size: 10, mode: StoreMode::Upsert }.encode();
    let dw: Vec<(usize, u32)> = [2, 3, 10, 11, 14, 15].iter().map(|&i| (i, cdw[i])).collect();
    let (sct, sc, _) = raw(&s, KV_NSID, op, &dw, Some(b"xyz"), 0);
    assert_eq!((sct, sc), (0, 0x0F));
    check_intact();
    // List with a buffer too small for its header, or larger than the transfer.
    let (sct, sc, _) = raw(&s, KV_NSID, opcode::LIST, &[(10, 2)], None, 2);
    assert_eq!((sct, sc), (0, 0x02));
    let (sct, sc, _) = raw(&s, KV_NSID, opcode::LIST, &[(10, 8192)], None, 64);
    assert_eq!((sct, sc), (0, 0x0F));
    // Unknown options, unknown opcodes.
    let (sct, sc, _) = raw(&s, KV_NSID, opcode::DELETE, &[(11, 4 | 0x100), (2, u32::from_le_bytes(*b"keep"))], None, 0);
    assert_eq!((sct, sc), (0, 0x02));
    let (sct, sc, _) = raw(&s, KV_NSID, 0x99, &[(11, 4)], None, 0);
    assert_eq!((sct, sc), (0, 0x01));
    // KV commands to a block namespace are block commands there (Exist 14h is no NVM
    // opcode: refused); Retrieve (= Read) to a private or absent one: Invalid Namespace.
    let (sct, sc, _) = raw(&s, 1, opcode::EXIST, &[(11, 4), (2, u32::from_le_bytes(*b"keep"))], None, 0);
    assert_eq!((sct, sc), (0, 0x01));
    let e = s.kv_exist(2, b"keep").unwrap_err();
    assert_eq!(status_of(&e), Some((0, 0x01)), "{e}");
    for nsid in [2, 9] {
        let e = s.kv_retrieve(nsid, b"keep").unwrap_err();
        assert_eq!(status_of(&e), Some((0, 0x0B)), "{e}");
    }
    // Retrieve into a buffer shorter than the value: the start of it, DW0 the full size.
    let (sct, sc, data) = {
        let (op, cdw) = KvCommand::Retrieve { key: Key::new(b"keep").unwrap(), buffer: 2 }.encode();
        let dw: Vec<(usize, u32)> = [2, 3, 10, 11, 14, 15].iter().map(|&i| (i, cdw[i])).collect();
        raw(&s, KV_NSID, op, &dw, None, 2)
    };
    assert_eq!((sct, sc, data), (0, 0, b"sa".to_vec()));
    check_intact();
}

#[test]
fn identify_reports_the_kv_command_set() {
    let dir = tempfile::tempdir().unwrap();
    let h = serve(dir.path(), Some(16 << 20)).unwrap();
    let s = connect(&h);
    assert_eq!(s.active_namespaces().unwrap(), vec![1, KV_NSID]);
    // Namespace Identification Descriptors: the CSI descriptor (type 4) says 01h.
    let mut c = Command::zeroed();
    c.set_opcode(0x06).set_nsid(KV_NSID).set_cdw(10, 0x03);
    let (cqe, d) = s.submit_admin(c, None, 4096).unwrap();
    assert_eq!(cqe.status, 0);
    let mut at = 0;
    let mut found = None;
    while at + 4 <= d.len() && d[at] != 0 {
        let len = usize::from(d[at + 1]);
        if d[at] == 4 {
            found = Some(d[at + 4]);
        }
        at += 4 + len;
    }
    assert_eq!(found, Some(1));
    // CNS 05h, CSI 01h: one KV format, 16-byte keys, 1 MiB values.
    let mut c = Command::zeroed();
    c.set_opcode(0x06).set_nsid(KV_NSID).set_cdw(10, 0x05).set_cdw(11, 1 << 24);
    let (cqe, d) = s.submit_admin(c, None, 4096).unwrap();
    assert_eq!(cqe.status, 0);
    assert_eq!(d[25], 1);
    assert_eq!(u16::from_le_bytes([d[72], d[73]]), 16);
    assert_eq!(u32::from_le_bytes(d[76..80].try_into().unwrap()), 1 << 20);
}

#[test]
fn a_target_without_a_private_namespace_refuses_kv_store() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared.img");
    std::fs::File::create(&shared).unwrap().set_len(4 << 20).unwrap();
    let cfg = TargetConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        subsystems: vec![SubsystemConfig { nqn: NQN.into(), namespaces: vec![NamespaceSpec::sharable(&shared)], allow_hosts: vec![] }],
        kv_store: Some(8 << 20),
        ..TargetConfig::default()
    };
    let e = Target::bind(cfg).err().expect("refused").to_string();
    assert!(e.contains("--private IMG"), "{e}");
    // Too large for the private image.
    assert!(serve(dir.path(), Some(64 << 20)).err().expect("refused").to_string().contains("does not fit"));
}

#[test]
fn stored_data_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = BTreeMap::new();
    {
        let h = serve(dir.path(), Some(16 << 20)).unwrap();
        let s = connect(&h);
        for i in 0..300u64 {
            let v = vec![i as u8; (i as usize * 131) % 5000];
            let k = format!("r{i}").into_bytes();
            s.kv_store(KV_NSID, &k, &v, StoreMode::Upsert).unwrap();
            model.insert(k, v);
        }
        for i in (0..300u64).step_by(3) {
            let k = format!("r{i}").into_bytes();
            s.kv_delete(KV_NSID, &k).unwrap();
            model.remove(&k);
        }
        h.shutdown();
    }
    let h = serve(dir.path(), Some(16 << 20)).unwrap();
    let s = connect(&h);
    assert_eq!(s.kv_list(KV_NSID, b"").unwrap(), model.keys().cloned().collect::<Vec<_>>());
    for (k, v) in &model {
        assert_eq!(&s.kv_retrieve(KV_NSID, k).unwrap(), v);
    }
    // Another --kv-store size over the same image is refused (the KV cache, which keeps
    // the rest of the namespace, notices first), so neither is damaged.
    h.shutdown();
    assert!(serve(dir.path(), Some(8 << 20)).is_err());
}

#[test]
fn a_modelled_drive_paces_the_store() {
    // Programming a page takes 20 ms on this drive: every durable Store writes at least
    // one page before it is acknowledged, so five cannot take less than 100 ms.
    let flash = insitu_model::FlashConfig { program_us: 20_000.0, ..insitu_model::FlashConfig::default() };
    let model = insitu_model::DeviceModel {
        name: "slow".into(),
        description: String::new(),
        source: String::new(),
        flash: Some(flash),
        link: None,
        engine_link: None,
        compute: None,
    };
    let dir = tempfile::tempdir().unwrap();
    let h = serve_modelled(dir.path(), Some(16 << 20), Some(model)).unwrap();
    let s = connect(&h);
    let t = std::time::Instant::now();
    for i in 0..5u64 {
        s.kv_store(KV_NSID, &key(i), b"value", StoreMode::Upsert).unwrap();
    }
    let took = t.elapsed();
    assert!(took >= std::time::Duration::from_millis(100), "five Stores on a 20 ms-per-program drive took {took:?}");
    assert_eq!(s.kv_retrieve(KV_NSID, &key(3)).unwrap(), b"value");
}
