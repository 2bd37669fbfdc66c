// SPDX-License-Identifier: Apache-2.0
//! The `csv-select-piece` kernel: `csv-select` over pieces of one larger CSV object (the
//! data fragments of an erasure-coded object, each where it is stored), so that a host can
//! join the pieces' results into `csv-select`'s output for the whole object.
//!
//! A piece starts and ends anywhere, even inside a quoted field. The host first asks each
//! piece for its quote count (`scan=true`; record `quotes`, and `last`, its last byte or 256
//! when empty): with RFC 4180 quoting (a `"` opens a quoted field only at the field's start,
//! `""` inside it stands for one), the parity of the quotes before a byte says whether it is
//! inside quotes. Then each piece runs with its start state in `starts`, one letter per
//! input: `q` inside a quoted field, `c` right after the quote that closed one, `f` at the
//! start of a field, `m` inside an unquoted field. The piece's records are cut at every `\n` or `\r` outside quotes (a CRLF cut by an
//! edge leaves a blank record, which CSV skips); the bytes up to and including the first cut
//! are `head`, those after the last are `tail`, and the records between are selected with
//! `header` (the object's header record, CSV text), `where` and `columns` as `csv-select`
//! does. `rows` holds the selected records projected, each ending in `\n`; `header_out` the
//! projected header. With `whole=true` the input is complete records: no head or tail.
//!
//! A `"` inside an unquoted field (which RFC 4180 does not allow and which would make the
//! parity wrong) fails the command, naming its offset, rather than give a wrong answer.
//!
//! Record: `[("rows_in", U64), ("rows_out", U64), ("rows", Bytes), ("head", Bytes),
//! ("tail", Bytes), ("header_out", Bytes), ("cut", Bool)]` (`cut`: whether the piece has a
//! record cut at all; without one `head` is the whole piece), or `[("quotes", U64), ("last", U64)]` with
//! `scan`.

use crate::csv_select::{column_index, csv_error, selection, Predicate};
use crate::{check_shape, Args, InputStream, Job, Kernel, KernelError, OutputSink, Param, ParamType, Record, Value};
use csv::{ByteRecord, QuoteStyle, Terminator};

/// The `csv-select-piece` kernel.
pub(crate) struct CsvPiece;

static PARAMS: [Param; 6] = [
    Param { key: "header", ty: ParamType::Str, required: false, doc: "the object's header record, as CSV text (required unless scan)" },
    Param { key: "where", ty: ParamType::Str, required: false, doc: "as csv-select's" },
    Param { key: "columns", ty: ParamType::Str, required: false, doc: "as csv-select's" },
    Param {
        key: "starts",
        ty: ParamType::Str,
        required: false,
        doc: "each input's start state: q (in quotes), c (after a closing quote), f (field start), m (mid field); default f",
    },
    Param { key: "scan", ty: ParamType::Bool, required: false, doc: "only count each input's quotes (default false)" },
    Param { key: "whole", ty: ParamType::Bool, required: false, doc: "the inputs are complete records, without head or tail (default false)" },
];

/// Largest piece (they are buffered whole).
const MAX_PIECE: u64 = 256 << 20;

impl Kernel for CsvPiece {
    fn name(&self) -> &'static str {
        "csv-select-piece"
    }
    fn summary(&self) -> &'static str {
        "csv-select over pieces of a larger CSV object, with what a host needs to join them"
    }
    fn params(&self) -> &'static [Param] {
        &PARAMS
    }
    fn prepare(&self, args: &Args<'_>) -> Result<Box<dyn Job>, KernelError> {
        args.check(self.params())?;
        let bad = |key: &str, detail: String| KernelError::BadArgument { key: key.into(), detail };
        if args.bool_or("scan", false) {
            return Ok(Box::new(ScanJob));
        }
        let (predicates, columns) = selection(args)?;
        let text = args.str("header").ok_or_else(|| bad("header", "is required unless scan=true".into()))?;
        let mut reader = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(text.as_bytes());
        let mut header = ByteRecord::new();
        if !reader.read_byte_record(&mut header).map_err(csv_error)? || header.is_empty() {
            return Err(bad("header", format!("{text:?} holds no CSV record")));
        }
        let tests = predicates.into_iter().map(|p| Ok((column_index(&header, p.column(), "where")?, p))).collect::<Result<Vec<_>, KernelError>>()?;
        let projection = match &columns {
            Some(names) => names.iter().map(|n| column_index(&header, n, "columns")).collect::<Result<_, _>>()?,
            None => (0..header.len()).collect(),
        };
        let starts = args.str("starts").unwrap_or_default().to_string();
        if let Some(c) = starts.chars().find(|c| !matches!(c, 'q' | 'c' | 'f' | 'm')) {
            return Err(bad("starts", format!("{c:?} is not q, c, f or m")));
        }
        Ok(Box::new(PieceJob { header, tests, projection, starts, whole: args.bool_or("whole", false) }))
    }
}

