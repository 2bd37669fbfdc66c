// SPDX-License-Identifier: Apache-2.0
//! The compute descriptor: what EXEC runs, with which arguments, over which virtual objects.
//!
//! Byte layout: `docs/compute-descriptor.md`. Test vectors: `docs/vectors/`.

use crate::cursor::{Cursor, DecodeError};
use crate::value::{get_name, len_u32, put_name, Value};

/// Magic at byte 0 of every descriptor.
pub const DESCRIPTOR_MAGIC: &[u8; 4] = b"ISCD";
/// The descriptor format version this build writes and reads.
pub const DESCRIPTOR_VERSION: u16 = 1;
/// Size of the fixed header in bytes.
pub const HEADER_LEN: usize = 32;
/// Size of one encoded extent in bytes.
pub const EXTENT_LEN: usize = 16;
/// Size of the fixed part of one encoded virtual object in bytes.
pub const OBJECT_HEADER_LEN: usize = 16;
/// Extents are addressed in units of this many bytes, whatever the namespace's block size,
/// so that every extent a file system can produce on a 512-byte-sector device is expressible.
pub const SECTOR: u64 = 512;

/// Bounds enforced while decoding, before anything is allocated in proportion to input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest descriptor accepted, in bytes. Default 16 MiB.
    pub max_descriptor_bytes: usize,
    /// Most arguments. Default 32.
    pub max_args: u8,
    /// Longest string or byte-string argument, in bytes. Default 64 KiB.
    pub max_arg_bytes: u32,
    /// Most input objects. Default 64.
    pub max_inputs: u16,
    /// Most output objects. Default 8.
    pub max_outputs: u16,
    /// Most extents in one object. Default 1 Mi.
    pub max_extents_per_object: u32,
    /// Largest object length, in bytes. Default 2^48 (256 TiB).
    pub max_object_len: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_descriptor_bytes: 16 << 20,
            max_args: 32,
            max_arg_bytes: 64 << 10,
            max_inputs: 64,
            max_outputs: 8,
            max_extents_per_object: 1 << 20,
            max_object_len: 1 << 48,
        }
    }
}

/// What an extent's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExtentKind {
    /// Kind 0: bytes stored on the namespace at the extent's sectors.
    Data,
    /// Kind 1: bytes that read as zero (a hole or an unwritten extent); nothing is read.
    Zero,
}

/// A run of 512-byte sectors of the namespace, in object order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Extent {
    /// Data or zeros.
    pub kind: ExtentKind,
    /// First sector (512-byte units from the start of the namespace); 0 for zero extents.
    pub start_sector: u64,
    /// Number of sectors, at least 1.
    pub sectors: u32,
}

impl Extent {
    /// A data extent.
    pub fn data(start_sector: u64, sectors: u32) -> Self {
        Extent { kind: ExtentKind::Data, start_sector, sectors }
    }

    /// A zero extent of `sectors` sectors.
    pub fn zero(sectors: u32) -> Self {
        Extent { kind: ExtentKind::Zero, start_sector: 0, sectors }
    }

    /// Length in bytes.
    pub fn bytes(&self) -> u64 {
        u64::from(self.sectors) * SECTOR
    }
}

/// An object the target is made aware of for one command: its bytes are the concatenation of
/// its extents from byte `offset` on, cut to `length`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VirtualObject {
    /// Bytes of the extents' concatenation before the object's first byte: less than one
    /// sector, so that a byte range of a file that starts inside a sector is an object
    /// (an erasure-coded fragment after its header, a record of a larger file). Zero for
    /// output objects.
    pub offset: u32,
    /// Exact length in bytes. For an output object: its capacity.
    pub length: u64,
    /// Extents in object order; together at least `length` bytes.
    pub extents: Vec<Extent>,
}

impl VirtualObject {
    /// Total bytes covered by the extents.
    pub fn extent_bytes(&self) -> u64 {
        self.extents.iter().map(Extent::bytes).sum()
    }

    /// The object of bytes `[start, start + len)` of this one: the extents that hold them,
    /// the first cut to the sector that holds `start`. `None` when the range runs past the
    /// object's length.
    pub fn range(&self, start: u64, len: u64) -> Option<VirtualObject> {
        if start.checked_add(len)? > self.length {
            return None;
        }
        if len == 0 {
            return Some(VirtualObject::default());
        }
        let first = start + u64::from(self.offset); // in the extents' bytes
        let end = first + len;
        let mut out = VirtualObject { offset: (first % SECTOR) as u32, length: len, extents: Vec::new() };
        let mut at = 0u64; // extents' bytes before the current extent
        for e in &self.extents {
            let (lo, hi) = (at, at + e.bytes());
            at = hi;
            if hi <= first - first % SECTOR {
                continue;
            }
            if lo >= end {
                break;
            }
            // Whole sectors of this extent from the one holding `first` (or its start) to
            // the one holding the last byte (or its end).
            let skip = (first.max(lo) - lo) / SECTOR;
            let last = (end.min(hi) - lo).div_ceil(SECTOR);
            let sectors = (last - skip) as u32;
            out.extents.push(match e.kind {
                ExtentKind::Data => Extent::data(e.start_sector + skip, sectors),
                ExtentKind::Zero => Extent::zero(sectors),
            });
        }
        Some(out)
    }
}

