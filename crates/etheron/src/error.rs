// SPDX-License-Identifier: Apache-2.0
//! Errors of Ether-oN: each names the object and what to do.

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
    Frame(#[from] insitu_proto::ether::FrameError),
    /// The NVMe side of a host bridge failed.
    #[error("Ether-oN link to the target: {0}")]
    Link(String),
}