struct ScanJob;

impl Job for ScanJob {
    fn run(self: Box<Self>, inputs: &mut [&mut dyn InputStream], outputs: &mut [&mut dyn OutputSink]) -> Result<Vec<Record>, KernelError> {
        check_shape("csv-select-piece", inputs, outputs, None, 0)?;
        let mut records = Vec::with_capacity(inputs.len());
        for input in inputs.iter_mut() {
            let (mut quotes, mut last) = (0u64, 256u64);
            while let Some(chunk) = input.next_chunk()? {
                quotes += memchr::memchr_iter(b'"', chunk).count() as u64;
                last = chunk.last().map_or(last, |b| u64::from(*b));
            }
            records.push(vec![("quotes".into(), Value::U64(quotes)), ("last".into(), Value::U64(last))]);
        }
        Ok(records)
    }
}

struct PieceJob {
    header: ByteRecord,
    tests: Vec<(usize, Predicate)>,
    projection: Vec<usize>,
    starts: String,
    whole: bool,
}

/// Lexer state at a byte.
#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Quoted,
    /// Right after a quote that closed a quoted field (or the first of `""`).
    AfterQuote,
    FieldStart,
    MidField,
}

/// Offsets of the first and last record cuts (`\n`/`\r` outside quotes) of `piece`.
fn cuts(piece: &[u8], mut state: State) -> Result<Option<(usize, usize)>, KernelError> {
    let (mut first, mut last) = (None, None);
    for (i, &b) in piece.iter().enumerate() {
        state = match (state, b) {
            (State::Quoted, b'"') => State::AfterQuote,
            (State::Quoted, _) => State::Quoted,
            (State::FieldStart | State::AfterQuote, b'"') => State::Quoted, // opens, or `""`
            (State::MidField, b'"') => {
                return Err(KernelError::Failed(format!("a quote inside an unquoted field at byte {i} of the piece (not RFC 4180 quoting)")));
            }
            (_, b'\n' | b'\r') => {
                first.get_or_insert(i);
                last = Some(i);
                State::FieldStart
            }
            (_, b',') => State::FieldStart,
            _ => State::MidField,
        };
    }
    Ok(first.zip(last))
}

impl Job for PieceJob {
    fn run(self: Box<Self>, inputs: &mut [&mut dyn InputStream], outputs: &mut [&mut dyn OutputSink]) -> Result<Vec<Record>, KernelError> {
        check_shape("csv-select-piece", inputs, outputs, None, 0)?;
        if !self.starts.is_empty() && self.starts.len() != inputs.len() {
            return Err(KernelError::BadArgument { key: "starts".into(), detail: format!("{} letters for {} inputs", self.starts.len(), inputs.len()) });
        }
        let header_out = self.emit(std::iter::once(&self.header))?;
        let mut records = Vec::with_capacity(inputs.len());
        for (n, input) in inputs.iter_mut().enumerate() {
            if input.len() > MAX_PIECE {
                return Err(KernelError::Failed(format!("a piece of {} bytes is larger than {MAX_PIECE}", input.len())));
            }
            let mut piece = Vec::with_capacity(input.len() as usize);
            while let Some(chunk) = input.next_chunk()? {
                piece.extend_from_slice(chunk);
            }
            let state = match self.starts.as_bytes().get(n) {
                Some(b'q') => State::Quoted,
                Some(b'c') => State::AfterQuote,
                Some(b'm') => State::MidField,
                _ => State::FieldStart,
            };
            let (head, body, tail, cut) = if self.whole {
                (&[][..], &piece[..], &[][..], false)
            } else {
                match cuts(&piece, state)? {
                    Some((a, b)) => (&piece[..=a], &piece[a + 1..=b], &piece[b + 1..], true),
                    None => (&piece[..], &[][..], &[][..], false),
                }
            };
            let (rows, rows_in, rows_out) = self.select(body)?;
            records.push(vec![
                ("rows_in".into(), Value::U64(rows_in)),
                ("rows_out".into(), Value::U64(rows_out)),
                ("rows".into(), Value::Bytes(rows)),
                ("head".into(), Value::Bytes(head.to_vec())),
                ("tail".into(), Value::Bytes(tail.to_vec())),
                ("header_out".into(), Value::Bytes(header_out.clone())),
                ("cut".into(), Value::Bool(cut)),
            ]);
        }
        Ok(records)
    }
}

