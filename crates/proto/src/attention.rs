// SPDX-License-Identifier: Apache-2.0
//! The byte format of the KV vendor commands (`docs/kv-commands.md` is the specification).
//!
//! Every request starts with a 4-byte magic and is little-endian throughout. Decoding
//! checks every length and field before anything is stored, so a malformed request fails
//! with [`BadRequest`] and changes nothing.

/// A malformed KV request or result; the message says which field and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub String);

/// Element type of the stored cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 => 2,
        }
    }

    /// The wire code (0 = f32, 1 = f16).
    pub fn code(self) -> u8 {
        match self {
            Dtype::F32 => 0,
            Dtype::F16 => 1,
        }
    }

    /// The element type of a wire code.
    pub fn from_code(c: u8) -> Result<Dtype, BadRequest> {
        match c {
            0 => Ok(Dtype::F32),
            1 => Ok(Dtype::F16),
            _ => Err(BadRequest(format!("unknown element type {c} (0 = f32, 1 = f16)"))),
        }
    }
}

/// How attention is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Every token: all token-indexed K and V pages are read.
    Dense,
    /// SparF: the `r` largest-magnitude query components select dimension-indexed K pages
    /// (approximate scores, L1-ratio scaled); the `k` best tokens (the last `local` tokens
    /// always among them) select token-indexed K and V pages; only selected units enter the
    /// computation (dual-step loading); with `mean_v` the result is mixed with the mean of V
    /// by α (the paper's step 11), else it is the softmax over the kept tokens alone.
    ///
    /// `r` is clamped to the head size; with `k` at least the number of tokens every token
    /// is kept, α is 1 and the call is computed (and counted) as [`Method::Dense`].
    ///
    /// `pages` caps the token pages read besides the first one and those of the local
    /// tokens (0: no cap). With grouped-query attention every query row picks its own
    /// tokens, and on real models their union touches about half of the pages at a 1/8
    /// ratio, so without a cap the first loading step saves little. With a cap the KV head
    /// selects as a whole (flash-aware selection: the page is the unit the drive reads):
    /// its rows share the `r` components of largest `Σ |q_row| / ‖q_row‖₁`, so `r`
    /// dimension pages are read rather than up to `rows · r`; the token pages are chosen
    /// before the tokens, the first page (the attention sink) and the local tokens' always,
    /// and the `pages` others on which some row puts the most approximate weight (its ŝ
    /// summed over the page); each row's `k` tokens come from those pages, all of them when
    /// `k` is at least their count.
    SparF {
        /// Query components kept.
        r: usize,
        /// Tokens kept.
        k: usize,
        /// Most recent tokens always kept.
        local: usize,
        /// Most token pages read besides the local tokens' (0: no cap).
        pages: usize,
        /// Mix with the mean of V by α, the approximate weight of the kept tokens (step 11 of
        /// Algorithm 1, SparQ's mean value reallocation). Off, the kept tokens carry all the
        /// weight: on SmolLM2-135M at 1/8 that is the more accurate of the two (see
        /// docs/llm.md), the mean of V standing in poorly for the tokens left out.
        mean_v: bool,
    },
    /// SparQ: the same selection and arithmetic as SparF, with media reads counted at element
    /// granularity, as a store without page groups would need (for comparison).
    ///
    /// The pages are still loaded through [`HeadPages`] (the data must come from somewhere),
    /// but the stats report `bytes = (c · tokens + 2 · t · head_dim) · element size` and
    /// `pages = ⌈bytes / page_bytes⌉`, where `c` and `t` are the distinct components and
    /// tokens kept by any query row (`r` and `k` for a single row).
    SparQ {
        /// Query components kept.
        r: usize,
        /// Tokens kept.
        k: usize,
        /// Most recent tokens always kept.
        local: usize,
        /// As for [`Method::SparF`].
        mean_v: bool,
    },
}

/// Counters of one attention call, as the vendor command reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AttendStats {
    /// Flash pages read.
    pub pages_read: u64,
    /// Bytes read from the media.
    pub media_bytes: u64,
    /// Token rows (K or V) that entered the computation after filtering.
    pub rows_used: u64,
    /// Nanoseconds the target waited, once its engine had finished the request, for the
    /// modelled drive to deliver the request's last read (0 on a target without a device
    /// model, or whose engine was the slower): the part of the request's time that the
    /// drive, not the engine, set.
    pub drive_wait_ns: u64,
}

impl std::ops::AddAssign for AttendStats {
    fn add_assign(&mut self, o: AttendStats) {
        self.pages_read += o.pages_read;
        self.media_bytes += o.media_bytes;
        self.rows_used += o.rows_used;
        self.drive_wait_ns += o.drive_wait_ns;
    }
}

/// Magic of an admin request (create, fork, free, info).
pub const ADMIN_MAGIC: &[u8; 4] = b"KVAD";
/// Magic of an append request.
pub const APPEND_MAGIC: &[u8; 4] = b"KVAP";
/// Magic of an attention request.
pub const ATTEND_MAGIC: &[u8; 4] = b"KVAT";
/// Magic of an attention result.
pub const RESULT_MAGIC: &[u8; 4] = b"KVRS";
/// Magic of a sequence-info result.
pub const INFO_MAGIC: &[u8; 4] = b"KVIN";
/// Format version of append and attention requests and results.
pub const VERSION: u8 = 1;
/// Length of an admin request.
pub const ADMIN_LEN: usize = 32;
/// Length of the fixed part of an append request.
pub const APPEND_HEADER_LEN: usize = 32;
/// Length of the fixed part of an attention request.
pub const ATTEND_HEADER_LEN: usize = 40;
/// Length of the fixed part of an attention result.
pub const RESULT_HEADER_LEN: usize = 48;
/// Most sequences in one attention request.
pub const MAX_ENTRIES: usize = 4096;
/// Most heads in one request.
pub const MAX_HEADS: usize = 1024;
/// Most query heads sharing one KV head.
pub const MAX_GROUP: usize = 64;
/// Largest head size.
pub const MAX_HEAD_DIM: usize = 1024;
/// Most layers of a sequence.
pub const MAX_LAYERS: usize = 1024;
/// Most tokens in one append.
pub const MAX_APPEND_TOKENS: usize = 1 << 20;

fn bad(m: impl Into<String>) -> BadRequest {
    BadRequest(m.into())
}

use crate::le::{u16_at, u32_at, u64_at};

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect()
}

