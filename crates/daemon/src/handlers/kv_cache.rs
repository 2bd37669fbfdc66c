// SPDX-License-Identifier: Apache-2.0
//! The KV-cache vendor commands (`docs/kv-commands.md`): append, admin, attention, result.
//!
//! Attention needs data both ways, which one NVMe command cannot carry (its opcode fixes
//! the direction, and a stock Linux host's passthrough follows it). So KV_ATTEND brings the
//! queries in and leaves the outputs with the controller under a host-chosen tag, and
//! KV_RESULT takes them out: two commands a stock host can send. The results wait with
//! the controller ([`IoContext::controller_state`]), which keeps a bounded number.
//!
//! A sequence not created *kept* belongs to the controller that created it, and is freed
//! when that controller ends ([`HostSequences`]): a host that is killed or cut off
//! mid-inference leaves no KV cache behind.

use std::sync::{Arc, OnceLock, Weak};

use insitu_engine::Engine;
use insitu_fabric::{opcode, Command};
use insitu_kvcache::{HeldResults, KvCache, KvError, Lifetime, Owner, RESULT_GRACE};
use insitu_nvmf::{IoContext, IoHandler, MetricsSource, Outcome};
use insitu_proto::attention::{encode_info, Admin, Append, Attend, AttendOptions};

/// The four KV-cache commands against an engine's KV cache.
pub(crate) struct KvCacheCommands(pub(crate) Arc<Engine>);

impl IoHandler for KvCacheCommands {
    fn execute(&self, ctx: &IoContext<'_>, cmd: &Command, data: &[u8]) -> Outcome {
        outcome(execute(&self.0, ctx, cmd, data))
    }

    /// A KV_RESULT whose result is not held yet waits for it, so it goes to a worker;
    /// every other command runs here.
    fn execute_here(&self, ctx: &IoContext<'_>, cmd: &Command, data: &[u8]) -> Option<Outcome> {
        if cmd.opcode() != opcode::KV_RESULT {
            return Some(self.execute(ctx, cmd, data));
        }
        let tag = cmd.cdw(10);
        let held = ctx.controller_state::<HeldResults>().take(tag)?;
        Some(outcome(result(ctx, cmd, tag, held)))
    }
}

fn outcome(r: Result<Outcome, KvError>) -> Outcome {
    r.unwrap_or_else(|e| Outcome::status(e.status().to_nvme_field()))
}

/// Runs a KV command (`cmd`'s opcode is one of the four) with the data the host sent.
fn execute(target: &Arc<Engine>, ctx: &IoContext<'_>, cmd: &Command, data: &[u8]) -> Result<Outcome, KvError> {
    let tag = cmd.cdw(10);
    if cmd.opcode() == opcode::KV_RESULT {
        let held = ctx.controller_state::<HeldResults>().take_wait(tag, RESULT_GRACE).ok_or(KvError::NoResult(tag))?;
        return result(ctx, cmd, tag, held);
    }
    let store = target.kv_cache()?;
    match cmd.opcode() {
        opcode::KV_ADMIN => {
            let a = Admin::decode(data)?;
            let lifetime = |kept| {
                if kept {
                    Lifetime::Kept
                } else {
                    Lifetime::Owned(ctx.controller_state::<HostSequences>().owner(target, store))
                }
            };
            admin(store, ctx, tag, a, lifetime)
        }
        opcode::KV_APPEND => {
            let a = Append::decode(data)?;
            check_shape(store, a.seq, a.layer, a.heads, a.head_dim)?;
            let tokens = store.append(a.seq, a.layer, a.tokens, &a.k, &a.v)?;
            Ok(Outcome { dw0: tokens as u32, ..Outcome::ok() })
        }
        opcode::KV_ATTEND => {
            // A KV_RESULT for this tag waits until the result is held (or this fails).
            let results = ctx.controller_state::<HeldResults>();
            let pending = results.begin(tag);
            let options = AttendOptions::from_cdw11(cmd.cdw(11))?;
            let (media, bytes) = if options.page_scores {
                let scores = store.page_scores_request(checked(store, Attend::decode(data)?)?)?;
                (scores.stats.media_bytes, scores.encode())
            } else {
                let result = store.attend_request(checked(store, Attend::decode(data)?)?, options)?;
                (result.stats.media_bytes, result.encode())
            };
            let len = bytes.len() as u32;
            pending.complete(bytes);
            Ok(Outcome { dw0: len, media_bytes: media, ..Outcome::ok() })
        }
        _ => unreachable!("only KV opcodes are routed here"),
    }
}

/// KV_RESULT's answer: the result `held` under `tag`, when the host's transfer holds it.
fn result(ctx: &IoContext<'_>, cmd: &Command, tag: u32, held: Vec<u8>) -> Result<Outcome, KvError> {
    if (cmd.sgl().1 as usize) < held.len() {
        // Keep it: the host may ask again with a buffer large enough.
        let len = held.len();
        ctx.controller_state::<HeldResults>().put(tag, held);
        return Err(KvError::BadRequest(format!("the result under tag {tag} is {len} bytes, larger than the transfer asked for")));
    }
    Ok(Outcome { dw0: held.len() as u32, data: held, ..Outcome::ok() })
}

