// SPDX-License-Identifier: Apache-2.0
//! YCSB's core workloads A–F, generated the way YCSB's `CoreWorkload` generates them, for
//! the key-value benchmark.
//!
//! There is no maintained Rust YCSB, so this module re-implements the parts of the Java
//! client that decide *what* is asked of the store: the operation mix, the request
//! distributions (scrambled zipfian, skewed latest), the insert counter, the scan lengths and
//! the record layout. The runner decides how each [`Op`] maps onto the store.
//!
//! What matches YCSB (`core/.../workloads/CoreWorkload.java` and the generators it uses):
//!
//! * the operation mixes of `workloads/workloada`..`workloadf` ([`Workload`]);
//! * the operation chooser: one uniform draw walked over the proportions in the order read,
//!   update, insert, scan, read-modify-write;
//! * zipfian requests through the *scrambled* zipfian generator: a zipfian (constant 0.99)
//!   over 10^10 + 1 items with YCSB's precomputed zeta constant, hashed with FNV-1a 64 and
//!   taken modulo `records + 2 × expected inserts + 1`; a key number above the last one
//!   inserted is drawn again;
//! * "latest" requests through the skewed-latest generator: the last inserted key number minus
//!   a zipfian draw over the insert counter, whose zeta grows incrementally as keys are
//!   inserted; like YCSB, the grown generator keeps computing `eta` from the item count it was
//!   built with (a quirk of `ZipfianGenerator.nextLong`, kept so the shapes agree);
//! * inserts take the next key number from a counter that starts at `records`;
//! * records of [`FIELD_COUNT`] fields of [`FIELD_LEN`] bytes of printable ASCII; reads and
//!   scans read all fields (`readallfields=true`); updates and read-modify-writes write one
//!   field chosen uniformly (`writeallfields=false`); scan lengths uniform in 1..=100.
//!
//! Where it deviates, and why:
//!
//! * **Keys.** YCSB's key is `"user"` followed by the decimal FNV hash of the key number
//!   (`insertorder=hashed`), up to 23 bytes. The target's store takes keys of 1 to 16 bytes,
//!   so [`key_for`] writes the same hash as 16 lowercase hex digits. The order of the key
//!   numbers in the key space is still the hashed order, and byte order equals the numeric
//!   order of the hashes, so scans walk the hashed order (YCSB's string keys sort by the
//!   decimal text instead, which is a different, equally arbitrary permutation).
//! * **Randomness.** One seeded SplitMix64 stream ([`Rng`]) drives the run phase, so a seed
//!   reproduces a run exactly; YCSB draws from `ThreadLocalRandom`. Record values come from
//!   a stream seeded by the key number, so a record's bytes do not depend on when it is
//!   written (the load phase needs no state and a run-phase insert writes what a load of the
//!   same key number would).
//! * **One client thread.** Inserts are acknowledged as soon as they are issued, so YCSB's
//!   acknowledged-counter window never holds a gap.
//! * **64-bit key numbers** throughout; YCSB truncates them to `int` in places, which only
//!   matters beyond 2^31 records.

use std::fmt;
use std::str::FromStr;

use crate::{Error, Rng};

/// Fields in a record (YCSB's `fieldcount` default).
pub const FIELD_COUNT: usize = 10;
/// Bytes in a field (YCSB's `fieldlength` default, constant length).
pub const FIELD_LEN: usize = 100;
/// Bytes in a whole record: the fields concatenated, field 0 first.
pub const RECORD_LEN: usize = FIELD_COUNT * FIELD_LEN;
/// The longest scan of workload E (its `maxscanlength`); scans are uniform in 1..=this.
pub const MAX_SCAN_LEN: usize = 100;

/// YCSB's zipfian constant.
const ZIPFIAN_CONSTANT: f64 = 0.99;
/// The item count the scrambled zipfian generator draws ranks from before hashing them down.
const SCRAMBLED_ITEM_COUNT: u64 = 10_000_000_000;
/// zeta(10^10, 0.99) as YCSB precomputed it; summing 10^10 terms at start-up would take a
/// minute. The test `scrambled_zetan_matches_euler_maclaurin` checks it independently.
const SCRAMBLED_ZETAN: f64 = 26.46902820178302;

/// One of YCSB's six core workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Workload {
    /// Update heavy: read 0.5, update 0.5, zipfian.
    A,
    /// Read mostly: read 0.95, update 0.05, zipfian.
    B,
    /// Read only: read 1.0, zipfian.
    C,
    /// Read latest: read 0.95, insert 0.05, latest.
    D,
    /// Short ranges: scan 0.95 (1..=100 records, uniform), insert 0.05, zipfian.
    E,
    /// Read-modify-write: read 0.5, read-modify-write 0.5, zipfian.
    F,
}

/// Which generator picks the key of a read, update, scan or read-modify-write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Distribution {
    Zipfian,
    Latest,
}