fn put_f32s(out: &mut Vec<u8>, v: &[f32]) {
    out.reserve(v.len() * 4);
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

/// Values of element type `dtype` (f32 or f16, little-endian) as f32.
fn read_vectors(b: &[u8], dtype: Dtype) -> Vec<f32> {
    match dtype {
        Dtype::F32 => f32s(b),
        Dtype::F16 => b.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
    }
}

/// The values a target decodes from `v` sent as `dtype` (f16: rounded to nearest): what
/// a host computing on its queries as the target does must start from.
pub fn as_sent(v: &[f32], dtype: Dtype) -> Vec<f32> {
    match dtype {
        Dtype::F32 => v.to_vec(),
        Dtype::F16 => v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect(),
    }
}

/// Appends `v` as `dtype` values (f16: rounded to nearest).
fn put_vectors(out: &mut Vec<u8>, v: &[f32], dtype: Dtype) {
    match dtype {
        Dtype::F32 => put_f32s(out, v),
        Dtype::F16 => {
            out.reserve(2 * v.len());
            v.iter().for_each(|x| out.extend_from_slice(&half::f16::from_f32(*x).to_le_bytes()));
        }
    }
}

fn check_magic(b: &[u8], magic: &[u8; 4], min: usize, what: &str) -> Result<(), BadRequest> {
    if b.len() < min {
        return Err(bad(format!("{what} is {} bytes, shorter than its {min}-byte header", b.len())));
    }
    if &b[..4] != magic {
        return Err(bad(format!("{what} does not start with {:?}", String::from_utf8_lossy(magic))));
    }
    Ok(())
}

fn check_range(name: &str, v: usize, max: usize) -> Result<usize, BadRequest> {
    if v == 0 || v > max {
        return Err(bad(format!("{name} {v} is not in 1..={max}")));
    }
    Ok(v)
}

/// An admin request.
#[derive(Debug, Clone, PartialEq)]
pub enum Admin {
    /// Create a sequence.
    Create {
        /// Sequence id.
        seq: u64,
        /// Layers.
        layers: usize,
        /// KV heads kept on this target.
        kv_heads: usize,
        /// Head size.
        head_dim: usize,
        /// Stored element type.
        dtype: Dtype,
        /// Dimensions per dimension-indexed page.
        dims_per_page: usize,
        /// Kept until freed, across hosts and restarts; otherwise the sequence belongs to
        /// the controller that created it and is freed when that controller ends.
        kept: bool,
    },
    /// Fork `parent` into `child`.
    Fork {
        /// The sequence forked.
        parent: u64,
        /// The new sequence.
        child: u64,
        /// The child is kept (as [`Admin::Create`]'s `kept`).
        kept: bool,
    },
    /// Free a sequence.
    Free {
        /// The sequence.
        seq: u64,
    },
    /// Leave the sequence's info as the command's result.
    Info {
        /// The sequence.
        seq: u64,
    },
}

const OP_CREATE: u8 = 1;
const OP_FORK: u8 = 2;
const OP_FREE: u8 = 3;
const OP_INFO: u8 = 4;
/// Admin flags (byte 7), bit 0: the sequence created or forked is kept.
const ADMIN_KEPT: u8 = 1;

impl Admin {
    /// Encodes the request.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; ADMIN_LEN];
        b[..4].copy_from_slice(ADMIN_MAGIC);
        let (op, seq, other) = match *self {
            Admin::Create { seq, layers, kv_heads, head_dim, dtype, dims_per_page, kept } => {
                b[5] = dtype.code();
                b[6] = dims_per_page as u8;
                b[7] = u8::from(kept) * ADMIN_KEPT;
                b[24..26].copy_from_slice(&(layers as u16).to_le_bytes());
                b[26..28].copy_from_slice(&(kv_heads as u16).to_le_bytes());
                b[28..30].copy_from_slice(&(head_dim as u16).to_le_bytes());
                (OP_CREATE, seq, 0)
            }
            Admin::Fork { parent, child, kept } => {
                b[7] = u8::from(kept) * ADMIN_KEPT;
                (OP_FORK, parent, child)
            }
            Admin::Free { seq } => (OP_FREE, seq, 0),
            Admin::Info { seq } => (OP_INFO, seq, 0),
        };
        b[4] = op;
        b[8..16].copy_from_slice(&seq.to_le_bytes());
        b[16..24].copy_from_slice(&other.to_le_bytes());
        b
    }

    /// Decodes a request.
    pub fn decode(b: &[u8]) -> Result<Admin, BadRequest> {
        check_magic(b, ADMIN_MAGIC, ADMIN_LEN, "KV admin request")?;
        if b.len() != ADMIN_LEN {
            return Err(bad(format!("KV admin request is {} bytes, not {ADMIN_LEN}", b.len())));
        }
        let seq = u64_at(b, 8);
        let flags = b[7];
        if flags != 0 && !matches!(b[4], OP_CREATE | OP_FORK) || flags & !ADMIN_KEPT != 0 {
            return Err(bad(format!("KV admin flags {flags:#04x}: only bit 0 (kept) exists, and only for create and fork")));
        }
        let kept = flags & ADMIN_KEPT != 0;
        match b[4] {
            OP_CREATE => Ok(Admin::Create {
                seq,
                layers: check_range("layers", usize::from(u16_at(b, 24)), MAX_LAYERS)?,
                kv_heads: check_range("KV heads", usize::from(u16_at(b, 26)), MAX_HEADS)?,
                head_dim: check_range("head size", usize::from(u16_at(b, 28)), MAX_HEAD_DIM)?,
                dtype: Dtype::from_code(b[5])?,
                dims_per_page: usize::from(b[6].max(1)),
                kept,
            }),
            OP_FORK => Ok(Admin::Fork { parent: seq, child: u64_at(b, 16), kept }),
            OP_FREE => Ok(Admin::Free { seq }),
            OP_INFO => Ok(Admin::Info { seq }),
            op => Err(bad(format!("unknown KV admin operation {op} (1 create, 2 fork, 3 free, 4 info)"))),
        }
    }
}

/// An append request: `tokens` tokens of every KV head of one layer.
#[derive(Debug, Clone, PartialEq)]
pub struct Append {
    /// Sequence id.
    pub seq: u64,
    /// Layer.
    pub layer: usize,
    /// KV heads (all the sequence has on this target).
    pub heads: usize,
    /// Head size.
    pub head_dim: usize,
    /// Tokens.
    pub tokens: usize,
    /// Keys, `[heads][tokens][head_dim]`.
    pub k: Vec<f32>,
    /// Values, same shape.
    pub v: Vec<f32>,
}

impl Append {
    /// Encodes the request.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; APPEND_HEADER_LEN];
        b[..4].copy_from_slice(APPEND_MAGIC);
        b[4] = VERSION;
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..18].copy_from_slice(&(self.layer as u16).to_le_bytes());
        b[18..20].copy_from_slice(&(self.heads as u16).to_le_bytes());
        b[20..22].copy_from_slice(&(self.head_dim as u16).to_le_bytes());
        b[24..28].copy_from_slice(&(self.tokens as u32).to_le_bytes());
        put_f32s(&mut b, &self.k);
        put_f32s(&mut b, &self.v);
        b
    }

    /// Decodes a request.
    pub fn decode(b: &[u8]) -> Result<Append, BadRequest> {
        check_magic(b, APPEND_MAGIC, APPEND_HEADER_LEN, "KV append request")?;
        if b[4] != VERSION {
            return Err(bad(format!("KV append request version {} (this target speaks {VERSION})", b[4])));
        }
        let heads = check_range("KV heads", usize::from(u16_at(b, 18)), MAX_HEADS)?;
        let head_dim = check_range("head size", usize::from(u16_at(b, 20)), MAX_HEAD_DIM)?;
        let tokens = check_range("tokens", u32_at(b, 24) as usize, MAX_APPEND_TOKENS)?;
        let n = heads * tokens * head_dim;
        let want = APPEND_HEADER_LEN as u64 + 8 * n as u64;
        if b.len() as u64 != want {
            return Err(bad(format!("KV append of {tokens} tokens x {heads} heads x {head_dim} needs {want} bytes, got {}", b.len())));
        }
        let body = &b[APPEND_HEADER_LEN..];
        Ok(Append { seq: u64_at(b, 8), layer: usize::from(u16_at(b, 16)), heads, head_dim, tokens, k: f32s(&body[..4 * n]), v: f32s(&body[4 * n..]) })
    }
}

