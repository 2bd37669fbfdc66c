// SPDX-License-Identifier: Apache-2.0
//! The `wc` kernel: line, word and byte counts, identical to `LC_ALL=C wc`.
//!
//! No arguments; one or more input objects, no output object; one record per input:
//! `[("lines", U64), ("words", U64), ("bytes", U64)]`.
//!
//! * `lines` is the number of `'\n'` bytes (a last line without `'\n'` is not counted, as
//!   with `wc -l`).
//! * `bytes` is the object's length.
//! * `words` follows GNU coreutils `wc -w` (checked against coreutils 9.1) in the C locale,
//!   which sorts every byte into one of three classes:
//!   - **separators**: the six C-locale `isspace` bytes `' '`, `\t`, `\n`, `\v`, `\f`, `\r`;
//!     they end a word;
//!   - **word bytes**: the printable non-space ASCII bytes `0x21..=0x7e`; a word byte after
//!     a separator (or at the start) begins a new word;
//!   - **neutral bytes**: everything else — other control bytes (including NUL), DEL `0x7f`
//!     and every byte `>= 0x80`. They neither begin nor end a word: `"a\x01b"` is one word,
//!     `"\x01"` and `"\x80 \x80"` are no words, `"a\x80 b"` is two.
//!
//!   So `words` is the number of word bytes that have no word byte before them since the last
//!   separator. The state carries across chunk boundaries, so a word cut by a boundary counts
//!   once.
//!
//! With `edges=true` each record also says how the input joins its neighbours, so that a
//! host can add up the counts of consecutive pieces of one larger object (the fragments of an
//! erasure-coded object, each counted where it is stored): `lead` is the class of the first
//! byte that is not neutral (0 none, 1 separator, 2 word byte) and `in_word` whether a word
//! is open at the end, counting from a separator before the input. A piece whose `lead` is 2
//! continues a word that the piece before left open (its first word counted twice), and a
//! piece with `lead` 0 leaves the state as it found it.

use crate::{check_shape, Args, InputStream, Job, Kernel, KernelError, OutputSink, Param, ParamType, Record, Value};

static PARAMS: [Param; 1] = [Param {
    key: "edges",
    ty: ParamType::Bool,
    required: false,
    doc: "also report lead and in_word, to join the counts of consecutive pieces (default false)",
}];

/// The `wc` kernel.
pub(crate) struct Wc;

/// Byte classes, see the module doc.
const NEUTRAL: u8 = 0;
const SPACE: u8 = 1;
const WORD: u8 = 2;

/// The class of every byte value.
static CLASS: [u8; 256] = {
    let mut t = [NEUTRAL; 256];
    let mut b = 0x21;
    while b <= 0x7e {
        t[b] = WORD;
        b += 1;
    }
    t[b' ' as usize] = SPACE;
    t[b'\t' as usize] = SPACE;
    t[b'\n' as usize] = SPACE;
    t[0x0b] = SPACE; // \v
    t[0x0c] = SPACE; // \f
    t[b'\r' as usize] = SPACE;
    t
};

/// Running counts over one object.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    lines: u64,
    words: u64,
    bytes: u64,
    in_word: bool,
    /// Class of the first byte that is not neutral; `NEUTRAL` while there is none.
    lead: u8,
}

impl Counts {
    /// Counts the next chunk.
    pub(crate) fn update(&mut self, chunk: &[u8]) {
        self.bytes += chunk.len() as u64;
        self.lines += memchr::memchr_iter(b'\n', chunk).count() as u64;
        if self.lead == NEUTRAL {
            self.lead = chunk.iter().map(|&b| CLASS[usize::from(b)]).find(|&c| c != NEUTRAL).unwrap_or(NEUTRAL);
        }
        let mut words = 0u64;
        let mut in_word = self.in_word;
        for &b in chunk {
            let class = CLASS[usize::from(b)];
            words += u64::from(class == WORD && !in_word);
            // A word byte starts or continues a word; a separator ends it; neutral keeps it.
            in_word = class == WORD || (in_word && class == NEUTRAL);
        }
        self.words += words;
        self.in_word = in_word;
    }

    fn record(&self) -> Record {
        vec![("lines".into(), Value::U64(self.lines)), ("words".into(), Value::U64(self.words)), ("bytes".into(), Value::U64(self.bytes))]
    }

    fn edges(&self) -> [(String, Value); 2] {
        [("lead".into(), Value::U64(u64::from(self.lead))), ("in_word".into(), Value::Bool(self.in_word))]
    }
}

impl Kernel for Wc {
    fn name(&self) -> &'static str {
        "wc"
    }
    fn summary(&self) -> &'static str {
        "line, word and byte counts of each input, like LC_ALL=C wc"
    }
    fn params(&self) -> &'static [Param] {
        &PARAMS
    }
    fn prepare(&self, args: &Args<'_>) -> Result<Box<dyn Job>, KernelError> {
        args.check(self.params())?;
        Ok(Box::new(WcJob { edges: args.bool_or("edges", false) }))
    }
}

/// A prepared `wc` run.
struct WcJob {
    edges: bool,
}

