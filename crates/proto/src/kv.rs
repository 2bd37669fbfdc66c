// SPDX-License-Identifier: Apache-2.0
//! The NVMe Key Value Command Set (command set identifier 01h) on the wire: keys carried in
//! the command, the five commands' dwords, their status codes and the List data.
//!
//! Layout (Key Value Command Set Specification 1.0, "Key Value Commands"):
//!
//! | Dword      | Store                  | Retrieve          | List              | Delete / Exist |
//! |------------|------------------------|-------------------|-------------------|----------------|
//! | CDW2–3     | key bytes 0–7          | key bytes 0–7     | key bytes 0–7     | key bytes 0–7  |
//! | CDW10      | value size             | host buffer size  | host buffer size  | —              |
//! | CDW11 7:0  | key length (1–16)      | key length        | key length (0–16) | key length     |
//! | CDW11 15:8 | store options          | retrieve options  | —                 | —              |
//! | CDW14–15   | key bytes 8–15         | key bytes 8–15    | key bytes 8–15    | key bytes 8–15 |
//!
//! This module only encodes and decodes; it checks every field against the rules the
//! target enforces, so one decoder serves both sides and the fuzz tests.

/// Command set identifier of the Key Value command set (Identify, CNS 05h, CSI 01h).
pub const CSI_KV: u8 = 0x01;

/// Longest key, in bytes: what the command's four key dwords hold.
pub const MAX_KEY_LEN: usize = 16;

/// Key Value command opcodes (they reuse NVM opcode values, so a target dispatches on the
/// namespace's command set first; [`KvOpcode`] is the same as an enum).
pub mod opcode {
    /// Store: value host to controller.
    pub const STORE: u8 = 0x01;
    /// Retrieve: value controller to host.
    pub const RETRIEVE: u8 = 0x02;
    /// List: keys controller to host.
    pub const LIST: u8 = 0x06;
    /// Delete: no data.
    pub const DELETE: u8 = 0x10;
    /// Exist: no data; the status says.
    pub const EXIST: u8 = 0x14;
}

/// A command on a key-value namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvOpcode {
    /// Store.
    Store,
    /// Retrieve.
    Retrieve,
    /// List.
    List,
    /// Delete.
    Delete,
    /// Exist.
    Exist,
    /// Any other opcode: answered with Invalid Command Opcode.
    Unknown(u8),
}

impl From<u8> for KvOpcode {
    fn from(op: u8) -> KvOpcode {
        match op {
            opcode::STORE => KvOpcode::Store,
            opcode::RETRIEVE => KvOpcode::Retrieve,
            opcode::LIST => KvOpcode::List,
            opcode::DELETE => KvOpcode::Delete,
            opcode::EXIST => KvOpcode::Exist,
            other => KvOpcode::Unknown(other),
        }
    }
}

/// Status codes of the Key Value command set. They are generic command status values
/// (status code type 0) in the command-set-specific range 80h–BFh, as the KV command set
/// specification lists them (next to the NVM set's Capacity Exceeded, 81h).
pub mod status {
    /// Capacity Exceeded: the store has no room for the value.
    pub const CAPACITY_EXCEEDED: u8 = 0x81;
    /// Invalid Value Size: the value is larger than the namespace's maximum, or the value
    /// size does not match the data sent.
    pub const INVALID_VALUE_SIZE: u8 = 0x85;
    /// Invalid Key Size: a key length of 0 or more than 16.
    pub const INVALID_KEY_SIZE: u8 = 0x86;
    /// KV Key Does Not Exist.
    pub const KEY_NOT_FOUND: u8 = 0x87;
    /// Unrecovered Error: the store failed to read or write its media.
    pub const UNRECOVERED_ERROR: u8 = 0x88;
    /// Key Exists: a Store that must not overwrite found the key.
    pub const KEY_EXISTS: u8 = 0x89;
    /// Invalid Field in Command (generic): unknown option bits.
    pub const INVALID_FIELD: u8 = 0x02;
    /// Invalid Command Opcode (generic).
    pub const INVALID_OPCODE: u8 = 0x01;

