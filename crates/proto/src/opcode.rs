// SPDX-License-Identifier: Apache-2.0
//! Every command opcode insitu speaks, in one place: the admin and NVM commands it serves,
//! and its vendor commands (`docs/nvme-vendor-commands.md`). Raw values are constants;
//! [`AdminOpcode`] and [`IoOpcode`] turn them into enums at the edge, with an `Unknown`
//! arm for anything else (answered with Invalid Command Opcode).
//!
//! In NVMe the two low bits of an opcode fix the data direction (01 host→controller, 10
//! controller→host), and a stock Linux host's passthrough ioctl follows them, so every
//! vendor command that carries data in ends in 01 and every one that returns data in 10.
//! The Key Value command set's opcodes (on a key-value namespace) are in
//! [`crate::kv::opcode`].

/// Fabrics command (admin or I/O queue); the type is in byte 4.
pub const FABRICS: u8 = 0x7F;
/// Admin: Get Log Page.
pub const GET_LOG_PAGE: u8 = 0x02;
/// Admin: Identify.
pub const IDENTIFY: u8 = 0x06;
/// Admin: Abort.
pub const ABORT: u8 = 0x08;
/// Admin: Set Features.
pub const SET_FEATURES: u8 = 0x09;
/// Admin: Get Features.
pub const GET_FEATURES: u8 = 0x0A;
/// Admin: Asynchronous Event Request.
pub const ASYNC_EVENT: u8 = 0x0C;
/// Admin: Keep Alive.
pub const KEEP_ALIVE: u8 = 0x18;
/// NVM: Flush.
pub const FLUSH: u8 = 0x00;
/// NVM: Write.
pub const WRITE: u8 = 0x01;
/// NVM: Read.
pub const READ: u8 = 0x02;
/// NVM: Write Zeroes.
pub const WRITE_ZEROES: u8 = 0x08;
/// NVM: Dataset Management.
pub const DSM: u8 = 0x09;
/// Vendor (I/O): EXEC. Data direction host→controller (low bits 01): the compute
/// descriptor travels as the command's data; the result is read with [`EXEC_RESULT`].
pub const EXEC: u8 = 0x99;
/// Vendor (I/O): read the result of the EXEC with the same CID tag, controller→host
/// (low bits 10).
pub const EXEC_RESULT: u8 = 0x9A;
/// Vendor (I/O): append keys and values to a sequence of the target's KV cache,
/// host→controller (`docs/kv-commands.md`).
pub const KV_APPEND: u8 = 0x9D;
/// Vendor (I/O): create, fork, free a KV-cache sequence, or ask for its info,
/// host→controller.
pub const KV_ADMIN: u8 = 0xA1;
/// Vendor (I/O): attention over the KV cache for a batch of sequences, host→controller;
/// the outputs are held under the tag in CDW10 and read with [`KV_RESULT`].
pub const KV_ATTEND: u8 = 0xA5;
/// Vendor (I/O): read (and release) the result held under the tag in CDW10,
/// controller→host.
pub const KV_RESULT: u8 = 0xA6;
/// Vendor (I/O): lock a path of a sharable namespace for a container, host→controller:
/// the data lists its path and extents (`docs/lock-commands.md`); the lock id comes
/// back in completion DW0/DW1.
pub const LOCK: u8 = 0xB1;
/// Vendor (I/O): release the lock whose id is in CDW10/CDW11 (no data).
pub const UNLOCK: u8 = 0xB5;
/// Vendor (I/O, Ether-oN): one Ethernet frame from the host, host→controller.
pub const TRANSMIT_FRAME: u8 = 0xE1;
/// Vendor (I/O, Ether-oN): a receive buffer the target completes with one frame for the
/// host, controller→host (a pre-posted upcall).
pub const RECEIVE_FRAME: u8 = 0xE2;

/// Fabrics command types (byte 4 of an opcode 0x7F command).
pub mod fabrics {
    /// Property Set.
    pub const PROPERTY_SET: u8 = 0x00;
    /// Connect.
    pub const CONNECT: u8 = 0x01;
    /// Property Get.
    pub const PROPERTY_GET: u8 = 0x04;
}

