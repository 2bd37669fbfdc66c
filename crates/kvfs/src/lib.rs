// SPDX-License-Identifier: Apache-2.0
//! The local API of a target's key-value store: a FUSE directory whose files are the
//! store's keys, for code running on the target (containers see it at `/kv`). Hosts keep
//! using the NVMe Key Value command set (`insitu-kvstore`'s `wire`, without this crate or
//! FUSE).
//!
//! * one flat directory: listing it lists the keys (List), `stat` of a name is Exist and
//!   the value's length, reading a file is Retrieve, `unlink` is Delete, creating a file
//!   stores the key with an empty value;
//! * a file written and closed is stored whole, durably, before `close(2)` returns (the
//!   close reports the Store's error: ENOSPC when the store is full); writing past the
//!   store's largest value fails with EFBIG;
//! * [`name_of`] and [`key_of`] map keys to names: text keys are their own names, others
//!   `0x` and hex; names of more than 16 key bytes fail with ENAMETOOLONG, `0x` without an
//!   even number of hex digits with EINVAL, and nothing is stored.
//!
//! [`KvDir`] holds the operations without FUSE (tests drive it directly); [`KvFs`] serves
//! them to the kernel and [`KvMount`] mounts it.
//!
//! ```
//! use insitu_kvfs::{key_of, name_of};
//! assert_eq!(name_of(b"greeting"), "greeting");
//! assert_eq!(name_of(b"\x00\xff"), "0x00ff");
//! assert_eq!(key_of("0x00ff".as_ref())?.as_bytes(), b"\x00\xff");
//! # Ok::<(), insitu_kvfs::NameError>(())
//! ```
#![deny(missing_docs)]

mod dir;
mod fuse;
mod names;

pub use dir::{errno, Attr, DirEntry, Errno, KvDir, ROOT};
pub use fuse::{KvFs, KvMount, MountError};
pub use names::{key_of, name_of, NameError};
