// SPDX-License-Identifier: Apache-2.0
//! LevelDB `db_bench`-style key-value workloads: `fillseq`, `fillrandom`, `readseq` and
//! `readrandom` over `n` entries.
//!
//! As in `db_bench`: keys are 16 bytes, the key number in decimal zero-padded to 16 digits;
//! the sequential benchmarks take key numbers 0..n in order, the random ones draw `n` key
//! numbers uniformly from 0..n (with repeats, so `fillrandom` leaves about 63% of the key
//! numbers written and `readrandom` asks for each about once). Values are compressible to
//! half their size, built like `db_bench`'s `RandomGenerator`: a 1 MiB pool of 100-byte
//! pieces, each 50 random printable bytes written twice, from which values are cut one after
//! another, wrapping at the end. Whether the store compresses or not, its values then have
//! the shape `db_bench`'s have. The generators are seeded ([`Rng`]) where `db_bench` uses
//! fixed seeds. The value sizes the benchmarks use are 100 bytes (`db_bench`'s default) and
//! 4 KiB ([`DB_BENCH_VALUE_SIZES`]).
//!
//! `db_bench`'s `readseq` walks the database with an iterator; [`DbBench::keys`] gives the
//! keys that walk visits, so a runner can either scan or get them one by one.

use std::fmt;
use std::str::FromStr;

use crate::{Error, Rng};

/// The value sizes the benchmarks use: `db_bench`'s default 100 bytes, and a 4 KiB page.
pub const DB_BENCH_VALUE_SIZES: [usize; 2] = [100, 4096];

/// The fraction of a value that is random; the rest repeats it (`--compression_ratio`).
const COMPRESSION_RATIO: f64 = 0.5;
/// Bytes per compressible piece of the value pool.
const PIECE_LEN: usize = 100;
/// The value pool's size: larger than a compressor's window, as in `db_bench`.
const POOL_LEN: usize = 1 << 20;

/// One of the `db_bench` benchmarks this rig runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DbBench {
    /// Write `n` entries in key order.
    FillSeq,
    /// Write `n` entries at uniformly random key numbers in 0..n.
    FillRandom,
    /// Read `n` entries in key order.
    ReadSeq,
    /// Read `n` uniformly random key numbers in 0..n.
    ReadRandom,
}

impl DbBench {
    /// All four, in the order `db_bench` runs them by default (fills first).
    pub const ALL: [DbBench; 4] = [DbBench::FillSeq, DbBench::FillRandom, DbBench::ReadSeq, DbBench::ReadRandom];

    /// `db_bench`'s name: `fillseq`, `fillrandom`, `readseq` or `readrandom`.
    pub fn name(self) -> &'static str {
        match self {
            DbBench::FillSeq => "fillseq",
            DbBench::FillRandom => "fillrandom",
            DbBench::ReadSeq => "readseq",
            DbBench::ReadRandom => "readrandom",
        }
    }

    /// Whether it writes (the fills) rather than reads.
    pub fn is_fill(self) -> bool {
        matches!(self, DbBench::FillSeq | DbBench::FillRandom)
    }

    /// Whether its key numbers are random rather than in order.
    pub fn is_random(self) -> bool {
        matches!(self, DbBench::FillRandom | DbBench::ReadRandom)
    }

    /// The `n` key numbers it visits, in order: 0..n, or `n` uniform draws from 0..n.
    pub fn key_numbers(self, n: u64, seed: u64) -> impl Iterator<Item = u64> {
        let mut rng = Rng::new(seed);
        let random = self.is_random();
        (0..n).map(move |i| if random { rng.below(n) } else { i })
    }

    /// The `n` keys it visits ([`db_bench_key`] of [`DbBench::key_numbers`]).
    pub fn keys(self, n: u64, seed: u64) -> impl Iterator<Item = [u8; 16]> {
        self.key_numbers(n, seed).map(db_bench_key)
    }

    /// The `n` (key, value) pairs a fill writes, values of `value_size` bytes. For the read
    /// benchmarks it gives their keys with fresh values, which is rarely what is wanted: fill
    /// first, then read [`DbBench::keys`].
    pub fn entries(self, n: u64, value_size: usize, seed: u64) -> impl Iterator<Item = ([u8; 16], Vec<u8>)> {
        let mut values = DbBenchValues::new(value_size, seed ^ 0xDB_BE4C);
        self.keys(n, seed).map(move |k| (k, values.next_value().to_vec()))
    }
}

impl fmt::Display for DbBench {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DbBench {
    type Err = Error;

