// SPDX-License-Identifier: Apache-2.0
//! The EXEC result: records of named, typed values returned to the host.
//!
//! Byte layout: `docs/compute-descriptor.md` ("Result records").

use crate::cursor::{Cursor, DecodeError};
use crate::value::{get_name, put_name, Value};

/// Magic at byte 0 of every encoded result.
pub const RESULT_MAGIC: &[u8; 4] = b"ISRS";
/// The result format version.
pub const RESULT_VERSION: u16 = 1;
/// Longest string, byte string or list in a result (elements or bytes).
pub const MAX_RESULT_VALUE: u32 = 1 << 26;

/// One record: the named values a kernel returns for one input (or for the whole command).
pub type Record = Vec<(String, Value)>;

/// Everything an EXEC returns inline.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExecResult {
    /// One record per input object for per-object functions; one record for functions that
    /// write output objects.
    pub records: Vec<Record>,
}

impl ExecResult {
    /// Encodes to bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(RESULT_MAGIC);
        out.extend_from_slice(&RESULT_VERSION.to_le_bytes());
        out.extend_from_slice(&u16::try_from(self.records.len()).expect("too many records").to_le_bytes());
        for rec in &self.records {
            out.extend_from_slice(&u16::try_from(rec.len()).expect("too many fields").to_le_bytes());
            for (key, value) in rec {
                put_name(&mut out, key);
                value.encode(&mut out);
            }
        }
        out
    }

    /// Decodes bytes produced by [`ExecResult::encode`].
    pub fn decode(buf: &[u8]) -> Result<ExecResult, DecodeError> {
        let mut cur = Cursor::new(buf);
        cur.magic(RESULT_MAGIC, "exec result")?;
        let version = cur.u16("version")?;
        if version != RESULT_VERSION {
            return Err(DecodeError::BadVersion { found: version, supported: RESULT_VERSION });
        }
        let n = cur.u16("record count")?;
        let mut records = Vec::with_capacity(usize::from(n).min(1024));
        for _ in 0..n {
            let fields = cur.u16("field count")?;
            let mut rec = Vec::with_capacity(usize::from(fields).min(64));
            for _ in 0..fields {
                let key = get_name(&mut cur, 32, "field name")?;
                rec.push((key, Value::decode(&mut cur, MAX_RESULT_VALUE)?));
            }
            records.push(rec);
        }
        cur.finish()?;
        Ok(ExecResult { records })
    }
}
