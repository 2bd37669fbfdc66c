// SPDX-License-Identifier: Apache-2.0
//! The assembled target's fuzzing harness (cargo feature `fuzzing`): the bytes a stranger
//! sends on a connection, fed to the real connection state machine, controllers, handlers
//! and engine (`insitu_nvmf::fuzzing` without a socket).
//!
//! One target is made per process, its namespaces in memory (/dev/shm where there is one)
//! so that an execution costs no device time: namespaces 1 and 2 sharable, namespace 3
//! private, and one enabled controller of host [`HOSTNQN`] / [`HOSTID`] whose I/O queue 1
//! an input may connect to ([`controller_id`]), so that one input can reach Read, Write,
//! R2T and H2CData, EXEC and the rest without first building a whole association.

use crate::{NamespaceSpec, SubsystemConfig, Target, TargetConfig};
use std::path::PathBuf;
use std::sync::OnceLock;

/// The subsystem the fuzzing target serves.
pub const NQN: &str = "nqn.2024-01.io.insitu:fuzz";
/// The host NQN of the controller made in advance.
pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000f022";
/// The host identifier of the controller made in advance.
pub const HOSTID: [u8; 16] = [0xF0; 16];

struct World {
    /// Bound, never served: inputs reach it without a socket.
    target: Target,
    cntlid: u16,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let dir = |base: PathBuf| {
            let d = base.join(format!("insitu-fuzz-{}", std::process::id()));
            std::fs::create_dir_all(&d).expect("fuzzing work directory");
            d
        };
        let memory = dir(if std::path::Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() });
        let file = |d: &PathBuf, name: &str, len: u64| {
            let p = d.join(name);
            std::fs::File::create(&p).and_then(|f| f.set_len(len)).expect("fuzzing namespace file");
            p
        };
        let namespaces = vec![
            NamespaceSpec::sharable(file(&memory, "ns1.img", 4 << 20)),
            NamespaceSpec::sharable(file(&memory, "ns2.img", 2 << 20)),
            NamespaceSpec::private(file(&memory, "ns3.img", 1 << 20)),
        ];
        let cfg = TargetConfig {
            listen: ([127, 0, 0, 1], 0).into(),
            subsystems: vec![SubsystemConfig { nqn: NQN.into(), namespaces, allow_hosts: vec![] }],
            workers_per_queue: 1,
            ..TargetConfig::default()
        };
        let target = Target::bind(cfg).expect("fuzzing target");
        let cntlid = insitu_nvmf::fuzzing::ready_controller(target.server(), NQN, HOSTNQN, HOSTID).expect("a first controller");
        // The target holds its files open: their names can go now. The world lives as
        // long as the process, and a static is never dropped to remove them later.
        let _ = std::fs::remove_dir_all(&memory);
        World { target, cntlid }
    })
}

/// The controller ID an input names in an I/O-queue Connect (with [`HOSTNQN`], [`HOSTID`]).
pub fn controller_id() -> u16 {
    world().cntlid
}

/// Serves `input` as everything one connection receives, then the end of the stream;
/// what the target sends is discarded. Returns once the connection has ended.
pub fn serve_bytes(input: &[u8]) {
    insitu_nvmf::fuzzing::serve_bytes(world().target.server(), input);
}

