// SPDX-License-Identifier: Apache-2.0
//! A user-space NVMe/TCP initiator for insitu targets (and any NVMe/TCP controller).
//!
//! * [`Session::connect`] opens an association: the admin queue (ICReq/ICResp, Fabrics
//!   Connect, CC.EN, Identify Controller, Number of Queues) and `io_queues` I/O queues,
//!   then keeps it alive with Keep Alive every half KATO. The discovery NQN
//!   ([`DISCOVERY_NQN`]) gets the admin queue only, for [`Session::discovery_log`].
//! * Block commands ([`Session::read`], [`Session::write`], [`Session::flush`],
//!   [`Session::write_zeroes`], [`Session::deallocate`]) split at the controller's MDTS and
//!   keep the pieces in flight together; writes up to the in-capsule size (IOCCSZ) travel
//!   in the command capsule, larger ones on R2T. [`Session::exec`] sends insitu's vendor
//!   EXEC with a compute descriptor; [`Session::submit`] passes any command through.
//! * Key Value commands ([`Session::kv_store`], [`Session::kv_retrieve`],
//!   [`Session::kv_delete`], [`Session::kv_exist`], [`Session::kv_list`]) drive a target's
//!   key-value namespace (NVMe Key Value command set, `docs/kv-store.md`).
//! * A `Session` is `Send + Sync`: threads share it and their commands spread round-robin
//!   over the I/O queues, at most `queue_depth` outstanding per queue.
//! * When a connection dies, the next command re-establishes the whole association (a new
//!   controller ID) once; read-only commands in flight are retried there, writes fail with
//!   [`InitiatorError::OutcomeUnknown`].
//! * [`Session::stats`] counts every byte on the wire, headers and digests included: the
//!   host↔target traffic that insitu's `bytes_to_host` accounting reports.
//!
//! ```no_run
//! use insitu_initiator::{ConnectOptions, Session};
//!
//! let opts = ConnectOptions::new("192.0.2.10:4420", "nqn.2024-01.io.insitu:data");
//! let s = Session::connect(opts)?;
//! let ns = s.identify_namespace(1)?;
//! s.write(1, 0, &vec![0xAB; ns.lba_size as usize * 8])?;
//! assert_eq!(s.read(1, 0, 8)?, vec![0xAB; ns.lba_size as usize * 8]);
//! println!("{} bytes sent, {} received", s.stats().bytes_sent, s.stats().bytes_received);
//! s.disconnect()?;
//! # Ok::<(), insitu_initiator::InitiatorError>(())
//! ```
#![deny(missing_docs)]

mod assoc;
mod cid;
pub mod cmd;
mod error;
mod info;
mod io;
mod kv_store;
mod options;
mod queue;
#[cfg(test)]
mod queue_tests;
mod session;

pub use cmd::DISCOVERY_NQN;
pub use error::{status_name, InitiatorError};
pub use info::{parse_discovery_log, CommandSet, ControllerInfo, DiscoveryEntry, KvNamespaceInfo, NamespaceInfo};
pub use insitu_fabric::{Command, Completion, Digests};
pub use insitu_proto::kv::StoreMode;
pub use io::{submit_pipelined_all, Answers, Submission};
pub use options::{default_hostid, default_hostnqn, hostnqn_for, ConnectOptions};
pub use session::{Session, Stats};
