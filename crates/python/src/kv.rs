// SPDX-License-Identifier: Apache-2.0
//! `insitu._native.KvTarget` (the KV-cache vendor commands of one target) and
//! `insitu._native.EmbeddedTarget` (a target served from this process, on loopback).

use crate::{RequestError, StorageIOError, TargetError};
use insitu_fabric::{opcode, Command, SGL_TRANSPORT_DATA_BLOCK};
use insitu_initiator::{default_hostnqn, Answers, ConnectOptions, InitiatorError, Session, Submission};
use insitu_proto::attention::{as_sent, check_new_entries, Dtype, Method, ReducedQueries};
use insitu_proto::attention::{decode_info, Admin, Append, Attend, AttendOptions, AttendResult, PageScores};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

/// `command`'s error `e` from the target at `url`, as the Python exception it raises.
fn kv_err(url: &str, command: &str, e: InitiatorError) -> PyErr {
    match e {
        InitiatorError::Status { sct, sc, .. } => {
            let why = insitu_proto::attention::explain_status(sct, sc);
            TargetError::new_err(format!("{command}: {why} (NVMe status {sct:#x}/{sc:#04x})"))
        }
        InitiatorError::InvalidArgument { .. } => RequestError::new_err(e.to_string()),
        // Appends and attention change the cache, so a plain retry could append twice;
        // and the target frees what this connection created as the connection ends.
        InitiatorError::ConnectionLost { detail, .. } | InitiatorError::OutcomeUnknown { detail, .. } => StorageIOError::new_err(format!(
            "{command}: the connection to {url} was lost ({detail}); the target frees the KV cache sequences this connection \
             created (all but kept ones), so start again once it serves"
        )),
        e => StorageIOError::new_err(format!("{command} on {url}: {e}")),
    }
}

pub(crate) fn bad(m: impl Into<String>) -> PyErr {
    RequestError::new_err(m.into())
}

/// The element type named `name` ("f32" or "f16") for the argument `what`.
pub(crate) fn element_type(what: &str, name: &str) -> PyResult<Dtype> {
    match name {
        "f32" => Ok(Dtype::F32),
        "f16" => Ok(Dtype::F16),
        d => Err(bad(format!("{what} {d:?}: use \"f32\" or \"f16\""))),
    }
}

pub(crate) fn f32s(name: &str, b: &[u8]) -> PyResult<Vec<f32>> {
    if !b.len().is_multiple_of(4) {
        return Err(bad(format!("{name}: {} bytes is not a whole number of f32 values", b.len())));
    }
    Ok(b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect())
}

/// SparF's step 1 on the host for a page-scores request: the queries `q` (as the target
/// will decode them) reduced to the `r` components each KV head's rows share.
fn reduce(q: &[f32], group: usize, head_dim: usize, r: usize, vectors: Dtype) -> (Vec<f32>, Option<ReducedQueries>) {
    let (dims, vals, l1) = insitu_kvcache::reduce_queries(&as_sent(q, vectors), group, head_dim, r);
    (vals, Some(ReducedQueries { dims: dims.into_iter().map(|d| d as u16).collect(), l1 }))
}

pub(crate) fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The KV cache and attention engine of one target, over NVMe/TCP vendor commands
/// (`docs/kv-commands.md`). `KvTarget("nvme-tcp://127.0.0.1:4420/NQN")`. Safe to share
/// between threads.
#[pyclass(module = "insitu", frozen)]
pub struct KvTarget {
    session: Session,
    /// The target's URL, for errors.
    url: String,
    next_tag: AtomicU32,
    /// One attention exchange (ATTEND then RESULT) at a time per tag space is enough; the
    /// lock keeps a result from being taken by another thread's RESULT.
    exchange: Mutex<()>,
    /// (KV heads, head size) of sequences seen, so a decode step costs one exchange.
    shapes: Mutex<std::collections::HashMap<u64, (usize, usize)>>,
}

/// A KV command `op` for exchange `tag` (CDW10) with options `cdw11`, moving `len` bytes.
fn kv_command(op: u8, tag: u32, cdw11: u32, len: usize) -> Command {
    let mut cmd = Command::zeroed();
    cmd.set_opcode(op).set_cdw(10, tag).set_cdw(11, cdw11).set_sgl(0, len as u32, SGL_TRANSPORT_DATA_BLOCK);
    cmd
}

