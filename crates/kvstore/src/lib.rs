// SPDX-License-Identifier: Apache-2.0
//! The key-value service of an insitu target, reached by hosts through the NVMe Key Value
//! command set (`docs/kv-store.md`). Not to be confused with `insitu-kvcache`, the LLM
//! attention KV *cache*.
//!
//! * [`wire`] encodes and decodes the five KV commands (Store, Retrieve, List, Delete,
//!   Exist), their status codes and the List data. Hosts need only this (build with
//!   `default-features = false`).
//! * [`KvStore`] (feature `engine`, on by default) is the engine: [redb] over a
//!   [`redb::StorageBackend`], the pluggable storage interface. [`RegionBackend`] is the
//!   backend the target uses: a byte range of its private namespace, which hosts never see.
//!   [`FsFileBackend`] puts the store in a file of the target's own file system
//!   ([`insitu_accelfs`]) instead, beside other files ([`KvStore::open_fs`]);
//!   [`PacedDevice`] makes that file system's blocks cost what a drive model charges.
//!
//! Every Store and Delete is committed with immediate durability (redb's checksummed
//! commit and a media sync) before it returns, so a target acknowledges only durable
//! changes.
//!
//! ```
//! # #[cfg(feature = "engine")] {
//! use insitu_kvstore::{wire::{Key, StoreMode}, KvStore};
//!
//! let store = KvStore::in_memory(1 << 20)?;
//! let key = Key::new(b"answer")?;
//! store.store(&key, b"42", StoreMode::Upsert)?;
//! assert_eq!(store.retrieve(&key)?, b"42");
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

#[cfg(feature = "engine")]
mod fs_backend;
#[cfg(feature = "engine")]
mod paced;
#[cfg(feature = "engine")]
mod region;
#[cfg(feature = "engine")]
mod store;
/// The Key Value command set's wire format, from the protocol crate.
pub use insitu_proto::kv as wire;

#[cfg(feature = "engine")]
pub use fs_backend::FsFileBackend;
#[cfg(feature = "engine")]
pub use paced::PacedDevice;
#[cfg(feature = "engine")]
pub use region::{RegionBackend, HEADER_BYTES};
#[cfg(feature = "engine")]
pub use store::{KvStore, CACHE_BYTES, DEFAULT_MAX_VALUE};

/// What a store operation ran into. [`KvStoreError::status`] gives the NVMe status a
/// target answers with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KvStoreError {
    /// Retrieve, Delete or a `MustExist` Store of a key the store does not hold.
    #[error("the key does not exist")]
    KeyNotFound,
    /// A `MustNotExist` Store of a key the store holds.
    #[error("the key exists already")]
    KeyExists,
    /// A value over the store's limit.
    #[error("a value of {len} bytes exceeds the store's limit of {max} bytes")]
    ValueSize {
        /// The value's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The region has no room left for the change (nothing was changed).
    #[error("the KV store is full ({capacity} bytes): delete keys or give the target a larger --kv-store ({detail})")]
    Full {
        /// Bytes the store may occupy.
        capacity: u64,
        /// What the engine reported.
        detail: String,
    },
    /// The store could not be opened.
    #[error("cannot open the KV store: {0}")]
    Open(String),
    /// The engine failed to read or write its media.
    #[error("KV store I/O failed: {0}")]
    Storage(String),
}

impl KvStoreError {
    /// The NVMe status code (status code type 0) for this error.
    pub fn status(&self) -> u8 {
        use wire::status;
        match self {
            KvStoreError::KeyNotFound => status::KEY_NOT_FOUND,
            KvStoreError::KeyExists => status::KEY_EXISTS,
            KvStoreError::ValueSize { .. } => status::INVALID_VALUE_SIZE,
            KvStoreError::Full { .. } => status::CAPACITY_EXCEEDED,
            KvStoreError::Open(_) | KvStoreError::Storage(_) => status::UNRECOVERED_ERROR,
        }
    }
}

#[cfg(feature = "engine")]
impl From<wire::DecodeError> for KvStoreError {
    fn from(e: wire::DecodeError) -> Self {
        KvStoreError::Storage(e.to_string())
    }
}
