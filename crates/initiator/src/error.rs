// SPDX-License-Identifier: Apache-2.0
//! The initiator's error type and the names of NVMe status codes.

use std::time::Duration;

/// What went wrong, on which command or object, and what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InitiatorError {
    /// The TCP connection to the target could not be opened.
    #[error("cannot connect to {addr}: {source}; check that the target is running and listening on that host:port")]
    Connect {
        /// The address dialled.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The NVMe/TCP connection handshake (ICReq/ICResp) failed.
    #[error("NVMe/TCP handshake with {addr} (queue {qid}) failed: {detail}; is this an NVMe/TCP target?")]
    Handshake {
        /// The address.
        addr: String,
        /// Queue being set up.
        qid: u16,
        /// What was wrong.
        detail: String,
    },
    /// The controller refused the Fabrics Connect command.
    #[error("Connect to {subnqn} (queue {qid}) refused: {reason} (sct {sct}, sc {sc:#04x}); {hint}")]
    ConnectRefused {
        /// Subsystem NQN asked for.
        subnqn: String,
        /// Queue being connected.
        qid: u16,
        /// Status code type.
        sct: u8,
        /// Status code.
        sc: u8,
        /// The status, in words.
        reason: String,
        /// What to do about it.
        hint: String,
    },
    /// A command completed with an error status.
    #[error("{command} failed: {} (sct {sct}, sc {sc:#04x})", status_name(command, *sct, *sc))]
    Status {
        /// The command that failed ("Read", "Identify", "Exec", ...).
        command: &'static str,
        /// Status code type.
        sct: u8,
        /// Status code.
        sc: u8,
        /// Do Not Retry: the same command will fail again.
        dnr: bool,
    },
    /// The controller did not answer within the command timeout; the queue was closed
    /// and the next command reconnects.
    #[error("{command} timed out after {timeout:?}; the connection was closed and will be re-established by the next command (raise ConnectOptions::timeout for slow targets)")]
    Timeout {
        /// The command.
        command: &'static str,
        /// The timeout that expired.
        timeout: Duration,
    },
    /// The connection failed and the command could not be completed (read-only commands
    /// are retried once on a new connection before this is returned).
    #[error("{command} failed: connection to the target lost ({detail}); check the target and the network, then retry")]
    ConnectionLost {
        /// The command.
        command: &'static str,
        /// Why the connection closed.
        detail: String,
    },
    /// The connection failed while a command that changes data was in flight: it may or
    /// may not have been executed.
    #[error("{command} outcome unknown: the connection to the target was lost while it was in flight ({detail}); the data may or may not have been written, so verify or rewrite it")]
    OutcomeUnknown {
        /// The command.
        command: &'static str,
        /// Why the connection closed.
        detail: String,
    },
    /// The target violated the NVMe/TCP or NVMe protocol.
    #[error("protocol error from the target during {command}: {detail}")]
    Protocol {
        /// The command or step.
        command: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// The controller did not become ready, or reported a fatal status.
    #[error("controller {subnqn} not ready: {detail}")]
    NotReady {
        /// Subsystem NQN.
        subnqn: String,
        /// CSTS and what was waited for.
        detail: String,
    },
    /// The namespace does not exist or is not active on this controller.
    #[error("namespace {nsid} is not active on {subnqn}; `insitu nvme identify nvme-tcp://{addr}/{subnqn}` lists the active ones")]
    NoNamespace {
        /// The NSID asked for.
        nsid: u32,
        /// Subsystem NQN.
        subnqn: String,
        /// The target's address, `host:port`.
        addr: String,
    },
    /// A caller-supplied argument cannot be turned into a valid command.
    #[error("{command}: {detail}")]
    InvalidArgument {
        /// The command.
        command: &'static str,
        /// What is wrong and what is allowed.
        detail: String,
    },
    /// A KV Retrieve, Delete, Exist or `MustExist` Store named a key the namespace does
    /// not hold (status KV Key Does Not Exist, 87h).
    #[error("{command}: the key does not exist")]
    KeyNotFound {
        /// The command.
        command: &'static str,
    },
    /// A `MustNotExist` KV Store named a key the namespace holds (status Key Exists, 89h).
    #[error("{command}: the key exists already")]
    KeyExists {
        /// The command.
        command: &'static str,
    },
    /// The session was disconnected with [`Session::disconnect`](crate::Session::disconnect).
    #[error("{command}: the session is disconnected; connect a new Session")]
    Disconnected {
        /// The command attempted.
        command: &'static str,
    },
}

impl InitiatorError {
    /// The 15-bit NVMe status field (DNR, SCT, SC) of a [`InitiatorError::Status`] or
    /// [`InitiatorError::ConnectRefused`] error.
    pub fn status_field(&self) -> Option<u16> {
        match *self {
            InitiatorError::Status { sct, sc, dnr, .. } => Some(u16::from(dnr) << 14 | u16::from(sct & 7) << 8 | u16::from(sc)),
            InitiatorError::ConnectRefused { sct, sc, .. } => Some(u16::from(sct & 7) << 8 | u16::from(sc)),
            _ => None,
        }
    }

    /// A status error for `command` from a completion's 15-bit status field, or `None` on
    /// success.
    pub(crate) fn from_status(command: &'static str, status: u16) -> Option<InitiatorError> {
        let (sct, sc) = split_status(status);
        (sct != 0 || sc != 0).then_some(InitiatorError::Status { command, sct, sc, dnr: status & (1 << 14) != 0 })
    }
}

/// (SCT, SC) of a 15-bit status field.
pub(crate) fn split_status(status: u16) -> (u8, u8) {
    (((status >> 8) & 7) as u8, (status & 0xFF) as u8)
}

/// The name of a status code, as the NVMe base and fabrics specifications spell it.
/// Command-specific codes (SCT 1) depend on the command.
pub fn status_name(command: &str, sct: u8, sc: u8) -> &'static str {
    match (sct, sc) {
        (0, 0x00) => "Successful Completion",
        (0, 0x01) => "Invalid Command Opcode",
        (0, 0x02) => "Invalid Field in Command",
        (0, 0x03) => "Command ID Conflict",
        (0, 0x04) => "Data Transfer Error",
        (0, 0x05) => "Commands Aborted due to Power Loss Notification",
        (0, 0x06) => "Internal Error",
        (0, 0x07) => "Command Abort Requested",
        (0, 0x08) => "Command Aborted due to SQ Deletion",
        (0, 0x0B) => "Invalid Namespace or Format",
        (0, 0x0C) => "Command Sequence Error",
        (0, 0x0D) => "Invalid SGL Segment Descriptor",
        (0, 0x0E) => "Invalid Number of SGL Descriptors",
        (0, 0x0F) => "Data SGL Length Invalid",
        (0, 0x11) => "SGL Descriptor Type Invalid",
        (0, 0x15) => "Operation Denied",
        (0, 0x16) => "SGL Offset Invalid",
        (0, 0x18) => "Host Identifier Inconsistent Format",
        (0, 0x19) => "Keep Alive Timer Expired",
        (0, 0x1A) => "Keep Alive Timeout Invalid",
        (0, 0x20) => "Namespace is Write Protected",
        (0, 0x21) => "Command Interrupted",
        (0, 0x22) => "Transient Transport Error",
        (0, 0x80) => "LBA Out of Range",
        (0, 0x81) => "Capacity Exceeded",
        (0, 0x82) => "Namespace Not Ready",
        (0, 0x83) => "Reservation Conflict",
        (0, 0x84) => "Format In Progress",
        (0, 0x85) if command.starts_with("KV ") => "Invalid Value Size",
        (0, 0x86) if command.starts_with("KV ") => "Invalid Key Size (keys are 1 to 16 bytes)",
        (0, 0x87) if command.starts_with("KV ") => "KV Key Does Not Exist",
        (0, 0x88) if command.starts_with("KV ") => "Unrecovered Error (see the target's log)",
        (0, 0x89) if command.starts_with("KV ") => "Key Exists",
        (1, 0x00) => "Completion Queue Invalid",
        (1, 0x01) => "Invalid Queue Identifier",
        (1, 0x02) => "Invalid Queue Size",
        (1, 0x09) => "Invalid Log Page",
        (1, 0x0A) => "Invalid Format",
        (1, 0x0D) => "Feature Identifier Not Saveable",
        (1, 0x0E) => "Feature Not Changeable",
        (1, 0x0F) => "Feature Not Namespace Specific",
        (1, 0x80) if command == "Connect" => "Incompatible Format",
        (1, 0x81) if command == "Connect" => "Controller Busy",
        (1, 0x82) if command == "Connect" => "Invalid Parameters",
        (1, 0x83) if command == "Connect" => "Restart Discovery",
        (1, 0x84) if command == "Connect" => "Host Not Allowed",
        (1, 0x80) => "Conflicting Attributes",
        (1, 0x81) => "Invalid Protection Information",
        (1, 0x82) => "Attempted Write to Read Only Range",
        (2, 0x80) => "Write Fault",
        (2, 0x81) => "Unrecovered Read Error",
        (2, 0x82) => "End-to-end Guard Check Error",
        (2, 0x83) => "End-to-end Application Tag Check Error",
        (2, 0x84) => "End-to-end Reference Tag Check Error",
        (2, 0x85) => "Compare Failure",
        (2, 0x86) => "Access Denied",
        (2, 0x87) => "Deallocated or Unwritten Logical Block",
        (3, 0x00) => "Internal Path Error",
        (3, 0x71) => "Command Aborted By Host",
        (7, 0xC0) => "Malformed Compute Descriptor",
        (7, 0xC1) => "Unknown Function",
        (7, 0xC2) => "Invalid Function Argument",
        (7, 0xC3) => "Output Object Too Small",
        (7, 0xC4) => "Function Failed",
        (7, 0xC5) => "Inline Result Too Large",
        (7, 0xC6) => "Blocks Locked by a Container (see `insitu lock --list`; `insitu unlock PATH` releases them)",
        (7, _) => "Vendor Specific Status",
        _ => "Unknown Status",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_display_names_command_and_code() {
        let e = InitiatorError::from_status("Read", 0x4080).unwrap();
        assert_eq!(e.to_string(), "Read failed: LBA Out of Range (sct 0, sc 0x80)");
        assert!(matches!(e, InitiatorError::Status { dnr: true, .. }));
        assert_eq!(e.status_field(), Some(0x4080));
        assert!(InitiatorError::from_status("Read", 0).is_none());
        let e = InitiatorError::from_status("Exec", 0x07C2).unwrap();
        assert_eq!(e.to_string(), "Exec failed: Invalid Function Argument (sct 7, sc 0xc2)");
    }

    #[test]
    fn command_specific_codes_depend_on_the_command() {
        assert_eq!(status_name("Connect", 1, 0x84), "Host Not Allowed");
        assert_eq!(status_name("Write", 1, 0x82), "Attempted Write to Read Only Range");
        assert_eq!(split_status(0x4184), (1, 0x84));
    }
}
