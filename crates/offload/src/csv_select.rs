// SPDX-License-Identifier: Apache-2.0
//! The `csv-select` kernel: filters the rows and projects the columns of a CSV object.
//!
//! Selecting where the data lives returns only the rows and columns wanted. Exactly one
//! input and one output object.
//!
//! **Arguments.**
//! * `where` (optional): predicates joined by `;`, all of which must hold. Each is
//!   `COLUMN OP VALUE`, OP one of `=` `!=` `<` `<=` `>` `>=` `~` (substring). The operator is
//!   the first of the characters `= ! < > ~` in the predicate, so a column name can't contain
//!   them; a value can't contain `;`. Column and value are trimmed of whitespace; the column
//!   must not be empty (the value may be). If OP is not `~` and VALUE parses as an `f64`
//!   (Rust's `str::parse`: decimal and exponent forms, optional sign, `inf`, `infinity` and
//!   `nan` in any case), the comparison is numeric: the field, trimmed of ASCII whitespace,
//!   must parse the same way or the row does not match, and comparisons follow IEEE 754 (a
//!   NaN is unequal to everything). Otherwise fields are compared with VALUE bytewise
//!   (unsigned, a prefix sorts first), and `~` tests whether the field contains VALUE.
//! * `columns` (optional): comma-separated column names, trimmed, to output in that order
//!   (default: all columns in input order). A name may repeat.
//!
//! A malformed predicate or an empty column list or name is refused before any data is read;
//! a column that the header lacks is refused (`BadArgument`, listing the header) once the
//! header is read. A name that occurs twice in the header refers to its first occurrence.
//!
//! **Input.** The first record is the header. Fields are separated by `,`, records by `\n`,
//! `\r\n` or a lone `\r`; a field that starts with `"` is quoted and `""` inside it stands for
//! one `"`. Blank lines are skipped (Python's `csv.reader` yields `[]` for them). Fields are
//! bytes; UTF-8 is not required. A record whose field count differs from the header's is an
//! error (`Failed`, naming the record and line). An empty input gives an empty output.
//!
//! **Output.** The projected header, then each matching row projected. Fields are joined by
//! `,` and every record ends with `\n`. A field is quoted, with each `"` doubled, exactly when
//! it contains `,`, `"`, `\r` or `\n`, or when it is empty and the record's only field
//! (written `""`). Python's `csv.writer(f, lineterminator="\n")` (QUOTE_MINIMAL) writes the
//! same bytes except that Python 3.11 leaves a field containing `\r` (but none of `,` `"`
//! `\n`) unquoted, so an oracle should apply the rule above directly.
//!
//! Record: `[("output_length", U64), ("rows_in", U64), ("rows_out", U64)]`, rows counted
//! without the header. The output needs at most `2 * input_len + 4096` bytes.
//!
//! The input is parsed by `csv::Reader` through an adapter that copies one chunk at a time,
//! and the output is written by `csv::Writer` (which buffers 8 KiB) straight to the sink.

use crate::stream::{unwrap_io, ChunkReader, SinkWriter};
use crate::{check_shape, Args, InputStream, Job, Kernel, KernelError, OutputSink, Param, ParamType, Record, Value};
use csv::{ByteRecord, QuoteStyle, Terminator};
use std::cmp::Ordering;

/// The `csv-select` kernel.
pub(crate) struct CsvSelect;

static PARAMS: [Param; 2] = [
    Param { key: "where", ty: ParamType::Str, required: false, doc: "predicates `COLUMN OP VALUE` joined by ';' (OP: = != < <= > >= ~); default: every row" },
    Param { key: "columns", ty: ParamType::Str, required: false, doc: "comma-separated columns to output, in order (default: all)" },
];

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Contains,
}

impl Op {
    fn holds(self, ord: Ordering) -> bool {
        match self {
            Op::Eq => ord == Ordering::Equal,
            Op::Ne => ord != Ordering::Equal,
            Op::Lt => ord == Ordering::Less,
            Op::Le => ord != Ordering::Greater,
            Op::Gt => ord == Ordering::Greater,
            Op::Ge => ord != Ordering::Less,
            Op::Contains => false,
        }
    }
}

