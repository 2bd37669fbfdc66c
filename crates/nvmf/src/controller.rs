// SPDX-License-Identifier: Apache-2.0
//! Controllers: the controller registers (CAP, VS, CC, CSTS), features, and the admin
//! command set (Identify, Get Log Page, Get/Set Features, Keep Alive, AER).

use crate::config::{TransportConfig, DISCOVERY_NQN};
use crate::handler::States;
use crate::identify::{self, ControllerIdentity, DiscoveryEntry};
use crate::subsystem::{Kind, Subsystem};
use insitu_fabric::{opcode, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Builds a completion status field: Do Not Retry, Status Code Type, Status Code.
pub(crate) const fn status(sct: u8, sc: u8) -> u16 {
    (1 << 14) | ((sct as u16 & 7) << 8) | sc as u16
}

/// Invalid Field in Command.
pub(crate) const INVALID_FIELD: u16 = status(0, 0x02);
/// Invalid Command Opcode.
pub(crate) const INVALID_OPCODE: u16 = status(0, 0x01);
/// Command Sequence Error.
pub(crate) const SEQUENCE_ERROR: u16 = status(0, 0x0C);
/// Connect Invalid Parameters.
pub(crate) const CONNECT_INVALID_PARAMETERS: u16 = status(1, 0x82);
/// Connect Invalid Host.
pub(crate) const CONNECT_INVALID_HOST: u16 = status(1, 0x84);
/// Controller Busy (no controller IDs left).
pub(crate) const CONTROLLER_BUSY: u16 = status(1, 0x81);

/// Controller registers and negotiated settings.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Regs {
    pub(crate) cc: u32,
    pub(crate) csts: u32,
    pub(crate) io_queues: u16,
    pub(crate) kato_ms: u32,
    pub(crate) async_event_config: u32,
}

/// One controller: the association of a host with a subsystem.
pub(crate) struct Controller {
    pub(crate) cntlid: u16,
    pub(crate) subsys: Arc<Subsystem>,
    pub(crate) hostnqn: String,
    pub(crate) hostid: [u8; 16],
    pub(crate) regs: Mutex<Regs>,
    pub(crate) read_cmds: AtomicU64,
    pub(crate) write_cmds: AtomicU64,
    /// I/O queue IDs connected now; a second connection may not claim one.
    io_qids: Mutex<std::collections::HashSet<u16>>,
    /// What handlers keep for this host (`IoContext::controller_state`).
    pub(crate) states: States,
}

/// The result of an admin command: status, dword 0, data to return, or held (AER).
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) dw0: u32,
    pub(crate) dw1: u32,
    pub(crate) data: Vec<u8>,
    pub(crate) held: bool,
}

impl Reply {
    pub(crate) fn ok(dw0: u32) -> Reply {
        Reply { status: 0, dw0, dw1: 0, data: Vec::new(), held: false }
    }

    pub(crate) fn data(data: Vec<u8>) -> Reply {
        Reply { status: 0, dw0: 0, dw1: 0, data, held: false }
    }

    pub(crate) fn err(status: u16) -> Reply {
        Reply { status, dw0: 0, dw1: 0, data: Vec::new(), held: false }
    }
}

/// CC.EN, CSTS.RDY, CC.SHN, CSTS.SHST.
const CC_EN: u32 = 1;
const CSTS_RDY: u32 = 1;
const CC_SHN_MASK: u32 = 3 << 14;
const CSTS_SHST_COMPLETE: u32 = 2 << 2;

impl Controller {
    pub(crate) fn new(cntlid: u16, subsys: Arc<Subsystem>, hostnqn: &str, hostid: [u8; 16], kato_ms: u32) -> Controller {
        let regs = Regs { kato_ms, ..Regs::default() };
        Controller {
            cntlid,
            subsys,
            hostnqn: hostnqn.into(),
            hostid,
            regs: Mutex::new(regs),
            read_cmds: AtomicU64::new(0),
            write_cmds: AtomicU64::new(0),
            io_qids: Mutex::new(Default::default()),
            states: Default::default(),
        }
    }

    /// Claims I/O queue `qid`; false if another connection holds it.
    pub(crate) fn claim_queue(&self, qid: u16) -> bool {
        self.io_qids.lock().unwrap_or_else(|e| e.into_inner()).insert(qid)
    }

    /// Releases I/O queue `qid` when its connection ends.
    pub(crate) fn release_queue(&self, qid: u16) {
        self.io_qids.lock().unwrap_or_else(|e| e.into_inner()).remove(&qid);
    }

