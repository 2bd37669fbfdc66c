// SPDX-License-Identifier: Apache-2.0
//! The KV cache of LLM decoding, kept on a target's private namespace, and the attention
//! engine that computes decode-phase attention next to it (InstInfer).
//!
//! * [`Layout`] fixes how one attention head's cache maps onto flash pages: K and V rows of
//!   a group of consecutive tokens per page (token-indexed), and a second copy of K with a
//!   few dimensions per page and tokens contiguous (dimension-indexed), both sized from the
//!   head size, the element type and the flash page size.
//! * [`KvCache`] owns the pages of a private namespace: sequences are created, extended,
//!   forked and freed; appends go through a DRAM group buffer that flushes whole pages; a
//!   journal lets a restarted target find every flushed page again.
//! * [`attend`] runs dense attention or SparF (Algorithm 1 of InstInfer: SparQ with
//!   flash-page groups and dual-step loading) over a [`HeadPages`] view of one head.
//! * [`HeldResults`] keeps the results of attention requests until the host takes them,
//!   and lets a KV_RESULT sent before its KV_ATTEND is done wait for it.
//! * [`split`] is the host's side of a sequence split over targets by tokens: SparF's
//!   page choice over every target's page scores, and the exact merge of partial outputs.
//! * [`wire`] is the byte format of the vendor commands that carry appends and attention
//!   requests (specified in `docs/kv-commands.md`).
#![deny(missing_docs)]

mod attention;
mod held;
mod layout;
mod page_pairs;
mod request;
pub mod split;
mod store;
/// The byte format of the KV vendor commands, from the protocol crate.
pub use insitu_proto::attention as wire;

pub use attention::{attend, attend_groups, attend_partial, page_log_mass, page_log_mass_reduced, reduce_queries, Method};
pub use attention::{attend_all, Task};
pub use held::{HeldResults, Pending, HELD_RESULTS, RESULT_GRACE};
pub use layout::{Dtype, Layout};
pub use page_pairs::{DimRuns, PagePairs};
pub use store::{HeadView, KvCache, Lifetime, Owner, SeqInfo, StoreUsage};

use insitu_proto::Status;

/// Which half of the cache a token-indexed page holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Keys.
    K,
    /// Values.
    V,
}

/// What loading part of a head's cache cost: flash pages and bytes read from the media.
/// Rows served from the DRAM group buffer cost nothing here.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Loaded {
    /// Flash pages read.
    pub pages: u64,
    /// Bytes read from the media.
    pub bytes: u64,
}

impl std::ops::AddAssign for Loaded {
    fn add_assign(&mut self, o: Loaded) {
        self.pages += o.pages;
        self.bytes += o.bytes;
    }
}