/// Well-formed sessions to start fuzzing from, by name: an admin queue bring-up, and an
/// I/O queue of the controller made in advance doing Write (in-capsule and by R2T), Read,
/// EXEC, Flush, Write Zeroes, Dataset Management and
/// refused commands, without digests and with both.
pub fn seed_inputs() -> Vec<(&'static str, Vec<u8>)> {
    use insitu_fabric::{opcode, Command, Digests, Pdu, SGL_DATA_BLOCK_OFFSET, SGL_TRANSPORT_DATA_BLOCK};
    let cntlid = controller_id();
    let session = |digests: Digests, qid: u16, commands: Vec<(Command, Vec<u8>, Option<Vec<u8>>)>| {
        let mut out = Vec::new();
        Pdu::IcReq { pfv: 0, hpda: 0, digests, maxr2t: 0 }.encode(Digests::default(), 0, &mut out);
        let mut connect = Command::zeroed();
        connect.set_opcode(opcode::FABRICS).set_cid(0).set_sgl(0, 1024, SGL_DATA_BLOCK_OFFSET);
        connect.0[4] = insitu_fabric::fabrics::CONNECT;
        connect.0[42..44].copy_from_slice(&qid.to_le_bytes());
        connect.0[44..46].copy_from_slice(&31u16.to_le_bytes());
        let mut data = vec![0u8; 1024];
        data[..16].copy_from_slice(&HOSTID);
        data[16..18].copy_from_slice(&(if qid == 0 { 0xFFFF } else { cntlid }).to_le_bytes());
        data[256..256 + NQN.len()].copy_from_slice(NQN.as_bytes());
        data[512..512 + HOSTNQN.len()].copy_from_slice(HOSTNQN.as_bytes());
        Pdu::CapsuleCmd { sqe: connect, data }.encode(digests, 0, &mut out);
        let mut ttag = 0u16;
        for (cid, (mut sqe, inline, by_r2t)) in commands.into_iter().enumerate() {
            sqe.set_cid(cid as u16 + 1);
            match by_r2t {
                Some(data) => {
                    sqe.set_sgl(0, data.len() as u32, SGL_TRANSPORT_DATA_BLOCK);
                    Pdu::CapsuleCmd { sqe, data: Vec::new() }.encode(digests, 0, &mut out);
                    Pdu::H2CData { cccid: sqe.cid(), ttag, datao: 0, last: true, data }.encode(digests, 0, &mut out);
                    ttag += 1;
                }
                None => {
                    let ty = if inline.is_empty() { SGL_TRANSPORT_DATA_BLOCK } else { SGL_DATA_BLOCK_OFFSET };
                    let len = if inline.is_empty() { sqe.sgl().1 } else { inline.len() as u32 };
                    sqe.set_sgl(0, len, ty);
                    Pdu::CapsuleCmd { sqe, data: inline }.encode(digests, 0, &mut out);
                }
            }
        }
        out
    };
    let cmd = |op: u8, nsid: u32, cdws: &[(usize, u32)], data_len: u32| {
        let mut c = Command::zeroed();
        c.set_opcode(op).set_nsid(nsid).set_sgl(0, data_len, SGL_TRANSPORT_DATA_BLOCK);
        for &(n, v) in cdws {
            c.set_cdw(n, v);
        }
        c
    };
    let exec = |nsid: u32| {
        let obj = insitu_proto::VirtualObject { offset: 0, length: 4000, extents: vec![insitu_proto::Extent::data(0, 8)] };
        let mut d = insitu_proto::Descriptor::new("crc32c", vec![obj]);
        d.result = Some(insitu_proto::VirtualObject { offset: 0, length: 4096, extents: vec![insitu_proto::Extent::data(64, 8)] });
        (cmd(opcode::EXEC, nsid, &[], 0), d.encode(), None)
    };
    let io = vec![
        (cmd(opcode::WRITE, 1, &[(10, 0), (12, 7)], 0), vec![0x5A; 4096], None),
        (cmd(opcode::READ, 1, &[(10, 0), (12, 7)], 4096), Vec::new(), None),
        (cmd(opcode::WRITE, 2, &[(10, 8), (12, 15)], 0), Vec::new(), Some(vec![0xA5; 8192])),
        (cmd(opcode::READ, 2, &[(10, 8), (12, 15)], 8192), Vec::new(), None),
        exec(1),
        exec(2),
        (cmd(opcode::FLUSH, 1, &[], 0), Vec::new(), None),
        (cmd(opcode::WRITE_ZEROES, 1, &[(10, 16), (12, 3)], 0), Vec::new(), None),
        (cmd(opcode::DSM, 2, &[(10, 0), (11, 4)], 0), [[0u8; 4], 8u32.to_le_bytes(), [0u8; 4], 32u32.to_le_bytes()].concat(), None),
        (cmd(opcode::READ, 3, &[(12, 0)], 512), Vec::new(), None),
        (cmd(0xFE, 1, &[], 0), Vec::new(), None),
    ];
    let admin = vec![
        (cmd(opcode::IDENTIFY, 0, &[(10, 1)], 4096), Vec::new(), None),
        (cmd(opcode::IDENTIFY, 1, &[(10, 0)], 4096), Vec::new(), None),
        (cmd(opcode::IDENTIFY, 0, &[(10, 2)], 4096), Vec::new(), None),
        (cmd(opcode::GET_LOG_PAGE, 0, &[(10, 0x02 | (127 << 16))], 512), Vec::new(), None),
        (cmd(opcode::SET_FEATURES, 0, &[(10, 0x07), (11, 0x0003_0003)], 0), Vec::new(), None),
        (cmd(opcode::GET_FEATURES, 0, &[(10, 0x07)], 0), Vec::new(), None),
        (cmd(opcode::KEEP_ALIVE, 0, &[], 0), Vec::new(), None),
        (cmd(opcode::ASYNC_EVENT, 0, &[], 0), Vec::new(), None),
    ];
    let kv = {
        use insitu_kvcache::{Dtype, Method};
        use insitu_proto::attention::{Admin, Append, Attend};
        let (heads, d, t) = (2usize, 16usize, 40usize);
        let vals = |n: usize, s: f32| (0..n).map(|i| ((i as f32) * s).sin()).collect::<Vec<f32>>();
        let create = Admin::Create { seq: 1, layers: 2, kv_heads: heads, head_dim: d, dtype: Dtype::F32, dims_per_page: 1, kept: false };
        let append = Append { seq: 1, layer: 0, heads, head_dim: d, tokens: t, k: vals(heads * t * d, 0.37), v: vals(heads * t * d, 0.11) };
        let attend = |method, tag: u32| {
            let a = Attend {
                layer: 0,
                heads,
                group: 2,
                head_dim: d,
                method,
                scale: 0.25,
                seqs: vec![1],
                q: vals(heads * 2 * d, 0.7),
                new_kv: Some((vals(heads * d, 0.3), vals(heads * d, 0.5))),
                new_entries: None,
                groups: None,
                vectors: Dtype::F32,
                reduced: None,
            };
            (cmd(opcode::KV_ATTEND, 0, &[(10, tag)], 0), Vec::new(), Some(a.encode()))
        };
        vec![
            (cmd(opcode::KV_ADMIN, 0, &[], 0), create.encode(), None),
            (cmd(opcode::KV_APPEND, 0, &[], 0), Vec::new(), Some(append.encode())),
            attend(Method::Dense, 7),
            (cmd(opcode::KV_RESULT, 0, &[(10, 7)], 4096), Vec::new(), None),
            attend(Method::SparF { r: 4, k: 8, local: 2, pages: 2, mean_v: true }, 8),
            (cmd(opcode::KV_RESULT, 0, &[(10, 8)], 4096), Vec::new(), None),
            (cmd(opcode::KV_ADMIN, 0, &[], 0), Admin::Fork { parent: 1, child: 2, kept: false }.encode(), None),
            (cmd(opcode::KV_ADMIN, 0, &[(10, 9)], 0), Admin::Info { seq: 2 }.encode(), None),
            (cmd(opcode::KV_RESULT, 0, &[(10, 9)], 512), Vec::new(), None),
            (cmd(opcode::KV_ADMIN, 0, &[], 0), Admin::Free { seq: 2 }.encode(), None),
            (cmd(opcode::KV_ADMIN, 0, &[], 0), Admin::Free { seq: 1 }.encode(), None),
        ]
    };
    let both = Digests { header: true, data: true };
    vec![
        ("kv-session", session(Digests::default(), 1, kv)),
        ("io-session", session(Digests::default(), 1, io.clone())),
        ("io-session-digests", session(both, 1, io)),
        ("admin-session", session(Digests::default(), 0, admin.clone())),
        ("admin-session-digests", session(both, 0, admin)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// Polls until `f` holds (the queue's worker runs the last commands after the
    /// connection has ended).
    fn eventually(f: impl Fn() -> bool) -> bool {
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    #[test]
    fn seeds_reach_the_media_and_cut_seeds_end_cleanly() {
        let seeds = seed_inputs();
        for (_, bytes) in &seeds {
            serve_bytes(bytes);
        }
        let target = world().target.engine().unwrap();
        let holds = |nsid: u32, slba: u64, len: usize, byte: u8| {
            let mut buf = vec![0u8; len];
            target.read(nsid, slba, &mut buf).is_ok() && buf.iter().all(|b| *b == byte)
        };
        assert!(eventually(|| holds(1, 0, 4096, 0x5A)), "the in-capsule Write reached namespace 1");
        assert!(eventually(|| holds(2, 8, 8192, 0xA5)), "the Write by R2T and H2CData reached namespace 2");
        let kv = target.kv_cache().expect("the private namespace holds a KV cache");
        assert!(eventually(|| kv.usage().sequences == 0), "the KV session freed what it created");
        for (_, bytes) in &seeds {
            for cut in (0..bytes.len()).step_by(61) {
                serve_bytes(&bytes[..cut]);
            }
        }
    }
}