fn admin(store: &KvCache, ctx: &IoContext<'_>, tag: u32, a: Admin, lifetime: impl Fn(bool) -> Lifetime) -> Result<Outcome, KvError> {
    match a {
        Admin::Create { seq, layers, kv_heads, head_dim, dtype, dims_per_page, kept } => {
            store.create_as(lifetime(kept), seq, layers, kv_heads, head_dim, dtype, dims_per_page)?;
        }
        Admin::Fork { parent, child, kept } => {
            store.fork_as(lifetime(kept), parent, child)?;
        }
        Admin::Free { seq } => store.free(seq)?,
        Admin::Info { seq } => {
            let info = encode_info(&store.info(seq)?.wire_info());
            let len = info.len() as u32;
            ctx.controller_state::<HeldResults>().put(tag, info);
            return Ok(Outcome { dw0: len, ..Outcome::ok() });
        }
    }
    Ok(Outcome::ok())
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

/// `a` once every entry matches its sequence's shape: checked before the first append, so
/// a bad entry changes nothing.
fn checked(store: &KvCache, a: Attend) -> Result<Attend, KvError> {
    for s in &a.seqs {
        check_shape(store, *s, a.layer, a.heads, a.head_dim)?;
    }
    Ok(a)
}

/// The owner of the sequences a controller created without the kept flag, made on its
/// first such create: when the controller ends (its host disconnected, its connection broke,
/// or its keep-alive ran out), its state is dropped and they are freed with it.
#[derive(Default)]
struct HostSequences(OnceLock<(Weak<Engine>, Owner)>);

impl HostSequences {
    fn owner(&self, target: &Arc<Engine>, store: &KvCache) -> Owner {
        self.0.get_or_init(|| (Arc::downgrade(target), store.new_owner())).1
    }
}

impl Drop for HostSequences {
    fn drop(&mut self) {
        let Some((target, owner)) = self.0.take() else { return };
        let Some(store) = target.upgrade() else { return };
        let Ok(store) = store.kv_cache() else { return };
        match store.free_owned(owner) {
            Ok(0) => {}
            Ok(n) => tracing::info!("freed {n} KV cache sequence(s) left by a host that went away"),
            Err(e) => tracing::warn!("freeing the KV cache sequences of a host that went away: {e}"),
        }
    }
}

/// The gauges and counters of the KV caches of `subsystems` (NQN, engine) in the
/// Prometheus text format.
pub(crate) fn metrics(subsystems: Vec<(String, &Arc<Engine>)>) -> Arc<dyn MetricsSource> {
    Arc::new(KvCacheMetrics(subsystems.into_iter().map(|(nqn, e)| (nqn, Arc::downgrade(e))).collect()))
}

struct KvCacheMetrics(Vec<(String, Weak<Engine>)>);

impl MetricsSource for KvCacheMetrics {
    fn render(&self, out: &mut String) {
        use std::fmt::Write as _;
        let usage: Vec<_> = self.0.iter().filter_map(|(nqn, e)| Some((nqn, e.upgrade()?.kv_cache().ok()?.usage()))).collect();
        let _ = writeln!(out, "# HELP insitu_kv_sequences KV cache sequences: kept until freed, or owned by the host that created them.");
        let _ = writeln!(out, "# TYPE insitu_kv_sequences gauge");
        for (nqn, u) in &usage {
            let _ = writeln!(out, "insitu_kv_sequences{{subsystem=\"{nqn}\",lifetime=\"kept\"}} {}", u.kept);
            let _ = writeln!(out, "insitu_kv_sequences{{subsystem=\"{nqn}\",lifetime=\"owned\"}} {}", u.sequences - u.kept);
        }
        let _ = writeln!(out, "# HELP insitu_kv_pages KV cache pages of the private namespace.");
        let _ = writeln!(out, "# TYPE insitu_kv_pages gauge");
        for (nqn, u) in &usage {
            let _ = writeln!(out, "insitu_kv_pages{{subsystem=\"{nqn}\",state=\"used\"}} {}", u.pages_total - u.pages_free);
            let _ = writeln!(out, "insitu_kv_pages{{subsystem=\"{nqn}\",state=\"free\"}} {}", u.pages_free);
        }
        let _ = writeln!(out, "# HELP insitu_kv_reclaimed_sequences_total KV cache sequences freed because the host that owned them went away.");
        let _ = writeln!(out, "# TYPE insitu_kv_reclaimed_sequences_total counter");
        for (nqn, u) in &usage {
            let _ = writeln!(out, "insitu_kv_reclaimed_sequences_total{{subsystem=\"{nqn}\"}} {}", u.reclaimed);
        }
    }
}