impl KvTarget {
    fn send(&self, what: &str, op: u8, tag: u32, data: &[u8]) -> PyResult<u32> {
        let (cqe, _) = self.session.submit(kv_command(op, tag, 0, data.len()), Some(data), 0).map_err(|e| kv_err(&self.url, what, e))?;
        self.check(what, cqe.status)?;
        Ok(cqe.dw0)
    }

    fn result(&self, what: &str, tag: u32, len: usize) -> PyResult<Vec<u8>> {
        let (cqe, data) = self.session.submit(kv_command(opcode::KV_RESULT, tag, 0, len), None, len).map_err(|e| kv_err(&self.url, what, e))?;
        self.check(what, cqe.status)?;
        Ok(data)
    }

    fn check(&self, what: &str, status: u16) -> PyResult<()> {
        let (sct, sc) = (((status >> 8) & 7) as u8, (status & 0xFF) as u8);
        if sct == 0 && sc == 0 {
            return Ok(());
        }
        Err(kv_err(&self.url, what, InitiatorError::Status { command: "KV", sct, sc, dnr: status & (1 << 14) != 0 }))
    }

    fn admin(&self, what: &str, a: Admin) -> PyResult<u32> {
        self.send(what, opcode::KV_ADMIN, 0, &a.encode())
    }
}

#[pymethods]
impl KvTarget {
    /// Connects to `url` (`nvme-tcp://HOST:PORT/NQN`) as `hostnqn` (default: this host's).
    #[new]
    #[pyo3(signature = (url, hostnqn=None, io_queues=2))]
    fn new(py: Python<'_>, url: &str, hostnqn: Option<String>, io_queues: u16) -> PyResult<Self> {
        let u = insitu_attach::TargetUrl::parse(url).map_err(|e| bad(e.to_string()))?;
        let mut o = ConnectOptions::new(u.address(), u.nqn);
        o.hostnqn = hostnqn.unwrap_or_else(default_hostnqn);
        o.io_queues = io_queues;
        let session = py.allow_threads(|| Session::connect(o)).map_err(|e| kv_err(url, "connect", e))?;
        Ok(KvTarget { session, url: url.to_string(), next_tag: AtomicU32::new(1), exchange: Mutex::new(()), shapes: Mutex::new(Default::default()) })
    }

    /// Creates sequence `seq` with `layers` layers of `kv_heads` KV heads of `head_dim`,
    /// stored as `dtype` ("f32" or "f16") with `dims_per_page` dimensions of K per
    /// dimension-indexed page. The target frees it when this connection ends (closed,
    /// broken or timed out) unless it is `kept`, which lasts until freed, restarts included.
    #[pyo3(signature = (seq, layers, kv_heads, head_dim, dtype="f32", dims_per_page=1, kept=false))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments, one per shape field
    fn create(&self, py: Python<'_>, seq: u64, layers: usize, kv_heads: usize, head_dim: usize, dtype: &str, dims_per_page: usize, kept: bool) -> PyResult<()> {
        let dtype = element_type("dtype", dtype)?;
        if layers > 0xFFFF || kv_heads > 0xFFFF || head_dim > 0xFFFF || dims_per_page > 255 {
            return Err(bad("layers, KV heads, head size or dimensions per page out of range"));
        }
        py.allow_threads(|| self.admin("KV create", Admin::Create { seq, layers, kv_heads, head_dim, dtype, dims_per_page, kept })).map(|_| ())
    }

    /// Creates `child` sharing every token `parent` holds; freed with this connection
    /// unless `kept`, as [`create`](Self::create).
    #[pyo3(signature = (parent, child, kept=false))]
    fn fork(&self, py: Python<'_>, parent: u64, child: u64, kept: bool) -> PyResult<()> {
        py.allow_threads(|| self.admin("KV fork", Admin::Fork { parent, child, kept })).map(|_| ())
    }