/// One `COLUMN OP VALUE` test.
#[derive(Debug, Clone)]
pub(crate) struct Predicate {
    column: String,
    op: Op,
    value: String,
    /// VALUE as a number, when the comparison is numeric.
    number: Option<f64>,
}

impl Predicate {
    /// The column it tests.
    pub(crate) fn column(&self) -> &str {
        &self.column
    }

    pub(crate) fn parse(text: &str) -> Result<Predicate, KernelError> {
        let bad = |detail: &str| KernelError::BadArgument { key: "where".into(), detail: format!("{detail} in predicate {text:?}") };
        let at = text.find(['=', '!', '<', '>', '~']).ok_or_else(|| bad("no operator (= != < <= > >= ~)"))?;
        let next_is_eq = text.as_bytes().get(at + 1) == Some(&b'=');
        let (op, len) = match (text.as_bytes()[at], next_is_eq) {
            (b'=', _) => (Op::Eq, 1),
            (b'!', true) => (Op::Ne, 2),
            (b'<', true) => (Op::Le, 2),
            (b'<', false) => (Op::Lt, 1),
            (b'>', true) => (Op::Ge, 2),
            (b'>', false) => (Op::Gt, 1),
            (b'~', _) => (Op::Contains, 1),
            _ => return Err(bad("'!' must be followed by '='")),
        };
        let column = text[..at].trim();
        if column.is_empty() {
            return Err(bad("no column name"));
        }
        let value = text[at + len..].trim();
        let number = if op == Op::Contains { None } else { value.parse::<f64>().ok() };
        Ok(Predicate { column: column.into(), op, value: value.into(), number })
    }

    pub(crate) fn holds(&self, field: &[u8]) -> bool {
        if self.op == Op::Contains {
            return memchr::memmem::find(field, self.value.as_bytes()).is_some();
        }
        match self.number {
            Some(v) => {
                let Some(f) = std::str::from_utf8(field.trim_ascii()).ok().and_then(|s| s.parse::<f64>().ok()) else {
                    return false;
                };
                match self.op {
                    Op::Eq => f == v,
                    Op::Ne => f != v,
                    Op::Lt => f < v,
                    Op::Le => f <= v,
                    Op::Gt => f > v,
                    Op::Ge => f >= v,
                    Op::Contains => false,
                }
            }
            None => self.op.holds(field.cmp(self.value.as_bytes())),
        }
    }
}

impl Kernel for CsvSelect {
    fn name(&self) -> &'static str {
        "csv-select"
    }
    fn summary(&self) -> &'static str {
        "filter the rows (where) and pick the columns (columns) of a CSV file with a header"
    }
    fn params(&self) -> &'static [Param] {
        &PARAMS
    }
    fn max_inputs(&self) -> usize {
        1
    }
    fn output_count(&self) -> usize {
        1
    }
    /// Quoting at most doubles a field, so one copy of each input byte needs at most
    /// `2 * input + 4096`; a column listed `m` times in `columns` is copied `m` times.
    fn output_capacity(&self, args: &Args<'_>, input_len: u64) -> u64 {
        let copies = args.str("columns").map_or(1, |c| {
            let names: Vec<&str> = c.split(',').map(str::trim).collect();
            names.iter().map(|n| names.iter().filter(|m| *m == n).count()).max().unwrap_or(1)
        });
        input_len.saturating_mul(2).saturating_add(4096).saturating_mul(copies as u64)
    }
    fn prepare(&self, args: &Args<'_>) -> Result<Box<dyn Job>, KernelError> {
        args.check(self.params())?;
        let (predicates, columns) = selection(args)?;
        Ok(Box::new(CsvSelectJob { predicates, columns }))
    }
}

