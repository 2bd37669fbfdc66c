// SPDX-License-Identifier: Apache-2.0
//! The `grep` kernel: which lines of an object match a pattern, like
//! `LC_ALL=C grep -n -b` (`-F` for literals, `-E` for regular expressions).
//!
//! Searching where the data lives returns a few line numbers instead of the whole object.
//!
//! Arguments: `pattern` (string, required), `regex` (bool, default false: `pattern` is a
//! literal), `ignore_case` (bool, default false: ASCII case folding), `max_matches` (u64,
//! default 1000000). One or more input objects, no output object; one record per input:
//! `[("count", U64), ("matches", U64List), ("truncated", Bool)]`.
//!
//! * Lines are split on `'\n'`; a last line without `'\n'` is still a line.
//! * `count` is the number of matching lines (`grep -c`), always exact.
//! * `matches` is flattened `[line_no, byte_offset, ...]` for the first `max_matches`
//!   matching lines: the 1-based line number and the byte offset of the line's *start*
//!   (`grep -n -b`). `truncated` says whether more matching lines existed.
//! * An empty pattern matches every line. A pattern containing `'\n'` is refused.
//! * Regular expressions use `regex::bytes` syntax with Unicode off (`.` is any byte but
//!   `'\n'`, classes are ASCII), matched per line (`^`/`$` are line start/end). This agrees
//!   with `grep -E` wherever the two syntaxes agree (no back-references; `\d`, `\w`, `\A`
//!   are Rust's). A pattern holding `\A`, `\z` or a flag group `(?` is matched one line at
//!   a time (slower) so that those keep their per-line meaning.
//!
//! With `edges=true` the input is taken as one piece of a larger object (an erasure-coded
//! fragment, say) whose first and last lines continue in the pieces around it: only the
//! lines that start after the piece's first `'\n'` and end at its last are searched, line
//! numbers count from the first of them and offsets from the piece's start, and the record
//! adds `newlines` (the piece's `'\n'` count), `head` (the bytes up to and including the
//! first `'\n'`, or the whole piece when it has none) and `tail` (the bytes after the last
//! `'\n'`). The host joins each tail to the next head and searches those lines itself.
//! `edge_limit` (default 16 MiB) bounds `head` and `tail`; a longer one fails the command.
//!
//! Literal patterns are found with `memchr::memmem` over whole chunks, not line by line;
//! each hit is then mapped to its line (with `ignore_case`, a literal is compiled as an
//! escaped regex instead). Regular expressions also search the complete lines
//! of a chunk in one call and fall back to one line at a time only where a match crosses a
//! `'\n'` (e.g. `[^x]+`). The line cut by a chunk boundary is carried over: for a literal,
//! only its last `len(pattern) - 1` bytes and whether it matched already; for a regex the
//! whole line (so a regex over an object without newlines buffers it).

use crate::{check_shape, Args, InputStream, Job, Kernel, KernelError, OutputSink, Param, ParamType, Record, Value};
use memchr::memmem::Finder;
use regex::bytes::{Regex, RegexBuilder};

/// The `grep` kernel.
pub(crate) struct Grep;

static PARAMS: [Param; 6] = [
    Param { key: "pattern", ty: ParamType::Str, required: true, doc: "the literal or regular expression to find" },
    Param { key: "regex", ty: ParamType::Bool, required: false, doc: "pattern is a regular expression (default false: literal)" },
    Param { key: "ignore_case", ty: ParamType::Bool, required: false, doc: "ASCII case-insensitive matching (default false)" },
    Param { key: "max_matches", ty: ParamType::U64, required: false, doc: "most matching lines to list (default 1000000); count stays exact" },
    Param {
        key: "edges",
        ty: ParamType::Bool,
        required: false,
        doc: "the input is a piece of a larger object: search its inner lines, return its head and tail (default false)",
    },
    Param { key: "edge_limit", ty: ParamType::U64, required: false, doc: "most bytes of head or tail with edges (default 16777216)" },
];

