// SPDX-License-Identifier: Apache-2.0
//! A deterministic, realistic data set for the demo and the benchmarks: web-server logs, CSV
//! order tables, binary blobs, a sparse file and an empty one. The same seed always gives
//! the same bytes.

use std::fs::{self, File};
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// SplitMix64: small, fast, and reproducible everywhere.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Uniform in `[0, 1)`, with the 53 bits of precision a double holds (as Java's
    /// `Random.nextDouble`, which the YCSB generators draw from).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Writes `bytes` random bytes to `w`, a MiB at a time.
    pub fn write_to(&mut self, w: &mut impl Write, bytes: u64) -> io::Result<()> {
        let mut buf = vec![0u8; 1 << 20];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            self.fill(&mut buf[..n]);
            w.write_all(&buf[..n])?;
            left -= n as u64;
        }
        Ok(())
    }

    /// Fills `buf` with random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// The files of a generated data set, by kind.
#[derive(Debug, Default)]
pub struct Dataset {
    /// Text logs.
    pub logs: Vec<PathBuf>,
    /// CSV tables with a header.
    pub tables: Vec<PathBuf>,
    /// Binary files, including a sparse one and an empty one.
    pub blobs: Vec<PathBuf>,
    /// Two equally long ascending arrays of little-endian u64.
    pub arrays: Vec<PathBuf>,
    /// A graph as little-endian u32 (source, destination) pairs, and its node count.
    pub graph: (PathBuf, u64),
}

impl Dataset {
    /// Every file.
    pub fn all(&self) -> Vec<PathBuf> {
        self.logs.iter().chain(&self.tables).chain(&self.blobs).chain(&self.arrays).chain([&self.graph.0]).cloned().collect()
    }
}

const HOSTS: [&str; 6] = ["web-01", "web-02", "web-03", "api-01", "api-02", "batch-01"];
const PATHS: [&str; 6] = ["/api/v2/orders", "/api/v2/items", "/login", "/static/app.js", "/api/v2/cart", "/health"];
const COUNTRIES: [&str; 8] = ["DE", "FR", "US", "JP", "BR", "IN", "NL", "KE"];
const STATUSES: [&str; 4] = ["paid", "shipped", "cancelled", "refunded"];
const NAMES: [&str; 6] = ["Ada Park", "Smith, Jane", "Li Wei", "O'Neil \"Neo\" Ray", "Zoë Weiß", "Ravi Kumar"];

fn log_line(rng: &mut Rng, n: u64, out: &mut Vec<u8>) {
    let (level, status) = match rng.below(100) {
        0..=4 => ("ERROR", 500 + rng.below(4)),
        5..=14 => ("WARN ", 400 + rng.below(30)),
        _ => ("INFO ", 200 + rng.below(5)),
    };
    let secs = n / 7;
    let _ = writeln!(
        out,
        "2026-11-{:02}T{:02}:{:02}:{:02}.{:03}Z {} {level} request {} {}/{} status={status} bytes={} latency_ms={} user=u{}",
        1 + (secs / 86400) % 28,
        (secs / 3600) % 24,
        (secs / 60) % 60,
        secs % 60,
        rng.below(1000),
        HOSTS[rng.below(6) as usize],
        if rng.below(4) == 0 { "POST" } else { "GET" },
        PATHS[rng.below(6) as usize],
        rng.below(100_000),
        rng.below(60_000),
        rng.below(2000),
        rng.below(5000),
    );
}

fn csv_row(rng: &mut Rng, id: u64, out: &mut Vec<u8>) {
    let name = NAMES[rng.below(6) as usize];
    let quoted = if name.contains([',', '"']) { format!("\"{}\"", name.replace('"', "\"\"")) } else { name.to_owned() };
    let _ = writeln!(
        out,
        "{id},{quoted},{},{}.{:02},{},2026-{:02}-{:02}",
        COUNTRIES[rng.below(8) as usize],
        rng.below(2000),
        rng.below(100),
        STATUSES[rng.below(4) as usize],
        1 + rng.below(12),
        1 + rng.below(28)
    );
}

/// Writes `bytes` of generated lines to `w`.
fn write_lines(w: &mut impl Write, rng: &mut Rng, bytes: u64, header: Option<&str>, line: fn(&mut Rng, u64, &mut Vec<u8>)) -> io::Result<()> {
    let mut buf = Vec::with_capacity(1 << 20);
    if let Some(h) = header {
        buf.extend_from_slice(h.as_bytes());
    }
    let mut written = 0u64;
    let mut n = 1u64;
    while written < bytes {
        while buf.len() < (1 << 20) && written + (buf.len() as u64) < bytes {
            line(rng, n, &mut buf);
            n += 1;
        }
        w.write_all(&buf)?;
        written += buf.len() as u64;
        buf.clear();
    }
    Ok(())
}

