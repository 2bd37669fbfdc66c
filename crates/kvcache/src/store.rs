// SPDX-License-Identifier: Apache-2.0
//! The KV store of a private namespace: sequences, pages, the DRAM group buffer, the journal.

use crate::{Dtype, HeadPages, KvError, Layout};
use insitu_media::Backing;
use std::sync::Arc;

/// A sequence's shape and progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqInfo {
    /// Sequence id (chosen by the host).
    pub seq: u64,
    /// Layers.
    pub layers: usize,
    /// KV heads kept on this target.
    pub kv_heads: usize,
    /// Page layout of every head.
    pub layout: Layout,
    /// Tokens stored, per layer.
    pub tokens: Vec<usize>,
}

/// Space in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreUsage {
    /// Flash page size.
    pub page_bytes: usize,
    /// Data pages in the namespace.
    pub pages_total: u64,
    /// Data pages free.
    pub pages_free: u64,
    /// Live sequences.
    pub sequences: usize,
}

/// The KV cache kept in one private namespace.
pub struct KvStore {
    _media: Arc<Backing>,
}

/// A read view of one (sequence, layer, head), steady while it lives.
pub struct HeadView {}

impl KvStore {
    /// Opens the store in `len` bytes at `base` of `media` with flash pages of `page_bytes`:
    /// recovers the sequences a previous run left (every flushed page), or formats an empty
    /// store when the region holds none.
    pub fn open(media: Arc<Backing>, base: u64, len: u64, page_bytes: usize) -> Result<KvStore, KvError> {
        let _ = (base, len, page_bytes);
        Ok(KvStore { _media: media })
    }

    /// Creates sequence `seq` with `layers` layers of `kv_heads` heads of `head_dim`.
    pub fn create(&self, seq: u64, layers: usize, kv_heads: usize, head_dim: usize, dtype: Dtype, dims_per_page: usize) -> Result<SeqInfo, KvError> {
        let _ = (seq, layers, kv_heads, head_dim, dtype, dims_per_page);
        todo!("store")
    }

    /// Creates `child` sharing every token of `parent` (its full pages by reference).
    pub fn fork(&self, parent: u64, child: u64) -> Result<SeqInfo, KvError> {
        let _ = (parent, child);
        todo!("store")
    }

    /// Frees a sequence; its pages return to the free list once no fork uses them.
    pub fn free(&self, seq: u64) -> Result<(), KvError> {
        let _ = seq;
        todo!("store")
    }

    /// A sequence's shape and progress.
    pub fn info(&self, seq: u64) -> Result<SeqInfo, KvError> {
        let _ = seq;
        todo!("store")
    }

    /// Space in the store.
    pub fn usage(&self) -> StoreUsage {
        todo!("store")
    }

    /// Appends `tokens` tokens to `layer` of `seq`: `k` and `v` are f32,
    /// `[kv_heads][tokens][head_dim]`. Returns the layer's new token count.
    pub fn append(&self, seq: u64, layer: usize, tokens: usize, k: &[f32], v: &[f32]) -> Result<usize, KvError> {
        let _ = (seq, layer, tokens, k, v);
        todo!("store")
    }

    /// A read view of one head of one layer.
    pub fn head(&self, seq: u64, layer: usize, head: usize) -> Result<HeadView, KvError> {
        let _ = (seq, layer, head);
        todo!("store")
    }
}

impl HeadPages for HeadView {
    fn layout(&self) -> &Layout {
        todo!()
    }
    fn tokens(&self) -> usize {
        todo!()
    }
    fn load_token_group(&self, kind: crate::Kind, group: usize, out: &mut [f32]) -> Result<(usize, crate::Loaded), KvError> {
        let _ = (kind, group, out);
        todo!()
    }
    fn load_dim_group(&self, group: usize, out: &mut [f32]) -> Result<crate::Loaded, KvError> {
        let _ = (group, out);
        todo!()
    }
    fn v_sum(&self) -> Vec<f64> {
        todo!()
    }
}
