// SPDX-License-Identifier: Apache-2.0
//! NVMe-style completion status for EXEC and the block commands.

use std::fmt;

/// A completion status: status code type and status code, as in the NVMe base specification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status {
    /// Status Code Type: 0 generic, 1 command specific, 7 vendor specific.
    pub sct: u8,
    /// Status Code within the type.
    pub sc: u8,
}

impl Status {
    /// Generic 0x00: Successful Completion.
    pub const SUCCESS: Status = Status { sct: 0, sc: 0x00 };
    /// Generic 0x01: Invalid Command Opcode.
    pub const INVALID_OPCODE: Status = Status { sct: 0, sc: 0x01 };
    /// Generic 0x02: Invalid Field in Command.
    pub const INVALID_FIELD: Status = Status { sct: 0, sc: 0x02 };
    /// Generic 0x04: Data Transfer Error.
    pub const DATA_TRANSFER_ERROR: Status = Status { sct: 0, sc: 0x04 };
    /// Generic 0x06: Internal Error.
    pub const INTERNAL_ERROR: Status = Status { sct: 0, sc: 0x06 };
    /// Generic 0x0B: Invalid Namespace or Format.
    pub const INVALID_NAMESPACE: Status = Status { sct: 0, sc: 0x0B };
    /// Generic 0x80: LBA Out of Range.
    pub const LBA_OUT_OF_RANGE: Status = Status { sct: 0, sc: 0x80 };
    /// Vendor 0xC0: the descriptor is malformed (bad magic, truncated, bad field).
    pub const BAD_DESCRIPTOR: Status = Status { sct: 7, sc: 0xC0 };
    /// Vendor 0xC1: no kernel of that name is registered.
    pub const UNKNOWN_FUNCTION: Status = Status { sct: 7, sc: 0xC1 };
    /// Vendor 0xC2: an argument is missing, unknown or of the wrong type or value.
    pub const BAD_ARGUMENT: Status = Status { sct: 7, sc: 0xC2 };
    /// Vendor 0xC3: an output object is too small for the result.
    pub const OUTPUT_TOO_SMALL: Status = Status { sct: 7, sc: 0xC3 };
    /// Vendor 0xC4: the kernel failed on the data (e.g. malformed CSV).
    pub const KERNEL_FAILED: Status = Status { sct: 7, sc: 0xC4 };
    /// Vendor 0xC5: the inline result is larger than the target returns inline.
    pub const RESULT_TOO_LARGE: Status = Status { sct: 7, sc: 0xC5 };
    /// Vendor 0xC6: the write touches blocks of a path a container holds locked
    /// (`docs/lock-commands.md`); it is refused until the lock is released.
    pub const LBA_LOCKED: Status = Status { sct: 7, sc: 0xC6 };

    /// True for Successful Completion.
    pub fn is_success(self) -> bool {
        self == Status::SUCCESS
    }

    /// The 15-bit status field of an NVMe completion (SCT in bits 10:8, SC in 7:0), with Do
    /// Not Retry set for every error: EXEC errors are properties of the request.
    pub fn to_nvme_field(self) -> u16 {
        let dnr = if self.is_success() { 0 } else { 1 << 14 };
        dnr | (u16::from(self.sct & 0x7) << 8) | u16::from(self.sc)
    }

    fn name(self) -> &'static str {
        match self {
            Status::SUCCESS => "Successful Completion",
            Status::INVALID_OPCODE => "Invalid Command Opcode",
            Status::INVALID_FIELD => "Invalid Field in Command",
            Status::DATA_TRANSFER_ERROR => "Data Transfer Error",
            Status::INTERNAL_ERROR => "Internal Error",
            Status::INVALID_NAMESPACE => "Invalid Namespace or Format",
            Status::LBA_OUT_OF_RANGE => "LBA Out of Range",
            Status::BAD_DESCRIPTOR => "Malformed Compute Descriptor",
            Status::UNKNOWN_FUNCTION => "Unknown Function",
            Status::BAD_ARGUMENT => "Invalid Function Argument",
            Status::OUTPUT_TOO_SMALL => "Output Object Too Small",
            Status::KERNEL_FAILED => "Function Failed",
            Status::RESULT_TOO_LARGE => "Inline Result Too Large",
            Status::LBA_LOCKED => "Blocks Locked by a Container",
            _ => "Unknown Status",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (sct {:#x}, sc {:#04x})", self.name(), self.sct, self.sc)
    }
}

/// A failed command: its status and a message naming what failed and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct CommandError {
    /// The completion status.
    pub status: Status,
    /// Human-readable detail.
    pub message: String,
}

impl CommandError {
    /// A new error.
    pub fn new(status: Status, message: impl Into<String>) -> Self {
        CommandError { status, message: message.into() }
    }
}