/// Declares an opcode enum with its raw values, both ways.
macro_rules! opcodes {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $value:path,)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vdoc])* $variant,)*
            /// Any other opcode: answered with Invalid Command Opcode.
            Unknown(u8),
        }

        impl From<u8> for $name {
            fn from(op: u8) -> $name {
                match op {
                    $($value => $name::$variant,)*
                    other => $name::Unknown(other),
                }
            }
        }

        impl From<$name> for u8 {
            fn from(op: $name) -> u8 {
                match op {
                    $($name::$variant => $value,)*
                    $name::Unknown(other) => other,
                }
            }
        }
    };
}

opcodes! {
    /// A command on the admin queue.
    AdminOpcode {
        /// Fabrics (Connect, Property Get/Set).
        Fabrics = FABRICS,
        /// Get Log Page.
        GetLogPage = GET_LOG_PAGE,
        /// Identify.
        Identify = IDENTIFY,
        /// Abort.
        Abort = ABORT,
        /// Set Features.
        SetFeatures = SET_FEATURES,
        /// Get Features.
        GetFeatures = GET_FEATURES,
        /// Asynchronous Event Request.
        AsyncEvent = ASYNC_EVENT,
        /// Keep Alive.
        KeepAlive = KEEP_ALIVE,
    }
}

opcodes! {
    /// A command on an I/O queue, to a block namespace (a key-value namespace reads the
    /// same byte as a [`crate::kv::KvOpcode`]).
    IoOpcode {
        /// Fabrics (Connect).
        Fabrics = FABRICS,
        /// Flush.
        Flush = FLUSH,
        /// Write.
        Write = WRITE,
        /// Read.
        Read = READ,
        /// Write Zeroes.
        WriteZeroes = WRITE_ZEROES,
        /// Dataset Management.
        Dsm = DSM,
        /// EXEC.
        Exec = EXEC,
        /// EXEC's result.
        ExecResult = EXEC_RESULT,
        /// KV-cache append.
        KvAppend = KV_APPEND,
        /// KV-cache sequence administration.
        KvAdmin = KV_ADMIN,
        /// Attention over the KV cache.
        KvAttend = KV_ATTEND,
        /// A held KV result.
        KvResult = KV_RESULT,
        /// Lock a path.
        Lock = LOCK,
        /// Release a lock.
        Unlock = UNLOCK,
        /// Ether-oN transmit.
        TransmitFrame = TRANSMIT_FRAME,
        /// Ether-oN receive.
        ReceiveFrame = RECEIVE_FRAME,
    }
}

impl IoOpcode {
    /// Whether this is one of insitu's vendor commands (not NVMe's own).
    pub fn is_vendor(self) -> bool {
        u8::from(self) >= 0x80 && !matches!(self, IoOpcode::Unknown(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_round_trips_through_the_enums() {
        for b in 0..=255u8 {
            assert_eq!(u8::from(AdminOpcode::from(b)), b);
            assert_eq!(u8::from(IoOpcode::from(b)), b);
        }
        assert_eq!(IoOpcode::from(0x99), IoOpcode::Exec);
        assert_eq!(IoOpcode::from(0x42), IoOpcode::Unknown(0x42));
        assert_eq!(AdminOpcode::from(0x18), AdminOpcode::KeepAlive);
    }

    #[test]
    fn vendor_commands_follow_the_direction_bits() {
        // Data in ends in 01, data out in 10 (UNLOCK carries none: its id is in the CDWs).
        for op in [EXEC, KV_APPEND, KV_ADMIN, KV_ATTEND, LOCK, TRANSMIT_FRAME] {
            assert_eq!(op & 3, 1, "{op:#x}");
        }
        for op in [EXEC_RESULT, KV_RESULT, RECEIVE_FRAME] {
            assert_eq!(op & 3, 2, "{op:#x}");
        }
        assert!(IoOpcode::Exec.is_vendor() && !IoOpcode::Read.is_vendor() && !IoOpcode::Unknown(0xF0).is_vendor());
    }
}