/// A compute descriptor: the whole of an EXEC request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Descriptor {
    /// Kernel to run, e.g. `crc32c`.
    pub function: String,
    /// Named, typed arguments, in order; keys are unique.
    pub args: Vec<(String, Value)>,
    /// Objects to read.
    pub inputs: Vec<VirtualObject>,
    /// Objects to write results into.
    pub outputs: Vec<VirtualObject>,
    /// Where the target writes the encoded [`crate::ExecResult`] instead of returning it
    /// inline: for transports whose vendor commands carry data in one direction only (the
    /// descriptor goes in; the completion says how many result bytes were written here, and
    /// the host reads them with ordinary Reads). Encoded as one more output object after
    /// `outputs`, with header flag bit 0 set.
    pub result: Option<VirtualObject>,
}

/// Header flag (byte 22) bit 0: the last output object is the result object.
pub const FLAG_RESULT_OBJECT: u8 = 0x01;

impl Descriptor {
    /// A descriptor for `function` over `inputs`, with no arguments or outputs.
    pub fn new(function: &str, inputs: Vec<VirtualObject>) -> Self {
        Descriptor { function: function.to_owned(), args: Vec::new(), inputs, outputs: Vec::new(), result: None }
    }

    /// Looks up an argument by key.
    pub fn arg(&self, key: &str) -> Option<&Value> {
        self.args.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Encodes to bytes. Panics if a field is beyond what the format can express (a name
    /// over 255 bytes, more than 65535 objects); `decode` enforces far tighter limits.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + 64);
        out.extend_from_slice(DESCRIPTOR_MAGIC);
        out.extend_from_slice(&DESCRIPTOR_VERSION.to_le_bytes());
        out.extend_from_slice(&(HEADER_LEN as u16).to_le_bytes());
        out.extend_from_slice(&[0u8; 4]); // total length, patched below
        out.extend_from_slice(&[0u8; 4]); // reserved
        out.push(u8::try_from(self.function.len()).expect("function name too long"));
        out.push(u8::try_from(self.args.len()).expect("too many args"));
        out.extend_from_slice(&u16::try_from(self.inputs.len()).expect("too many inputs").to_le_bytes());
        let n_out = self.outputs.len() + usize::from(self.result.is_some());
        out.extend_from_slice(&u16::try_from(n_out).expect("too many outputs").to_le_bytes());
        out.push(if self.result.is_some() { FLAG_RESULT_OBJECT } else { 0 });
        out.extend_from_slice(&[0u8; 9]); // reserved
        debug_assert_eq!(out.len(), HEADER_LEN);
        out.extend_from_slice(self.function.as_bytes());
        for (key, value) in &self.args {
            put_name(&mut out, key);
            value.encode(&mut out);
        }
        for obj in self.inputs.iter().chain(&self.outputs).chain(&self.result) {
            out.extend_from_slice(&obj.length.to_le_bytes());
            out.extend_from_slice(&len_u32(obj.extents.len()).to_le_bytes());
            out.extend_from_slice(&obj.offset.to_le_bytes());
            for e in &obj.extents {
                out.extend_from_slice(&e.start_sector.to_le_bytes());
                out.extend_from_slice(&e.sectors.to_le_bytes());
                out.push(match e.kind {
                    ExtentKind::Data => 0,
                    ExtentKind::Zero => 1,
                });
                out.extend_from_slice(&[0u8; 3]);
            }
        }
        let total = len_u32(out.len()).to_le_bytes();
        out[8..12].copy_from_slice(&total);
        out
    }

    /// Decodes and structurally validates a descriptor.
    ///
    /// Checks every rule of the format that does not depend on the namespace: sizes and
    /// counts within `limits`, reserved bytes zero, names from the allowed alphabet, unique
    /// argument keys, extents that cover each object's length, no zero extents in outputs.
    /// Namespace bounds and overlaps are checked by [`Descriptor::check_extents`].
    pub fn decode(buf: &[u8], limits: &Limits) -> Result<Descriptor, DecodeError> {
        if buf.len() > limits.max_descriptor_bytes {
            return Err(DecodeError::TooMany { field: "descriptor bytes", count: buf.len() as u64, max: limits.max_descriptor_bytes as u64 });
        }
        let mut cur = Cursor::new(buf);
        cur.magic(DESCRIPTOR_MAGIC, "compute descriptor")?;
        let version = cur.u16("version")?;
        if version != DESCRIPTOR_VERSION {
            return Err(DecodeError::BadVersion { found: version, supported: DESCRIPTOR_VERSION });
        }
        let header_len = cur.u16("header length")?;
        if usize::from(header_len) != HEADER_LEN {
            return Err(bad("header length", 6, format!("must be {HEADER_LEN}, found {header_len}")));
        }
        let total = cur.u32("total length")?;
        if total as usize != buf.len() {
            return Err(bad("total length", 8, format!("says {total} bytes but {} were given", buf.len())));
        }
        reserved(&mut cur, 4)?;
        let func_len = cur.u8("function name length")?;
        let n_args = cur.u8("argument count")?;
        let n_inputs = cur.u16("input count")?;
        let n_outputs = cur.u16("output count")?;
        let flags = cur.u8("flags")?;
        if flags & !FLAG_RESULT_OBJECT != 0 {
            return Err(bad("flags", 22, format!("unknown flag bits {flags:#04x}")));
        }
        let has_result = flags & FLAG_RESULT_OBJECT != 0;
        if has_result && n_outputs == 0 {
            return Err(bad("output count", 20, "the result-object flag needs at least one output object".into()));
        }
        reserved(&mut cur, 9)?;
        if n_args > limits.max_args {
            return Err(DecodeError::TooMany { field: "arguments", count: n_args.into(), max: limits.max_args.into() });
        }
        if n_inputs == 0 {
            return Err(bad("input count", 18, "at least one input object is required".into()));
        }
        if n_inputs > limits.max_inputs {
            return Err(DecodeError::TooMany { field: "input objects", count: n_inputs.into(), max: limits.max_inputs.into() });
        }
        if n_outputs > limits.max_outputs {
            return Err(DecodeError::TooMany { field: "output objects", count: n_outputs.into(), max: limits.max_outputs.into() });
        }
        // The function name shares the key alphabet; re-read it with its length byte.
        let mut name_buf = Vec::with_capacity(usize::from(func_len) + 1);
        name_buf.push(func_len);
        name_buf.extend_from_slice(cur.bytes(usize::from(func_len), "function name")?);
        // Offsets from the re-read map back to the message: its length byte is header byte 16,
        // its characters start at HEADER_LEN.
        let function = get_name(&mut Cursor::new(&name_buf), 32, "function name").map_err(|e| match e {
            DecodeError::BadField { field, offset: 0, detail } => DecodeError::BadField { field, offset: 16, detail },
            e => shift(e, HEADER_LEN - 1),
        })?;

        let mut args: Vec<(String, Value)> = Vec::with_capacity(usize::from(n_args));
        for _ in 0..n_args {
            let at = cur.position();
            let key = get_name(&mut cur, 32, "argument key")?;
            if args.iter().any(|(k, _)| *k == key) {
                return Err(bad("argument key", at, format!("duplicate key {key:?}")));
            }
            let value = Value::decode(&mut cur, limits.max_arg_bytes)?;
            args.push((key, value));
        }
        let mut inputs = Vec::with_capacity(usize::from(n_inputs));
        for _ in 0..n_inputs {
            inputs.push(decode_object(&mut cur, limits, false)?);
        }
        let mut outputs = Vec::with_capacity(usize::from(n_outputs));
        for _ in 0..n_outputs {
            outputs.push(decode_object(&mut cur, limits, true)?);
        }
        cur.finish()?;
        let result = if has_result { outputs.pop() } else { None };
        Ok(Descriptor { function, args, inputs, outputs, result })
    }

    /// Checks the extents against a namespace of `namespace_bytes` bytes: every data extent
    /// lies inside it, and no output extent overlaps an input or another output extent (a
    /// result must never overwrite what is being read).
    pub fn check_extents(&self, namespace_bytes: u64) -> Result<(), ExtentError> {
        let ns_sectors = namespace_bytes / SECTOR;
        let objects = self.inputs.iter().map(|o| (false, o)).chain(self.outputs.iter().chain(&self.result).map(|o| (true, o)));
        let mut spans: Vec<(u64, u64, bool, usize)> = Vec::new();
        for (index, (is_output, obj)) in objects.enumerate() {
            for e in obj.extents.iter().filter(|e| e.kind == ExtentKind::Data) {
                let end = e.start_sector.checked_add(u64::from(e.sectors));
                match end {
                    Some(end) if end <= ns_sectors => spans.push((e.start_sector, end, is_output, index)),
                    _ => {
                        return Err(ExtentError::OutOfRange { object: index, start_sector: e.start_sector, sectors: e.sectors, namespace_sectors: ns_sectors })
                    }
                }
            }
        }
        spans.sort_unstable();
        // Overlap matters only where an output is involved; track the furthest-reaching span
        // so far and whether the overlap touches an output.
        let mut reach: Option<(u64, bool, usize)> = None;
        for &(start, end, is_output, index) in &spans {
            if let Some((far, far_is_output, far_index)) = reach {
                if start < far && (is_output || far_is_output) {
                    return Err(ExtentError::OutputOverlap { object: index, other: far_index, sector: start });
                }
                if end > far {
                    reach = Some((end, is_output, index));
                }
            } else {
                reach = Some((end, is_output, index));
            }
        }
        Ok(())
    }
}

/// An extent that the namespace cannot serve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExtentError {
    /// A data extent reaches past the end of the namespace (or overflows).
    #[error("object {object}: extent at sector {start_sector} (+{sectors}) lies outside the namespace of {namespace_sectors} sectors")]
    OutOfRange {
        /// Index of the object (inputs first, then outputs).
        object: usize,
        /// The extent's first sector.
        start_sector: u64,
        /// Its length in sectors.
        sectors: u32,
        /// Namespace size in sectors.
        namespace_sectors: u64,
    },
    /// An output extent overlaps another object's extent.
    #[error("object {object} overlaps object {other} at sector {sector}: outputs may not overlap inputs or each other")]
    OutputOverlap {
        /// Index of one object (inputs first, then outputs).
        object: usize,
        /// Index of the other.
        other: usize,
        /// First overlapping sector.
        sector: u64,
    },
}