/// An attention request: one layer, a batch of sequences, every KV head on this target.
#[derive(Debug, Clone, PartialEq)]
pub struct Attend {
    /// Layer.
    pub layer: usize,
    /// KV heads.
    pub heads: usize,
    /// Query heads per KV head.
    pub group: usize,
    /// Head size.
    pub head_dim: usize,
    /// How to attend.
    pub method: Method,
    /// Score scale (1/sqrt(head_dim) for most models).
    pub scale: f32,
    /// The sequences, one per batch entry.
    pub seqs: Vec<u64>,
    /// Queries, `[entries][heads][group][head_dim]`.
    pub q: Vec<f32>,
    /// The new token's keys and values, `[entries][heads][head_dim]` each, appended before
    /// attending (decode step), when present.
    pub new_kv: Option<(Vec<f32>, Vec<f32>)>,
    /// The entries `new_kv` holds a token for, strictly ascending (its rows in that
    /// order); `None`: every entry. A host that splits sequences over targets sends each
    /// target the new tokens it stores, which differ by sequence, in the same request.
    pub new_entries: Option<Vec<usize>>,
    /// With [`Method::Dense`] only: per (entry, KV head), entry-major, the token groups
    /// (flash pages of the token-indexed copy, ascending) to attend over instead of every
    /// token: the second phase of SparF over a sequence split across targets, the host
    /// having chosen the pages from every target's [`PageScores`]. Needs a partial result.
    pub groups: Option<Vec<Vec<u32>>>,
    /// The element type of the queries and the new token's K and V on the wire (flag bit
    /// 3: f16), and of the outputs the target answers with: f16 halves the link bytes of a
    /// host whose model runs in half precision. Decoded values are always f32 here.
    pub vectors: Dtype,
    /// With [`Method::SparF`] page scores only (flag bit 5): the queries reduced to the
    /// `r` components each KV head's rows share, `q` then holding
    /// `[entries][heads][group][r]` values. The page scores only read those components;
    /// the full queries would cross the link for nothing.
    pub reduced: Option<ReducedQueries>,
}

/// What a reduced query carries besides its `r` values (see [`Attend::reduced`]): the host
/// makes SparF's step 1 (the shared choice of components) and sends the result.
#[derive(Debug, Clone, PartialEq)]
pub struct ReducedQueries {
    /// Per (entry, KV head), entry-major, the `r` components its rows share, strictly
    /// ascending, each below the head size.
    pub dims: Vec<u16>,
    /// Per query row, `‖q‖₁` over all its components (the temperature's denominator),
    /// `[entries][heads][group]`.
    pub l1: Vec<f64>,
}

const FLAG_APPEND: u8 = 1;
/// Sparse methods: the softmax over the kept tokens alone, not mixed with the mean of V (a
/// clear bit keeps the paper's step 11, so requests from before the bit mean what they did).
const FLAG_NO_MEAN_V: u8 = 2;
/// A token-group list per (entry, KV head) follows the new token's K and V.
const FLAG_GROUPS: u8 = 4;
/// The queries and the new token's K and V are f16, and so are the result's outputs.
const FLAG_F16_VECTORS: u8 = 8;
/// With [`FLAG_APPEND`]: the new tokens are for some entries only, listed after the queries.
const FLAG_SOME_ENTRIES: u8 = 16;
/// The queries are reduced to the components of SparF's step 1 ([`Attend::reduced`]).
const FLAG_REDUCED_QUERIES: u8 = 32;
/// Most token groups in one list (a 4 KiB page of 8 f32 tokens each: 2^27 tokens).
pub const MAX_GROUPS: usize = 1 << 24;

