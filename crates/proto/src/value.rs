// SPDX-License-Identifier: Apache-2.0
//! Typed values: function arguments in a descriptor and fields of a result record.

use crate::cursor::{Cursor, DecodeError};

/// A typed value carried by the wire formats.
///
/// The tag byte of each variant is part of the format (`docs/compute-descriptor.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// Tag 1: unsigned 64-bit integer.
    U64(u64),
    /// Tag 2: signed 64-bit integer.
    I64(i64),
    /// Tag 3: UTF-8 string.
    Str(String),
    /// Tag 4: opaque bytes.
    Bytes(Vec<u8>),
    /// Tag 5: boolean (one byte, 0 or 1).
    Bool(bool),
    /// Tag 6: list of unsigned 64-bit integers.
    U64List(Vec<u64>),
}

impl Value {
    /// The tag byte that identifies this variant on the wire.
    pub fn tag(&self) -> u8 {
        match self {
            Value::U64(_) => 1,
            Value::I64(_) => 2,
            Value::Str(_) => 3,
            Value::Bytes(_) => 4,
            Value::Bool(_) => 5,
            Value::U64List(_) => 6,
        }
    }

    /// A short name of the variant's type, used in error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::Bool(_) => "bool",
            Value::U64List(_) => "u64-list",
        }
    }

    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.tag());
        match self {
            Value::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::Str(s) => put_blob(out, s.as_bytes()),
            Value::Bytes(b) => put_blob(out, b),
            Value::Bool(b) => out.push(u8::from(*b)),
            Value::U64List(list) => {
                out.extend_from_slice(&len_u32(list.len()).to_le_bytes());
                for v in list {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
    }

    /// Decodes one tagged value; `max_len` bounds strings, byte strings (in bytes) and lists
    /// (in elements).
    pub(crate) fn decode(cur: &mut Cursor<'_>, max_len: u32) -> Result<Value, DecodeError> {
        let at = cur.position();
        let tag = cur.u8("value tag")?;
        Ok(match tag {
            1 => Value::U64(cur.u64("u64 value")?),
            2 => Value::I64(cur.u64("i64 value")? as i64),
            3 => {
                let bytes = blob(cur, max_len, "string value")?;
                let s = std::str::from_utf8(bytes).map_err(|_| DecodeError::BadUtf8 { field: "string value", offset: at })?;
                Value::Str(s.to_owned())
            }
            4 => Value::Bytes(blob(cur, max_len, "bytes value")?.to_vec()),
            5 => match cur.u8("bool value")? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                other => return Err(DecodeError::BadField { field: "bool value", offset: at + 1, detail: format!("must be 0 or 1, found {other}") }),
            },
            6 => {
                let n = cur.u32("list length")?;
                if n > max_len {
                    return Err(DecodeError::TooMany { field: "list elements", count: u64::from(n), max: u64::from(max_len) });
                }
                let mut list = Vec::with_capacity(n.min(4096) as usize);
                for _ in 0..n {
                    list.push(cur.u64("list element")?);
                }
                Value::U64List(list)
            }
            other => return Err(DecodeError::UnknownTag { tag: other, offset: at }),
        })
    }
}

fn blob<'a>(cur: &mut Cursor<'a>, max_len: u32, field: &'static str) -> Result<&'a [u8], DecodeError> {
    let n = cur.u32(field)?;
    if n > max_len {
        return Err(DecodeError::TooMany { field, count: u64::from(n), max: u64::from(max_len) });
    }
    cur.bytes(n as usize, field)
}

fn put_blob(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&len_u32(bytes.len()).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Lengths are bounded by the decoder's limits long before 4 GiB; an encoder given more is
/// a caller bug, so it panics rather than writing a wrapped length.
pub(crate) fn len_u32(n: usize) -> u32 {
    u32::try_from(n).expect("wire length exceeds u32")
}

/// Writes a short name (key or function): one length byte, then the bytes.
pub(crate) fn put_name(out: &mut Vec<u8>, name: &str) {
    out.push(u8::try_from(name.len()).expect("name longer than 255 bytes"));
    out.extend_from_slice(name.as_bytes());
}

/// Reads a short name and checks it against the name alphabet `[a-z0-9_-]`, 1..=max bytes.
pub(crate) fn get_name(cur: &mut Cursor<'_>, max: u8, field: &'static str) -> Result<String, DecodeError> {
    let at = cur.position();
    let n = cur.u8(field)?;
    if n == 0 || n > max {
        return Err(DecodeError::BadField { field, offset: at, detail: format!("length {n} not in 1..={max}") });
    }
    let bytes = cur.bytes(usize::from(n), field)?;
    if !bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_' || *b == b'-') {
        return Err(DecodeError::BadField { field, offset: at + 1, detail: "only a-z, 0-9, '_' and '-' are allowed".into() });
    }
    // The alphabet check above makes this infallible.
    Ok(String::from_utf8(bytes.to_vec()).unwrap_or_default())
}