/// A workload's operation proportions, in YCSB's chooser order.
#[derive(Debug, Clone, Copy)]
struct Mix {
    read: f64,
    update: f64,
    insert: f64,
    scan: f64,
    rmw: f64,
    distribution: Distribution,
}

/// The kinds of [`Op`], for the chooser.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpKind {
    Read,
    Update,
    Insert,
    Scan,
    ReadModifyWrite,
}

impl Mix {
    /// YCSB's `DiscreteGenerator`: the operations with a non-zero proportion, in the order
    /// read, update, insert, scan, read-modify-write, each taking its share of [0, 1) in turn;
    /// `u` picks one.
    fn choose(&self, u: f64) -> OpKind {
        let table = [
            (self.read, OpKind::Read),
            (self.update, OpKind::Update),
            (self.insert, OpKind::Insert),
            (self.scan, OpKind::Scan),
            (self.rmw, OpKind::ReadModifyWrite),
        ];
        let sum: f64 = table.iter().map(|&(p, _)| p).sum();
        let mut left = u;
        let mut last = OpKind::Read;
        for (p, kind) in table.into_iter().filter(|&(p, _)| p > 0.0) {
            let share = p / sum;
            if left < share {
                return kind;
            }
            left -= share;
            last = kind;
        }
        // Rounding can leave a draw just past the last share (YCSB would throw): take the
        // last operation.
        last
    }
}

impl Workload {
    /// All six, in order.
    pub const ALL: [Workload; 6] = [Workload::A, Workload::B, Workload::C, Workload::D, Workload::E, Workload::F];

    /// The lowercase letter, as [`Display`](fmt::Display) writes it and [`FromStr`] reads it.
    pub fn name(self) -> &'static str {
        match self {
            Workload::A => "a",
            Workload::B => "b",
            Workload::C => "c",
            Workload::D => "d",
            Workload::E => "e",
            Workload::F => "f",
        }
    }

    fn mix(self) -> Mix {
        let m = |read, update, insert, scan, rmw, distribution| Mix { read, update, insert, scan, rmw, distribution };
        match self {
            Workload::A => m(0.5, 0.5, 0.0, 0.0, 0.0, Distribution::Zipfian),
            Workload::B => m(0.95, 0.05, 0.0, 0.0, 0.0, Distribution::Zipfian),
            Workload::C => m(1.0, 0.0, 0.0, 0.0, 0.0, Distribution::Zipfian),
            Workload::D => m(0.95, 0.0, 0.05, 0.0, 0.0, Distribution::Latest),
            Workload::E => m(0.0, 0.0, 0.05, 0.95, 0.0, Distribution::Zipfian),
            Workload::F => m(0.5, 0.0, 0.0, 0.0, 0.5, Distribution::Zipfian),
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Workload {
    type Err = Error;

    /// `a`..`f`, any case; `workloada`..`workloadf` (YCSB's file names) are accepted too.
    fn from_str(s: &str) -> Result<Self, Error> {
        let lower = s.trim().to_ascii_lowercase();
        let letter = lower.strip_prefix("workload").unwrap_or(&lower);
        Workload::ALL
            .into_iter()
            .find(|w| w.name() == letter)
            .ok_or_else(|| Error::from(format!("unknown YCSB workload {s:?}: expected one of a, b, c, d, e, f (YCSB's core workloads A to F)")))
    }
}

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct YcsbConfig {
    /// The workload.
    pub workload: Workload,
    /// Records written by the load phase (YCSB's `recordcount`); at least 1.
    pub records: u64,
    /// Operations in the run phase (YCSB's `operationcount`).
    pub operations: u64,
    /// Seed of every random choice: the same config gives the same load and the same run.
    pub seed: u64,
}

impl Default for YcsbConfig {
    /// Workload A with the record and operation counts of YCSB's workload files (1000 each).
    fn default() -> Self {
        YcsbConfig { workload: Workload::A, records: 1000, operations: 1000, seed: 0x0059_C5B0 }
    }
}

/// One run-phase operation. Keys are [`key_for`] of a key number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Read the whole record.
    Read {
        /// The record's key.
        key: [u8; 16],
    },
    /// Overwrite one field of an existing record, leaving the others (the runner reads,
    /// merges and writes back, as YCSB's RocksDB binding does).
    Update {
        /// The record's key.
        key: [u8; 16],
        /// The field, `0..FIELD_COUNT`; it lives at `field * FIELD_LEN` in the value.
        field: usize,
        /// The field's new [`FIELD_LEN`] bytes.
        data: Vec<u8>,
    },
    /// Write a new record.
    Insert {
        /// The new key, the next key number's.
        key: [u8; 16],
        /// The whole record, [`RECORD_LEN`] bytes.
        value: Vec<u8>,
    },
    /// Read `count` records in key order, from `start` on.
    Scan {
        /// The first key.
        start: [u8; 16],
        /// Records to read, 1..=[`MAX_SCAN_LEN`].
        count: usize,
    },
    /// Read the whole record, then overwrite one field (timed as one operation).
    ReadModifyWrite {
        /// The record's key.
        key: [u8; 16],
        /// The field, `0..FIELD_COUNT`.
        field: usize,
        /// The field's new [`FIELD_LEN`] bytes.
        data: Vec<u8>,
    },
}

impl Op {
    /// YCSB's name for the operation, in lowercase: `read`, `update`, `insert`, `scan` or
    /// `read-modify-write`.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Read { .. } => "read",
            Op::Update { .. } => "update",
            Op::Insert { .. } => "insert",
            Op::Scan { .. } => "scan",
            Op::ReadModifyWrite { .. } => "read-modify-write",
        }
    }

    /// The key the operation addresses (a scan's first key).
    pub fn key(&self) -> &[u8; 16] {
        match self {
            Op::Read { key } | Op::Update { key, .. } | Op::Insert { key, .. } | Op::ReadModifyWrite { key, .. } => key,
            Op::Scan { start, .. } => start,
        }
    }
}