impl Attend {
    /// Encodes the request.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; ATTEND_HEADER_LEN];
        b[..4].copy_from_slice(ATTEND_MAGIC);
        b[4] = VERSION;
        let (m, r, k, local, pages, mean_v) = match self.method {
            Method::Dense => (0u8, 0, 0, 0, 0, true),
            Method::SparF { r, k, local, pages, mean_v } => (1, r, k, local, pages, mean_v),
            Method::SparQ { r, k, local, mean_v } => (2, r, k, local, 0, mean_v),
        };
        b[5] = m;
        b[6] = if self.new_kv.is_some() { FLAG_APPEND } else { 0 }
            | if mean_v { 0 } else { FLAG_NO_MEAN_V }
            | if self.groups.is_some() { FLAG_GROUPS } else { 0 }
            | if self.vectors == Dtype::F16 { FLAG_F16_VECTORS } else { 0 }
            | if self.new_kv.is_some() && self.new_entries.is_some() { FLAG_SOME_ENTRIES } else { 0 }
            | if self.reduced.is_some() { FLAG_REDUCED_QUERIES } else { 0 };
        b[8..10].copy_from_slice(&(self.layer as u16).to_le_bytes());
        b[10..12].copy_from_slice(&(self.heads as u16).to_le_bytes());
        b[12..14].copy_from_slice(&(self.group as u16).to_le_bytes());
        b[14..16].copy_from_slice(&(self.head_dim as u16).to_le_bytes());
        b[16..18].copy_from_slice(&(self.seqs.len() as u16).to_le_bytes());
        b[18..20].copy_from_slice(&(r as u16).to_le_bytes());
        b[20..24].copy_from_slice(&(k as u32).to_le_bytes());
        b[24..28].copy_from_slice(&(local as u32).to_le_bytes());
        b[28..32].copy_from_slice(&self.scale.to_le_bytes());
        b[32..36].copy_from_slice(&(pages as u32).to_le_bytes());
        let listed = self.new_kv.as_ref().and(self.new_entries.as_ref());
        b[36..40].copy_from_slice(&(listed.map_or(0, Vec::len) as u32).to_le_bytes());
        for s in &self.seqs {
            b.extend_from_slice(&s.to_le_bytes());
        }
        if let Some(red) = &self.reduced {
            red.dims.iter().for_each(|d| b.extend_from_slice(&d.to_le_bytes()));
        }
        put_vectors(&mut b, &self.q, self.vectors);
        if let Some(red) = &self.reduced {
            red.l1.iter().for_each(|x| b.extend_from_slice(&x.to_le_bytes()));
        }
        for e in listed.into_iter().flatten() {
            b.extend_from_slice(&(*e as u32).to_le_bytes());
        }
        if let Some((k, v)) = &self.new_kv {
            put_vectors(&mut b, k, self.vectors);
            put_vectors(&mut b, v, self.vectors);
        }
        for list in self.groups.iter().flatten() {
            b.extend_from_slice(&(list.len() as u32).to_le_bytes());
            list.iter().for_each(|g| b.extend_from_slice(&g.to_le_bytes()));
        }
        b
    }

    /// Decodes a request.
    pub fn decode(b: &[u8]) -> Result<Attend, BadRequest> {
        check_magic(b, ATTEND_MAGIC, ATTEND_HEADER_LEN, "KV attention request")?;
        if b[4] != VERSION {
            return Err(bad(format!("KV attention request version {} (this target speaks {VERSION})", b[4])));
        }
        if b[6] & !(FLAG_APPEND | FLAG_NO_MEAN_V | FLAG_GROUPS | FLAG_F16_VECTORS | FLAG_SOME_ENTRIES | FLAG_REDUCED_QUERIES) != 0 {
            return Err(bad(format!("unknown KV attention flags {:#04x}", b[6])));
        }
        let mean_v = b[6] & FLAG_NO_MEAN_V == 0;
        let heads = check_range("KV heads", usize::from(u16_at(b, 10)), MAX_HEADS)?;
        let group = check_range("query heads per KV head", usize::from(u16_at(b, 12)), MAX_GROUP)?;
        let head_dim = check_range("head size", usize::from(u16_at(b, 14)), MAX_HEAD_DIM)?;
        let entries = check_range("batch entries", usize::from(u16_at(b, 16)), MAX_ENTRIES)?;
        let (r, k, local) = (usize::from(u16_at(b, 18)), u32_at(b, 20) as usize, u32_at(b, 24) as usize);
        let method = match b[5] {
            0 if !mean_v => return Err(bad("KV attention flag 0x02 (no mean of V) needs a sparse method")),
            0 => Method::Dense,
            m @ (1 | 2) => {
                if r == 0 || r > head_dim || k == 0 || local > k {
                    return Err(bad(format!("sparse attention needs 1 <= r <= {head_dim} (got {r}), k >= 1 (got {k}) and local <= k (got {local})")));
                }
                if m == 1 {
                    Method::SparF { r, k, local, pages: u32_at(b, 32) as usize, mean_v }
                } else {
                    Method::SparQ { r, k, local, mean_v }
                }
            }
            m => return Err(bad(format!("unknown attention method {m} (0 dense, 1 SparF, 2 SparQ)"))),
        };
        let scale = f32::from_le_bytes(b[28..32].try_into().expect("4 bytes"));
        if !scale.is_finite() || scale <= 0.0 {
            return Err(bad(format!("score scale {scale} is not a positive number")));
        }
        let append = b[6] & FLAG_APPEND != 0;
        let with_groups = b[6] & FLAG_GROUPS != 0;
        if with_groups && method != Method::Dense {
            return Err(bad("KV attention flag 0x04 (token groups) needs the dense method"));
        }
        if with_groups && append {
            return Err(bad("KV attention flag 0x04 (token groups) cannot come with a new token (flag 0x01): the groups are chosen over what is stored"));
        }
        let some = b[6] & FLAG_SOME_ENTRIES != 0;
        if some && !append {
            return Err(bad("KV attention flag 0x10 (new tokens for some entries) needs flag 0x01 (new tokens)"));
        }
        let listed = if some { u32_at(b, 36) as usize } else { 0 };
        if some && !(1..=entries).contains(&listed) {
            return Err(bad(format!("KV attention request lists {listed} entries with a new token; it has {entries}")));
        }
        let reduced = b[6] & FLAG_REDUCED_QUERIES != 0;
        if reduced && !matches!(method, Method::SparF { .. }) {
            return Err(bad("KV attention flag 0x20 (reduced queries) needs the SparF method (its page scores)"));
        }
        // Reduced: r values a row, after the r components of each (entry, KV head).
        let (per_row, dims_n, l1_n) = if reduced { (r, entries * heads * r, entries * heads * group) } else { (head_dim, 0, 0) };
        let nq = entries * heads * group * per_row;
        let nkv = match (append, some) {
            (false, _) => 0,
            (true, false) => entries * heads * head_dim,
            (true, true) => listed * heads * head_dim,
        };
        let vectors = if b[6] & FLAG_F16_VECTORS != 0 { Dtype::F16 } else { Dtype::F32 };
        let size = vectors.size();
        let want = ATTEND_HEADER_LEN as u64 + 8 * entries as u64 + 4 * listed as u64 + (size * (nq + 2 * nkv) + 2 * dims_n + 8 * l1_n) as u64;
        let fixed_ok = if with_groups { b.len() as u64 >= want } else { b.len() as u64 == want };
        if !fixed_ok {
            return Err(bad(format!("KV attention request for {entries} entries x {heads} heads x {group} x {head_dim} needs {want} bytes, got {}", b.len())));
        }
        let groups = if with_groups { Some(decode_groups(&b[want as usize..], entries * heads)?) } else { None };
        let mut o = ATTEND_HEADER_LEN;
        let seqs = (0..entries).map(|i| u64_at(b, o + 8 * i)).collect();
        o += 8 * entries;
        let dims: Vec<u16> = (0..dims_n).map(|i| u16_at(b, o + 2 * i)).collect();
        o += 2 * dims_n;
        let q = read_vectors(&b[o..o + size * nq], vectors);
        o += size * nq;
        let reduced = if reduced {
            dims.chunks(r.max(1)).try_for_each(|run| check_components(run, head_dim))?;
            let l1: Vec<f64> = (0..l1_n).map(|i| f64::from_le_bytes(b[o + 8 * i..o + 8 * i + 8].try_into().expect("8 bytes"))).collect();
            if let Some(x) = l1.iter().find(|x| !x.is_finite() || **x < 0.0) {
                return Err(bad(format!("KV attention request: a reduced query's ‖q‖₁ of {x} is not a number of 0 or more")));
            }
            o += 8 * l1_n;
            Some(ReducedQueries { dims, l1 })
        } else {
            None
        };
        let new_entries = if some {
            let list: Vec<usize> = (0..listed).map(|i| u32_at(b, o + 4 * i) as usize).collect();
            check_new_entries(&list, entries)?;
            o += 4 * listed;
            Some(list)
        } else {
            None
        };
        let new_kv = append.then(|| (read_vectors(&b[o..o + size * nkv], vectors), read_vectors(&b[o + size * nkv..o + 2 * size * nkv], vectors)));
        Ok(Attend { layer: usize::from(u16_at(b, 8)), heads, group, head_dim, method, scale, seqs, q, new_kv, new_entries, groups, vectors, reduced })
    }
}

/// Refuses the components one (entry, KV head)'s reduced queries share
/// ([`ReducedQueries::dims`]) unless there is at least one, strictly ascending, each below
/// `head_dim`: the one check of the decoder and of the engine's reduced page scores.
pub fn check_components<T: Copy + Into<usize> + std::fmt::Debug>(run: &[T], head_dim: usize) -> Result<(), BadRequest> {
    if run.is_empty() || run.windows(2).any(|w| w[0].into() >= w[1].into()) || run.last().is_some_and(|&d| d.into() >= head_dim) {
        return Err(bad(format!("reduced query components {run:?} are not strictly ascending below the head size {head_dim}")));
    }
    Ok(())
}

/// Refuses a list of the entries with a new token ([`Attend::new_entries`]) of a request
/// with `entries` entries unless it names at least one, strictly ascending, each below
/// `entries`.
pub fn check_new_entries(list: &[usize], entries: usize) -> Result<(), BadRequest> {
    if list.is_empty() || list.windows(2).any(|w| w[0] >= w[1]) || list.last().is_some_and(|&e| e >= entries) {
        return Err(bad(format!("the entries with a new token must be at least one, strictly ascending and below {entries}, got {list:?}")));
    }
    Ok(())
}

