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

pub use error::{EtherError, FrameError};
pub use frame::{check_frame, check_receive, check_transmit, status_message, Cidr};
pub use host::{HostBridge, HostLink, Received};
pub use switch::{Counters, CountersSnapshot, Posted, Switch, Upcall};
pub use tap::Tap;

use std::time::Duration;

/// Vendor I/O opcode of TRANSMIT_FRAME: host→target data (opcode bits 1:0 = 01), one
/// Ethernet frame; CDW10 holds its length.
pub const TRANSMIT_FRAME: u8 = 0xE1;

/// Vendor I/O opcode of RECEIVE_FRAME: target→host data (opcode bits 1:0 = 10), a buffer
/// of at least [`RECEIVE_BUFFER`] bytes; held by the target until a frame arrives.
pub const RECEIVE_FRAME: u8 = 0xE2;

/// The shortest frame accepted: an Ethernet header (destination, source, EtherType).
pub const MIN_FRAME: usize = 14;

/// The longest frame accepted: 1500 bytes of payload, the 14-byte header and a 4-byte
/// 802.1Q tag (the frame check sequence is never carried).
pub const MAX_FRAME: usize = 1518;

/// The smallest buffer a RECEIVE_FRAME may offer.
pub const RECEIVE_BUFFER: usize = 2048;

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

/// NVMe status field (DNR, SCT 7, SC 0xD0): the target has no Ether-oN interface.
pub const STATUS_NO_INTERFACE: u16 = status(7, 0xD0);

/// NVMe status field (DNR, SCT 7, SC 0xD1): another host's association owns the bridge.
pub const STATUS_BRIDGE_BUSY: u16 = status(7, 0xD1);

/// NVMe status field (DNR, SCT 7, SC 0xD2): [`MAX_HELD_RECEIVES`] receives are held.
pub const STATUS_TOO_MANY_RECEIVES: u16 = status(7, 0xD2);

/// NVMe status field (DNR, SCT 0, SC 0x02 Invalid Field in Command): a frame length out of
/// range or not the data length.
pub const STATUS_INVALID_FIELD: u16 = status(0, 0x02);

/// NVMe status field (DNR, SCT 0, SC 0x0F Data SGL Length Invalid): a receive buffer
/// shorter than [`RECEIVE_BUFFER`].
pub const STATUS_SGL_LENGTH_INVALID: u16 = status(0, 0x0F);

/// NVMe status field (DNR, SCT 0, SC 0x06 Internal Error): the TAP device refused a frame.
pub const STATUS_INTERNAL_ERROR: u16 = status(0, 0x06);

/// A completion status field with Do Not Retry set.
const fn status(sct: u8, sc: u8) -> u16 {
    (1 << 14) | ((sct as u16 & 7) << 8) | sc as u16
}