    /// `fillseq`, `fillrandom`, `readseq` or `readrandom`, any case.
    fn from_str(s: &str) -> Result<Self, Error> {
        let lower = s.trim().to_ascii_lowercase();
        DbBench::ALL
            .into_iter()
            .find(|b| b.name() == lower)
            .ok_or_else(|| Error::from(format!("unknown db_bench benchmark {s:?}: expected one of fillseq, fillrandom, readseq, readrandom")))
    }
}

/// `db_bench`'s key for key number `k`: the decimal number zero-padded to 16 digits
/// (`%016d`), so byte order is numeric order.
///
/// # Panics
///
/// If `k` has more than 16 digits (`db_bench`'s key numbers are `int`s, far below).
pub fn db_bench_key(k: u64) -> [u8; 16] {
    assert!(k < 10_000_000_000_000_000, "db_bench key number {k} does not fit in 16 decimal digits");
    let mut key = [b'0'; 16];
    let mut v = k;
    for b in key.iter_mut().rev() {
        *b = b'0' + (v % 10) as u8;
        v /= 10;
    }
    key
}

/// Compressible values, cut one after another from a pool as `db_bench`'s `RandomGenerator`
/// does (see the module docs).
#[derive(Debug, Clone)]
pub struct DbBenchValues {
    pool: Vec<u8>,
    len: usize,
    pos: usize,
}

impl DbBenchValues {
    /// Values of `value_size` bytes from a pool seeded by `seed`.
    pub fn new(value_size: usize, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        // At least 1 MiB, and always room for a whole value.
        let pool_len = POOL_LEN.max(value_size).next_multiple_of(PIECE_LEN);
        let raw_len = ((PIECE_LEN as f64 * COMPRESSION_RATIO) as usize).max(1);
        let mut pool = Vec::with_capacity(pool_len);
        let mut raw = vec![0u8; raw_len];
        while pool.len() < pool_len {
            for b in raw.iter_mut() {
                *b = b' ' + rng.below(95) as u8;
            }
            for i in 0..PIECE_LEN {
                pool.push(raw[i % raw_len]);
            }
        }
        DbBenchValues { pool, len: value_size, pos: 0 }
    }

    /// The next value.
    pub fn next_value(&mut self) -> &[u8] {
        if self.pos + self.len > self.pool.len() {
            self.pos = 0;
        }
        self.pos += self.len;
        &self.pool[self.pos - self.len..self.pos]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_parse_and_display() {
        for b in DbBench::ALL {
            assert_eq!(b.to_string().parse::<DbBench>().unwrap(), b);
            assert_eq!(b.name().to_uppercase().parse::<DbBench>().unwrap(), b);
        }
        assert_eq!(DbBench::FillSeq.to_string(), "fillseq");
        assert_eq!(DbBench::ReadRandom.to_string(), "readrandom");
        let err = "fill".parse::<DbBench>().unwrap_err().to_string();
        assert!(err.contains("\"fill\"") && err.contains("fillseq, fillrandom, readseq, readrandom"), "{err}");
    }

    #[test]
    fn keys_are_zero_padded_decimal() {
        assert_eq!(&db_bench_key(0), b"0000000000000000");
        assert_eq!(&db_bench_key(42), b"0000000000000042");
        assert_eq!(&db_bench_key(9_999_999_999_999_999), b"9999999999999999");
        assert_eq!(&db_bench_key(1_234_567), format!("{:016}", 1_234_567).as_bytes());
        // Byte order is numeric order.
        assert!(db_bench_key(99) < db_bench_key(100));
    }

    #[test]
    #[should_panic(expected = "16 decimal digits")]
    fn a_17_digit_key_number_is_refused() {
        db_bench_key(10_000_000_000_000_000);
    }

    #[test]
    fn sequential_benchmarks_walk_in_order() {
        for b in [DbBench::FillSeq, DbBench::ReadSeq] {
            let keys: Vec<_> = b.keys(1000, 1).collect();
            assert_eq!(keys, (0..1000).map(db_bench_key).collect::<Vec<_>>(), "{b}");
        }
    }

    #[test]
    fn random_benchmarks_draw_uniformly_with_repeats() {
        let n = 100_000u64;
        for b in [DbBench::FillRandom, DbBench::ReadRandom] {
            let nums: Vec<u64> = b.key_numbers(n, 5).collect();
            assert_eq!(nums.len() as u64, n);
            assert!(nums.iter().all(|&k| k < n), "{b}: key number out of range");
            assert!(nums.windows(2).any(|w| w[0] > w[1]), "{b}: in order");
            // Draws with replacement: about 1 - 1/e = 63.2% distinct.
            let distinct = nums.iter().collect::<HashSet<_>>().len() as f64 / n as f64;
            assert!((distinct - 0.632).abs() < 0.01, "{b}: {distinct} distinct");
            let mut deciles = [0u64; 10];
            for &k in &nums {
                deciles[(k * 10 / n) as usize] += 1;
            }
            assert!(deciles.iter().all(|&c| (9_000..11_000).contains(&c)), "{b}: deciles {deciles:?}");
        }
        assert_ne!(DbBench::FillRandom.key_numbers(100, 1).collect::<Vec<_>>(), DbBench::FillRandom.key_numbers(100, 2).collect::<Vec<_>>());
    }

    #[test]
    fn values_have_the_size_and_half_compressible_shape() {
        for size in DB_BENCH_VALUE_SIZES {
            let entries: Vec<_> = DbBench::FillSeq.entries(600, size, 3).collect();
            assert!(entries.iter().all(|(_, v)| v.len() == size && v.iter().all(|b| (b' '..=b'~').contains(b))));
            assert_ne!(entries[0].1, entries[1].1);
            // Same seed, same entries.
            assert!(entries.iter().cloned().eq(DbBench::FillSeq.entries(600, size, 3)));
        }
        // Each 100-byte piece of the pool is 50 random bytes twice.
        let mut values = DbBenchValues::new(100, 9);
        let v = values.next_value().to_vec();
        assert_eq!(v[..50], v[50..]);
        assert!(v[..50].iter().collect::<HashSet<_>>().len() > 20, "the random half is random");
        // Values larger than the pool still come whole.
        let mut big = DbBenchValues::new(3 << 20, 1);
        assert_eq!(big.next_value().len(), 3 << 20);
        assert_eq!(big.next_value().len(), 3 << 20);
    }
}