/// `lists` token-group lists, each a u32 count and that many ascending u32 groups, filling
/// `b` exactly.
fn decode_groups(mut b: &[u8], lists: usize) -> Result<Vec<Vec<u32>>, BadRequest> {
    let mut out = Vec::with_capacity(lists);
    for i in 0..lists {
        if b.len() < 4 {
            return Err(bad(format!("KV attention request: token-group list {i} of {lists} is missing")));
        }
        let n = u32_at(b, 0) as usize;
        if n > MAX_GROUPS || b.len() - 4 < 4 * n {
            return Err(bad(format!("KV attention request: token-group list {i} claims {n} groups, more than the {} bytes left hold", b.len() - 4)));
        }
        let list: Vec<u32> = (0..n).map(|j| u32_at(b, 4 + 4 * j)).collect();
        if list.windows(2).any(|w| w[0] >= w[1]) {
            return Err(bad(format!("KV attention request: token-group list {i} is not strictly ascending")));
        }
        out.push(list);
        b = &b[4 + 4 * n..];
    }
    if !b.is_empty() {
        return Err(bad(format!("KV attention request: {} bytes follow the last token-group list", b.len())));
    }
    Ok(out)
}

/// Options of a KV_ATTEND command carried in its command dword 11 rather than in the
/// request body, so that a request's bytes mean the same with or without them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AttendOptions {
    /// The result carries each query row's log-sum-exp of the scores it attended over
    /// ([`AttendResult::lse`]), and a batch entry whose sequence holds no token on this
    /// target gets an empty part (output 0, log-sum-exp −∞) instead of an error. With it a
    /// host that splits a sequence's tokens over several targets merges their parts
    /// exactly (split-K attention).
    pub partial: bool,
    /// The first phase of SparF over a sequence split across targets: with
    /// [`Method::SparF`] (its `r` used, the rest ignored) the target appends the new
    /// token, chooses the components and reads their dimension pages, and returns
    /// [`PageScores`] instead of attention outputs.
    pub page_scores: bool,
}

/// CDW11 bit 0 of KV_ATTEND: [`AttendOptions::partial`].
const CDW11_PARTIAL: u32 = 1;
/// CDW11 bit 1 of KV_ATTEND: [`AttendOptions::page_scores`].
const CDW11_PAGE_SCORES: u32 = 2;

impl AttendOptions {
    /// The command dword 11 that carries these options.
    pub fn cdw11(self) -> u32 {
        (if self.partial { CDW11_PARTIAL } else { 0 }) | if self.page_scores { CDW11_PAGE_SCORES } else { 0 }
    }

    /// The options of a KV_ATTEND's command dword 11; unknown bits are refused, so a host
    /// never believes a target honoured an option it does not know.
    pub fn from_cdw11(cdw11: u32) -> Result<AttendOptions, BadRequest> {
        if cdw11 & !(CDW11_PARTIAL | CDW11_PAGE_SCORES) != 0 {
            return Err(bad(format!("unknown KV attention options {cdw11:#010x} in CDW11 (bit 0: partial result, bit 1: page scores)")));
        }
        Ok(AttendOptions { partial: cdw11 & CDW11_PARTIAL != 0, page_scores: cdw11 & CDW11_PAGE_SCORES != 0 })
    }
}

/// The result of an attention request.
#[derive(Debug, Clone, PartialEq)]
pub struct AttendResult {
    /// Batch entries.
    pub entries: usize,
    /// KV heads.
    pub heads: usize,
    /// Query heads per KV head.
    pub group: usize,
    /// Head size.
    pub head_dim: usize,
    /// What the call cost.
    pub stats: AttendStats,
    /// Outputs, `[entries][heads][group][head_dim]`.
    pub out: Vec<f32>,
    /// With [`AttendOptions::partial`]: per query row (`[entries][heads][group]`), the
    /// natural log of the sum of `exp(score)` over the tokens the row attended to (scores
    /// scaled), −∞ for a row that attended to none. `out` of a row is its softmax-weighted
    /// sum of V over those tokens; parts from disjoint token sets merge exactly as
    /// `Σ exp(lse_i − L)·out_i` with `L = log Σ exp(lse_i)`.
    pub lse: Option<Vec<f64>>,
    /// The element type of `out` on the wire (result flag bit 1: f16), that of the
    /// request's queries.
    pub vectors: Dtype,
}

/// Result flags (byte 5): the log-sum-exp section follows the outputs.
const RESULT_FLAG_LSE: u8 = 1;
/// Result flags (byte 5): the outputs are f16.
const RESULT_FLAG_F16: u8 = 2;

impl AttendResult {
    /// Encodes the result.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; RESULT_HEADER_LEN];
        b[..4].copy_from_slice(RESULT_MAGIC);
        b[4] = VERSION;
        b[6..8].copy_from_slice(&(self.entries as u16).to_le_bytes());
        b[8..10].copy_from_slice(&(self.heads as u16).to_le_bytes());
        b[10..12].copy_from_slice(&(self.group as u16).to_le_bytes());
        b[12..14].copy_from_slice(&(self.head_dim as u16).to_le_bytes());
        b[16..24].copy_from_slice(&self.stats.pages_read.to_le_bytes());
        b[24..32].copy_from_slice(&self.stats.media_bytes.to_le_bytes());
        b[32..40].copy_from_slice(&self.stats.rows_used.to_le_bytes());
        b[40..48].copy_from_slice(&self.stats.drive_wait_ns.to_le_bytes());
        put_vectors(&mut b, &self.out, self.vectors);
        if self.vectors == Dtype::F16 {
            b[5] |= RESULT_FLAG_F16;
        }
        if let Some(lse) = &self.lse {
            b[5] |= RESULT_FLAG_LSE;
            b.reserve(8 * lse.len());
            lse.iter().for_each(|x| b.extend_from_slice(&x.to_le_bytes()));
        }
        b
    }

    /// Decodes a result.
    pub fn decode(b: &[u8]) -> Result<AttendResult, BadRequest> {
        check_magic(b, RESULT_MAGIC, RESULT_HEADER_LEN, "KV attention result")?;
        let (entries, heads, group, head_dim) = (usize::from(u16_at(b, 6)), usize::from(u16_at(b, 8)), usize::from(u16_at(b, 10)), usize::from(u16_at(b, 12)));
        if b[5] & !(RESULT_FLAG_LSE | RESULT_FLAG_F16) != 0 {
            return Err(bad(format!("unknown KV attention result flags {:#04x}", b[5])));
        }
        let with_lse = b[5] & RESULT_FLAG_LSE != 0;
        let vectors = if b[5] & RESULT_FLAG_F16 != 0 { Dtype::F16 } else { Dtype::F32 };
        // In u128: four u16 fields and the element size overflow a u64.
        let rows = [entries, heads, group].iter().map(|&x| x as u128).product::<u128>();
        let outputs = vectors.size() as u128 * rows * head_dim as u128;
        let want = RESULT_HEADER_LEN as u128 + outputs + if with_lse { 8 * rows } else { 0 };
        if b.len() as u128 != want {
            return Err(bad(format!("KV attention result is {} bytes, expected {want}", b.len())));
        }
        let stats = AttendStats { pages_read: u64_at(b, 16), media_bytes: u64_at(b, 24), rows_used: u64_at(b, 32), drive_wait_ns: u64_at(b, 40) };
        // The length check above bounds both sections by the buffer, so these fit a usize.
        let split = RESULT_HEADER_LEN + outputs as usize;
        let lse = with_lse.then(|| b[split..].chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect());
        Ok(AttendResult { entries, heads, group, head_dim, stats, out: read_vectors(&b[RESULT_HEADER_LEN..split], vectors), lse, vectors })
    }
}