impl Kernel for Grep {
    fn name(&self) -> &'static str {
        "grep"
    }
    fn summary(&self) -> &'static str {
        "count and locate the lines of each input matching a literal or regex, like grep -n -b"
    }
    fn params(&self) -> &'static [Param] {
        &PARAMS
    }
    fn prepare(&self, args: &Args<'_>) -> Result<Box<dyn Job>, KernelError> {
        args.check(self.params())?;
        let pattern = args.str("pattern").unwrap_or_default();
        if pattern.contains('\n') {
            return Err(KernelError::BadArgument { key: "pattern".into(), detail: "must not contain a newline".into() });
        }
        let is_regex = args.bool_or("regex", false);
        let ignore_case = args.bool_or("ignore_case", false);
        let matcher = if !is_regex && !ignore_case {
            Matcher::Literal(Box::new(Finder::new(pattern.as_bytes()).into_owned()))
        } else {
            let source = if is_regex { pattern.to_string() } else { regex::escape(pattern) };
            let regex = RegexBuilder::new(&source)
                .unicode(false)
                .case_insensitive(ignore_case)
                .multi_line(true)
                .build()
                .map_err(|e| KernelError::BadArgument { key: "pattern".into(), detail: format!("invalid regex: {e}") })?;
            // `\A`, `\z` and flag groups such as `(?-m)` can tie a match to the start or end
            // of the searched text, which is one line only when lines are searched one by one.
            let per_line = ["\\A", "\\z", "(?"].iter().any(|t| source.contains(t));
            Matcher::Regex { regex, per_line }
        };
        let edges = args.bool_or("edges", false).then(|| args.u64_or("edge_limit", 16 << 20) as usize);
        Ok(Box::new(GrepJob { matcher, max_matches: args.u64_or("max_matches", 1_000_000), edges }))
    }
}

/// A compiled pattern.
enum Matcher {
    Literal(Box<Finder<'static>>),
    Regex { regex: Regex, per_line: bool },
}

impl Matcher {
    /// The first match in `hay` as `(start, end)`.
    fn find(&self, hay: &[u8]) -> Option<(usize, usize)> {
        match self {
            Matcher::Literal(f) => f.find(hay).map(|s| (s, s + f.needle().len())),
            Matcher::Regex { regex, .. } => regex.find(hay).map(|m| (m.start(), m.end())),
        }
    }
}

/// A prepared `grep` run.
struct GrepJob {
    matcher: Matcher,
    max_matches: u64,
    /// With `edges`: the most bytes of a head or tail.
    edges: Option<usize>,
}

impl Job for GrepJob {
    fn run(self: Box<Self>, inputs: &mut [&mut dyn InputStream], outputs: &mut [&mut dyn OutputSink]) -> Result<Vec<Record>, KernelError> {
        check_shape("grep", inputs, outputs, None, 0)?;
        let mut records = Vec::with_capacity(inputs.len());
        for input in inputs.iter_mut() {
            let mut scan = Scan::new(&self.matcher, self.max_matches);
            if let Some(limit) = self.edges {
                records.push(edges(scan, &mut **input, limit)?);
                continue;
            }
            while let Some(chunk) = input.next_chunk()? {
                scan.feed(chunk);
            }
            records.push(scan.finish());
        }
        Ok(records)
    }
}

/// Searches the inner lines of a piece (see the module doc) and returns its edge record.
fn edges(mut scan: Scan<'_>, input: &mut dyn InputStream, limit: usize) -> Result<Record, KernelError> {
    let too_long = |what: &str| KernelError::Failed(format!("the {what} line of this piece is longer than edge_limit ({limit} bytes)"));
    let (mut head, mut tail) = (Vec::new(), Vec::new());
    let (mut newlines, mut in_head) = (0u64, true);
    while let Some(chunk) = input.next_chunk()? {
        newlines += memchr::memchr_iter(b'\n', chunk).count() as u64;
        let mut rest = chunk;
        if in_head {
            let Some(nl) = memchr::memchr(b'\n', rest) else {
                head.extend_from_slice(rest);
                if head.len() > limit {
                    return Err(too_long("first"));
                }
                continue;
            };
            head.extend_from_slice(&rest[..=nl]);
            if head.len() > limit {
                return Err(too_long("first"));
            }
            in_head = false;
            rest = &rest[nl + 1..];
        }
        // Whole lines go to the search now; the bytes after the last newline wait in `tail`
        // until the next one completes them.
        match memchr::memrchr(b'\n', rest) {
            Some(nl) => {
                scan.feed(&tail);
                scan.feed(&rest[..=nl]);
                tail.clear();
                tail.extend_from_slice(&rest[nl + 1..]);
            }
            None => tail.extend_from_slice(rest),
        }
        if tail.len() > limit {
            return Err(too_long("last"));
        }
    }
    let mut record = scan.finish();
    // The search began after the head; offsets count from the piece's start.
    for (key, value) in record.iter_mut() {
        if let (true, Value::U64List(pairs)) = (key == "matches", value) {
            pairs.chunks_exact_mut(2).for_each(|p| p[1] += head.len() as u64);
        }
    }
    record.extend([("newlines".into(), Value::U64(newlines)), ("head".into(), Value::Bytes(head)), ("tail".into(), Value::Bytes(tail))]);
    Ok(record)
}

/// The search state over one object.
struct Scan<'m> {
    matcher: &'m Matcher,
    max: u64,
    count: u64,
    matches: Vec<u64>,
    truncated: bool,
    /// Lines completed before the current position.
    lines_done: u64,
    /// Bytes fed so far.
    pos: u64,
    /// Whether the current line has bytes from earlier chunks (it is carried).
    partial: bool,
    /// Offset of the carried line's start.
    line_start: u64,
    /// The carried line: all of it for a regex, its last `len(pattern) - 1` bytes for a literal.
    carry: Vec<u8>,
    /// Whether the carried line already holds a literal match.
    carry_matched: bool,
}