/// The `where` predicates and `columns` of a selection, checked.
pub(crate) fn selection(args: &Args<'_>) -> Result<(Vec<Predicate>, Option<Vec<String>>), KernelError> {
    let predicates = match args.str("where") {
        Some(w) => w.split(';').map(Predicate::parse).collect::<Result<Vec<_>, _>>()?,
        None => Vec::new(),
    };
    let columns = match args.str("columns") {
        Some(c) => {
            let names: Vec<String> = c.split(',').map(|n| n.trim().to_string()).collect();
            if names.iter().any(String::is_empty) {
                return Err(KernelError::BadArgument {
                    key: "columns".into(),
                    detail: format!("{c:?} names an empty column; give comma-separated column names"),
                });
            }
            Some(names)
        }
        None => None,
    };
    Ok((predicates, columns))
}

/// A prepared `csv-select` run.
struct CsvSelectJob {
    predicates: Vec<Predicate>,
    columns: Option<Vec<String>>,
}

/// Turns a csv crate error into a kernel error, recovering sink errors.
pub(crate) fn csv_error(e: csv::Error) -> KernelError {
    if !e.is_io_error() {
        return KernelError::Failed(format!("malformed CSV: {e}"));
    }
    match e.into_kind() {
        csv::ErrorKind::Io(io) => unwrap_io(io),
        other => KernelError::Failed(format!("malformed CSV: {other:?}")),
    }
}

/// The index of column `name` in `header`.
pub(crate) fn column_index(header: &ByteRecord, name: &str, key: &str) -> Result<usize, KernelError> {
    header.iter().position(|h| h == name.as_bytes()).ok_or_else(|| {
        let names: Vec<String> = header.iter().map(|h| format!("{:?}", String::from_utf8_lossy(h))).collect();
        KernelError::BadArgument { key: key.into(), detail: format!("no column {name:?}; the header has: {}", names.join(", ")) }
    })
}