/// Magic of a page-scores result.
pub const PAGE_SCORES_MAGIC: &[u8; 4] = b"KVPS";

/// The result of a KV_ATTEND with [`AttendOptions::page_scores`]: per batch entry, the
/// token groups (pages) it holds on this target, and per (KV head, query row, group) the
/// log of the group's approximate mass, `log Σ exp(ŝ_t)` over its tokens (`ŝ` SparF's
/// temperature-scaled partial scores, before the softmax).
#[derive(Debug, Clone, PartialEq)]
pub struct PageScores {
    /// KV heads.
    pub heads: usize,
    /// Query heads per KV head.
    pub group: usize,
    /// What the call cost (the dimension pages read).
    pub stats: AttendStats,
    /// Per batch entry, its token groups on this target.
    pub groups: Vec<u32>,
    /// Per batch entry, `[heads][group][groups]` log-masses, entry after entry.
    pub log_mass: Vec<f32>,
}

impl PageScores {
    /// Encodes the result: a 48-byte header (magic, version, entries, heads, group, the
    /// stats), a u32 group count per entry, then the log-masses.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; RESULT_HEADER_LEN];
        b[..4].copy_from_slice(PAGE_SCORES_MAGIC);
        b[4] = VERSION;
        b[6..8].copy_from_slice(&(self.groups.len() as u16).to_le_bytes());
        b[8..10].copy_from_slice(&(self.heads as u16).to_le_bytes());
        b[10..12].copy_from_slice(&(self.group as u16).to_le_bytes());
        b[16..24].copy_from_slice(&self.stats.pages_read.to_le_bytes());
        b[24..32].copy_from_slice(&self.stats.media_bytes.to_le_bytes());
        b[32..40].copy_from_slice(&self.stats.rows_used.to_le_bytes());
        b[40..48].copy_from_slice(&self.stats.drive_wait_ns.to_le_bytes());
        self.groups.iter().for_each(|g| b.extend_from_slice(&g.to_le_bytes()));
        put_f32s(&mut b, &self.log_mass);
        b
    }

    /// Decodes a result.
    pub fn decode(b: &[u8]) -> Result<PageScores, BadRequest> {
        check_magic(b, PAGE_SCORES_MAGIC, RESULT_HEADER_LEN, "KV page-scores result")?;
        let (entries, heads, group) = (usize::from(u16_at(b, 6)), usize::from(u16_at(b, 8)), usize::from(u16_at(b, 10)));
        let counts_end = RESULT_HEADER_LEN + 4 * entries;
        if b.len() < counts_end {
            return Err(bad(format!("KV page-scores result is {} bytes, shorter than its {entries} group counts", b.len())));
        }
        let groups: Vec<u32> = (0..entries).map(|i| u32_at(b, RESULT_HEADER_LEN + 4 * i)).collect();
        let values = groups.iter().map(|&g| g as u128).sum::<u128>() * (heads * group) as u128;
        if (b.len() - counts_end) as u128 != 4 * values {
            return Err(bad(format!("KV page-scores result is {} bytes, expected {}", b.len(), counts_end as u128 + 4 * values)));
        }
        let stats = AttendStats { pages_read: u64_at(b, 16), media_bytes: u64_at(b, 24), rows_used: u64_at(b, 32), drive_wait_ns: u64_at(b, 40) };
        Ok(PageScores { heads, group, stats, groups, log_mass: f32s(&b[counts_end..]) })
    }
}

/// A sequence's shape and progress, as the info result carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Info {
    /// Layers.
    pub layers: usize,
    /// KV heads kept on the target.
    pub kv_heads: usize,
    /// Dimensions per head.
    pub head_dim: usize,
    /// Stored element type.
    pub dtype: Dtype,
    /// Dimensions per dimension-indexed page.
    pub dims_per_page: usize,
    /// Flash page size in bytes.
    pub page_bytes: usize,
    /// Tokens stored, per layer.
    pub tokens: Vec<usize>,
}

/// Encodes a sequence's info result: magic, layers, KV heads, head size, element type,
/// dimensions per page, then the token count of each layer (u32).
pub fn encode_info(info: &Info) -> Vec<u8> {
    let mut b = Vec::with_capacity(16 + 4 * info.tokens.len());
    b.extend_from_slice(INFO_MAGIC);
    b.extend_from_slice(&(info.layers as u16).to_le_bytes());
    b.extend_from_slice(&(info.kv_heads as u16).to_le_bytes());
    b.extend_from_slice(&(info.head_dim as u16).to_le_bytes());
    b.push(info.dtype.code());
    b.push(info.dims_per_page as u8);
    b.extend_from_slice(&(info.page_bytes as u32).to_le_bytes());
    for t in &info.tokens {
        b.extend_from_slice(&(*t as u32).to_le_bytes());
    }
    b
}

/// A decoded info result: (layers, KV heads, head size, element type, dimensions per page,
/// page bytes, tokens per layer).
pub type InfoFields = (usize, usize, usize, Dtype, usize, usize, Vec<usize>);

/// Decodes a sequence's info result.
pub fn decode_info(b: &[u8]) -> Result<InfoFields, BadRequest> {
    check_magic(b, INFO_MAGIC, 16, "KV info result")?;
    let layers = usize::from(u16_at(b, 4));
    if b.len() != 16 + 4 * layers {
        return Err(bad("KV info result length does not match its layer count"));
    }
    let tokens = (0..layers).map(|l| u32_at(b, 16 + 4 * l) as usize).collect();
    Ok((layers, usize::from(u16_at(b, 6)), usize::from(u16_at(b, 8)), Dtype::from_code(b[10])?, usize::from(b[11]), u32_at(b, 12) as usize, tokens))
}

/// Status codes of the KV commands (command-specific, SCT 1).
pub mod status {
    use crate::Status;
    /// No sequence with this id.
    pub const UNKNOWN_SEQUENCE: Status = Status { sct: 1, sc: 0xC0 };
    /// A sequence with this id exists.
    pub const SEQUENCE_EXISTS: Status = Status { sct: 1, sc: 0xC1 };
    /// The request does not match the sequence's shape.
    pub const SHAPE_MISMATCH: Status = Status { sct: 1, sc: 0xC2 };
    /// The private namespace is full.
    pub const NO_SPACE: Status = Status { sct: 1, sc: 0xC3 };
    /// The target has no KV store (no private namespace).
    pub const NO_STORE: Status = Status { sct: 1, sc: 0xC4 };
    /// The attention result asked for is not (or no longer) held.
    pub const NO_RESULT: Status = Status { sct: 1, sc: 0xC5 };
}

