// SPDX-License-Identifier: Apache-2.0
//! The KV-cache vendor commands (`docs/kv-commands.md`): append, admin, attention, result.
//!
//! Attention needs data both ways, which one NVMe command cannot carry (its opcode fixes
//! the direction, and a stock Linux host's passthrough follows it). So KV_ATTEND brings the
//! queries in and leaves the outputs with the controller under a host-chosen tag, and
//! KV_RESULT takes them out: two commands a stock host can send.

use crate::controller::Controller;
use insitu_engine::Engine;
use insitu_fabric::{opcode, Command};
use insitu_kvcache::{KvCache, KvError, RESULT_GRACE};
use insitu_proto::attention::{encode_info, Admin, Append, Attend, AttendOptions, AttendResult};

/// Results of KV commands waiting for KV_RESULT, by tag (a KV_RESULT may wait for its
/// KV_ATTEND, so a host needs one round trip per exchange).
pub(crate) use insitu_kvcache::HeldResults;

/// What a KV command produced: dword 0, data to return, bytes read from the media.
pub(crate) struct KvDone {
    pub(crate) dw0: u32,
    pub(crate) data: Option<Vec<u8>>,
    pub(crate) media: u64,
}

impl KvDone {
    fn ok(dw0: u32) -> KvDone {
        KvDone { dw0, data: None, media: 0 }
    }
}

/// Runs a KV command (`cmd`'s opcode is one of the four) with the data the host sent.
pub(crate) fn execute(target: &Engine, ctrl: &Controller, cmd: &Command, data: &[u8]) -> Result<KvDone, KvError> {
    let tag = cmd.cdw(10);
    if cmd.opcode() == opcode::KV_RESULT {
        let held = ctrl.kv_results.take_wait(tag, RESULT_GRACE).ok_or(KvError::NoResult(tag))?;
        if (cmd.sgl().1 as usize) < held.len() {
            // Keep it: the host may ask again with a buffer large enough.
            let len = held.len();
            ctrl.kv_results.put(tag, held);
            return Err(KvError::BadRequest(format!("the result under tag {tag} is {len} bytes, larger than the transfer asked for")));
        }
        return Ok(KvDone { dw0: held.len() as u32, data: Some(held), media: 0 });
    }
    let store = target.kv_cache()?;
    match cmd.opcode() {
        opcode::KV_ADMIN => admin(store, ctrl, tag, Admin::decode(data)?),
        opcode::KV_APPEND => {
            let a = Append::decode(data)?;
            check_shape(store, a.seq, a.layer, a.heads, a.head_dim)?;
            let tokens = store.append(a.seq, a.layer, a.tokens, &a.k, &a.v)?;
            Ok(KvDone::ok(tokens as u32))
        }
        opcode::KV_ATTEND => {
            // A KV_RESULT for this tag waits until the result is held (or this fails).
            let pending = ctrl.kv_results.begin(tag);
            let result = attend(store, Attend::decode(data)?, AttendOptions::from_cdw11(cmd.cdw(11))?)?;
            let media = result.stats.media_bytes;
            let bytes = result.encode();
            let len = bytes.len() as u32;
            pending.complete(bytes);
            Ok(KvDone { dw0: len, data: None, media })
        }
        _ => unreachable!("only KV opcodes are routed here"),
    }
}

fn admin(store: &KvCache, ctrl: &Controller, tag: u32, a: Admin) -> Result<KvDone, KvError> {
    match a {
        Admin::Create { seq, layers, kv_heads, head_dim, dtype, dims_per_page } => {
            store.create(seq, layers, kv_heads, head_dim, dtype, dims_per_page)?;
        }
        Admin::Fork { parent, child } => {
            store.fork(parent, child)?;
        }
        Admin::Free { seq } => store.free(seq)?,
        Admin::Info { seq } => {
            let info = encode_info(&store.info(seq)?.wire_info());
            let len = info.len() as u32;
            ctrl.kv_results.put(tag, info);
            return Ok(KvDone::ok(len));
        }
    }
    Ok(KvDone::ok(0))
}

/// Checks that a request addresses `heads` heads of `head_dim` in `layer` of `seq`, as the
/// sequence was created (a different split with the same byte count must not slip through).
fn check_shape(store: &KvCache, seq: u64, layer: usize, heads: usize, head_dim: usize) -> Result<(), KvError> {
    let info = store.info(seq)?;
    let mismatch = |what: String| Err(KvError::Mismatch { seq, what });
    if layer >= info.layers {
        return mismatch(format!("layer {layer} does not exist (the sequence has {} layers)", info.layers));
    }
    if heads != info.kv_heads {
        return mismatch(format!("{heads} KV heads given, the sequence has {} on this target", info.kv_heads));
    }
    if head_dim != info.layout.head_dim {
        return mismatch(format!("head size {head_dim} given, the sequence's is {}", info.layout.head_dim));
    }
    Ok(())
}

fn attend(store: &KvCache, a: Attend, options: AttendOptions) -> Result<AttendResult, KvError> {
    // Validate every entry before the first append, so a bad entry changes nothing.
    for s in &a.seqs {
        check_shape(store, *s, a.layer, a.heads, a.head_dim)?;
    }
    store.attend_request(a, options)
}
