// SPDX-License-Identifier: Apache-2.0
//! What a target serves over the transport, one module per command family: the engine's
//! block namespaces, EXEC, the KV-cache commands, the key-value namespace, locks and
//! Ether-oN. [`register`] gives an NVM subsystem all of them; a new vendor command is one
//! more handler here (its wire format in `insitu-proto`, its opcode in
//! `insitu_proto::opcode`, its reference in `docs/`).

pub(crate) mod ether;
mod exec;
mod kv_cache;
pub(crate) mod kv_store;
mod lock;

use std::sync::Arc;

use insitu_engine::{Engine, Visibility};
use insitu_fabric::opcode;
use insitu_media::{Backing, BlockRead};
use insitu_nvmf::{BlockNamespace, BlockNamespaces, NvmSubsystem, Placement};
use insitu_proto::CommandError;

pub(crate) use kv_cache::metrics as kv_cache_metrics;

/// The engine's namespaces as the transport's block namespaces.
pub(crate) struct EngineBlocks(pub(crate) Arc<Engine>);

impl BlockNamespaces for EngineBlocks {
    fn count(&self) -> usize {
        self.0.namespace_count()
    }

    fn namespace(&self, nsid: u32) -> Option<BlockNamespace<'_>> {
        self.0.namespace(nsid).map(|ns| BlockNamespace {
            lba_size: ns.lba_size(),
            size: ns.size(),
            sharable: ns.visibility() == Visibility::Sharable,
            media: ns.media(),
            buffers: ns.buffer_pool(),
        })
    }

    fn read_blocks(&self, nsid: u32, slba: u64, bytes: usize) -> Result<BlockRead, CommandError> {
        self.0.read_blocks(nsid, slba, bytes)
    }

    fn read_source(&self, nsid: u32, slba: u64, bytes: usize) -> Result<(&Backing, u64), CommandError> {
        self.0.read_source(nsid, slba, bytes)
    }

    fn write(&self, nsid: u32, slba: u64, data: &[u8]) -> Result<(), CommandError> {
        self.0.write(nsid, slba, data)
    }

    fn write_zeroes(&self, nsid: u32, slba: u64, nlb: u64) -> Result<(), CommandError> {
        self.0.write_zeroes(nsid, slba, nlb)
    }

    fn flush(&self, nsid: u32) -> Result<(), CommandError> {
        self.0.flush(nsid)
    }

    fn media_totals(&self) -> (u64, u64) {
        self.0.media_totals()
    }
}

/// Registers every vendor command of `engine` on `nvm`, and Ether-oN through `port`.
pub(crate) fn register(nvm: &mut NvmSubsystem, engine: &Arc<Engine>, port: &Arc<ether::Port>) {
    nvm.handle(opcode::EXEC, Arc::new(exec::Exec(engine.clone())), Placement::Worker);
    let kv = Arc::new(kv_cache::KvCacheCommands(engine.clone()));
    for op in [opcode::KV_ADMIN, opcode::KV_APPEND] {
        nvm.handle(op, kv.clone(), Placement::Worker);
    }
    // An attention runs on the connection's thread: the host sends its KV_RESULT right
    // behind it and waits on both, so a worker would only add a hand-off (a wake-up on
    // another core) and leave the KV_RESULT waiting for it. On 2 cores that hand-off was
    // a fifth of the CPU of a 4-target exchange. The KV_RESULT then finds its result held
    // and is answered there too; one that finds nothing yet (its KV_ATTEND's data came
    // by R2T, or on another queue) waits on a worker.
    for op in [opcode::KV_ATTEND, opcode::KV_RESULT] {
        nvm.handle(op, kv.clone(), Placement::Connection);
    }
    let locks = Arc::new(lock::LockCommands(engine.clone()));
    nvm.handle(opcode::LOCK, locks.clone(), Placement::Worker);
    nvm.handle(opcode::UNLOCK, locks, Placement::Worker);
    // Answered by the connection's own thread: transmits reach the TAP device in the
    // order the host sent them, and a held receive occupies no worker.
    nvm.handle(insitu_etheron::TRANSMIT_FRAME, port.clone(), Placement::Connection);
    nvm.handle(insitu_etheron::RECEIVE_FRAME, port.clone(), Placement::Connection);
}
