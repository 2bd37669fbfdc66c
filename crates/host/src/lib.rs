// SPDX-License-Identifier: Apache-2.0
//! The insitu host library: the *Object Aware Storage* (OAS) library of the virtual-objects
//! design. It turns files into virtual objects, wraps them in compute descriptors, sends
//! them with EXEC to the target that holds their blocks, and turns the results back into
//! per-file answers.
//!
//! * [`Offloader`] runs a [`Request`] offloaded (EXEC on the target) or conventionally (the
//!   same kernel on the host, reading through the file system with a cold cache), and
//!   returns a [`Report`] with per-file results and [`Stats`]: bytes that crossed the
//!   host↔target boundary and bytes the target read from its media, next to wall time.
//! * [`virtual_object`] and [`device::resolve`] are the building blocks: `stat` + FIEMAP on
//!   a file, and the loop device's backing file behind the file system.
//! * [`pool::OutputPool`] holds pre-allocated, written output files for kernels that
//!   produce large results (compression, sort, CSV selection).
//!
//! Files are found on their target from the path alone: a file on any loop-mounted image
//! (`mount -o loop`, `losetup`, `insitu image mount`) resolves to the image, and an embedded
//! target is opened over it.
#![deny(missing_docs)]

pub mod conventional;
pub mod device;
pub mod fiemap;
pub mod local;
pub mod lock;
mod offloader;
pub mod pool;
mod remote;
pub mod scrub;
mod vobj;

pub use offloader::{model_sidecar, output_suffix, parse_args, run_in_memory, FileResult, Mode, Offloader, Report, Request, Stats};
pub use vobj::{from_extents, virtual_object};

use insitu_proto::CommandError;
use std::path::PathBuf;

/// What went wrong, on which file, and what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OasError {
    /// An I/O call failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// FIEMAP is not supported or failed.
    #[error("{}: FIEMAP failed ({source}); the file system must support FIEMAP (ext4, xfs, btrfs do)", path.display())]
    Fiemap {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not on a device insitu can reach.
    #[error("{}: cannot offload: the file is on {device}. Offload works on files of a file system mounted from an image or an insitu namespace (see `insitu image create` and `insitu image mount`); use --conventional to compute on the host", path.display())]
    NotInsituDevice {
        /// The file.
        path: PathBuf,
        /// What device it is on.
        device: String,
    },
    /// Part of the file cannot be read from the device safely.
    #[error("{}: cannot offload safely: the extent at byte {offset} {reason}; use --conventional", path.display())]
    NotOffloadable {
        /// The file.
        path: PathBuf,
        /// Logical byte offset of the extent.
        offset: u64,
        /// Why.
        reason: String,
    },
    /// The request itself is wrong (unknown function, bad argument syntax, wrong paths).
    #[error("{0}")]
    BadRequest(String),
    /// The target refused or failed the command.
    #[error("{}: {source}", path.display())]
    Target {
        /// The file the command was for.
        path: PathBuf,
        /// The status and message from the target.
        source: CommandError,
    },
}