    pub(crate) fn regs(&self) -> Regs {
        *self.regs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// True once the host has enabled the controller and it is ready.
    pub(crate) fn ready(&self) -> bool {
        self.regs().csts & CSTS_RDY != 0
    }

    /// Property Get: CAP, VS, CC, CSTS.
    pub(crate) fn property_get(&self, cfg: &TransportConfig, offset: u32) -> Option<u64> {
        let r = self.regs();
        Some(match offset {
            // CAP: MQES, CQR, TO = 15 s, CSS = NVM, MPSMIN = MPSMAX = 4 KiB.
            0x00 => u64::from(cfg.queue_depth - 1) | (1 << 16) | (30 << 24) | (1 << 37),
            0x08 => u64::from(identify::VERSION),
            0x14 => u64::from(r.cc),
            0x1C => u64::from(r.csts),
            _ => return None,
        })
    }

    /// Property Set: only CC is writable.
    pub(crate) fn property_set(&self, offset: u32, value: u64) -> bool {
        if offset != 0x14 {
            return false;
        }
        let mut r = self.regs.lock().unwrap_or_else(|e| e.into_inner());
        let cc = value as u32;
        r.cc = cc;
        if cc & CC_SHN_MASK != 0 {
            r.csts = (r.csts & !CSTS_RDY) | CSTS_SHST_COMPLETE;
        } else if cc & CC_EN != 0 {
            r.csts = (r.csts | CSTS_RDY) & !(3 << 2);
        } else {
            r.csts &= !CSTS_RDY;
        }
        true
    }

    fn identity<'a>(&'a self, cfg: &TransportConfig) -> ControllerIdentity<'a> {
        let namespaces = self.subsys.nvm().map_or(0, |n| n.namespace_count());
        ControllerIdentity {
            cntlid: self.cntlid,
            serial: &self.subsys.serial,
            subnqn: &self.subsys.nqn,
            namespaces,
            mdts: cfg.mdts,
            max_cmd: cfg.queue_depth,
            inline_data: cfg.inline_data,
            discovery: matches!(self.subsys.kind, Kind::Discovery),
        }
    }

    fn nguid(&self, nsid: u32) -> [u8; 16] {
        identify::guid(&format!("{}/{nsid}", self.subsys.nqn))
    }

    /// Runs an admin command. `discovery_entries` lists the NVM subsystems this host may see.
    pub(crate) fn admin(&self, cfg: &TransportConfig, cmd: &Command, discovery_entries: &dyn Fn(&str) -> Vec<u8>) -> Reply {
        match cmd.opcode() {
            opcode::IDENTIFY => self.identify(cfg, cmd),
            opcode::GET_LOG_PAGE => self.get_log_page(cmd, cfg.max_transfer(), discovery_entries),
            opcode::SET_FEATURES => self.set_features(cfg, cmd),
            opcode::GET_FEATURES => self.get_features(cmd),
            opcode::KEEP_ALIVE => Reply::ok(0),
            opcode::ASYNC_EVENT => Reply { held: true, ..Reply::ok(0) },
            opcode::ABORT => Reply::ok(1), // bit 0 set: command not aborted
            _ => Reply::err(INVALID_OPCODE),
        }
    }

    fn identify(&self, cfg: &TransportConfig, cmd: &Command) -> Reply {
        let cns = cmd.cdw(10) & 0xFF;
        let nsid = cmd.nsid();
        let nvm = self.subsys.nvm();
        let block = |n: u32| nvm.and_then(|s| s.blocks.namespace(n));
        let visible = |n: u32| block(n).is_some_and(|ns| ns.sharable);
        let other = nvm.and_then(|s| s.command_set(nsid));
        let csi = (cmd.cdw(11) >> 24) as u8;
        match cns {
            0x01 => Reply::data(identify::controller(&self.identity(cfg))),
            // A namespace of another command set: no NVM structure (all zeros); its
            // descriptors give its CSI, and CNS 05h with that CSI its own structure.
            0x00 if other.is_some() => Reply::data(vec![0; 4096]),
            0x03 if other.is_some() => Reply::data(identify::namespace_descriptors_csi(self.nguid(nsid), other.expect("checked").csi())),
            0x05 if other.is_some_and(|o| o.csi() == csi) => Reply::data(other.expect("checked").identify(self.nguid(nsid))),
            0x05 if other.is_some() => Reply::err(INVALID_FIELD),
            0x00 => match block(nsid) {
                Some(ns) if ns.sharable => Reply::data(identify::namespace(ns.size / u64::from(ns.lba_size), ns.lba_size, self.nguid(nsid))),
                // Private and unallocated-but-valid NSIDs read as inactive: all zeros.
                Some(_) => Reply::data(vec![0; 4096]),
                None if nsid == 0xFFFF_FFFF => Reply::data(vec![0; 4096]),
                None => Reply::err(status(0, 0x0B)),
            },
            0x02 => {
                let nsids: Vec<u32> = nvm.map(|s| s.host_namespaces()).unwrap_or_default();
                Reply::data(identify::active_namespaces(&nsids, nsid))
            }
            0x03 if visible(nsid) => Reply::data(identify::namespace_descriptors(self.nguid(nsid))),
            0x03 => Reply::err(status(0, 0x0B)),
            // I/O command set specific structures for the NVM set: nothing beyond defaults.
            0x05 | 0x06 if (cmd.cdw(11) >> 24) == 0 => Reply::data(vec![0; 4096]),
            _ => Reply::err(INVALID_FIELD),
        }
    }

    fn get_log_page(&self, cmd: &Command, max_transfer: usize, discovery_entries: &dyn Fn(&str) -> Vec<u8>) -> Reply {
        let lid = cmd.cdw(10) & 0xFF;
        let numd = ((cmd.cdw(10) >> 16) | ((cmd.cdw(11) & 0xFFFF) << 16)) as usize + 1;
        let offset = u64::from(cmd.cdw(12)) | (u64::from(cmd.cdw(13)) << 32);
        let page = match (lid, &self.subsys.kind) {
            (0x70, Kind::Discovery) => discovery_entries(&self.hostnqn),
            (0x01, _) => vec![0; 64],
            (0x02, Kind::Nvm(n)) => {
                let (r, w) = n.blocks.media_totals();
                identify::smart_log(r, w, self.read_cmds.load(Ordering::Relaxed), self.write_cmds.load(Ordering::Relaxed))
            }
            (0x03, Kind::Nvm(_)) => identify::firmware_log(),
            _ => return Reply::err(INVALID_FIELD),
        };
        // Never trust the host's length beyond what one command may move.
        let len = numd * 4;
        if len > max_transfer {
            return Reply::err(INVALID_FIELD);
        }
        let mut out = vec![0u8; len];
        if let Ok(off) = usize::try_from(offset) {
            if off < page.len() {
                let n = (page.len() - off).min(len);
                out[..n].copy_from_slice(&page[off..off + n]);
            }
        }
        Reply::data(out)
    }

    fn set_features(&self, cfg: &TransportConfig, cmd: &Command) -> Reply {
        let fid = cmd.cdw(10) & 0xFF;
        let mut r = self.regs.lock().unwrap_or_else(|e| e.into_inner());
        match fid {
            0x07 => {
                let nsqr = (cmd.cdw(11) & 0xFFFF) as u16;
                let ncqr = (cmd.cdw(11) >> 16) as u16;
                if nsqr == 0xFFFF || ncqr == 0xFFFF {
                    return Reply::err(INVALID_FIELD);
                }
                let n = nsqr.min(ncqr).saturating_add(1).min(cfg.max_io_queues);
                r.io_queues = n;
                Reply::ok(u32::from(n - 1) | (u32::from(n - 1) << 16))
            }
            0x0F => {
                r.kato_ms = cmd.cdw(11);
                Reply::ok(0)
            }
            0x0B => {
                r.async_event_config = cmd.cdw(11);
                Reply::ok(0)
            }
            0x06 => Reply::ok(0), // volatile write cache: always on; Flush makes data durable
            _ => Reply::err(INVALID_FIELD),
        }
    }

    fn get_features(&self, cmd: &Command) -> Reply {
        let r = self.regs();
        match cmd.cdw(10) & 0xFF {
            0x07 => {
                let n = u32::from(r.io_queues.max(1) - 1);
                Reply::ok(n | (n << 16))
            }
            0x0F => Reply::ok(r.kato_ms),
            0x0B => Reply::ok(r.async_event_config),
            0x06 => Reply::ok(1),
            _ => Reply::err(INVALID_FIELD),
        }
    }
}

/// Builds the discovery log page for `hostnqn`: one entry per NVM subsystem it may connect
/// to, on the address the target listens on.
pub(crate) fn discovery_page(subsystems: &[Arc<Subsystem>], cfg: &TransportConfig, hostnqn: &str) -> Vec<u8> {
    let traddr = cfg.listen.ip().to_string();
    let trsvcid = cfg.listen.port().to_string();
    let entries: Vec<DiscoveryEntry<'_>> = subsystems
        .iter()
        .filter(|s| s.nqn != DISCOVERY_NQN && s.admits(hostnqn))
        .map(|s| DiscoveryEntry { subnqn: &s.nqn, traddr: &traddr, trsvcid: &trsvcid, ipv6: cfg.listen.is_ipv6() })
        .collect();
    identify::discovery_log(1, &entries)
}