impl Job for WcJob {
    fn run(self: Box<Self>, inputs: &mut [&mut dyn InputStream], outputs: &mut [&mut dyn OutputSink]) -> Result<Vec<Record>, KernelError> {
        check_shape("wc", inputs, outputs, None, 0)?;
        let mut records = Vec::with_capacity(inputs.len());
        for input in inputs.iter_mut() {
            let mut counts = Counts::default();
            while let Some(chunk) = input.next_chunk()? {
                counts.update(chunk);
            }
            let mut record = counts.record();
            if self.edges {
                record.extend(counts.edges());
            }
            records.push(record);
        }
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{random_bytes, run_kernel, tool, u64_field, CHUNKS};
    use proptest::prelude::*;

    fn wc(data: &[u8], chunk: usize) -> [u64; 3] {
        let (records, _) = run_kernel("wc", &[], &[data], chunk, None).unwrap();
        let r = &records[0];
        assert_eq!(r.len(), 3);
        [u64_field(r, "lines"), u64_field(r, "words"), u64_field(r, "bytes")]
    }

    fn system_wc(data: &[u8]) -> Option<[u64; 3]> {
        let out = tool("wc", &[], data)?;
        let text = String::from_utf8(out).unwrap();
        let v: Vec<u64> = text.split_whitespace().map(|n| n.parse().unwrap()).collect();
        Some([v[0], v[1], v[2]])
    }

    /// Joins the edge records of consecutive pieces as a host does.
    fn joined(pieces: &[&[u8]]) -> [u64; 3] {
        let args = [("edges".to_string(), Value::Bool(true))];
        let (records, _) = run_kernel("wc", &args, pieces, 7, None).unwrap();
        let (mut total, mut open) = ([0u64; 3], false);
        for r in &records {
            let lead = u64_field(r, "lead");
            total[0] += u64_field(r, "lines");
            total[1] += u64_field(r, "words") - u64::from(open && lead == 2);
            total[2] += u64_field(r, "bytes");
            if lead != 0 {
                open = matches!(r.iter().find(|(k, _)| k == "in_word"), Some((_, Value::Bool(true))));
            }
        }
        total
    }

    proptest! {
        #[test]
        fn pieces_joined_by_their_edges_count_like_the_whole(data in proptest::collection::vec(prop_oneof![Just(b'a'), Just(b' '), Just(0x80u8), Just(b'\n'), Just(0x01u8)], 0..200), cuts in proptest::collection::vec(0usize..200, 0..6)) {
            let owned = crate::testutil::pieces(&data, &cuts);
            let pieces: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
            prop_assert_eq!(joined(&pieces), wc(&data, usize::MAX));
        }
    }

    fn check(data: &[u8]) {
        let ours = wc(data, usize::MAX);
        for &c in &CHUNKS {
            assert_eq!(wc(data, c), ours, "chunk {c}");
        }
        if let Some(want) = system_wc(data) {
            assert_eq!(ours, want, "data {:?}", String::from_utf8_lossy(&data[..data.len().min(80)]));
        }
    }

    #[test]
    fn small_cases() {
        let cases: [(&[u8], [u64; 3]); 12] = [
            (b"", [0, 0, 0]),
            (b"hello world\nbye\n", [2, 3, 16]),
            (b"no newline", [0, 2, 10]),
            (b"a\x01b", [0, 1, 3]),
            (b"\x01", [0, 0, 1]),
            (b"\x80 \x80", [0, 0, 3]),
            (b"a\x80 b", [0, 2, 4]),
            (b"a\rb\x0bc\x0cd\te", [0, 5, 9]),
            (b"a\x00b \x7f", [0, 1, 5]),
            (b"\n\n\n", [3, 0, 3]),
            (b"  lead and trail  ", [0, 3, 18]),
            ("caf\u{e9} na\u{ef}ve\n".as_bytes(), [1, 2, 13]),
        ];
        for (data, want) in cases {
            assert_eq!(wc(data, usize::MAX), want, "{data:?}");
            check(data);
        }
    }

    #[test]
    fn matches_system_wc_on_random_data() {
        let all: Vec<u8> = (0..=255).collect();
        let text = b"abc xyz\t\n\r\x0b\x0c  .,;\x01\x80\xff\x00";
        for seed in 0..20 {
            check(&random_bytes(seed, 5000 + seed as usize * 1000, &all));
            check(&random_bytes(seed + 100, 5000, text));
        }
        check(&random_bytes(7, 300_000, &all));
    }

    #[test]
    fn word_cut_by_chunk_counts_once() {
        assert_eq!(wc(b"abcdefgh ijklmnop", 1), [0, 2, 17]);
        assert_eq!(wc(b"ab\x80\x80cd ef", 3), [0, 2, 9]);
    }

    #[test]
    fn several_inputs_and_bad_shape() {
        let (records, _) = run_kernel("wc", &[], &[b"a b\n", b"", b"x"], 2, None).unwrap();
        assert_eq!(records.len(), 3);
        assert_eq!(u64_field(&records[2], "words"), 1);
        assert!(matches!(run_kernel("wc", &[], &[], 1, None), Err(KernelError::BadShape(_))));
        let args = [crate::testutil::s("lines", "yes")];
        assert!(matches!(run_kernel("wc", &args, &[b"a"], 1, None), Err(KernelError::BadArgument { .. })));
    }

    proptest! {
        #[test]
        fn chunking_does_not_matter(data in proptest::collection::vec(any::<u8>(), 0..2000), chunk in 1usize..300) {
            prop_assert_eq!(wc(&data, chunk), wc(&data, usize::MAX));
        }
    }
}