    /// Frees a sequence.
    fn free(&self, py: Python<'_>, seq: u64) -> PyResult<()> {
        self.shapes.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&seq);
        py.allow_threads(|| self.admin("KV free", Admin::Free { seq })).map(|_| ())
    }

    /// `{"layers", "kv_heads", "head_dim", "dtype", "dims_per_page", "page_bytes", "tokens"}`.
    fn info<'py>(&self, py: Python<'py>, seq: u64) -> PyResult<Bound<'py, PyDict>> {
        let (layers, kv_heads, head_dim, dtype, dpp, page_bytes, tokens) = py.allow_threads(|| self.fetch_info(seq))?;
        let d = PyDict::new(py);
        d.set_item("layers", layers)?;
        d.set_item("kv_heads", kv_heads)?;
        d.set_item("head_dim", head_dim)?;
        d.set_item("dtype", if dtype == Dtype::F16 { "f16" } else { "f32" })?;
        d.set_item("dims_per_page", dpp)?;
        d.set_item("page_bytes", page_bytes)?;
        d.set_item("tokens", tokens)?;
        Ok(d)
    }

    /// Appends `tokens` tokens to `layer` of `seq`: `k` and `v` are f32 little-endian,
    /// `[kv_heads][tokens][head_dim]` for this target's heads. Split into commands that fit
    /// the target's transfer size. Returns the layer's token count.
    fn append(&self, py: Python<'_>, seq: u64, layer: usize, tokens: usize, k: &[u8], v: &[u8]) -> PyResult<u32> {
        let (k, v) = (f32s("k", k)?, f32s("v", v)?);
        if tokens == 0 || k.len() != v.len() || k.len() % tokens != 0 {
            return Err(bad(format!("k and v must both hold [kv_heads][{tokens}][head_dim] f32 values ({} and {} given)", k.len(), v.len())));
        }
        let per_token_all_heads = k.len() / tokens; // kv_heads * head_dim
        py.allow_threads(|| {
            let info = self.info_shape(seq)?;
            let (heads, head_dim) = info;
            if heads * head_dim != per_token_all_heads {
                return Err(TargetError::new_err(format!(
                    "KV append: sequence {seq} has {heads} KV heads of {head_dim} on this target, but k holds {per_token_all_heads} values per token"
                )));
            }
            let room = (self.session.max_transfer() - insitu_proto::attention::APPEND_HEADER_LEN) / (8 * per_token_all_heads);
            let step = room.max(1);
            let mut count = 0;
            let mut start = 0;
            while start < tokens {
                let n = step.min(tokens - start);
                let slice = |x: &[f32]| -> Vec<f32> {
                    (0..heads).flat_map(|h| x[(h * tokens + start) * head_dim..(h * tokens + start + n) * head_dim].iter().copied()).collect()
                };
                let a = Append { seq, layer, heads, head_dim, tokens: n, k: slice(&k), v: slice(&v) };
                count = self.send("KV append", opcode::KV_APPEND, 0, &a.encode())?;
                start += n;
            }
            Ok(count)
        })
    }

    /// Attention for layer `layer` over sequences `seqs`: `q` is f32
    /// `[len(seqs)][kv_heads][group][head_dim]`; `new_k`/`new_v` (f32
    /// `[len(seqs)][kv_heads][head_dim]`) are appended first when given (a decode step).
    /// `method` is "dense", "sparf" or "sparq" (with `r`, `k`, `local`; SparF reads at most
    /// `pages` token pages besides the local tokens', 0 for no cap; `mean_v` mixes the
    /// result with the mean of V by α, as the paper's step 11, else the kept tokens carry
    /// all the weight). Returns the
    /// outputs (same shape as `q`) and `{"pages_read", "media_bytes", "rows_used", "drive_wait_ns"}`.
    ///
    /// `partial=True` asks for one part of a split-K attention (the sequences' tokens held
    /// on several targets): a sequence with no token on this target is an empty part
    /// rather than an error, sparse methods need `mean_v=False`, and the call returns a
    /// third item, each query row's log-sum-exp of its scaled scores (f64 little-endian,
    /// `[len(seqs)][kv_heads][group]`, −inf for an empty part), by which the host merges
    /// the parts exactly.
    ///
    /// SparF over split sequences runs in two phases. `page_scores=True` (method "sparf",
    /// its `r` used) appends the new token when given, reads the dimension pages, and
    /// returns `(groups, stats, log_mass)`: the token groups each sequence holds here (a
    /// list), and f32 log-masses `[seq][kv_heads][group][its groups]`, sequence after
    /// sequence. Then `groups=[[...] per (seq, kv head)]` (method "dense", partial)
    /// attends over those token groups only. `result_len` is the result's expected size in
    /// bytes when the caller knows it (it saves a round trip). `vectors="f16"` carries the
    /// queries, the new K and V and the outputs as f16 on the link (half the bytes; the
    /// buffers given and returned stay f32). `new_rows`, with `new_k`/`new_v`: the
    /// entries (indices into `seqs`, ascending) the new K and V rows belong to, when only
    /// some sequences get a token here (`new_k` then `[len(new_rows)][kv_heads][head_dim]`).
    /// `reduced=True`, with `page_scores`: only the `r` components each KV head's rows
    /// share go up (chosen here as the target would choose them), not the whole queries.
    /// `send=False` builds and checks the request without sending it and returns it, for
    /// `insitu._native.attend_all` to send with other targets' requests at once.
    #[pyo3(signature = (layer, seqs, q, group, scale, method="dense", r=0, k=0, local=0, new_k=None, new_v=None, pages=0, mean_v=true, partial=false, page_scores=false, groups=None, result_len=0, vectors="f32", new_rows=None, reduced=false, send=true))]
    #[allow(clippy::too_many_arguments)]
    fn attend<'py>(
        slf: &Bound<'py, Self>,
        py: Python<'py>,
        layer: usize,
        seqs: Vec<u64>,
        q: &[u8],
        group: usize,
        scale: f32,
        method: &str,
        r: usize,
        k: usize,
        local: usize,
        new_k: Option<&[u8]>,
        new_v: Option<&[u8]>,
        pages: usize,
        mean_v: bool,
        partial: bool,
        page_scores: bool,
        groups: Option<Vec<Vec<u32>>>,
        result_len: usize,
        vectors: &str,
        new_rows: Option<Vec<usize>>,
        reduced: bool,
        send: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let vectors = element_type("vectors", vectors)?;
        let method = match method {
            "dense" => Method::Dense,
            "sparf" => Method::SparF { r, k, local, pages, mean_v },
            "sparq" => Method::SparQ { r, k, local, mean_v },
            m => return Err(bad(format!("method {m:?}: use \"dense\", \"sparf\" or \"sparq\""))),
        };
        let q = f32s("q", q)?;
        let entries = seqs.len();
        if entries == 0 || group == 0 || q.len() % (entries * group) != 0 {
            return Err(bad("q must hold [len(seqs)][kv_heads][group][head_dim] f32 values"));
        }
        let new_kv = match (new_k, new_v) {
            (Some(a), Some(b)) => Some((f32s("new_k", a)?, f32s("new_v", b)?)),
            (None, None) => None,
            _ => return Err(bad("give both new_k and new_v, or neither")),
        };
        if new_rows.is_some() && new_kv.is_none() {
            return Err(bad("new_rows needs new_k and new_v"));
        }
        if let Some(rows) = &new_rows {
            check_new_entries(rows, entries).map_err(|e| bad(format!("new_rows: {e}")))?;
        }
        let new_entries = new_rows;
        if reduced && !(page_scores && matches!(method, Method::SparF { .. })) {
            return Err(bad("reduced=True needs page_scores=True and method \"sparf\""));
        }
        let me = slf.get();
        let options = AttendOptions { partial, page_scores };
        let prepared = py.allow_threads(|| {
            let req = Attend { layer, heads: 0, group, head_dim: 0, method, scale, seqs, q, new_kv, new_entries, groups, vectors, reduced: None };
            me.prepare(req, reduced.then_some(r), options, result_len)
        })?;
        if !send {
            return Ok(Bound::new(py, Pending { target: slf.clone().unbind(), prepared })?.into_any());
        }
        let answer = py.allow_threads(|| me.run(&prepared))?;
        Ok(answer.into_py(py)?.into_any())
    }

    /// Bytes sent and received on the wire so far: `{"bytes_sent", "bytes_received"}`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.session.stats();
        let d = PyDict::new(py);
        d.set_item("bytes_sent", s.bytes_sent)?;
        d.set_item("bytes_received", s.bytes_received)?;
        Ok(d)
    }

    /// Closes the connection.
    fn disconnect(&self, py: Python<'_>) -> PyResult<()> {
        py.allow_threads(|| self.session.disconnect()).map_err(|e| kv_err(&self.url, "disconnect", e))
    }
}