    /// A short name of a KV status code (status code type 0), for messages.
    pub fn name(sc: u8) -> Option<&'static str> {
        Some(match sc {
            CAPACITY_EXCEEDED => "Capacity Exceeded",
            INVALID_VALUE_SIZE => "Invalid Value Size",
            INVALID_KEY_SIZE => "Invalid Key Size",
            KEY_NOT_FOUND => "KV Key Does Not Exist",
            UNRECOVERED_ERROR => "Unrecovered Error",
            KEY_EXISTS => "Key Exists",
            _ => return None,
        })
    }
}

/// Store option bit (CDW11 bit 8): store only if the key exists already.
pub const STORE_OPT_MUST_EXIST: u8 = 1 << 0;
/// Store option bit (CDW11 bit 9): store only if the key does not exist.
pub const STORE_OPT_MUST_NOT_EXIST: u8 = 1 << 1;
/// Store option bit (CDW11 bit 10): the host allows compression. A hint; values are stored
/// as given.
pub const STORE_OPT_COMPRESS: u8 = 1 << 2;

/// Why a command's dwords are not a valid KV command. Each maps to the NVMe status the
/// target answers with ([`DecodeError::status`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The opcode is not one of the five KV commands.
    #[error("opcode {0:#04x} is not a Key Value command (Store 01h, Retrieve 02h, List 06h, Delete 10h, Exist 14h)")]
    UnknownOpcode(u8),
    /// The key length is 0 (List excepted) or over 16.
    #[error("key length {0} is invalid: keys are 1 to 16 bytes")]
    KeySize(usize),
    /// Option bits this target does not know, or a contradictory pair.
    #[error("options {options:#04x} are invalid for {command}")]
    Options {
        /// The command.
        command: &'static str,
        /// CDW11 bits 15:8.
        options: u8,
    },
}

impl DecodeError {
    /// The status code (type 0) a target returns for this error.
    pub fn status(&self) -> u8 {
        match self {
            DecodeError::UnknownOpcode(_) => status::INVALID_OPCODE,
            DecodeError::KeySize(_) => status::INVALID_KEY_SIZE,
            DecodeError::Options { .. } => status::INVALID_FIELD,
        }
    }
}

/// A key of 1 to 16 bytes, held inline (it travels in the command).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    len: u8,
    bytes: [u8; MAX_KEY_LEN],
}

impl Key {
    /// A key from its bytes; [`DecodeError::KeySize`] unless 1 to 16 of them.
    pub fn new(bytes: &[u8]) -> Result<Key, DecodeError> {
        if bytes.is_empty() || bytes.len() > MAX_KEY_LEN {
            return Err(DecodeError::KeySize(bytes.len()));
        }
        let mut k = Key { len: bytes.len() as u8, bytes: [0; MAX_KEY_LEN] };
        k.bytes[..bytes.len()].copy_from_slice(bytes);
        Ok(k)
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// The four key dwords (CDW2, CDW3, CDW14, CDW15), little-endian, zero padded.
    fn dwords(&self) -> [u32; 4] {
        let d = |i: usize| u32::from_le_bytes(self.bytes[i * 4..i * 4 + 4].try_into().expect("4 bytes"));
        [d(0), d(1), d(2), d(3)]
    }

    /// The key of length `len` in the four key dwords.
    fn from_dwords(len: usize, d: [u32; 4]) -> Result<Key, DecodeError> {
        let mut all = [0u8; MAX_KEY_LEN];
        for (i, w) in d.iter().enumerate() {
            all[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
        }
        Key::new(all.get(..len).ok_or(DecodeError::KeySize(len))?)
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({:?})", String::from_utf8_lossy(self.as_bytes()))
    }
}

/// What a Store may do to an existing key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StoreMode {
    /// Insert or overwrite (no option bits). The default.
    #[default]
    Upsert,
    /// Overwrite only: fails with KV Key Does Not Exist when absent.
    MustExist,
    /// Insert only: fails with Key Exists when present.
    MustNotExist,
}

/// A decoded Key Value command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvCommand {
    /// Store `value_size` bytes (the command's data) under `key`.
    Store {
        /// The key.
        key: Key,
        /// CDW10: bytes of value the data carries.
        value_size: u32,
        /// Options bits 0 and 1.
        mode: StoreMode,
    },
    /// Retrieve `key`'s value into a host buffer of `buffer` bytes.
    Retrieve {
        /// The key.
        key: Key,
        /// CDW10: host buffer size.
        buffer: u32,
    },
    /// List keys from `start` (that key or the next one; `None`: from the first) into a
    /// host buffer of `buffer` bytes.
    List {
        /// Where the listing starts.
        start: Option<Key>,
        /// CDW10: host buffer size.
        buffer: u32,
    },
    /// Delete `key`.
    Delete {
        /// The key.
        key: Key,
    },
    /// Whether `key` exists.
    Exist {
        /// The key.
        key: Key,
    },
}