/// Explains a KV command's completion status to a user (host side).
pub fn explain_status(sct: u8, sc: u8) -> &'static str {
    match (sct, sc) {
        (1, 0xC0) => "unknown sequence",
        (1, 0xC1) => "sequence already exists",
        (1, 0xC2) => "request does not match the sequence (layers, heads or head size)",
        (1, 0xC3) => "the target's private namespace is full",
        (1, 0xC4) => "the target has no private namespace for a KV cache (start it with --private IMG)",
        (1, 0xC5) => "no attention result held under this tag",
        (0, 0x02) => "malformed KV request",
        (0, 0x01) => "the target does not know this command",
        _ => "KV command failed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn requests_round_trip() {
        for kept in [false, true] {
            let a = Admin::Create { seq: 7, layers: 30, kv_heads: 3, head_dim: 64, dtype: Dtype::F16, dims_per_page: 2, kept };
            assert_eq!(Admin::decode(&a.encode()).unwrap(), a);
            let a = Admin::Fork { parent: 1, child: 2, kept };
            assert_eq!(Admin::decode(&a.encode()).unwrap(), a);
        }
        for a in [Admin::Free { seq: 9 }, Admin::Info { seq: 3 }] {
            assert_eq!(Admin::decode(&a.encode()).unwrap(), a);
        }
        let ap = Append { seq: 1, layer: 2, heads: 2, head_dim: 4, tokens: 3, k: (0..24).map(|x| x as f32).collect(), v: vec![0.5; 24] };
        assert_eq!(Append::decode(&ap.encode()).unwrap(), ap);
        let at = Attend {
            layer: 1,
            heads: 2,
            group: 3,
            head_dim: 4,
            method: Method::SparF { r: 2, k: 8, local: 2, pages: 3, mean_v: true },
            scale: 0.5,
            seqs: vec![4, 5],
            q: (0..48).map(|x| x as f32).collect(),
            new_kv: Some((vec![1.0; 16], vec![2.0; 16])),
            new_entries: None,
            groups: None,
            vectors: Dtype::F32,
            reduced: None,
        };
        assert_eq!(Attend::decode(&at.encode()).unwrap(), at);
        // A new token for the second entry only: its K and V rows alone follow the list.
        let some = Attend { new_kv: Some((vec![1.0; 8], vec![2.0; 8])), new_entries: Some(vec![1]), ..at.clone() };
        assert_eq!(some.encode().len(), at.encode().len() + 4 - 2 * 4 * 8);
        assert_eq!(Attend::decode(&some.encode()).unwrap(), some);
        for (list, why) in [(vec![1, 1], "ascending"), (vec![2], "below 2"), (vec![], "lists 0 entries")] {
            let mut b = Attend { new_kv: Some((vec![1.0; 8 * list.len()], vec![2.0; 8 * list.len()])), new_entries: Some(list), ..at.clone() }.encode();
            let e = Attend::decode(&b).unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
            b[6] &= !FLAG_APPEND;
            assert!(Attend::decode(&b).is_err());
        }
        for method in [
            Method::SparF { r: 2, k: 8, local: 2, pages: 3, mean_v: false },
            Method::SparQ { r: 1, k: 3, local: 0, mean_v: false },
            Method::SparQ { r: 1, k: 3, local: 0, mean_v: true },
        ] {
            let at = Attend { method, new_kv: None, ..at.clone() };
            assert_eq!(Attend::decode(&at.encode()).unwrap(), at);
        }
        let r = AttendResult {
            entries: 1,
            heads: 1,
            group: 2,
            head_dim: 2,
            stats: AttendStats { pages_read: 3, media_bytes: 4096, rows_used: 9, drive_wait_ns: 1_250_000 },
            out: vec![1.0, 2.0, 3.0, 4.0],
            lse: None,
            vectors: Dtype::F32,
        };
        assert_eq!(AttendResult::decode(&r.encode()).unwrap(), r);
        let r = AttendResult { lse: Some(vec![0.25, f64::NEG_INFINITY]), ..r };
        assert_eq!(AttendResult::decode(&r.encode()).unwrap(), r);
        for (partial, page_scores) in [(false, false), (true, false), (false, true), (true, true)] {
            let o = AttendOptions { partial, page_scores };
            assert_eq!(AttendOptions::from_cdw11(o.cdw11()).unwrap(), o);
        }
        // f16 on the wire: half the bytes, values that f16 holds exactly come back the same.
        let half_wire = Attend { vectors: Dtype::F16, ..at.clone() };
        let b16 = half_wire.encode();
        assert_eq!(b16.len() - ATTEND_HEADER_LEN - 16, (at.encode().len() - ATTEND_HEADER_LEN - 16) / 2);
        assert_eq!(Attend::decode(&b16).unwrap(), half_wire);
        let r16 = AttendResult {
            entries: 1,
            heads: 1,
            group: 2,
            head_dim: 2,
            stats: AttendStats::default(),
            out: vec![0.5, -2.0, 1024.0, 0.0],
            lse: Some(vec![1.5, 2.5]),
            vectors: Dtype::F16,
        };
        assert_eq!(AttendResult::decode(&r16.encode()).unwrap(), r16);
        let dense = Attend { method: Method::Dense, new_kv: None, groups: Some(vec![vec![0, 3, 9], vec![], vec![1], vec![2, 4]]), ..at.clone() };
        assert_eq!(Attend::decode(&dense.encode()).unwrap(), dense);
        let ps = PageScores {
            heads: 2,
            group: 1,
            stats: AttendStats { pages_read: 2, media_bytes: 8192, rows_used: 0, drive_wait_ns: 7 },
            groups: vec![2, 0, 1],
            log_mass: vec![0.5, -1.0, 2.0, 3.0, 4.0, f32::NEG_INFINITY],
        };
        assert_eq!(PageScores::decode(&ps.encode()).unwrap(), ps);
    }

    #[test]
    fn malformed_partial_results_and_options_are_refused() {
        let r = AttendResult {
            entries: 1,
            heads: 1,
            group: 2,
            head_dim: 2,
            stats: AttendStats::default(),
            out: vec![0.0; 4],
            lse: Some(vec![1.0, 2.0]),
            vectors: Dtype::F32,
        };
        let mut b = r.encode();
        b.truncate(b.len() - 8); // one row's log-sum-exp missing
        assert!(AttendResult::decode(&b).unwrap_err().to_string().contains("expected"));
        let mut b = r.encode();
        b[5] = 0; // the section is there but not announced
        assert!(AttendResult::decode(&b).unwrap_err().to_string().contains("expected"));
        b[5] = 4;
        assert!(AttendResult::decode(&b).unwrap_err().to_string().contains("unknown KV attention result flags"));
        assert!(AttendOptions::from_cdw11(4).unwrap_err().to_string().contains("CDW11"));
    }

    #[test]
    fn reduced_queries_round_trip_and_bad_components_are_refused() {
        let at = Attend {
            layer: 3,
            heads: 2,
            group: 2,
            head_dim: 8,
            method: Method::SparF { r: 3, k: 40, local: 4, pages: 2, mean_v: false },
            scale: 0.35,
            seqs: vec![7],
            q: (0..12).map(|x| x as f32 * 0.5).collect(), // [1][2][2][3]
            new_kv: Some((vec![1.0; 16], vec![2.0; 16])),
            new_entries: None,
            groups: None,
            vectors: Dtype::F16,
            reduced: Some(ReducedQueries { dims: vec![0, 4, 7, 1, 2, 3], l1: vec![1.5, 2.0, 0.0, 9.25] }),
        };
        let b = at.encode();
        assert_eq!(b.len(), ATTEND_HEADER_LEN + 8 + 2 * 6 + 2 * 12 + 8 * 4 + 2 * 2 * 16);
        assert_eq!(Attend::decode(&b).unwrap(), at);
        let refused = |a: &Attend, why: &str| {
            let e = Attend::decode(&a.encode()).unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
        };
        let red = |dims: Vec<u16>, l1: Vec<f64>| Some(ReducedQueries { dims, l1 });
        refused(&Attend { reduced: red(vec![0, 4, 4, 1, 2, 3], vec![1.0; 4]), ..at.clone() }, "strictly ascending");
        refused(&Attend { reduced: red(vec![0, 4, 8, 1, 2, 3], vec![1.0; 4]), ..at.clone() }, "below the head size");
        refused(&Attend { reduced: red(vec![0, 4, 7, 1, 2, 3], vec![1.0, f64::NAN, 1.0, 1.0]), ..at.clone() }, "‖q‖₁");
        refused(&Attend { method: Method::SparQ { r: 3, k: 40, local: 4, mean_v: false }, ..at.clone() }, "needs the SparF method");
        let mut short = at.encode();
        short.pop();
        assert!(Attend::decode(&short).is_err());
    }

    #[test]
    fn malformed_requests_say_what_is_wrong() {
        let at = Attend {
            layer: 0,
            heads: 1,
            group: 1,
            head_dim: 4,
            method: Method::Dense,
            scale: 0.5,
            seqs: vec![1],
            q: vec![0.0; 4],
            new_kv: None,
            new_entries: None,
            groups: None,
            vectors: Dtype::F32,
            reduced: None,
        };
        let mut b = at.encode();
        b.pop();
        assert!(Attend::decode(&b).unwrap_err().to_string().contains("needs"));
        let mut b = at.encode();
        b[5] = 1; // SparF with r = 0
        assert!(Attend::decode(&b).unwrap_err().to_string().contains("r <="));
        let mut b = at.encode();
        b[6] = FLAG_NO_MEAN_V; // dense has no mean of V to leave out
        assert!(Attend::decode(&b).unwrap_err().to_string().contains("needs a sparse method"));
        b[6] = 64;
        assert!(Attend::decode(&b).unwrap_err().to_string().contains("unknown KV attention flags"));
        // Token-group lists: only with dense, each one whole and ascending, nothing after.
        let listed = Attend { groups: Some(vec![vec![1, 2]]), ..at.clone() };
        let good = listed.encode();
        let mut b = good.clone();
        b.pop();
        assert!(Attend::decode(&b).unwrap_err().to_string().contains("claims 2 groups"));
        let mut b = good.clone();
        b.extend_from_slice(&[0; 4]);
        assert!(Attend::decode(&b).unwrap_err().to_string().contains("follow the last"));
        let mut b = good.clone();
        let n = b.len();
        b[n - 4..].copy_from_slice(&1u32.to_le_bytes());
        assert!(Attend::decode(&b).unwrap_err().to_string().contains("not strictly ascending"));
        let mut b = good.clone();
        b[5] = 1;
        b[18] = 1;
        b[20] = 1;
        assert!(Attend::decode(&b).unwrap_err().to_string().contains("needs the dense method"));
        let ps = PageScores { heads: 1, group: 1, stats: AttendStats::default(), groups: vec![3], log_mass: vec![0.0; 3] }.encode();
        assert!(PageScores::decode(&ps[..ps.len() - 1]).unwrap_err().to_string().contains("expected"));
        assert!(PageScores::decode(&ps[..50]).unwrap_err().to_string().contains("group counts"));
        let mut b = at.encode();
        b[28..32].copy_from_slice(&f32::NAN.to_le_bytes());
        assert!(Attend::decode(&b).is_err());
        let mut b = Admin::Free { seq: 1 }.encode();
        b[4] = 9;
        assert!(Admin::decode(&b).unwrap_err().to_string().contains("unknown KV admin operation"));
        // The kept flag only on create and fork; no other flag exists.
        let mut b = Admin::Free { seq: 1 }.encode();
        b[7] = 1;
        assert!(Admin::decode(&b).unwrap_err().to_string().contains("only for create and fork"));
        let mut b = Admin::Fork { parent: 1, child: 2, kept: true }.encode();
        b[7] = 3;
        assert!(Admin::decode(&b).unwrap_err().to_string().contains("only bit 0"));
        assert!(Append::decode(b"KVAP").is_err());
        // Shape fields whose product overflows u64 once scaled to bytes: refused, not wrapped.
        let mut b = AttendResult { entries: 1, heads: 1, group: 1, head_dim: 1, stats: AttendStats::default(), out: vec![0.0], lse: None, vectors: Dtype::F32 }
            .encode();
        for at in [6, 8, 10, 12] {
            b[at..at + 2].copy_from_slice(&u16::MAX.to_le_bytes());
        }
        assert!(AttendResult::decode(&b).unwrap_err().to_string().contains("expected"));
    }

    proptest! {
        #[test]
        fn decoders_never_panic(data in proptest::collection::vec(any::<u8>(), 0..256), kind in 0u8..5) {
            let mut d = data;
            if d.len() >= 4 {
                let m: &[u8; 4] = [ADMIN_MAGIC, APPEND_MAGIC, ATTEND_MAGIC, RESULT_MAGIC, PAGE_SCORES_MAGIC][kind as usize];
                d[..4].copy_from_slice(m);
            }
            let _ = Admin::decode(&d);
            let _ = Append::decode(&d);
            let _ = Attend::decode(&d);
            let _ = AttendResult::decode(&d);
            let _ = PageScores::decode(&d);
            let _ = decode_info(&d);
        }

        #[test]
        fn results_round_trip_and_any_flip_is_refused_or_read_back(
            rows in 1usize..5, head_dim in 1usize..5, lse in any::<bool>(), at in any::<prop::sample::Index>(), byte in any::<u8>(), cdw11 in any::<u32>(),
        ) {
            let out = (0..rows * head_dim).map(|i| i as f32 * 0.5).collect();
            let lse = lse.then(|| (0..rows).map(|i| i as f64 - 1.0).collect());
            let r = AttendResult { entries: 1, heads: 1, group: rows, head_dim, stats: AttendStats::default(), out, lse, vectors: Dtype::F32 };
            let mut b = r.encode();
            prop_assert_eq!(AttendResult::decode(&b).unwrap(), r);
            // A changed byte either decodes to a result of the same length or is refused;
            // it never panics.
            let i = at.index(b.len());
            b[i] = byte;
            if let Ok(d) = AttendResult::decode(&b) {
                prop_assert_eq!(d.encode().len(), b.len());
            }
            match AttendOptions::from_cdw11(cdw11) {
                Ok(o) => prop_assert_eq!(o.cdw11(), cdw11),
                Err(_) => prop_assert!(cdw11 & !3 != 0),
            }
        }
    }
}
