// SPDX-License-Identifier: Apache-2.0
//! A container's log: one record per line of output, each with the stream it came on and
//! when it arrived, so that `logs` can answer `tail`, `since`, `until` and `timestamps`
//! on line boundaries however the process's writes were chunked (the `json-file` and
//! `local` drivers of Docker keep lines the same way).
//!
//! A record is a 16-byte header (the stream byte, `b'L'`, two zero bytes, the line's
//! length as a big-endian u32, the arrival time as big-endian nanoseconds since the
//! epoch) and the line's bytes, its newline included; a last line without a newline is a
//! record of its own. Logs of older targets (plain multiplexed frames, file `log`) are
//! read as records without a time.

use std::path::Path;
use std::time::{Duration, SystemTime};

/// The log file of a container, in its directory.
pub const LOG_FILE: &str = "container.log";
/// The log file older targets wrote (multiplexed frames, no times).
const OLD_LOG_FILE: &str = "log";
const HEADER: usize = 16;
const MARK: u8 = b'L';

/// One line of a container's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// [`super::STDOUT`] or [`super::STDERR`].
    pub stream: u8,
    /// When it arrived (the epoch for logs of older targets).
    pub time: SystemTime,
    /// The line, with its newline if it had one.
    pub line: Vec<u8>,
}

/// The records of a chunk of output that arrived at `time`: one per line.
pub fn encode(stream: u8, data: &[u8], time: SystemTime) -> Vec<u8> {
    let nanos = time.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_nanos() as u64;
    let mut out = Vec::with_capacity(data.len() + HEADER * 2);
    for line in data.split_inclusive(|&b| b == b'\n') {
        out.extend_from_slice(&[stream, MARK, 0, 0]);
        out.extend_from_slice(&(line.len() as u32).to_be_bytes());
        out.extend_from_slice(&nanos.to_be_bytes());
        out.extend_from_slice(line);
    }
    out
}

/// The records in `b`; a torn last record (a crash mid-write) is dropped.
pub fn decode(mut b: &[u8]) -> Vec<Record> {
    let mut v = Vec::new();
    while b.len() >= HEADER && b[1] == MARK {
        let n = u32::from_be_bytes([b[4], b[5], b[6], b[7]]) as usize;
        let nanos = u64::from_be_bytes(b[8..16].try_into().expect("8 bytes"));
        let Some(line) = b.get(HEADER..HEADER + n) else { break };
        v.push(Record { stream: b[0], time: SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos), line: line.to_vec() });
        b = &b[HEADER + n..];
    }
    v
}

/// How much of a log `json-file`'s `max-size` and `max-file` let it keep, as Docker's
/// rotation does: up to `max_size × max_file` bytes; past that the oldest lines go,
/// down to `max_size × (max_file − 1)` (the files Docker would keep after rotating).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Rotation {
    /// `max-size`, bytes.
    pub max_size: u64,
    /// `max-file`.
    pub max_file: u64,
}

impl Rotation {
    /// Parses `LogConfig.Config`: `max-size` (bytes, or with `k`, `m`, `g`, binary) and
    /// `max-file` (at least 1, default 1); `None` without `max-size` (kept whole).
    /// Other options are an error naming them.
    pub fn parse(config: &serde_json::Map<String, serde_json::Value>) -> Result<Option<Rotation>, String> {
        let text = |k: &str| config.get(k).map(|v| v.as_str().map(str::to_string).ok_or_else(|| format!("HostConfig.LogConfig.Config {k:?} must be a string")));
        if let Some(k) = config.keys().find(|k| !matches!(k.as_str(), "max-size" | "max-file")) {
            return Err(format!("HostConfig.LogConfig.Config {k:?} is not supported on this target: only max-size and max-file"));
        }
        let max_file = match text("max-file").transpose()? {
            None => 1,
            Some(f) => f.parse::<u64>().ok().filter(|&n| n >= 1).ok_or_else(|| format!("invalid max-file {f:?}: a whole number from 1"))?,
        };
        let Some(size) = text("max-size").transpose()? else { return Ok(None) };
        let lower = size.to_ascii_lowercase();
        let (digits, unit) = lower.trim_end_matches('b').split_at(lower.trim_end_matches('b').trim_end_matches(['k', 'm', 'g']).len());
        let shift = match unit {
            "" => 0,
            "k" => 10,
            "m" => 20,
            "g" => 30,
            _ => return Err(format!("invalid max-size {size:?}: bytes, or a number with k, m or g")),
        };
        let n = digits.parse::<u64>().ok().and_then(|n| n.checked_mul(1 << shift)).filter(|&n| n > 0);
        let max_size = n.ok_or_else(|| format!("invalid max-size {size:?}: bytes, or a number with k, m or g"))?;
        Ok(Some(Rotation { max_size, max_file }))
    }