impl KvCommand {
    /// Decodes a command from its opcode and its 16 dwords (`cdw[n]` is CDWn).
    pub fn decode(opcode: u8, cdw: &[u32; 16]) -> Result<KvCommand, DecodeError> {
        let kl = (cdw[11] & 0xFF) as usize;
        let options = ((cdw[11] >> 8) & 0xFF) as u8;
        let key_dw = [cdw[2], cdw[3], cdw[14], cdw[15]];
        let key = || Key::from_dwords(kl, key_dw);
        let no_options = |command: &'static str| if options == 0 { Ok(()) } else { Err(DecodeError::Options { command, options }) };
        Ok(match opcode {
            opcode::STORE => {
                let key = key()?;
                if options & !(STORE_OPT_MUST_EXIST | STORE_OPT_MUST_NOT_EXIST | STORE_OPT_COMPRESS) != 0 {
                    return Err(DecodeError::Options { command: "Store", options });
                }
                let mode = match (options & STORE_OPT_MUST_EXIST != 0, options & STORE_OPT_MUST_NOT_EXIST != 0) {
                    (false, false) => StoreMode::Upsert,
                    (true, false) => StoreMode::MustExist,
                    (false, true) => StoreMode::MustNotExist,
                    (true, true) => return Err(DecodeError::Options { command: "Store", options }),
                };
                KvCommand::Store { key, value_size: cdw[10], mode }
            }
            opcode::RETRIEVE => {
                let key = key()?;
                // Bit 0 asks for the raw (uncompressed) value: every value is raw here.
                if options & !1 != 0 {
                    return Err(DecodeError::Options { command: "Retrieve", options });
                }
                KvCommand::Retrieve { key, buffer: cdw[10] }
            }
            opcode::LIST => {
                no_options("List")?;
                let start = if kl == 0 { None } else { Some(key()?) };
                KvCommand::List { start, buffer: cdw[10] }
            }
            opcode::DELETE => {
                no_options("Delete")?;
                KvCommand::Delete { key: key()? }
            }
            opcode::EXIST => {
                no_options("Exist")?;
                KvCommand::Exist { key: key()? }
            }
            other => return Err(DecodeError::UnknownOpcode(other)),
        })
    }

    /// The opcode and the dwords of this command (CDW0–1 and the data pointer left zero).
    pub fn encode(&self) -> (u8, [u32; 16]) {
        let mut cdw = [0u32; 16];
        let mut put_key = |key: &Key, options: u8| {
            let d = key.dwords();
            (cdw[2], cdw[3], cdw[14], cdw[15]) = (d[0], d[1], d[2], d[3]);
            cdw[11] = u32::from(key.len) | (u32::from(options) << 8);
        };
        let op = match *self {
            KvCommand::Store { key, value_size, mode } => {
                let options = match mode {
                    StoreMode::Upsert => 0,
                    StoreMode::MustExist => STORE_OPT_MUST_EXIST,
                    StoreMode::MustNotExist => STORE_OPT_MUST_NOT_EXIST,
                };
                put_key(&key, options);
                cdw[10] = value_size;
                opcode::STORE
            }
            KvCommand::Retrieve { key, buffer } => {
                put_key(&key, 0);
                cdw[10] = buffer;
                opcode::RETRIEVE
            }
            KvCommand::List { start, buffer } => {
                if let Some(k) = start {
                    put_key(&k, 0);
                }
                cdw[10] = buffer;
                opcode::LIST
            }
            KvCommand::Delete { key } => {
                put_key(&key, 0);
                opcode::DELETE
            }
            KvCommand::Exist { key } => {
                put_key(&key, 0);
                opcode::EXIST
            }
        };
        (op, cdw)
    }
}