/// YCSB's `Utils.fnvhash64`: FNV-1a over the 8 little-endian bytes of `value`, then Java's
/// `Math.abs` of the result as a signed 64-bit number.
pub fn fnvhash64(value: u64) -> u64 {
    const OFFSET_BASIS: u64 = 0xCBF2_9CE4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01B3;
    let hash = value.to_le_bytes().iter().fold(OFFSET_BASIS, |h, &b| (h ^ u64::from(b)).wrapping_mul(PRIME));
    // Math.abs leaves Long.MIN_VALUE as it is, as wrapping_abs does.
    (hash as i64).wrapping_abs() as u64
}

/// The key of key number `keynum`: [`fnvhash64`] of it as 16 lowercase hex digits, so that
/// byte order is YCSB's hashed order (see the module docs for why not `"user" + decimal`).
pub fn key_for(keynum: u64) -> [u8; 16] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let hash = fnvhash64(keynum);
    let mut key = [0u8; 16];
    for (i, k) in key.iter_mut().enumerate() {
        *k = HEX[((hash >> (60 - 4 * i)) & 0xF) as usize];
    }
    key
}

/// zeta(n, θ) continued from `start` terms whose sum is `initial`: Σ_{i=start+1..=n} 1/i^θ.
fn zeta_from(start: u64, n: u64, theta: f64, initial: f64) -> f64 {
    (start..n).fold(initial, |sum, i| sum + 1.0 / ((i + 1) as f64).powf(theta))
}

/// zeta(n, θ) = Σ_{i=1..=n} 1/i^θ.
fn zeta(n: u64, theta: f64) -> f64 {
    zeta_from(0, n, theta, 0.0)
}

/// YCSB's `ZipfianGenerator`: Gray et al.'s rejection-free zipfian ("Quickly generating
/// billion-record synthetic databases", SIGMOD 1994). Item 0 is the most popular.
#[derive(Debug, Clone)]
struct Zipfian {
    /// The item count it was built for; `eta` keeps using it when the count grows (YCSB does).
    items: u64,
    base: u64,
    theta: f64,
    alpha: f64,
    zeta2theta: f64,
    zetan: f64,
    eta: f64,
    /// The item count `zetan` is summed up to.
    count_for_zeta: u64,
}

impl Zipfian {
    /// Over `0..items`, summing zeta directly (O(items)).
    fn new(items: u64, theta: f64) -> Self {
        Self::with_zetan(0, items, theta, zeta(items, theta))
    }

    /// Over `base..base + items`, with zeta(items, θ) given.
    fn with_zetan(base: u64, items: u64, theta: f64, zetan: f64) -> Self {
        let zeta2theta = zeta(2, theta);
        Zipfian { items, base, theta, alpha: 1.0 / (1.0 - theta), zeta2theta, zetan, eta: eta(items, theta, zeta2theta, zetan), count_for_zeta: items }
    }

    /// A draw over the item count it was built for.
    fn next(&mut self, rng: &mut Rng) -> u64 {
        self.next_of(self.items, rng)
    }

    /// A draw over `itemcount` items; a larger count than before extends zeta incrementally.
    fn next_of(&mut self, itemcount: u64, rng: &mut Rng) -> u64 {
        if itemcount > self.count_for_zeta {
            self.zetan = zeta_from(self.count_for_zeta, itemcount, self.theta, self.zetan);
            self.count_for_zeta = itemcount;
            self.eta = eta(self.items, self.theta, self.zeta2theta, self.zetan);
        }
        self.draw_for(itemcount, rng.next_f64())
    }