fn decode_object(cur: &mut Cursor<'_>, limits: &Limits, is_output: bool) -> Result<VirtualObject, DecodeError> {
    let at = cur.position();
    let length = cur.u64("object length")?;
    if length > limits.max_object_len {
        return Err(DecodeError::TooMany { field: "object length bytes", count: length, max: limits.max_object_len });
    }
    let n = cur.u32("extent count")?;
    let offset_at = cur.position();
    let offset = cur.u32("object offset")?;
    if u64::from(offset) >= SECTOR || (is_output && offset != 0) {
        let why = if is_output { "must be 0 for an output object".to_string() } else { format!("must be less than {SECTOR}, found {offset}") };
        return Err(bad("object offset", offset_at, why));
    }
    if n > limits.max_extents_per_object {
        return Err(DecodeError::TooMany { field: "extents in one object", count: n.into(), max: limits.max_extents_per_object.into() });
    }
    // Refuse a count the remaining bytes cannot hold before allocating for it.
    if (n as usize).saturating_mul(EXTENT_LEN) > cur.remaining() {
        return Err(DecodeError::Truncated {
            field: "extent list",
            offset: cur.position(),
            need: (n as usize).saturating_mul(EXTENT_LEN),
            have: cur.remaining(),
        });
    }
    let mut extents = Vec::with_capacity(n as usize);
    let mut covered: u64 = 0;
    for _ in 0..n {
        let e_at = cur.position();
        let start_sector = cur.u64("extent start")?;
        let sectors = cur.u32("extent sectors")?;
        let kind = match cur.u8("extent kind")? {
            0 => ExtentKind::Data,
            1 if !is_output => ExtentKind::Zero,
            1 => return Err(bad("extent kind", e_at + 12, "output objects cannot have zero extents".into())),
            k => return Err(bad("extent kind", e_at + 12, format!("must be 0 (data) or 1 (zero), found {k}"))),
        };
        reserved(cur, 3)?;
        if sectors == 0 {
            return Err(bad("extent sectors", e_at + 8, "must be at least 1".into()));
        }
        if kind == ExtentKind::Zero && start_sector != 0 {
            return Err(bad("extent start", e_at, "must be 0 for a zero extent".into()));
        }
        covered = covered.saturating_add(u64::from(sectors) * SECTOR);
        extents.push(Extent { kind, start_sector, sectors });
    }
    if covered < length + u64::from(offset) {
        let from = if offset == 0 { String::new() } else { format!(" from offset {offset}") };
        return Err(bad("object length", at, format!("{length} bytes{from} but extents cover only {covered}")));
    }
    Ok(VirtualObject { offset, length, extents })
}

fn reserved(cur: &mut Cursor<'_>, n: usize) -> Result<(), DecodeError> {
    let at = cur.position();
    if cur.bytes(n, "reserved")?.iter().any(|b| *b != 0) {
        return Err(bad("reserved bytes", at, "must be zero".into()));
    }
    Ok(())
}

fn bad(field: &'static str, offset: usize, detail: String) -> DecodeError {
    DecodeError::BadField { field, offset, detail }
}

fn shift(e: DecodeError, by: usize) -> DecodeError {
    match e {
        DecodeError::BadField { field, offset, detail } => DecodeError::BadField { field, offset: offset + by, detail },
        other => other,
    }
}