/// A read view of one (sequence, layer, KV head): what the attention engine needs.
pub trait HeadPages: Sync {
    /// The page layout of this head.
    fn layout(&self) -> &Layout;
    /// Tokens in the cache.
    fn tokens(&self) -> usize;
    /// Loads token group `group` (tokens `group * layout.tokens_per_page ..`, at most
    /// `tokens_per_page`, fewer for the last group) of K or V into `out` as f32 rows of
    /// `head_dim`, token after token. Returns the rows loaded and what it cost.
    fn load_token_group(&self, kind: Kind, group: usize, out: &mut [f32]) -> Result<(usize, Loaded), KvError>;
    /// Loads the token groups `groups` of K or V, group `groups[i]` into `out` from row
    /// `i * tokens_per_page`, and returns the rows each gave and what they cost together.
    /// A store on a drive reads them as one batch (the drive overlaps the pages over its
    /// dies); by default they are loaded one after the other.
    fn load_token_groups(&self, kind: Kind, groups: &[usize], out: &mut [f32]) -> Result<(Vec<usize>, Loaded), KvError> {
        let per = self.layout().tokens_per_page * self.layout().head_dim;
        let mut total = Loaded::default();
        let mut rows = Vec::with_capacity(groups.len());
        for (&g, out) in groups.iter().zip(out.chunks_mut(per)) {
            let (n, cost) = self.load_token_group(kind, g, out)?;
            rows.push(n);
            total += cost;
        }
        Ok((rows, total))
    }
    /// Loads the token groups `groups` of both K and V in one batch: K as
    /// [`HeadPages::load_token_groups`] puts it into `out`, V after it, group `groups[i]`
    /// from row `(groups.len() + i) * tokens_per_page`. Returns the rows of each group.
    fn load_token_groups_kv(&self, groups: &[usize], out: &mut [f32]) -> Result<(Vec<usize>, Loaded), KvError> {
        let half = groups.len() * self.layout().tokens_per_page * self.layout().head_dim;
        let (k, v) = out.split_at_mut(half.min(out.len()));
        let (rows, mut loaded) = self.load_token_groups(Kind::K, groups, k)?;
        let (v_rows, v_loaded) = self.load_token_groups(Kind::V, groups, v)?;
        if v_rows != rows {
            return Err(KvError::invalid_data(format!("K and V token groups {groups:?} hold {rows:?} and {v_rows:?} rows")));
        }
        loaded += v_loaded;
        Ok((rows, loaded))
    }
    /// Loads dimension group `group` of K (dimensions `group * layout.dims_per_page ..`, at
    /// most `dims_per_page`) for every token into `out`, dimension-major: `out[j * tokens()
    /// + t]` is dimension `group * dims_per_page + j` of token `t`.
    fn load_dim_group(&self, group: usize, out: &mut [f32]) -> Result<Loaded, KvError>;
    /// Loads dimension groups `groups` of K as [`HeadPages::load_dim_group`] does, group
    /// `groups[i]` into `out[i * dims_per_page * tokens()..]`, as one batch of reads.
    fn load_dim_groups(&self, groups: &[usize], out: &mut [f32]) -> Result<Loaded, KvError> {
        let each = self.layout().dims_per_page * self.tokens();
        let mut total = Loaded::default();
        for (&g, out) in groups.iter().zip(out.chunks_mut(each)) {
            total += self.load_dim_group(g, out)?;
        }
        Ok(total)
    }
    /// The sum of every V row in f64 (for SparF's mean of V), kept by the store.
    fn v_sum(&self) -> Vec<f64>;
}

pub use insitu_proto::attention::AttendStats;

/// Why a KV command failed. Nothing stored changes when one is returned.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    /// The request is malformed (the message says where).
    #[error("bad KV request: {0}")]
    BadRequest(String),
    /// No sequence with this id.
    #[error("unknown sequence {0}")]
    UnknownSequence(u64),
    /// A sequence with this id already exists.
    #[error("sequence {0} already exists")]
    SequenceExists(u64),
    /// The request does not match the sequence's shape (layers, heads, head size).
    #[error("sequence {seq}: {what}")]
    Mismatch {
        /// The sequence.
        seq: u64,
        /// What does not match.
        what: String,
    },
    /// Not enough free pages in the private namespace.
    #[error("the private namespace is full: {needed} pages needed, {free} free")]
    Full {
        /// Pages the request needs.
        needed: u64,
        /// Pages free.
        free: u64,
    },
    /// The target has no private namespace to keep a KV cache in.
    #[error("this target has no private namespace for a KV cache; start it with --private IMG")]
    NoStore,
    /// No result is held under this tag (never made, already taken, or dropped).
    #[error("no KV result is held under tag {0}")]
    NoResult(u32),
    /// The media failed.
    #[error("KV cache I/O: {0}")]
    Io(#[from] std::io::Error),
}

impl From<insitu_proto::attention::BadRequest> for KvError {
    fn from(e: insitu_proto::attention::BadRequest) -> KvError {
        KvError::BadRequest(e.0)
    }
}

pub use insitu_proto::attention::status;

impl KvError {
    /// A store that gave back something its own layout rules out (a short page, a V sum of
    /// the wrong size): an I/O error, as a device returning bad data is.
    pub(crate) fn invalid_data(msg: String) -> KvError {
        KvError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, msg))
    }

    /// The NVMe status a command failing with this error completes with.
    pub fn status(&self) -> Status {
        match self {
            KvError::BadRequest(_) => Status::INVALID_FIELD,
            KvError::UnknownSequence(_) => status::UNKNOWN_SEQUENCE,
            KvError::SequenceExists(_) => status::SEQUENCE_EXISTS,
            KvError::Mismatch { .. } => status::SHAPE_MISMATCH,
            KvError::Full { .. } => status::NO_SPACE,
            KvError::NoStore => status::NO_STORE,
            KvError::NoResult(_) => status::NO_RESULT,
            KvError::Io(_) => Status::INTERNAL_ERROR,
        }
    }
}

pub use insitu_proto::attention::explain_status;