impl<'m> Scan<'m> {
    fn new(matcher: &'m Matcher, max: u64) -> Self {
        Scan {
            matcher,
            max,
            count: 0,
            matches: Vec::new(),
            truncated: false,
            lines_done: 0,
            pos: 0,
            partial: false,
            line_start: 0,
            carry: Vec::new(),
            carry_matched: false,
        }
    }

    /// Notes that line `lines_done + 1`, starting at `start`, matches.
    fn hit(&mut self, start: u64) {
        self.count += 1;
        if (self.matches.len() as u64) < self.max.saturating_mul(2) {
            self.matches.extend_from_slice(&[self.lines_done + 1, start]);
        } else {
            self.truncated = true;
        }
    }

    fn feed(&mut self, chunk: &[u8]) {
        let base = self.pos;
        self.pos += chunk.len() as u64;
        let mut rest_at = 0;
        if self.partial {
            match memchr::memchr(b'\n', chunk) {
                None => {
                    self.extend(chunk);
                    return;
                }
                Some(i) => {
                    self.extend(&chunk[..i]);
                    self.end_partial();
                    rest_at = i + 1;
                }
            }
        }
        let rest = &chunk[rest_at..];
        let complete = memchr::memrchr(b'\n', rest).map_or(0, |j| j + 1);
        self.scan_lines(&rest[..complete], base + rest_at as u64);
        let tail = &rest[complete..];
        if !tail.is_empty() {
            self.line_start = base + (rest_at + complete) as u64;
            self.extend(tail);
        }
    }

    /// Appends bytes (without `'\n'`) to the carried line.
    fn extend(&mut self, bytes: &[u8]) {
        self.partial = true;
        let Matcher::Literal(finder) = self.matcher else {
            self.carry.extend_from_slice(bytes);
            return;
        };
        if self.carry_matched {
            return;
        }
        let keep = finder.needle().len().saturating_sub(1);
        // A match either lies in `bytes` or starts in the kept tail and ends in `bytes`.
        let seam = bytes.len().min(keep);
        self.carry.extend_from_slice(&bytes[..seam]);
        if finder.find(&self.carry).is_some() || finder.find(bytes).is_some() {
            self.carry_matched = true;
        }
        if bytes.len() >= keep {
            self.carry.clear();
            self.carry.extend_from_slice(&bytes[bytes.len() - keep..]);
        } else {
            let excess = self.carry.len().saturating_sub(keep);
            self.carry.drain(..excess);
        }
    }