    /// After an append: drops the oldest records of the log at `path` when it has grown
    /// past what this rotation keeps.
    pub fn enforce(&self, path: &Path) -> std::io::Result<()> {
        let limit = self.max_size.saturating_mul(self.max_file);
        if std::fs::metadata(path)?.len() <= limit {
            return Ok(());
        }
        let b = std::fs::read(path)?;
        let keep = self.max_size.saturating_mul(self.max_file - 1) as usize;
        let mut at = 0;
        while at + HEADER <= b.len() && b.len() - at > keep {
            at += HEADER + u32::from_be_bytes([b[at + 4], b[at + 5], b[at + 6], b[at + 7]]) as usize;
        }
        let tmp = path.with_extension("rotating");
        std::fs::write(&tmp, b.get(at..).unwrap_or_default())?;
        std::fs::rename(&tmp, path)
    }
}

/// Records from the multiplexed frames older targets logged, split into lines.
fn decode_frames(mut b: &[u8]) -> Vec<Record> {
    let mut v = Vec::new();
    while b.len() >= 8 {
        let n = u32::from_be_bytes([b[4], b[5], b[6], b[7]]) as usize;
        let Some(data) = b.get(8..8 + n) else { break };
        for line in data.split_inclusive(|&x| x == b'\n') {
            v.push(Record { stream: b[0], time: SystemTime::UNIX_EPOCH, line: line.to_vec() });
        }
        b = &b[8 + n..];
    }
    v
}

/// Every record of the container whose directory is `dir`, its first `len` bytes of the
/// current log only (what was logged before a follower subscribed).
pub fn read(dir: &Path, len: u64) -> Vec<Record> {
    let mut out = std::fs::read(dir.join(OLD_LOG_FILE)).map(|b| decode_frames(&b)).unwrap_or_default();
    let mut cur = std::fs::read(dir.join(LOG_FILE)).unwrap_or_default();
    cur.truncate(len.min(cur.len() as u64) as usize);
    out.extend(decode(&cur));
    out
}

/// Which records `logs` shows: those of the wanted streams, after `since` and not after
/// `until`, the last `tail` of them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Filter {
    /// Standard output wanted.
    pub stdout: bool,
    /// Standard error wanted.
    pub stderr: bool,
    /// Only records at or after this time.
    pub since: Option<SystemTime>,
    /// Only records at or before this time.
    pub until: Option<SystemTime>,
    /// Only the last this many lines.
    pub tail: Option<usize>,
}

impl Filter {
    /// Whether a record (of the log or one that arrives later) passes, `tail` aside.
    pub fn keeps(&self, stream: u8, time: SystemTime) -> bool {
        let wanted = (stream == super::STDOUT && self.stdout) || (stream == super::STDERR && self.stderr);
        wanted && self.since.is_none_or(|s| time >= s) && self.until.is_none_or(|u| time <= u)
    }

    /// The records of `all` that pass, with `tail` applied.
    pub fn apply(&self, all: Vec<Record>) -> Vec<Record> {
        let mut v: Vec<Record> = all.into_iter().filter(|r| self.keeps(r.stream, r.time)).collect();
        if let Some(n) = self.tail {
            v.drain(..v.len().saturating_sub(n));
        }
        v
    }
}

/// A time as Docker prints log timestamps: RFC 3339 with nine digits of nanoseconds.
pub fn timestamp(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = crate::api::images::rfc3339(d.as_secs() as i64);
    format!("{}.{:09}Z", secs.trim_end_matches('Z'), d.subsec_nanos())
}

/// A time given to `since`/`until`: seconds since the epoch, with an optional fraction
/// (`1700000000.5`), or RFC 3339 (`2024-01-02T03:04:05Z`, a fraction allowed).
pub fn parse_time(s: &str) -> Result<SystemTime, String> {
    let bad = || format!("invalid time {s:?}: give seconds since the epoch (1700000000 or 1700000000.25) or RFC 3339 (2024-01-02T03:04:05Z)");
    if let Some((secs, frac)) = s.split_once('.').filter(|_| !s.contains('T')) {
        let secs: u64 = secs.parse().map_err(|_| bad())?;
        if frac.is_empty() || frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let nanos: u32 = format!("{frac:0<9}").parse().map_err(|_| bad())?;
        return Ok(SystemTime::UNIX_EPOCH + Duration::new(secs, nanos));
    }
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(SystemTime::UNIX_EPOCH + Duration::from_secs(secs));
    }
    parse_rfc3339(s).ok_or_else(bad)
}

