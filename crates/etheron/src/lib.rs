// SPDX-License-Identifier: Apache-2.0
//! Ethernet over NVMe (Ether-oN, after DockerSSD): a target gets an IP address that is
//! reachable only through its NVMe/TCP connection. Ethernet frames travel in two vendor I/O
//! commands (`docs/etheron.md`):
//!
//! * [`TRANSMIT_FRAME`] (0xE1, host→target data): one frame, its length in CDW10; the
//!   target writes it to its TAP device.
//! * [`RECEIVE_FRAME`] (0xE2, target→host data): an *upcall*. The host pre-posts a few;
//!   the target holds them and completes one when its TAP device gives a frame for the
//!   host (the frame is the data, its length completion dword 0, a sequence number dword 1).
//!
//! The parts, each usable alone:
//!
//! * [`Tap`]: a TAP network device (`/dev/net/tun`, `IFF_TAP | IFF_NO_PI`) with an address,
//!   up, from which whole Ethernet frames are read and to which they are written.
//! * [`check_transmit`], [`check_receive`], [`check_frame`]: the rules a command must meet.
//! * [`Switch`]: the target's side: held receives of the one host that owns the bridge
//!   ([`Upcall`]), frames queued while none is posted, counters.
//! * [`HostBridge`]: the host's side: TAP frames out as transmits (in order, batched),
//!   received frames into the TAP (in the target's order), over any [`HostLink`].
//!
//! ```
//! use insitu_etheron::{check_frame, Cidr, MAX_FRAME};
//!
//! let cidr: Cidr = "10.77.0.2/24".parse()?;
//! assert_eq!(cidr.prefix, 24);
//! assert!(check_frame(&[0u8; 60]).is_ok());
//! assert!(check_frame(&vec![0u8; MAX_FRAME + 1]).is_err());
//! # Ok::<(), insitu_etheron::EtherError>(())
//! ```
#![deny(missing_docs)]

mod error;
mod frame;
mod host;
mod switch;
mod tap;

pub use error::EtherError;
pub use frame::Cidr;
pub use host::{HostBridge, HostLink, Received};
pub use insitu_proto::ether::{
    check_frame, check_receive, check_transmit, status_message, FrameError, MAX_FRAME, MIN_FRAME, RECEIVE_BUFFER, RECEIVE_FRAME, STATUS_BRIDGE_BUSY,
    STATUS_INTERNAL_ERROR, STATUS_INVALID_FIELD, STATUS_NO_INTERFACE, STATUS_SGL_LENGTH_INVALID, STATUS_TOO_MANY_RECEIVES, TRANSMIT_FRAME,
};
pub use switch::{Counters, CountersSnapshot, Posted, Switch, Upcall};
pub use tap::Tap;

use std::time::Duration;

/// Receives a target holds at most per bridge; more are refused with
/// [`STATUS_TOO_MANY_RECEIVES`].
pub const MAX_HELD_RECEIVES: usize = 64;

/// Frames a target queues for its host while no receive is posted; more are dropped, as
/// a full Ethernet queue drops.
pub const MAX_QUEUED_FRAMES: usize = 256;

/// How long a target holds a receive with nothing to deliver before it completes it with
/// length 0 (the host posts it again): a host timeout never fires on an idle link, and a
/// host that went away is noticed.
pub const IDLE_RECEIVE: Duration = Duration::from_secs(10);

/// Receives the host keeps posted (DockerSSD's four upcalls per queue).
pub const HOST_RECEIVES: usize = 4;