    /// The carried line is complete: decides whether it matches.
    fn end_partial(&mut self) {
        let matched = match self.matcher {
            Matcher::Literal(_) => self.carry_matched,
            Matcher::Regex { regex, .. } => regex.is_match(&self.carry),
        };
        if matched {
            self.hit(self.line_start);
        }
        self.lines_done += 1;
        self.partial = false;
        self.carry_matched = false;
        self.carry.clear();
    }

    /// Searches `region`, which is empty or whole lines ending in `'\n'`, starting at `base`.
    fn scan_lines(&mut self, region: &[u8], base: u64) {
        if let Matcher::Regex { regex, per_line: true } = self.matcher {
            let mut start = 0;
            for end in memchr::memchr_iter(b'\n', region) {
                if regex.is_match(&region[start..end]) {
                    self.hit(base + start as u64);
                }
                self.lines_done += 1;
                start = end + 1;
            }
            return;
        }
        // `cursor` is always at a line start; lines before it are counted in `lines_done`.
        let mut cursor = 0;
        while cursor < region.len() {
            let Some((s, e)) = self.matcher.find(&region[cursor..]) else { break };
            let (s, e) = (cursor + s, cursor + e);
            if s == region.len() {
                break; // an empty match after the last '\n' belongs to no line
            }
            let line = memchr::memrchr(b'\n', &region[cursor..s]).map_or(cursor, |i| cursor + i + 1);
            let end = memchr::memchr(b'\n', &region[s..]).map_or(region.len(), |i| s + i);
            self.lines_done += memchr::memchr_iter(b'\n', &region[cursor..line]).count() as u64;
            // No earlier line matches (a match there would have been found first), and a
            // match without '\n' proves this line matches; one spanning lines proves nothing.
            let matched = match self.matcher {
                Matcher::Regex { regex, .. } if region[s..e].contains(&b'\n') => regex.is_match(&region[line..end]),
                _ => true,
            };
            if matched {
                self.hit(base + line as u64);
            }
            self.lines_done += 1;
            cursor = end + 1;
        }
        if cursor < region.len() {
            self.lines_done += memchr::memchr_iter(b'\n', &region[cursor..]).count() as u64;
        }
    }

    fn finish(mut self) -> Record {
        if self.partial {
            self.end_partial();
        }
        vec![("count".into(), Value::U64(self.count)), ("matches".into(), Value::U64List(self.matches)), ("truncated".into(), Value::Bool(self.truncated))]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{field, random_bytes, run_kernel, s, tool, u64_field, CHUNKS};
    use proptest::prelude::*;

    type Result3 = (u64, Vec<u64>, bool);

    fn args(pattern: &str, regex: bool, ignore_case: bool) -> Vec<(String, Value)> {
        vec![s("pattern", pattern), ("regex".into(), Value::Bool(regex)), ("ignore_case".into(), Value::Bool(ignore_case))]
    }

    fn grep(args: &[(String, Value)], data: &[u8], chunk: usize) -> Result3 {
        let (records, _) = run_kernel("grep", args, &[data], chunk, None).unwrap();
        let r = &records[0];
        let Value::U64List(m) = field(r, "matches").clone() else { panic!("matches not a list") };
        let Value::Bool(t) = *field(r, "truncated") else { panic!("truncated not a bool") };
        (u64_field(r, "count"), m, t)
    }

    /// What `grep -n -b` and `grep -c` say, as our record.
    fn system_grep(pattern: &str, regex: bool, ignore_case: bool, data: &[u8]) -> Option<Result3> {
        let mode = if regex { "-E" } else { "-F" };
        let mut flags = vec![mode, "-n", "-b", "-a"];
        if ignore_case {
            flags.push("-i");
        }
        flags.extend(["-e", pattern]);
        let out = tool("grep", &flags, data)?;
        let mut matches = Vec::new();
        for line in out.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let text = String::from_utf8_lossy(line);
            let mut parts = text.splitn(3, ':');
            matches.push(parts.next().unwrap().parse().unwrap());
            matches.push(parts.next().unwrap().parse().unwrap());
        }
        let count_flags: Vec<&str> = flags.iter().copied().filter(|f| *f != "-n" && *f != "-b").chain(["-c"]).collect();
        let count = String::from_utf8(tool("grep", &count_flags, data)?).unwrap().trim().parse().unwrap();
        Some((count, matches, false))
    }