impl Job for CsvSelectJob {
    fn run(self: Box<Self>, inputs: &mut [&mut dyn InputStream], outputs: &mut [&mut dyn OutputSink]) -> Result<Vec<Record>, KernelError> {
        check_shape("csv-select", inputs, outputs, Some(1), 1)?;
        let sink = &mut *outputs[0];
        let mut reader = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(ChunkReader::new(&mut *inputs[0]));
        let mut writer =
            csv::WriterBuilder::new().terminator(Terminator::Any(b'\n')).quote_style(QuoteStyle::Necessary).from_writer(SinkWriter::new(&mut *sink));

        let (mut rows_in, mut rows_out) = (0u64, 0u64);
        let mut header = ByteRecord::new();
        if reader.read_byte_record(&mut header).map_err(csv_error)? {
            let tests: Vec<(usize, &Predicate)> =
                self.predicates.iter().map(|p| Ok((column_index(&header, &p.column, "where")?, p))).collect::<Result<_, KernelError>>()?;
            let projection: Vec<usize> = match &self.columns {
                Some(names) => names.iter().map(|n| column_index(&header, n, "columns")).collect::<Result<_, _>>()?,
                None => (0..header.len()).collect(),
            };
            let mut row = ByteRecord::new();
            let mut out = ByteRecord::new();
            let mut emit = |rec: &ByteRecord, out: &mut ByteRecord| {
                out.clear();
                for &i in &projection {
                    out.push_field(&rec[i]);
                }
                writer.write_byte_record(out).map_err(csv_error)
            };
            emit(&header, &mut out)?;
            while reader.read_byte_record(&mut row).map_err(csv_error)? {
                rows_in += 1;
                if row.len() != header.len() {
                    let line = row.position().map_or(0, |p| p.line());
                    return Err(KernelError::Failed(format!("CSV row {rows_in} (line {line}) has {} fields but the header has {}", row.len(), header.len())));
                }
                if tests.iter().all(|(i, p)| p.holds(&row[*i])) {
                    rows_out += 1;
                    emit(&row, &mut out)?;
                }
            }
        }
        writer.into_inner().map_err(|e| unwrap_io(e.into_error()))?;
        let output_length = sink.finish()?;
        Ok(vec![vec![("output_length".into(), Value::U64(output_length)), ("rows_in".into(), Value::U64(rows_in)), ("rows_out".into(), Value::U64(rows_out))]])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{random_bytes, run_kernel, s, u64_field, CHUNKS};
    use proptest::prelude::*;

    /// Runs csv-select at every chunk size (all must agree); returns output, rows_in, rows_out.
    fn select(args: &[(String, Value)], data: &[u8]) -> Result<(String, u64, u64), KernelError> {
        let cap = CsvSelect.output_capacity(&Args::new(&[]), data.len() as u64);
        let mut first = None;
        for &c in &CHUNKS {
            let (records, out) = run_kernel("csv-select", args, &[data], c, Some(cap))?;
            let r = &records[0];
            assert_eq!(u64_field(r, "output_length"), out.len() as u64);
            let got = (String::from_utf8(out).unwrap(), u64_field(r, "rows_in"), u64_field(r, "rows_out"));
            match &first {
                None => first = Some(got),
                Some(f) => assert_eq!(&got, f, "chunk {c}"),
            }
        }
        Ok(first.unwrap())
    }

    const PEOPLE: &[u8] = b"name,age,city\nalice,30,Paris\nbob,25,\"New York, NY\"\ncarol,35,Berlin\ndave,x,Paris\n";

    #[test]
    fn filters_and_projects() {
        let r = select(&[s("where", "age >= 30"), s("columns", "name, city")], PEOPLE).unwrap();
        assert_eq!(r, ("name,city\nalice,Paris\ncarol,Berlin\n".into(), 4, 2));
        let r = select(&[s("where", "city ~ York")], PEOPLE).unwrap();
        assert_eq!(r, ("name,age,city\nbob,25,\"New York, NY\"\n".into(), 4, 1));
        let r = select(&[s("where", "city = Paris; name != alice")], PEOPLE).unwrap();
        assert_eq!(r.0, "name,age,city\ndave,x,Paris\n");
        // Numeric: "x" does not parse, so `age != 30` alone skips dave as well.
        assert_eq!(select(&[s("where", "age != 30")], PEOPLE).unwrap().2, 2);
        // String comparison when the value is not a number.
        assert_eq!(select(&[s("where", "name < c"), s("columns", "name")], PEOPLE).unwrap().0, "name\nalice\nbob\n");
        assert_eq!(select(&[s("where", "age<=9")], PEOPLE).unwrap().2, 0);
        assert_eq!(select(&[], PEOPLE).unwrap(), (String::from_utf8(PEOPLE.to_vec()).unwrap(), 4, 4));
        assert_eq!(select(&[s("columns", "city,name,city")], b"name,city\na,b").unwrap().0, "city,name,city\nb,a,b\n");
    }

    #[test]
    fn numeric_comparisons() {
        let data = b"v\n10\n9\n 1e1 \n-3.5\nnan\nabc\n";
        assert_eq!(select(&[s("where", "v = 10")], data).unwrap().0, "v\n10\n 1e1 \n");
        assert_eq!(select(&[s("where", "v > 9.5")], data).unwrap().2, 2);
        assert_eq!(select(&[s("where", "v < 0")], data).unwrap().0, "v\n-3.5\n");
        // Bytewise, "10" < "9" as strings.
        assert_eq!(select(&[s("where", "v ~ 1")], data).unwrap().2, 2);
        assert_eq!(select(&[s("where", "v >= a")], data).unwrap().0, "v\nnan\nabc\n");
    }

    #[test]
    fn quoting_and_line_ends() {
        let data = b"a,b\r\n\"x,1\",\"say \"\"hi\"\"\"\r\n\r\n\"multi\nline\",\"cr\rhere\"\r\n\"\",plain";
        let (out, rows_in, rows_out) = select(&[], data).unwrap();
        assert_eq!(out, "a,b\n\"x,1\",\"say \"\"hi\"\"\"\n\"multi\nline\",\"cr\rhere\"\n,plain\n");
        assert_eq!((rows_in, rows_out), (3, 3));
        // An empty field alone on a record is written quoted.
        assert_eq!(select(&[s("columns", "a")], data).unwrap().0, "a\n\"x,1\"\n\"multi\nline\"\n\"\"\n");
        // Non-UTF-8 bytes pass through.
        let (_, out) = run_kernel("csv-select", &[s("where", "h ~ \u{fe}")], &[b"h\n\xff\xfe\n"], 1, Some(5000)).unwrap();
        assert_eq!(out, b"h\n");
        let (_, out) = run_kernel("csv-select", &[], &[b"h\n\xff\xfe\n"], 1, Some(5000)).unwrap();
        assert_eq!(out, b"h\n\xff\xfe\n");
    }

    #[test]
    fn empty_and_header_only() {
        assert_eq!(select(&[s("columns", "nope")], b"").unwrap(), (String::new(), 0, 0));
        assert_eq!(select(&[s("where", "a=1")], b"a,b").unwrap(), ("a,b\n".into(), 0, 0));
    }

    #[test]
    fn bad_arguments() {
        let bad_arg = |args: &[(String, Value)]| {
            let e = run_kernel("csv-select", args, &[PEOPLE], 7, Some(10_000)).unwrap_err();
            assert!(matches!(e, KernelError::BadArgument { .. }), "{args:?}: {e:?}");
            e.to_string()
        };
        for w in ["age", "= 3", "age ! 3", "age=3;", "age=3;;name=x"] {
            bad_arg(&[s("where", w)]);
        }
        for c in ["", " ", "name,,city", "name,"] {
            bad_arg(&[s("columns", c)]);
        }
        let msg = bad_arg(&[s("columns", "name,zip")]);
        assert!(msg.contains("zip") && msg.contains("\"city\""), "{msg}");
        assert!(bad_arg(&[s("where", "zip > 3")]).contains("zip"));
        bad_arg(&[s("select", "name")]);
        // Refused in prepare, before any data is read.
        let registry = crate::Registry::standard();
        let k = registry.get("csv-select").unwrap();
        assert!(k.prepare(&Args::new(&[s("where", "nonsense")])).is_err());
    }

    #[test]
    fn ragged_rows_fail() {
        let e = run_kernel("csv-select", &[], &[b"a,b\n1,2\n3\n"], 3, Some(10_000)).unwrap_err();
        match e {
            KernelError::Failed(m) => assert!(m.contains("row 2") && m.contains("line 3"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn output_too_small_and_bad_shape() {
        let e = run_kernel("csv-select", &[], &[PEOPLE], 7, Some(20)).unwrap_err();
        assert!(matches!(e, KernelError::OutputTooSmall { capacity: 20, .. }), "{e:?}");
        let big = random_bytes(1, 100_000, b"ab,\n");
        let mut data = b"x\n".to_vec();
        data.extend(big.iter().map(|&b| if b == b',' { b'"' } else { b }));
        let e = run_kernel("csv-select", &[], &[&data], 4096, Some(5000)).unwrap_err();
        assert!(matches!(e, KernelError::OutputTooSmall { .. }), "{e:?}");
        assert!(matches!(run_kernel("csv-select", &[], &[PEOPLE], 7, None), Err(KernelError::BadShape(_))));
    }

    proptest! {
        #[test]
        fn chunking_does_not_matter(
            data in proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'1'), Just(b','), Just(b'"'), Just(b'\n'), Just(b'\r')], 0..300),
            chunk in 1usize..40,
        ) {
            let mut input = b"a,b\n".to_vec();
            input.extend(data);
            let cap = 2 * input.len() as u64 + 4096;
            let run = |c| run_kernel("csv-select", &[s("where", "a ~ 1")], &[&input], c, Some(cap)).map_err(|e| e.to_string());
            prop_assert_eq!(run(chunk), run(usize::MAX));
        }
    }
}