/// Bytes one key takes in List data: a 2-byte length and the key, padded to 4 bytes.
pub fn list_entry_len(key_len: usize) -> usize {
    (2 + key_len).div_ceil(4) * 4
}

/// Builds List data for a host buffer of `buffer` bytes: a 4-byte little-endian count of
/// the keys returned, then per key a 2-byte little-endian length, the key, and zero padding
/// to a 4-byte boundary. Keys are taken in order while they fit. Returns the data (at most
/// `buffer` bytes, at least 4 when `buffer` allows) and how many keys it holds.
pub fn encode_list<'a>(keys: impl IntoIterator<Item = &'a [u8]>, buffer: usize) -> (Vec<u8>, usize) {
    let mut out = vec![0u8; 4];
    let mut n = 0u32;
    for k in keys {
        let at = out.len();
        if at + list_entry_len(k.len()) > buffer {
            break;
        }
        out.resize(at + list_entry_len(k.len()), 0);
        out[at..at + 2].copy_from_slice(&(k.len() as u16).to_le_bytes());
        out[at + 2..at + 2 + k.len()].copy_from_slice(k);
        n += 1;
    }
    out[..4].copy_from_slice(&n.to_le_bytes());
    out.truncate(buffer);
    (out, n as usize)
}

/// Why List data does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed List data: {0}")]
pub struct ListError(String);

/// Parses List data (see [`encode_list`]) into its keys.
pub fn decode_list(data: &[u8]) -> Result<Vec<Vec<u8>>, ListError> {
    let count = data.get(..4).ok_or_else(|| ListError(format!("{} bytes hold no key count", data.len())))?;
    let count = u32::from_le_bytes(count.try_into().expect("4 bytes")) as usize;
    let mut keys = Vec::with_capacity(count.min(data.len() / 4));
    let mut at = 4;
    for i in 0..count {
        let len = data.get(at..at + 2).ok_or_else(|| ListError(format!("key {i} of {count} starts past the {} bytes returned", data.len())))?;
        let len = usize::from(u16::from_le_bytes(len.try_into().expect("2 bytes")));
        if len == 0 || len > MAX_KEY_LEN {
            return Err(ListError(format!("key {i} has length {len}")));
        }
        let key = data.get(at + 2..at + 2 + len).ok_or_else(|| ListError(format!("key {i} ({len} bytes) runs past the {} bytes returned", data.len())))?;
        keys.push(key.to_vec());
        at += list_entry_len(len);
    }
    Ok(keys)
}