    /// The draw for uniform `u` in [0, 1).
    fn draw_for(&self, itemcount: u64, u: f64) -> u64 {
        let uz = u * self.zetan;
        if uz < 1.0 {
            return self.base;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return self.base + 1;
        }
        let rank = (itemcount as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        // The formula stays below itemcount for any sane eta; the clamp only guards the
        // degenerate one- and two-item generators (a NaN rank casts to 0).
        self.base + rank.min(itemcount.saturating_sub(1))
    }
}

fn eta(items: u64, theta: f64, zeta2theta: f64, zetan: f64) -> f64 {
    (1.0 - (2.0 / items as f64).powf(1.0 - theta)) / (1.0 - zeta2theta / zetan)
}

/// YCSB's `ScrambledZipfianGenerator`: popular items spread over the key space instead of
/// clustered at its start.
#[derive(Debug, Clone)]
struct ScrambledZipfian {
    zipfian: Zipfian,
    itemcount: u64,
}

impl ScrambledZipfian {
    /// Over `0..itemcount`.
    fn new(itemcount: u64) -> Self {
        // YCSB builds it as ZipfianGenerator(0, ITEM_COUNT), i.e. ITEM_COUNT + 1 items, with
        // the zeta precomputed for ITEM_COUNT.
        ScrambledZipfian { zipfian: Zipfian::with_zetan(0, SCRAMBLED_ITEM_COUNT + 1, ZIPFIAN_CONSTANT, SCRAMBLED_ZETAN), itemcount }
    }

    fn next(&mut self, rng: &mut Rng) -> u64 {
        fnvhash64(self.zipfian.next(rng)) % self.itemcount
    }
}

/// The request distribution of a workload.
#[derive(Debug, Clone)]
enum KeyChooser {
    Zipfian(ScrambledZipfian),
    /// YCSB's `SkewedLatestGenerator`: the last inserted key number minus a zipfian draw.
    Latest(Zipfian),
}

/// The generator of one YCSB run: its load phase and its run phase.
#[derive(Debug, Clone)]
pub struct Ycsb {
    cfg: YcsbConfig,
    mix: Mix,
    chooser: KeyChooser,
    /// The run phase's random stream.
    rng: Rng,
    /// Seeds the per-record streams of record values.
    record_seed: u64,
    /// The key number the next insert takes; every key number below it exists.
    next_insert: u64,
    /// Operations handed out by [`Ycsb::operations`] so far.
    issued: u64,
}

impl Ycsb {
    /// The generator for `cfg`. The "latest" workload (D) sums zeta over the records here,
    /// which takes about a second per 10^7 records.
    ///
    /// # Panics
    ///
    /// If `cfg.records` is 0: YCSB needs a loaded record to choose keys from.
    pub fn new(cfg: &YcsbConfig) -> Ycsb {
        assert!(cfg.records > 0, "YCSB workload {} needs at least one record to load; got records = 0", cfg.workload);
        let mix = cfg.workload.mix();
        let chooser = match mix.distribution {
            Distribution::Zipfian => {
                // Size the key space for the inserts to come (twice the expected number, as
                // YCSB does) so the popular keys stay popular as the space fills; key numbers
                // not inserted yet are drawn again.
                let expected_inserts = (cfg.operations as f64 * mix.insert * 2.0) as u64;
                KeyChooser::Zipfian(ScrambledZipfian::new(cfg.records + expected_inserts + 1))
            }
            // Over the last inserted key number, records - 1, as YCSB builds it.
            Distribution::Latest => KeyChooser::Latest(Zipfian::new(cfg.records - 1, ZIPFIAN_CONSTANT)),
        };
        let mut seeds = Rng::new(cfg.seed);
        let record_seed = seeds.next_u64();
        let rng = Rng::new(seeds.next_u64());
        Ycsb { cfg: *cfg, mix, chooser, rng, record_seed, next_insert: cfg.records, issued: 0 }
    }

    /// The configuration it was built from.
    pub fn config(&self) -> &YcsbConfig {
        &self.cfg
    }

    /// Records that exist so far: the loaded ones plus the run phase's inserts.
    pub fn record_count(&self) -> u64 {
        self.next_insert
    }

    /// The record of key number `keynum`: [`FIELD_COUNT`] fields of [`FIELD_LEN`] printable
    /// ASCII bytes, concatenated. The same seed and key number always give the same bytes.
    pub fn record(&self, keynum: u64) -> Vec<u8> {
        let mut rng = Rng::new(self.record_seed ^ keynum.wrapping_mul(0xD1B5_4A32_D192_ED03));
        let mut value = vec![0u8; RECORD_LEN];
        fill_printable(&mut rng, &mut value);
        value
    }

    /// The load phase: `records` (key, value) pairs in key-number order 0..records.
    pub fn load(&self) -> impl Iterator<Item = ([u8; 16], Vec<u8>)> + '_ {
        (0..self.cfg.records).map(|k| (key_for(k), self.record(k)))
    }

