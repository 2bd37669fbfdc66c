// SPDX-License-Identifier: Apache-2.0
//! The lock vendor commands (`docs/lock-commands.md`): DockerSSD's inode lock over NVMe.
//!
//! * LOCK (0xB1, host→controller data): the payload names a path of a sharable namespace
//!   and its extents; the target fences those blocks against host writes and tells its
//!   lock listener (the container runtime). Completion DW0/DW1: the lock id.
//! * UNLOCK (0xB5, no data): CDW10/CDW11 hold the lock id; the fence goes and the
//!   listener hears of it.
//!
//! Both run against the target of the subsystem the controller belongs to, so a lock
//! lives on one subsystem's namespaces only; private namespaces are refused by the target.
//! Every refusal and every lock taken or released is logged with its reason.

use std::sync::Arc;

use insitu_engine::Engine;
use insitu_fabric::{opcode, Command};
use insitu_nvmf::{IoContext, IoHandler, Outcome};
use insitu_proto::lock::LockRequest;
use insitu_proto::{CommandError, Status};

/// LOCK and UNLOCK against an engine.
pub(crate) struct LockCommands(pub(crate) Arc<Engine>);

impl IoHandler for LockCommands {
    fn execute(&self, _: &IoContext<'_>, cmd: &Command, data: &[u8]) -> Outcome {
        match execute(&self.0, cmd, data) {
            Ok((dw0, dw1)) => Outcome { dw0, dw1, ..Outcome::ok() },
            Err(e) => e.into(),
        }
    }
}

/// Runs LOCK or UNLOCK; returns completion (DW0, DW1).
fn execute(target: &Engine, cmd: &Command, data: &[u8]) -> Result<(u32, u32), CommandError> {
    let nsid = cmd.nsid();
    let r = match cmd.opcode() {
        opcode::LOCK => lock(target, nsid, data),
        opcode::UNLOCK => {
            let id = u64::from(cmd.cdw(10)) | (u64::from(cmd.cdw(11)) << 32);
            target.unlock(nsid, id).map(|()| {
                tracing::info!("namespace {nsid}: lock {id:#x} released");
                (0, 0)
            })
        }
        other => Err(CommandError::new(Status::INVALID_OPCODE, format!("opcode {other:#04x} is not a lock command"))),
    };
    if let Err(e) = &r {
        tracing::info!("namespace {nsid}: {} refused: {} ({})", name(cmd.opcode()), e.message, e.status);
    }
    r
}

fn lock(target: &Engine, nsid: u32, data: &[u8]) -> Result<(u32, u32), CommandError> {
    let req = LockRequest::parse(data).map_err(|e| CommandError::new(Status::INVALID_FIELD, e.to_string()))?;
    let (path, extents) = (req.path.clone(), req.extents.len());
    let id = target.lock(nsid, req)?;
    tracing::info!("namespace {nsid}: {path:?} locked for containers ({extents} extents, lock {id:#x})");
    Ok((id as u32, (id >> 32) as u32))
}

fn name(op: u8) -> &'static str {
    if op == opcode::LOCK {
        "LOCK"
    } else {
        "UNLOCK"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use insitu_engine::{NamespaceConfig, Visibility};

    fn target() -> (tempfile::TempDir, Engine) {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.img"), dir.path().join("b.img"));
        std::fs::write(&a, vec![0u8; 1 << 20]).unwrap();
        std::fs::write(&b, vec![0u8; 1 << 20]).unwrap();
        let mut t = Engine::new();
        t.add_namespace(&a, NamespaceConfig::default()).unwrap();
        t.add_namespace(&b, NamespaceConfig { visibility: Visibility::Private, ..Default::default() }).unwrap();
        (dir, t)
    }

    fn cmd(op: u8, nsid: u32, id: u64) -> Command {
        let mut c = Command::zeroed();
        c.set_opcode(op).set_nsid(nsid).set_cdw(10, id as u32).set_cdw(11, (id >> 32) as u32);
        c
    }

    #[test]
    fn lock_then_unlock_over_the_command_interface() {
        let (_d, t) = target();
        let payload = LockRequest { path: "in.csv".into(), extents: vec![(4096, 4096)] }.encode();
        let (lo, hi) = execute(&t, &cmd(opcode::LOCK, 1, 0), &payload).unwrap();
        let id = u64::from(lo) | u64::from(hi) << 32;
        assert_eq!(t.write(1, 8, &[1u8; 512]).unwrap_err().status, Status::LBA_LOCKED);
        assert_eq!(execute(&t, &cmd(opcode::UNLOCK, 1, id ^ 1), &[]).unwrap_err().status, Status::INVALID_FIELD);
        execute(&t, &cmd(opcode::UNLOCK, 1, id), &[]).unwrap();
        t.write(1, 8, &[1u8; 512]).unwrap();
    }

    #[test]
    fn bad_locks_are_refused_and_store_nothing() {
        let (_d, t) = target();
        let past = LockRequest { path: "big".into(), extents: vec![(0, 2 << 20)] }.encode();
        assert_eq!(execute(&t, &cmd(opcode::LOCK, 1, 0), &past).unwrap_err().status, Status::LBA_OUT_OF_RANGE);
        let ok = LockRequest { path: "p".into(), extents: vec![(0, 512)] }.encode();
        assert_eq!(execute(&t, &cmd(opcode::LOCK, 2, 0), &ok).unwrap_err().status, Status::INVALID_NAMESPACE, "private");
        assert_eq!(execute(&t, &cmd(opcode::LOCK, 9, 0), &ok).unwrap_err().status, Status::INVALID_NAMESPACE, "unknown");
        let e = execute(&t, &cmd(opcode::LOCK, 1, 0), &ok[..ok.len() - 3]).unwrap_err();
        assert_eq!(e.status, Status::INVALID_FIELD);
        assert!(e.message.contains("announces"), "{}", e.message);
        assert_eq!(t.lock_count(), 0);
    }
}