/// What a KV_ATTEND answered: attention outputs, or SparF's page scores.
pub(crate) enum Answer {
    Outputs(AttendResult),
    Scores(PageScores),
}

impl Answer {
    /// The Python value `KvTarget.attend` returns for this answer.
    fn into_py(self, py: Python<'_>) -> PyResult<Bound<'_, PyTuple>> {
        let stats = |s: &insitu_proto::attention::AttendStats| -> PyResult<Bound<'_, PyAny>> {
            let d = PyDict::new(py);
            d.set_item("pages_read", s.pages_read)?;
            d.set_item("media_bytes", s.media_bytes)?;
            d.set_item("rows_used", s.rows_used)?;
            d.set_item("drive_wait_ns", s.drive_wait_ns)?;
            Ok(d.into_any())
        };
        match self {
            Answer::Scores(s) => {
                let groups = pyo3::types::PyList::new(py, &s.groups)?.into_any();
                PyTuple::new(py, [groups, stats(&s.stats)?, PyBytes::new(py, &to_bytes(&s.log_mass)).into_any()])
            }
            Answer::Outputs(r) => {
                let out = PyBytes::new(py, &to_bytes(&r.out)).into_any();
                match r.lse {
                    Some(lse) => {
                        let lse: Vec<u8> = lse.iter().flat_map(|x| x.to_le_bytes()).collect();
                        PyTuple::new(py, [out, stats(&r.stats)?, PyBytes::new(py, &lse).into_any()])
                    }
                    None => PyTuple::new(py, [out, stats(&r.stats)?]),
                }
            }
        }
    }
}