/// The Key Value command set's Identify Namespace structure (CNS 05h, CSI 01h), 4096
/// bytes: size in bytes, one KV format (keys of up to [`MAX_KEY_LEN`] bytes, values of up
/// to `max_value` bytes, no limit on the number of keys).
pub fn identify_namespace(capacity: u64, max_value: u32, nguid: [u8; 16]) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    b[0..8].copy_from_slice(&capacity.to_le_bytes()); // NSZE, bytes
    b[25] = 1; // NKVF: one KV format
    b[26] = 0x01; // NMIC: may be attached to several controllers
    b[48..64].copy_from_slice(&nguid);
    // KV format 0 at byte 72: KML, reserved, FOPT, VML, MNK (0: no limit).
    b[72..74].copy_from_slice(&(MAX_KEY_LEN as u16).to_le_bytes());
    b[76..80].copy_from_slice(&max_value.to_le_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn key_dwords_follow_the_specification() {
        let k = Key::new(b"0123456789abcdef").unwrap();
        let (op, cdw) = KvCommand::Exist { key: k }.encode();
        assert_eq!(op, 0x14);
        assert_eq!(cdw[2], u32::from_le_bytes(*b"0123"));
        assert_eq!(cdw[3], u32::from_le_bytes(*b"4567"));
        assert_eq!(cdw[14], u32::from_le_bytes(*b"89ab"));
        assert_eq!(cdw[15], u32::from_le_bytes(*b"cdef"));
        assert_eq!(cdw[11], 16);
        let (_, cdw) = KvCommand::Store { key: Key::new(b"k").unwrap(), value_size: 7, mode: StoreMode::MustNotExist }.encode();
        assert_eq!((cdw[10], cdw[11]), (7, 1 | 2 << 8));
    }

    #[test]
    fn bad_keys_and_options_are_refused_with_their_status() {
        let mut cdw = [0u32; 16];
        assert_eq!(KvCommand::decode(opcode::STORE, &cdw).unwrap_err().status(), status::INVALID_KEY_SIZE);
        cdw[11] = 17;
        assert_eq!(KvCommand::decode(opcode::RETRIEVE, &cdw).unwrap_err(), DecodeError::KeySize(17));
        cdw[11] = 4 | (3 << 8);
        assert_eq!(KvCommand::decode(opcode::STORE, &cdw).unwrap_err().status(), status::INVALID_FIELD);
        cdw[11] = 4 | (1 << 8);
        assert_eq!(KvCommand::decode(opcode::DELETE, &cdw).unwrap_err().status(), status::INVALID_FIELD);
        assert_eq!(KvCommand::decode(0x99, &cdw).unwrap_err().status(), status::INVALID_OPCODE);
        cdw[11] = 0;
        assert_eq!(KvCommand::decode(opcode::LIST, &cdw).unwrap(), KvCommand::List { start: None, buffer: 0 });
    }

    #[test]
    fn list_data_round_trips_and_stops_at_the_buffer() {
        let keys: Vec<&[u8]> = vec![b"a", b"bb", b"0123456789abcdef"];
        let (data, n) = encode_list(keys.iter().copied(), 4096);
        assert_eq!(n, 3);
        assert_eq!(data.len(), 4 + 4 + 4 + 20);
        assert_eq!(decode_list(&data).unwrap(), keys.iter().map(|k| k.to_vec()).collect::<Vec<_>>());
        let (data, n) = encode_list(keys.iter().copied(), 12);
        assert_eq!((n, data.len()), (2, 12));
        let (data, n) = encode_list(keys.iter().copied(), 4);
        assert_eq!((n, data), (0, vec![0; 4]));
        assert!(decode_list(&[1, 0, 0, 0, 5, 0, b'x']).is_err());
        assert!(decode_list(&[1, 0]).is_err());
    }

    proptest! {
        // The decoder never panics, and whatever it accepts encodes back to the same fields.
        #[test]
        fn decoder_survives_random_dwords(op in prop::sample::select(vec![0x01u8, 0x02, 0x06, 0x10, 0x14, 0x00, 0x81, 0xFF]), cdw in prop::array::uniform16(any::<u32>())) {
            if let Ok(cmd) = KvCommand::decode(op, &cdw) {
                let (op2, cdw2) = cmd.encode();
                prop_assert_eq!(op2, op);
                prop_assert_eq!(KvCommand::decode(op2, &cdw2).unwrap(), cmd);
            }
        }

        #[test]
        fn keys_round_trip(key in prop::collection::vec(any::<u8>(), 1..=16), buffer in any::<u32>()) {
            let k = Key::new(&key).unwrap();
            let cmd = KvCommand::Retrieve { key: k, buffer };
            let (op, cdw) = cmd.encode();
            prop_assert_eq!(KvCommand::decode(op, &cdw).unwrap(), cmd);
        }

        #[test]
        fn list_decoder_survives_random_bytes(data in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_list(&data);
        }
    }
}