    fn check(pattern: &str, regex: bool, ignore_case: bool, data: &[u8]) {
        let a = args(pattern, regex, ignore_case);
        let ours = grep(&a, data, usize::MAX);
        for &c in &CHUNKS {
            assert_eq!(grep(&a, data, c), ours, "pattern {pattern:?} chunk {c}");
        }
        if let Some(want) = system_grep(pattern, regex, ignore_case, data) {
            assert_eq!(ours, want, "pattern {pattern:?} regex {regex} ignore_case {ignore_case}");
        }
    }

    #[test]
    fn literal_basics() {
        let data = b"apple pie\nbanana\n\ncherry apple\napple";
        assert_eq!(grep(&args("apple", false, false), data, 3), (3, vec![1, 0, 4, 18, 5, 31], false));
        assert_eq!(grep(&args("", false, false), data, 3).0, 5);
        assert_eq!(grep(&args("x", false, false), b"", 3), (0, vec![], false));
        assert_eq!(grep(&args("", false, false), b"", 3), (0, vec![], false));
        assert_eq!(grep(&args("", false, false), b"\n", 3), (1, vec![1, 0], false));
    }

    #[test]
    fn matches_system_grep() {
        let text = b"the quick brown fox\njumps over\nthe lazy dog\n\nFOX fox\nfoxfox\n\r\nend without newline fox";
        let words = b"ab \nxyz.*";
        let accents = "caf\u{e9}\nCAF\u{c9}\n\u{c9}t\u{e9}\nfox\n".as_bytes();
        let mut inputs: Vec<Vec<u8>> = vec![text.to_vec(), accents.to_vec(), b"".to_vec(), b"\n\n".to_vec(), b"fox".to_vec()];
        for seed in 0..6 {
            inputs.push(random_bytes(seed, 20_000, words));
        }
        let all: Vec<u8> = (0..=255).collect();
        inputs.push(random_bytes(99, 50_000, &all));
        let cases: [(&str, bool, bool); 17] = [
            ("\u{e9}", false, true),
            ("\u{c9}", true, true),
            ("caf.", true, false),
            ("fox", false, false),
            ("fox", false, true),
            ("", false, false),
            ("the ", false, false),
            ("ab", false, false),
            ("aba", false, false),
            (".*", false, false),
            ("xyzxy", false, true),
            ("^the", true, false),
            ("fox$", true, false),
            ("o[vx]", true, true),
            ("b+a{2}", true, false),
            ("^$", true, false),
            ("x*", true, false),
        ];
        for data in &inputs {
            for (p, r, i) in cases {
                check(p, r, i, data);
            }
        }
    }

    #[test]
    fn regex_that_can_match_newline_is_per_line() {
        // `[^a]+` and `\s` match '\n' in a whole-chunk search; per line they must not.
        let data = b"a\na\nab\n a\naaa\n";
        check("[^a]", true, false, data);
        check("a\\sa", true, false, data);
        assert_eq!(grep(&args("a\\sa", true, false), data, usize::MAX).0, 0);
        assert_eq!(grep(&args("\\Aa", true, false), data, usize::MAX).0, 4);
    }

    #[test]
    fn max_matches_truncates_but_count_is_exact() {
        let mut a = args("x", false, false);
        a.push(("max_matches".into(), Value::U64(2)));
        assert_eq!(grep(&a, b"x\ny\nx\nx\n", 1), (3, vec![1, 0, 3, 4], true));
        a[3].1 = Value::U64(3);
        assert_eq!(grep(&a, b"x\ny\nx\nx\n", 1), (3, vec![1, 0, 3, 4, 4, 6], false));
        a[3].1 = Value::U64(0);
        assert_eq!(grep(&a, b"x", 1), (1, vec![], true));
    }