/// An attention request built and checked on the host, not yet sent.
pub(crate) struct PreparedAttend {
    req: Attend,
    options: AttendOptions,
    /// The result's expected length in bytes.
    want: usize,
}

/// `KvTarget.attend(..., send=False)`: a request ready to go, sent with others by
/// [`attend_all`].
#[pyclass(module = "insitu", frozen)]
pub struct Pending {
    target: Py<KvTarget>,
    prepared: PreparedAttend,
}

/// Sends every pending request (from `KvTarget.attend(..., send=False)`) at once, each on
/// its own target, and waits for all of them: one call, the GIL released throughout, where
/// a thread per target would hand the GIL and a future back and forth for each. Returns
/// their answers in order, as `KvTarget.attend` returns them; raises the first error.
#[pyfunction]
pub fn attend_all<'py>(py: Python<'py>, pending: Vec<Py<Pending>>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
    let answers = py.allow_threads(|| {
        let jobs: Vec<(&KvTarget, &PreparedAttend)> = pending.iter().map(|p| (p.get().target.get(), &p.get().prepared)).collect();
        run_all(&jobs)
    });
    answers.into_iter().map(|a| a?.into_py(py)).collect()
}

/// Runs every `(target, request)` at once and returns their answers in order: every
/// request is sent from this thread, then every answer read in turn
/// (`insitu_initiator::submit_pipelined_all`), so no thread is started or woken per
/// target. Call it without the GIL.
pub(crate) fn run_all(jobs: &[(&KvTarget, &PreparedAttend)]) -> Vec<PyResult<Answer>> {
    let distinct = jobs.iter().enumerate().all(|(i, (t, _))| jobs[..i].iter().all(|(u, _)| !std::ptr::eq(*t, *u)));
    if !distinct {
        // One exchange at a time per target: the same target twice goes one after the other.
        return jobs.iter().map(|(t, p)| t.run(p)).collect();
    }
    // Every target's exchange lock, taken in address order, so that two threads sending
    // to overlapping targets at once cannot each hold what the other waits for.
    let mut order: Vec<&KvTarget> = jobs.iter().map(|(t, _)| *t).collect();
    order.sort_by_key(|t| *t as *const KvTarget as usize);
    let _held: Vec<_> = order.iter().map(|t| t.exchange.lock().unwrap_or_else(std::sync::PoisonError::into_inner)).collect();
    let begun: Vec<Begun> = jobs.iter().map(|(t, p)| t.begin(p)).collect();
    let cmds: Vec<[Submission<'_>; 2]> = begun.iter().zip(jobs).map(|(b, (_, p))| b.commands(p.want)).collect();
    let sent: Vec<(&Session, &[Submission<'_>])> = jobs.iter().zip(&cmds).map(|((t, _), c)| (&t.session, &c[..])).collect();
    let done = insitu_initiator::submit_pipelined_all(&sent);
    jobs.iter().zip(&begun).zip(done).map(|(((t, p), b), d)| t.finish(p, b, d)).collect()
}

/// An attention exchange made ready to send: its tag and encoded request.
struct Begun {
    tag: u32,
    body: Vec<u8>,
    cdw11: u32,
}

impl Begun {
    /// The KV_ATTEND and the KV_RESULT asking for `want` bytes, sent back to back on one
    /// queue (a target waits for the result it is computing).
    fn commands(&self, want: usize) -> [Submission<'_>; 2] {
        [(kv_command(opcode::KV_ATTEND, self.tag, self.cdw11, self.body.len()), &self.body, 0), (kv_command(opcode::KV_RESULT, self.tag, 0, want), &[], want)]
    }
}

impl KvTarget {
    /// Checks `req` (its `heads` and `head_dim` filled in from the target) against the
    /// sequence it names and readies it: the queries reduced to `reduce_to` components
    /// when given (a page-scores request), the result's length worked out unless the
    /// caller knows it (`result_len` > 0).
    pub(crate) fn prepare(&self, mut req: Attend, reduce_to: Option<usize>, options: AttendOptions, result_len: usize) -> PyResult<PreparedAttend> {
        let entries = req.seqs.len();
        let (heads, head_dim) = self.info_shape(req.seqs[0])?;
        if req.q.len() != entries * heads * req.group * head_dim {
            return Err(TargetError::new_err(format!(
                "KV attend: q holds {} values; sequence {} needs {entries} x {heads} heads x {} x {head_dim}",
                req.q.len(),
                req.seqs[0],
                req.group
            )));
        }
        (req.heads, req.head_dim) = (heads, head_dim);
        if let Some(r) = reduce_to {
            let (q, reduced) = reduce(&req.q, req.group, head_dim, r, req.vectors);
            (req.q, req.reduced) = (q, reduced);
        }
        if req.layer > 0xFFFF {
            return Err(bad("layer out of range"));
        }
        let rows = req.q.len() / req.head_dim;
        let want = match (options.page_scores, result_len) {
            (_, n) if n > 0 => n,
            (true, _) => insitu_proto::attention::RESULT_HEADER_LEN,
            (false, _) => insitu_proto::attention::RESULT_HEADER_LEN + req.vectors.size() * req.q.len() + if options.partial { 8 * rows } else { 0 },
        };
        Ok(PreparedAttend { req, options, want })
    }

    /// Sends a prepared request and checks that its answer answers it.
    fn run(&self, p: &PreparedAttend) -> PyResult<Answer> {
        let _one = self.exchange.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let b = self.begin(p);
        let done = self.session.submit_pipelined(&b.commands(p.want));
        self.finish(p, &b, done)
    }

    /// A tag for `p`'s exchange and its encoded request (the exchange lock held).
    fn begin(&self, p: &PreparedAttend) -> Begun {
        Begun { tag: self.next_tag.fetch_add(1, Ordering::Relaxed), body: p.req.encode(), cdw11: p.options.cdw11() }
    }

    /// `p`'s answer from the completions of its KV_ATTEND and KV_RESULT (the exchange lock
    /// still held): the KV_ATTEND's error comes first, as it says why there is no result;
    /// a target that answered the KV_RESULT before the result was there is asked again.
    /// Then checks that the answer answers the request.
    fn finish(&self, p: &PreparedAttend, b: &Begun, done: Result<Answers, InitiatorError>) -> PyResult<Answer> {
        let req = &p.req;
        let mut done = done.map_err(|e| kv_err(&self.url, "KV attend", e))?;
        let (early, data) = done.pop().expect("two completions");
        let (sent, _) = done.pop().expect("two completions");
        self.check("KV attend", sent.status)?;
        let len = sent.dw0 as usize;
        let data = match self.check("KV attend", early.status) {
            Ok(()) if data.len() == len => data,
            _ => self.result("KV attend", b.tag, len)?,
        };
        if p.options.page_scores {
            let scores = PageScores::decode(&data).map_err(|e| StorageIOError::new_err(e.to_string()))?;
            if scores.groups.len() != req.seqs.len() || scores.heads != req.heads || scores.group != req.group {
                return Err(StorageIOError::new_err("KV page scores: the target's result does not answer the request"));
            }
            return Ok(Answer::Scores(scores));
        }
        let result = AttendResult::decode(&data).map_err(|e| StorageIOError::new_err(e.to_string()))?;
        if result.lse.is_some() != p.options.partial || result.out.len() != req.q.len() {
            return Err(StorageIOError::new_err(format!(
                "KV attend: the target's result does not answer the request ({} outputs for {} query values, log-sum-exp {})",
                result.out.len(),
                req.q.len(),
                if result.lse.is_some() { "present" } else { "absent" }
            )));
        }
        Ok(Answer::Outputs(result))
    }

    /// A sequence's KV info exchange (KV_ADMIN Info, then its KV_RESULT), decoded.
    fn fetch_info(&self, seq: u64) -> PyResult<insitu_proto::attention::InfoFields> {
        let _one = self.exchange.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        let len = self.send("KV info", opcode::KV_ADMIN, tag, &Admin::Info { seq }.encode())?;
        let data = self.result("KV info", tag, len as usize)?;
        decode_info(&data).map_err(|e| StorageIOError::new_err(e.to_string()))
    }

    /// (KV heads, head size) of a sequence, from the target.
    pub(crate) fn info_shape(&self, seq: u64) -> PyResult<(usize, usize)> {
        if let Some(s) = self.shapes.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&seq) {
            return Ok(*s);
        }
        let (_, heads, head_dim, ..) = self.fetch_info(seq)?;
        self.shapes.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(seq, (heads, head_dim));
        Ok((heads, head_dim))
    }
}

/// A target served by this process on loopback, for the embedded default: a sharable
/// namespace (NSID 1) and a private one (the KV cache), image files under `directory`
/// (created when missing, reused when present), optionally paced by a device model preset.
#[pyclass(module = "insitu", frozen)]
pub struct EmbeddedTarget {
    url: String,
    handle: Mutex<Option<insitu_daemon::Embedded>>,
}

#[pymethods]
impl EmbeddedTarget {
    #[new]
    #[pyo3(signature = (directory, shared_bytes, private_bytes, model=None))]
    fn new(py: Python<'_>, directory: PathBuf, shared_bytes: u64, private_bytes: u64, model: Option<String>) -> PyResult<Self> {
        if let Some(m) = model.as_deref() {
            insitu_model::parse(m).map_err(|e| bad(format!("device model: {e}")))?;
        }
        py.allow_threads(|| {
            let io = |e: std::io::Error| StorageIOError::new_err(format!("embedded target in {}: {e}", directory.display()));
            std::fs::create_dir_all(&directory).map_err(io)?;
            let image = |name: &str, size: u64| -> PyResult<PathBuf> {
                let p = directory.join(name);
                let f = std::fs::OpenOptions::new().create(true).truncate(false).read(true).write(true).open(&p).map_err(io)?;
                if f.metadata().map_err(io)?.len() < size {
                    f.set_len(size).map_err(io)?;
                }
                Ok(p)
            };
            let shared = image("shared.img", shared_bytes)?;
            let private = image("private.img", private_bytes)?;
            let nqn = "nqn.2024-01.io.insitu:embedded".to_string();
            let spec = insitu_daemon::TargetSpec {
                listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
                nqn: nqn.clone(),
                namespaces: vec![shared],
                private: vec![private],
                allow_hosts: Vec::new(),
                metrics: None,
                model,
                docker: None,
                registry_mirrors: Vec::new(),
                insecure_registries: Vec::new(),
                ether: None,
                kv_store: None,
                direct_reads: false,
            };
            let target =
                insitu_daemon::start_embedded(spec).map_err(|e| StorageIOError::new_err(format!("embedded target in {}: {e}", directory.display())))?;
            let url = format!("nvme-tcp://{}/{nqn}", target.local_addr());
            Ok(EmbeddedTarget { url, handle: Mutex::new(Some(target)) })
        })
    }

    /// `nvme-tcp://127.0.0.1:PORT/NQN`.
    #[getter]
    fn url(&self) -> String {
        self.url.clone()
    }

    /// Stops serving (idempotent).
    fn shutdown(&self, py: Python<'_>) {
        let h = self.handle.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(h) = h {
            py.allow_threads(|| h.shutdown());
        }
    }
}