/// `YYYY-MM-DDTHH:MM:SS[.fraction]Z` (UTC only).
fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.split(':').map(|x| x.parse::<i64>().ok());
    let (h, mi, sec) = (t.next()??, t.next()??, t.next()??);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || h > 23 || mi > 59 || sec > 60 || frac.len() > 9 {
        return None;
    }
    let nanos: u32 = if frac.is_empty() { 0 } else { format!("{frac:0<9}").parse().ok()? };
    // Days from civil (H. Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec;
    Some(SystemTime::UNIX_EPOCH + Duration::new(u64::try_from(secs).ok()?, nanos))
}

#[cfg(test)]
mod rotation_tests {
    use super::*;

    #[test]
    fn rotation_keeps_the_newest_lines_within_its_bounds() {
        let cfg = |v: serde_json::Value| v.as_object().cloned().unwrap();
        assert_eq!(Rotation::parse(&cfg(serde_json::json!({"max-file": "3"}))).unwrap(), None);
        let r = Rotation::parse(&cfg(serde_json::json!({"max-size": "1k", "max-file": "2"}))).unwrap().unwrap();
        assert_eq!((r.max_size, r.max_file), (1024, 2));
        for bad in [
            serde_json::json!({"max-size": "1x"}),
            serde_json::json!({"max-file": "0"}),
            serde_json::json!({"compress": "true"}),
            serde_json::json!({"max-size": 5}),
        ] {
            assert!(Rotation::parse(&cfg(bad.clone())).is_err(), "{bad}");
        }
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(LOG_FILE);
        let mut all = Vec::new();
        for i in 0..200 {
            all.extend(encode(1, format!("line {i:04}\n").as_bytes(), SystemTime::now()));
            std::fs::write(&p, &all).unwrap();
            r.enforce(&p).unwrap();
            all = std::fs::read(&p).unwrap();
            assert!(all.len() as u64 <= 2048);
        }
        let lines = decode(&all);
        assert!(lines.len() > 20 && lines.last().unwrap().line == b"line 0199\n", "{}", lines.len());
    }

    proptest::proptest! {
        #[test]
        fn random_options_never_panic(k in "[a-z-]{0,9}", v in "\\PC{0,12}") {
            let mut m = serde_json::Map::new();
            m.insert(k, serde_json::Value::String(v));
            let _ = Rotation::parse(&m);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_chunk_becomes_one_record_per_line() {
        let t = SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 5);
        let mut b = encode(1, b"a\nb\nc", t);
        b.extend(encode(2, b"e\n", t));
        let r = decode(&b);
        let lines: Vec<&[u8]> = r.iter().map(|r| r.line.as_slice()).collect();
        assert_eq!(lines, [&b"a\n"[..], b"b\n", b"c", b"e\n"]);
        assert_eq!((r[3].stream, r[3].time), (2, t));
        let f = Filter { stdout: true, stderr: true, tail: Some(1), ..Default::default() };
        assert_eq!(f.apply(r.clone())[0].line, b"e\n");
        let out_only = Filter { stdout: true, tail: Some(1), ..Default::default() };
        assert_eq!(out_only.apply(r)[0].line, b"c");
    }

    #[test]
    fn since_and_until_bound_records() {
        let at = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        let mut b = encode(1, b"old\n", at(100));
        b.extend(encode(1, b"mid\n", at(200)));
        b.extend(encode(1, b"new\n", at(300)));
        let f = Filter { stdout: true, since: Some(at(150)), until: Some(at(250)), ..Default::default() };
        let got = f.apply(decode(&b));
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].line, b"mid\n");
    }

    #[test]
    fn times_parse_and_print() {
        assert_eq!(parse_time("1700000000").unwrap(), SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000));
        assert_eq!(parse_time("1700000000.25").unwrap(), SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 250_000_000));
        assert_eq!(parse_time("2023-11-14T22:13:20Z").unwrap(), SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000));
        assert_eq!(parse_time("2000-02-29T00:00:00.5Z").unwrap(), SystemTime::UNIX_EPOCH + Duration::new(951_782_400, 500_000_000));
        for bad in ["", "x", "1.", "1.x", "-5", "2023-13-01T00:00:00Z", "2023-11-14 22:13:20"] {
            assert!(parse_time(bad).is_err(), "{bad}");
        }
        assert_eq!(timestamp(SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 7)), "2023-11-14T22:13:20.000000007Z");
    }

    proptest::proptest! {
        #[test]
        fn random_logs_never_panic(b in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            let _ = decode(&b);
            let _ = decode_frames(&b);
        }

        #[test]
        fn lines_survive_a_round_trip(data in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            let r = decode(&encode(1, &data, SystemTime::UNIX_EPOCH));
            let joined: Vec<u8> = r.iter().flat_map(|r| r.line.clone()).collect();
            proptest::prop_assert_eq!(joined, data);
        }

        #[test]
        fn random_times_never_panic(s in ".{0,40}") {
            let _ = parse_time(&s);
        }
    }
}