    /// The run phase: `operations` operations (fewer if [`Ycsb::next_op`] or an earlier call
    /// already handed some out).
    pub fn operations(&mut self) -> impl Iterator<Item = Op> + '_ {
        std::iter::from_fn(move || (self.issued < self.cfg.operations).then(|| self.next_op()))
    }

    /// The next run-phase operation, whether or not `operations` are used up.
    pub fn next_op(&mut self) -> Op {
        self.issued += 1;
        match self.mix.choose(self.rng.next_f64()) {
            OpKind::Read => Op::Read { key: key_for(self.next_keynum()) },
            OpKind::Update => {
                let key = key_for(self.next_keynum());
                let (field, data) = self.field_value();
                Op::Update { key, field, data }
            }
            OpKind::Insert => {
                let keynum = self.next_insert;
                self.next_insert += 1;
                Op::Insert { key: key_for(keynum), value: self.record(keynum) }
            }
            OpKind::Scan => {
                let start = key_for(self.next_keynum());
                let count = 1 + self.rng.below(MAX_SCAN_LEN as u64) as usize;
                Op::Scan { start, count }
            }
            OpKind::ReadModifyWrite => {
                let key = key_for(self.next_keynum());
                let (field, data) = self.field_value();
                Op::ReadModifyWrite { key, field, data }
            }
        }
    }

    /// A key number of an existing record, from the workload's request distribution.
    fn next_keynum(&mut self) -> u64 {
        let last = self.next_insert - 1;
        match &mut self.chooser {
            KeyChooser::Zipfian(z) => loop {
                let k = z.next(&mut self.rng);
                if k <= last {
                    return k;
                }
            },
            KeyChooser::Latest(z) => last.saturating_sub(z.next_of(last, &mut self.rng)),
        }
    }

    /// A field chosen uniformly and its new bytes.
    fn field_value(&mut self) -> (usize, Vec<u8>) {
        let field = self.rng.below(FIELD_COUNT as u64) as usize;
        let mut data = vec![0u8; FIELD_LEN];
        fill_printable(&mut self.rng, &mut data);
        (field, data)
    }
}