/// Generates about `total` bytes of files under `dir`.
///
/// Two logs are written interleaved with a sync after every piece, as concurrent appenders
/// would, so their extents are fragmented.
pub fn generate(dir: &Path, total: u64) -> io::Result<Dataset> {
    let mut rng = Rng::new(0x1A51_7E5D);
    let mut ds = Dataset::default();
    for sub in ["logs", "tables", "bin"] {
        fs::create_dir_all(dir.join(sub))?;
    }
    let log_bytes = total * 45 / 100 / 6;
    // Interleaved appenders: logs/app-0.log and logs/app-1.log.
    let pair = [dir.join("logs/app-0.log"), dir.join("logs/app-1.log")];
    let mut files = [File::create(&pair[0])?, File::create(&pair[1])?];
    let mut n = 1u64;
    let mut sizes = [0u64; 2];
    while sizes.iter().any(|s| *s < log_bytes) {
        for (i, f) in files.iter_mut().enumerate() {
            let mut piece = Vec::with_capacity(70_000);
            while piece.len() < 64 << 10 {
                log_line(&mut rng, n, &mut piece);
                n += 1;
            }
            f.write_all(&piece)?;
            f.sync_data()?;
            sizes[i] += piece.len() as u64;
        }
    }
    ds.logs.extend(pair);
    for i in 2..6 {
        let p = dir.join(format!("logs/app-{i}.log"));
        let mut w = BufWriter::new(File::create(&p)?);
        // Odd sizes: not a multiple of any block size.
        write_lines(&mut w, &mut rng, log_bytes + 777 * i, None, log_line)?;
        w.flush()?;
        ds.logs.push(p);
    }
    for i in 0..3 {
        let p = dir.join(format!("tables/orders-{i}.csv"));
        let mut w = BufWriter::new(File::create(&p)?);
        write_lines(&mut w, &mut rng, total * 25 / 100 / 3, Some("order_id,customer,country,amount,status,created\n"), csv_row)?;
        w.flush()?;
        ds.tables.push(p);
    }
    let blob_bytes = (total * 20 / 100 / 3) as usize;
    let mut buf = vec![0u8; 1 << 20];
    for i in 0..3 {
        let p = dir.join(format!("bin/blob-{i}.bin"));
        let mut f = BufWriter::new(File::create(&p)?);
        rng.write_to(&mut f, (blob_bytes + 4097 * i) as u64)?;
        f.flush()?;
        ds.blobs.push(p);
    }
    // A sparse file: data, a 3 MiB hole, data, and a hole at the end.
    let sparse = dir.join("bin/sparse.img");
    let mut f = File::create(&sparse)?;
    rng.fill(&mut buf);
    f.write_all(&buf)?;
    f.seek(SeekFrom::Current(3 << 20))?;
    f.write_all(&buf[..123_457])?;
    f.set_len((6 << 20) + 11)?;
    ds.blobs.push(sparse);
    let empty = dir.join("bin/empty");
    File::create(&empty)?;
    ds.blobs.push(empty);
    // Analysis inputs: two sorted u64 arrays and a random graph.
    let elements = (total / 100 / 8).max(1024);
    for name in ["a", "b"] {
        let p = dir.join(format!("bin/sorted-{name}.u64"));
        let mut w = BufWriter::new(File::create(&p)?);
        let mut v = 0u64;
        for _ in 0..elements {
            v += rng.below(1000);
            w.write_all(&v.to_le_bytes())?;
        }
        w.flush()?;
        ds.arrays.push(p);
    }
    let nodes = 10_000u64;
    let p = dir.join("bin/graph.edges");
    let mut w = BufWriter::new(File::create(&p)?);
    for _ in 0..(total / 200 / 8).max(1000) {
        let (s, d) = (rng.below(nodes) as u32, (rng.below(nodes / 10) * 10) as u32);
        w.write_all(&s.to_le_bytes())?;
        w.write_all(&d.to_le_bytes())?;
    }
    w.flush()?;
    ds.graph = (p, nodes);
    // Push everything to the device: the target reads the media, not the page cache.
    for p in ds.all() {
        File::open(&p)?.sync_all()?;
    }
    Ok(ds)
}
