// SPDX-License-Identifier: Apache-2.0
//! Wire formats shared by insitu hosts and targets.
//!
//! * [`Descriptor`]: a compute descriptor, the whole of an EXEC request: a function name,
//!   typed arguments ([`Value`]), input [`VirtualObject`]s and optional output objects.
//!   A virtual object is an extent list (512-byte sectors, data or zero) plus an exact length.
//! * [`ExecResult`]: the records an EXEC returns inline.
//! * [`Status`] and [`CommandError`]: NVMe-style completion status with a message.
//!
//! Decoding is strict and bounded ([`Limits`]); every rule violated has its own
//! [`DecodeError`] naming the field and byte offset. The byte-level specification and test
//! vectors are in `docs/compute-descriptor.md` and `docs/vectors/`.
//!
//! ```
//! use insitu_proto::{Descriptor, Extent, Limits, Value, VirtualObject};
//!
//! let obj = VirtualObject { offset: 0, length: 5000, extents: vec![Extent::data(2048, 8), Extent::zero(2)] };
//! let mut d = Descriptor::new("grep", vec![obj]);
//! d.args.push(("pattern".into(), Value::Str("foo".into())));
//! let bytes = d.encode();
//! assert_eq!(Descriptor::decode(&bytes, &Limits::default()).unwrap(), d);
//! assert!(d.check_extents(1 << 30).is_ok()); // 1 GiB: sectors 2048..2056 lie inside
//! assert!(d.check_extents(1 << 20).is_err()); // 1 MiB is 2048 sectors: the data extent ends past it
//! ```
#![deny(missing_docs)]

pub mod attention;
mod cursor;
mod descriptor;
pub mod ether;
pub mod kv;
pub mod lock;
pub mod opcode;
mod result;
mod status;
mod value;

pub use cursor::{le, DecodeError};
pub use descriptor::{
    Descriptor, Extent, ExtentError, ExtentKind, Limits, VirtualObject, DESCRIPTOR_MAGIC, DESCRIPTOR_VERSION, EXTENT_LEN, FLAG_RESULT_OBJECT, HEADER_LEN,
    OBJECT_HEADER_LEN, SECTOR,
};
pub use result::{ExecResult, Record, MAX_RESULT_VALUE, RESULT_MAGIC, RESULT_VERSION};
pub use status::{CommandError, Status};
pub use value::Value;
