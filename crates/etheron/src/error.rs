// SPDX-License-Identifier: Apache-2.0
//! Errors of Ether-oN: each names the object and what to do.

/// Why a frame command is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The frame is shorter than an Ethernet header.
    #[error("an Ethernet frame of {len} bytes is shorter than its 14-byte header")]
    TooShort {
        /// Its length.
        len: usize,
    },
    /// The frame is longer than the largest Ethernet frame.
    #[error("an Ethernet frame of {len} bytes exceeds {max} bytes (MTU 1500 with an 802.1Q tag); lower the interface MTU")]
    TooLong {
        /// Its length.
        len: usize,
        /// The longest accepted.
        max: usize,
    },
    /// TRANSMIT_FRAME's CDW10 does not match the data it carries.
    #[error("TRANSMIT_FRAME says the frame is {declared} bytes (CDW10) but carries {carried} bytes of data; set CDW10 to the data length")]
    LengthMismatch {
        /// CDW10.
        declared: u32,
        /// The data length.
        carried: usize,
    },
    /// RECEIVE_FRAME offers too small a buffer.
    #[error("RECEIVE_FRAME offers a {len}-byte buffer; offer at least {min} bytes")]
    BufferTooSmall {
        /// The buffer length.
        len: usize,
        /// The smallest accepted.
        min: usize,
    },
}

impl FrameError {
    /// The NVMe status field a target completes the command with.
    pub fn status(&self) -> u16 {
        match self {
            FrameError::BufferTooSmall { .. } => crate::STATUS_SGL_LENGTH_INVALID,
            _ => crate::STATUS_INVALID_FIELD,
        }
    }
}

/// Errors of TAP devices, addresses and bridges.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EtherError {
    /// An address is not ADDR/PREFIX.
    #[error("{text:?} is not an interface address ({why}); give ADDR/PREFIX, e.g. 10.77.0.2/24")]
    BadAddress {
        /// What was given.
        text: String,
        /// What is wrong.
        why: String,
    },
    /// `/dev/net/tun` could not be opened or the device not created.
    #[error("cannot create TAP device {name}: {source}; Ether-oN needs /dev/net/tun (modprobe tun) and CAP_NET_ADMIN (run as root), and the name must not be in use (stop the other `insitu ethernet` or target first)")]
    Tap {
        /// The device name.
        name: String,
        /// The cause.
        source: std::io::Error,
    },
    /// `ip` failed to configure the device.
    #[error("cannot configure TAP device {name}: `ip {args}` failed: {detail}; check that iproute2 is installed and the address is free")]
    Configure {
        /// The device name.
        name: String,
        /// The arguments given to `ip`.
        args: String,
        /// Its error output or the spawn error.
        detail: String,
    },
    /// Reading or writing the TAP device failed.
    #[error("TAP device {name}: {source}")]
    Io {
        /// The device name.
        name: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A frame broke a rule.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The NVMe side of a host bridge failed.
    #[error("Ether-oN link to the target: {0}")]
    Link(String),
}