/// Random printable ASCII (space to `~`), as YCSB's `RandomByteIterator` writes text rather
/// than arbitrary bytes.
fn fill_printable(rng: &mut Rng, buf: &mut [u8]) {
    for chunk in buf.chunks_mut(8) {
        for (b, r) in chunk.iter_mut().zip(rng.next_u64().to_le_bytes()) {
            *b = b' ' + r % 95;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};

    fn run(workload: Workload, records: u64, operations: u64, seed: u64) -> (Ycsb, Vec<Op>) {
        let mut y = Ycsb::new(&YcsbConfig { workload, records, operations, seed });
        let ops: Vec<Op> = y.operations().collect();
        (y, ops)
    }

    /// Key -> key number for key numbers 0..n.
    fn keynums(n: u64) -> HashMap<[u8; 16], u64> {
        (0..n).map(|k| (key_for(k), k)).collect()
    }

    #[test]
    fn workload_parses_and_displays() {
        for w in Workload::ALL {
            assert_eq!(w.to_string().parse::<Workload>().unwrap(), w);
            assert_eq!(w.to_string().to_uppercase().parse::<Workload>().unwrap(), w);
            assert_eq!(format!("workload{w}").parse::<Workload>().unwrap(), w);
        }
        assert_eq!("C".parse::<Workload>().unwrap(), Workload::C);
        let err = "g".parse::<Workload>().unwrap_err().to_string();
        assert!(err.contains("\"g\"") && err.contains("a, b, c, d, e, f"), "{err}");
        assert!("".parse::<Workload>().is_err());
        assert!("ab".parse::<Workload>().is_err());
    }

    #[test]
    fn operation_mix_matches_proportions() {
        let n = 100_000u64;
        for w in Workload::ALL {
            let (_, ops) = run(w, 1000, n, 7);
            assert_eq!(ops.len() as u64, n, "{w}: operation count");
            let mut counts: HashMap<&str, u64> = HashMap::new();
            for op in &ops {
                *counts.entry(op.name()).or_default() += 1;
            }
            let m = w.mix();
            for (name, p) in [("read", m.read), ("update", m.update), ("insert", m.insert), ("scan", m.scan), ("read-modify-write", m.rmw)] {
                let share = *counts.get(name).unwrap_or(&0) as f64 / n as f64;
                // Five standard deviations of a binomial share (at most 0.008 here).
                let tolerance = 5.0 * (p * (1.0 - p) / n as f64).sqrt();
                assert!((share - p).abs() <= tolerance, "workload {w}: {name} share {share}, expected {p} ± {tolerance}");
            }
        }
    }

    #[test]
    fn chooser_walks_the_proportions_in_ycsb_order() {
        let e = Workload::E.mix();
        // E: insert 0.05 comes before scan 0.95 in YCSB's order.
        assert_eq!(e.choose(0.0), OpKind::Insert);
        assert_eq!(e.choose(0.049), OpKind::Insert);
        assert_eq!(e.choose(0.051), OpKind::Scan);
        let f = Workload::F.mix();
        assert_eq!(f.choose(0.499), OpKind::Read);
        assert_eq!(f.choose(0.501), OpKind::ReadModifyWrite);
        // A draw past the sum by rounding takes the last operation.
        assert_eq!(Workload::B.mix().choose(1.0), OpKind::Update);
        assert_eq!(Workload::C.mix().choose(0.999_999), OpKind::Read);
    }

    #[test]
    fn zeta_matches_direct_sums() {
        // Reference values: math.fsum(1/(i+1)**0.99 for i in range(n)) in Python.
        for (n, want) in [(1, 1.0), (2, 1.503_477_775_028_359_4), (10, 2.956_107_516_510_364), (1000, 7.728_953_217_284_738), (100_000, 12.778_338_062_551_171)]
        {
            let got = zeta(n, ZIPFIAN_CONSTANT);
            assert!((got - want).abs() < 1e-9 * want, "zeta({n}, 0.99) = {got}, expected {want}");
        }
        // Continuing a sum gives the sum.
        let split = zeta_from(400, 1000, ZIPFIAN_CONSTANT, zeta(400, ZIPFIAN_CONSTANT));
        assert!((split - zeta(1000, ZIPFIAN_CONSTANT)).abs() < 1e-12);
    }

    #[test]
    fn scrambled_zetan_matches_euler_maclaurin() {
        // zeta(N, s) = Σ_{i<m} i^-s + Σ_{i=m..N} i^-s, the tail by Euler–Maclaurin:
        // ∫_m^N x^-s dx + (m^-s + N^-s)/2 + s/12 (m^-s-1 - N^-s-1).
        let (s, m, big) = (ZIPFIAN_CONSTANT, 1000.0f64, SCRAMBLED_ITEM_COUNT as f64);
        let head = zeta(999, s);
        let tail = (big.powf(1.0 - s) - m.powf(1.0 - s)) / (1.0 - s) + (m.powf(-s) + big.powf(-s)) / 2.0 + s / 12.0 * (m.powf(-s - 1.0) - big.powf(-s - 1.0));
        let estimate = head + tail;
        // YCSB's constant is a sum of 10^10 doubles, so allow its rounding drift.
        assert!((estimate - SCRAMBLED_ZETAN).abs() < 1e-4 * SCRAMBLED_ZETAN, "zeta(1e10, 0.99) ≈ {estimate}, YCSB's constant {SCRAMBLED_ZETAN}");
    }

    #[test]
    fn zipfian_draws_match_gray_formula() {
        // Reference: Python, zetan = zeta(1000), eta = (1-(2/n)**0.01)/(1-zeta(2)/zetan),
        // rank = 0 if u*zetan < 1, 1 if < 1 + 0.5**0.99, else int(n*(eta*u-eta+1)**100).
        let z = Zipfian::new(1000, ZIPFIAN_CONSTANT);
        assert!((z.eta - 0.074_806_086_706_898_03).abs() < 1e-12, "eta {}", z.eta);
        for (u, want) in [(0.05, 0), (0.2, 2), (0.5, 22), (0.9, 471), (0.999, 992)] {
            assert_eq!(z.draw_for(1000, u), want, "u = {u}");
        }
    }

    #[test]
    fn zipfian_grows_zeta_incrementally_and_keeps_ycsbs_eta() {
        let mut z = Zipfian::new(100, ZIPFIAN_CONSTANT);
        let mut rng = Rng::new(1);
        assert!(z.next_of(200, &mut rng) < 200);
        let zn = zeta(200, ZIPFIAN_CONSTANT);
        assert!((z.zetan - zn).abs() < 1e-12, "zetan {} after growing to 200, zeta(200) = {zn}", z.zetan);
        // YCSB's nextLong recomputes eta from the item count the generator was built with
        // (100), not the grown one.
        let want = (1.0 - (2.0f64 / 100.0).powf(1.0 - ZIPFIAN_CONSTANT)) / (1.0 - zeta(2, ZIPFIAN_CONSTANT) / zn);
        assert!((z.eta - want).abs() < 1e-12, "eta {}, YCSB's {want}", z.eta);
        // A smaller count later keeps the grown zeta (YCSB's allowitemcountdecrease=false).
        z.next_of(150, &mut rng);
        assert!((z.zetan - zn).abs() < 1e-12);
    }

    #[test]
    fn zipfian_skew_is_zipf_099() {
        let n = 1000u64;
        let draws = 200_000u64;
        let mut z = Zipfian::new(n, ZIPFIAN_CONSTANT);
        let mut rng = Rng::new(11);
        let mut counts = vec![0u64; n as usize];
        for _ in 0..draws {
            let k = z.next(&mut rng);
            assert!(k < n, "draw {k} out of 0..{n}");
            counts[k as usize] += 1;
        }
        // Item r has probability (r+1)^-0.99 / zeta(n) exactly for r = 0, 1.
        let zn = zeta(n, ZIPFIAN_CONSTANT);
        for (r, p) in [(0usize, 1.0 / zn), (1, 0.5f64.powf(ZIPFIAN_CONSTANT) / zn)] {
            let share = counts[r] as f64 / draws as f64;
            let tol = 5.0 * (p * (1.0 - p) / draws as f64).sqrt();
            assert!((share - p).abs() < tol, "item {r}: share {share}, zipf 0.99 gives {p}");
        }
        // Far from uniform: the first 10% of items take about zeta(100)/zeta(1000) = 0.67.
        let head: u64 = counts[..100].iter().sum();
        let p = zeta(100, ZIPFIAN_CONSTANT) / zn;
        assert!((head as f64 / draws as f64 - p).abs() < 0.02, "top 10% share {}, expected {p}", head as f64 / draws as f64);
    }

    #[test]
    fn scrambled_zipfian_requests_are_skewed_and_in_range() {
        let records = 1000;
        let (_, ops) = run(Workload::C, records, 100_000, 3);
        let names = keynums(records);
        let mut counts: HashMap<u64, u64> = HashMap::new();
        for op in &ops {
            let Op::Read { key } = op else { panic!("workload C issued {op:?}") };
            let k = *names.get(key).unwrap_or_else(|| panic!("read of a key never loaded: {key:?}"));
            *counts.entry(k).or_default() += 1;
        }
        let mut sorted: Vec<u64> = counts.values().copied().collect();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let top = sorted[0] as f64 / ops.len() as f64;
        // The hottest key gets at least the rank-0 mass of zipf(0.99) over 10^10 items,
        // 1/26.47 = 3.8%, plus the tail ranks hashed onto it (about 1/records).
        assert!((0.035..0.06).contains(&top), "hottest key share {top}");
        // Uniform would give every key 0.1%; the hottest 1% of keys take far more than 1%.
        let hot: u64 = sorted[..10].iter().sum();
        assert!(hot as f64 / ops.len() as f64 > 0.12, "hottest 10 keys share {}", hot as f64 / ops.len() as f64);
        // Scrambled: the hot keys are not the first key numbers.
        let mut by_count: Vec<(u64, u64)> = counts.into_iter().collect();
        by_count.sort_unstable_by_key(|&(_, c)| std::cmp::Reverse(c));
        assert!(by_count[..10].iter().any(|&(k, _)| k >= 10), "hot keys {:?} clustered at the start", &by_count[..10]);
    }

    #[test]
    fn latest_favours_recent_inserts() {
        let (records, operations) = (1000u64, 100_000u64);
        let (y, ops) = run(Workload::D, records, operations, 5);
        let names = keynums(y.record_count());
        let mut last = records - 1;
        let (mut reads, mut newest, mut recent) = (0u64, 0u64, 0u64);
        for op in &ops {
            let k = names[op.key()];
            match op {
                Op::Insert { .. } => {
                    assert_eq!(k, last + 1, "inserts take the next key number");
                    last = k;
                }
                Op::Read { .. } => {
                    assert!(k <= last, "read of key number {k} beyond the last inserted {last}");
                    reads += 1;
                    newest += u64::from(k == last);
                    recent += u64::from(last - k < (last + 1) / 10);
                }
                other => panic!("workload D issued {other:?}"),
            }
        }
        // The newest record is zipf rank 0: 1/zeta(last), between 1/zeta(999) = 0.129 and
        // 1/zeta(6000) = 0.106 as the inserts add items.
        let share = newest as f64 / reads as f64;
        assert!((0.095..0.14).contains(&share), "newest record's read share {share}");
        // The newest 10% take about two thirds of the reads; uniform would be 10%.
        let share = recent as f64 / reads as f64;
        assert!(share > 0.6, "newest 10% of records get {share} of reads");
    }

    #[test]
    fn keys_are_distinct_hex_and_hashed() {
        let mut seen = HashSet::new();
        for k in 0..1_000_000u64 {
            let key = key_for(k);
            assert!(key.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)), "{key:?}");
            assert!(seen.insert(key), "key numbers collide at {k}");
        }
        // FNV-1a 64 of the 8 little-endian bytes, then abs; values from a Python reference.
        assert_eq!(&key_for(0), b"573807cdd7e5c63b");
        assert_eq!(&key_for(1), b"7632ced6e2d5105c");
        assert_eq!(&key_for(1000), b"529cdc7da0589924");
        // Byte order is the hash's numeric order.
        let (a, b) = (key_for(3), key_for(4));
        assert_eq!(a < b, fnvhash64(3) < fnvhash64(4));
    }

    #[test]
    fn load_writes_every_record_in_keynum_order() {
        let y = Ycsb::new(&YcsbConfig { workload: Workload::A, records: 500, operations: 0, seed: 1 });
        let loaded: Vec<_> = y.load().collect();
        assert_eq!(loaded.len(), 500);
        for (k, (key, value)) in loaded.iter().enumerate() {
            assert_eq!(*key, key_for(k as u64));
            assert_eq!(value.len(), RECORD_LEN);
            assert!(value.iter().all(|b| (b' '..=b'~').contains(b)), "record {k} is not printable");
        }
        assert_ne!(loaded[0].1, loaded[1].1, "records differ");
    }

    #[test]
    fn updates_write_one_field() {
        for w in [Workload::A, Workload::F] {
            let (_, ops) = run(w, 100, 20_000, 9);
            let mut fields = [0u64; FIELD_COUNT];
            for op in ops {
                if let Op::Update { field, data, .. } | Op::ReadModifyWrite { field, data, .. } = op {
                    assert!(field < FIELD_COUNT);
                    assert_eq!(data.len(), FIELD_LEN);
                    fields[field] += 1;
                }
            }
            // Uniform over the fields: about 1000 each out of about 10000.
            assert!(fields.iter().all(|&c| (800..1200).contains(&c)), "workload {w}: field choices {fields:?}");
        }
    }

    #[test]
    fn scan_lengths_are_uniform_in_1_to_100() {
        let (_, ops) = run(Workload::E, 1000, 100_000, 13);
        let mut lengths = [0u64; MAX_SCAN_LEN + 1];
        let mut scans = 0u64;
        for op in &ops {
            if let Op::Scan { count, .. } = op {
                assert!((1..=MAX_SCAN_LEN).contains(count), "scan length {count}");
                lengths[*count] += 1;
                scans += 1;
            }
        }
        let expected = scans as f64 / MAX_SCAN_LEN as f64;
        for (len, &c) in lengths.iter().enumerate().skip(1) {
            assert!((c as f64 - expected).abs() < 6.0 * expected.sqrt(), "length {len}: {c} scans, expected about {expected}");
        }
        let mean = lengths.iter().enumerate().map(|(l, &c)| l as f64 * c as f64).sum::<f64>() / scans as f64;
        assert!((mean - 50.5).abs() < 0.5, "mean scan length {mean}");
    }

    #[test]
    fn inserts_extend_the_key_space() {
        for w in [Workload::D, Workload::E] {
            let records = 200u64;
            let (y, ops) = run(w, records, 20_000, 17);
            let inserts: Vec<&Op> = ops.iter().filter(|op| matches!(op, Op::Insert { .. })).collect();
            assert!(!inserts.is_empty());
            assert_eq!(y.record_count(), records + inserts.len() as u64);
            for (i, op) in inserts.iter().enumerate() {
                let Op::Insert { key, value } = op else { unreachable!() };
                assert_eq!(*key, key_for(records + i as u64), "workload {w}: insert {i}");
                assert_eq!(*value, y.record(records + i as u64));
            }
            // Requests reach the inserted records, and never a key number not inserted yet
            // (the zipfian chooser draws again past the last insert).
            let names = keynums(y.record_count());
            let mut last = records - 1;
            let mut hits_new = 0;
            for op in &ops {
                let k = names[op.key()];
                if let Op::Insert { .. } = op {
                    last = k;
                } else {
                    assert!(k <= last, "workload {w}: request for key number {k} before it was inserted (last {last})");
                    hits_new += u64::from(k >= records);
                }
            }
            assert!(hits_new > 0, "workload {w}: no request reached an inserted record");
        }
    }

    #[test]
    fn a_seed_reproduces_the_run() {
        for w in Workload::ALL {
            let cfg = YcsbConfig { workload: w, records: 300, operations: 2000, seed: 42 };
            let (mut a, mut b) = (Ycsb::new(&cfg), Ycsb::new(&cfg));
            assert!(a.load().eq(b.load()), "workload {w}: load differs");
            let ops: Vec<Op> = a.operations().collect();
            assert_eq!(ops, b.operations().collect::<Vec<_>>(), "workload {w}: run differs");
            let mut c = Ycsb::new(&YcsbConfig { seed: 43, ..cfg });
            assert_ne!(ops, c.operations().collect::<Vec<_>>(), "workload {w}: seed ignored");
            assert_ne!(a.record(0), c.record(0), "workload {w}: seed ignored by values");
        }
    }

    #[test]
    fn operations_stop_at_the_count_and_tiny_loads_work() {
        let mut y = Ycsb::new(&YcsbConfig { workload: Workload::B, records: 10, operations: 5, seed: 0 });
        assert_eq!(y.operations().count(), 5);
        assert_eq!(y.operations().count(), 0);
        // One record: every request is for key number 0 (D reads the newest records).
        for w in Workload::ALL {
            let (y, ops) = run(w, 1, 500, 1);
            let names = keynums(y.record_count());
            assert!(ops.iter().all(|op| names.contains_key(op.key())), "workload {w} with one record");
        }
    }

    #[test]
    #[should_panic(expected = "at least one record")]
    fn zero_records_is_refused() {
        Ycsb::new(&YcsbConfig { records: 0, ..Default::default() });
    }
}