impl PieceJob {
    /// The selected records of `body` (complete records), projected: (bytes, in, out).
    fn select(&self, body: &[u8]) -> Result<(Vec<u8>, u64, u64), KernelError> {
        let mut reader = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(body);
        let (mut rows_in, mut kept) = (0u64, Vec::new());
        let mut row = ByteRecord::new();
        while reader.read_byte_record(&mut row).map_err(csv_error)? {
            rows_in += 1;
            if row.len() != self.header.len() {
                return Err(KernelError::Failed(format!("a CSV record has {} fields but the header has {}", row.len(), self.header.len())));
            }
            if self.tests.iter().all(|(i, p)| p.holds(&row[*i])) {
                kept.push(row.clone());
            }
        }
        let rows_out = kept.len() as u64;
        Ok((self.emit(kept.iter())?, rows_in, rows_out))
    }

    /// `records` projected and written as `csv-select` writes them.
    fn emit<'r>(&self, records: impl Iterator<Item = &'r ByteRecord>) -> Result<Vec<u8>, KernelError> {
        let mut writer = csv::WriterBuilder::new().terminator(Terminator::Any(b'\n')).quote_style(QuoteStyle::Necessary).from_writer(Vec::new());
        let mut out = ByteRecord::new();
        for rec in records {
            out.clear();
            for &i in &self.projection {
                out.push_field(&rec[i]);
            }
            writer.write_byte_record(&out).map_err(csv_error)?;
        }
        writer.into_inner().map_err(|e| KernelError::Failed(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{run_kernel, s, u64_field};
    use proptest::prelude::*;

    fn bytes(r: &Record, k: &str) -> Vec<u8> {
        match &r.iter().find(|(key, _)| key == k).unwrap().1 {
            Value::Bytes(b) => b.clone(),
            other => panic!("{k}: {other:?}"),
        }
    }

    /// csv-select over the whole object.
    fn whole(args: &[(String, Value)], data: &[u8]) -> Result<(Vec<u8>, u64, u64), KernelError> {
        let cap = 2 * data.len() as u64 + 4096;
        let (records, out) = run_kernel("csv-select", args, &[data], 7, Some(cap))?;
        Ok((out, u64_field(&records[0], "rows_in"), u64_field(&records[0], "rows_out")))
    }

    /// Joins the pieces of `data` cut at `cuts` as the host does.
    fn joined(args: &[(String, Value)], data: &[u8], cuts: &[usize]) -> Result<(Vec<u8>, u64, u64), KernelError> {
        // The header: the first non-blank record.
        let mut reader = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(data);
        let mut header = ByteRecord::new();
        if !reader.read_byte_record(&mut header).map_err(csv_error)? {
            return Ok((Vec::new(), 0, 0));
        }
        let end = reader.position().byte() as usize;
        let text = String::from_utf8(data[..end].to_vec()).unwrap();
        let mut pieces = Vec::new();
        let mut at = end;
        for &c in cuts.iter().filter(|c| **c > end).chain([&data.len()]) {
            pieces.push(&data[at..c]);
            at = c;
        }
        let mut base = args.to_vec();
        base.push(s("header", text.trim_end_matches(['\n', '\r'])));
        let mut scan = base.clone();
        scan.push(("scan".into(), Value::Bool(true)));
        let (scanned, _) = run_kernel("csv-select-piece", &scan, &pieces, 5, None)?;
        let (mut starts, mut quotes, mut prev) = (String::new(), 0u64, u64::from(b'\n'));
        for r in &scanned {
            starts.push(if quotes % 2 == 1 {
                'q'
            } else if prev == u64::from(b'"') {
                'c'
            } else if [b',', b'\n', b'\r'].iter().any(|b| u64::from(*b) == prev) {
                'f'
            } else {
                'm'
            });
            quotes += u64_field(r, "quotes");
            let last = u64_field(r, "last");
            if last != 256 {
                prev = last;
            }
        }
        let mut run = base.clone();
        run.push(s("starts", &starts));
        let (records, _) = run_kernel("csv-select-piece", &run, &pieces, 5, None)?;
        let mut out = bytes(&records[0], "header_out");
        let (mut rows_in, mut rows_out) = (0, 0);
        let mut carry: Vec<u8> = Vec::new();
        let mut whole_args = base.clone();
        whole_args.push(("whole".into(), Value::Bool(true)));
        let finish = |rec: &[u8], out: &mut Vec<u8>, rows_in: &mut u64, rows_out: &mut u64| -> Result<(), KernelError> {
            let (r, _) = run_kernel("csv-select-piece", &whole_args, &[rec], usize::MAX, None)?;
            out.extend(bytes(&r[0], "rows"));
            *rows_in += u64_field(&r[0], "rows_in");
            *rows_out += u64_field(&r[0], "rows_out");
            Ok(())
        };
        for r in &records {
            carry.extend(bytes(r, "head"));
            if matches!(r.iter().find(|(k, _)| k == "cut"), Some((_, Value::Bool(true)))) {
                finish(&std::mem::take(&mut carry), &mut out, &mut rows_in, &mut rows_out)?;
                out.extend(bytes(r, "rows"));
                rows_in += u64_field(r, "rows_in");
                rows_out += u64_field(r, "rows_out");
                carry = bytes(r, "tail");
            }
        }
        if !carry.is_empty() {
            finish(&carry, &mut out, &mut rows_in, &mut rows_out)?;
        }
        Ok((out, rows_in, rows_out))
    }

    proptest! {
        #[test]
        fn pieces_joined_select_like_the_whole(
            fields in proptest::collection::vec(prop_oneof![Just("a"), Just("1"), Just("22"), Just("\"x,\ny\""), Just("\"q\"\"r\""), Just(""), Just("\u{e9}")], 6..60),
            seps in proptest::collection::vec(prop_oneof![Just("\n"), Just("\r\n"), Just("\r")], 20),
            cuts in proptest::collection::vec(0usize..400, 0..8),
            filter in any::<bool>(),
        ) {
            let mut data = b"k,v\n".to_vec();
            for (i, pair) in fields.chunks(2).enumerate() {
                data.extend_from_slice(pair[0].as_bytes());
                data.push(b',');
                data.extend_from_slice(pair.get(1).unwrap_or(&"z").as_bytes());
                data.extend_from_slice(seps[i % seps.len()].as_bytes());
            }
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(data.len())).collect();
            cuts.sort_unstable();
            cuts.dedup();
            let args = if filter { vec![s("where", "v ~ y"), s("columns", "v,k")] } else { vec![] };
            prop_assert_eq!(joined(&args, &data, &cuts).unwrap(), whole(&args, &data).unwrap());
        }
    }

    #[test]
    fn quotes_inside_unquoted_fields_are_refused() {
        let args = [s("header", "a,b"), s("starts", "f")];
        let r = run_kernel("csv-select-piece", &args, &[b"x,ab\"c\n"], 3, None);
        assert!(matches!(r, Err(KernelError::Failed(m)) if m.contains("not RFC 4180")));
        let r = run_kernel("csv-select-piece", &[s("header", "a,b"), s("starts", "fx")], &[b"x", b"y"], 3, None);
        assert!(matches!(r, Err(KernelError::BadArgument { .. })));
    }
}