    #[test]
    fn bad_arguments_are_refused() {
        let bad = |a: Vec<(String, Value)>| matches!(run_kernel("grep", &a, &[b""], 1, None), Err(KernelError::BadArgument { .. }));
        assert!(bad(vec![]));
        assert!(bad(args("a\nb", false, false)));
        assert!(bad(args("(", true, false)));
        assert!(bad(vec![("pattern".into(), Value::U64(1))]));
        assert!(bad(vec![s("pattern", "a"), s("color", "always")]));
        assert!(matches!(run_kernel("grep", &args("a", false, false), &[], 1, None), Err(KernelError::BadShape(_))));
    }

    /// Joins the edge records of consecutive pieces as a host does: each tail with the next
    /// heads into whole lines, searched on their own.
    fn joined(args: &[(String, Value)], pieces: &[&[u8]]) -> (u64, Vec<u64>) {
        let mut edge_args = args.to_vec();
        edge_args.push(("edges".into(), Value::Bool(true)));
        let (records, _) = run_kernel("grep", &edge_args, pieces, 5, None).unwrap();
        let (mut count, mut matches) = (0u64, Vec::new());
        let (mut lines, mut at) = (0u64, 0u64);
        let mut line: Vec<u8> = Vec::new(); // the line being joined, and where it starts
        let mut line_at = 0u64;
        let bytes = |r: &Record, k: &str| match field(r, k) {
            Value::Bytes(b) => b.clone(),
            other => panic!("{k}: {other:?}"),
        };
        let search = |line: &[u8], line_no: u64, start: u64, count: &mut u64, matches: &mut Vec<u64>| {
            let (r, _) = run_kernel("grep", args, &[line], usize::MAX, None).unwrap();
            if u64_field(&r[0], "count") == 1 {
                *count += 1;
                matches.extend([line_no, start]);
            }
        };
        for (r, piece) in records.iter().zip(pieces) {
            if line.is_empty() {
                line_at = at;
            }
            line.extend(bytes(r, "head"));
            if u64_field(r, "newlines") > 0 {
                lines += 1;
                search(&line, lines, line_at, &mut count, &mut matches);
                count += u64_field(r, "count");
                if let Value::U64List(l) = field(r, "matches") {
                    matches.extend(l.chunks(2).flat_map(|p| [p[0] + lines, p[1] + at]));
                }
                lines += u64_field(r, "newlines") - 1;
                line = bytes(r, "tail");
                line_at = at + piece.len() as u64 - line.len() as u64;
            }
            at += piece.len() as u64;
        }
        if !line.is_empty() {
            search(&line, lines + 1, line_at, &mut count, &mut matches);
        }
        // Lines are found in order except the joined ones; sort by line number.
        let mut pairs: Vec<[u64; 2]> = matches.chunks(2).map(|p| [p[0], p[1]]).collect();
        pairs.sort_unstable();
        (count, pairs.concat())
    }

    proptest! {
        #[test]
        fn pieces_joined_by_their_edges_match_like_the_whole(data in proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'b'), Just(b'\n'), Just(b'\r')], 0..120), cuts in proptest::collection::vec(0usize..120, 0..6), regex in any::<bool>()) {
            let owned = crate::testutil::pieces(&data, &cuts);
            let pieces: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
            let a = if regex { args("^a.*b$", true, false) } else { args("ab", false, false) };
            let (records, _) = run_kernel("grep", &a, &[&data], usize::MAX, None).unwrap();
            let want = match field(&records[0], "matches") {
                Value::U64List(l) => l.clone(),
                _ => unreachable!(),
            };
            prop_assert_eq!(joined(&a, &pieces), (u64_field(&records[0], "count"), want));
        }
    }

    proptest! {
        #[test]
        fn chunking_does_not_matter(
            data in proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'b'), Just(b'\n'), Just(b'A')], 0..400),
            chunk in 1usize..50,
            pattern in "[abA]{0,3}",
            regex in any::<bool>(),
            ignore_case in any::<bool>(),
        ) {
            let a = args(&pattern, regex, ignore_case);
            prop_assert_eq!(grep(&a, &data, chunk), grep(&a, &data, usize::MAX));
        }
    }
}
