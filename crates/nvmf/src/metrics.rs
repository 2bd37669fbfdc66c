// SPDX-License-Identifier: Apache-2.0
//! Counters the target exports in the Prometheus text format: commands, errors and latency
//! per namespace and command, and bytes on the wire.

use insitu_fabric::opcode;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Latency histogram bucket bounds, seconds.
const BUCKETS: [f64; 10] = [0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0];

#[derive(Default, Clone)]
struct Series {
    commands: u64,
    errors: u64,
    link_bytes: u64,
    media_bytes: u64,
    seconds: f64,
    buckets: [u64; BUCKETS.len()],
}

/// Target-wide metrics.
#[derive(Default)]
pub struct Metrics {
    wire_in: AtomicU64,
    wire_out: AtomicU64,
    protocol_errors: AtomicU64,
    series: Mutex<BTreeMap<(u32, &'static str, String), Series>>,
    /// Services that add their own counters to the exposition.
    sources: Mutex<Vec<std::sync::Arc<dyn MetricsSource>>>,
}

/// A service's counters in the Prometheus text format, rendered with the transport's.
pub trait MetricsSource: Send + Sync {
    /// Appends its lines (`# TYPE` and samples) to `out`.
    fn render(&self, out: &mut String);
}

fn command_name(op: u8) -> &'static str {
    match op {
        opcode::READ => "read",
        opcode::WRITE => "write",
        opcode::FLUSH => "flush",
        opcode::WRITE_ZEROES => "write_zeroes",
        opcode::DSM => "dataset_management",
        opcode::EXEC => "exec",
        _ => "other",
    }
}

/// The cost of one command.
pub(crate) struct CommandCost {
    /// EXEC's function name; empty for other commands.
    pub(crate) function: String,
    pub(crate) status: u16,
    pub(crate) took: Duration,
    /// Data bytes that crossed the link (either direction).
    pub(crate) link_bytes: u64,
    /// Bytes read from or written to the media.
    pub(crate) media_bytes: u64,
}

impl Metrics {
    pub(crate) fn add_wire_in(&self, n: u64) {
        self.wire_in.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn add_wire_out(&self, n: u64) {
        self.wire_out.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn add_protocol_error(&self) {
        self.protocol_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds `source`'s counters to every rendering from now on.
    pub fn add_source(&self, source: std::sync::Arc<dyn MetricsSource>) {
        self.sources.lock().unwrap_or_else(|e| e.into_inner()).push(source);
    }

    /// Bytes received and sent on all connections.
    pub fn wire_bytes(&self) -> (u64, u64) {
        (self.wire_in.load(Ordering::Relaxed), self.wire_out.load(Ordering::Relaxed))
    }

    /// Adds one command's cost to its series.
    pub(crate) fn record(&self, op: u8, nsid: u32, c: &CommandCost) {
        let mut m = self.series.lock().unwrap_or_else(|e| e.into_inner());
        let s = m.entry((nsid, command_name(op), c.function.clone())).or_default();
        s.commands += 1;
        s.errors += u64::from(c.status != 0);
        s.link_bytes += c.link_bytes;
        s.media_bytes += c.media_bytes;
        let took = c.took;
        let secs = took.as_secs_f64();
        s.seconds += secs;
        for (i, b) in BUCKETS.iter().enumerate() {
            if secs <= *b {
                s.buckets[i] += 1;
            }
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let (rx, tx) = self.wire_bytes();
        let _ = writeln!(out, "# HELP insitu_wire_bytes_total Bytes on the NVMe/TCP wire, PDU headers and digests included.");
        let _ = writeln!(out, "# TYPE insitu_wire_bytes_total counter");
        let _ = writeln!(out, "insitu_wire_bytes_total{{direction=\"to_target\"}} {rx}");
        let _ = writeln!(out, "insitu_wire_bytes_total{{direction=\"to_host\"}} {tx}");
        let _ = writeln!(out, "# TYPE insitu_protocol_errors_total counter");
        let _ = writeln!(out, "insitu_protocol_errors_total {}", self.protocol_errors.load(Ordering::Relaxed));
        for source in self.sources.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            source.render(&mut out);
        }
        let m = self.series.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(out, "# TYPE insitu_commands_total counter");
        for ((ns, cmd, f), s) in m.iter() {
            let _ = writeln!(out, "insitu_commands_total{{nsid=\"{ns}\",command=\"{cmd}\",function=\"{f}\"}} {}", s.commands);
        }
        let _ = writeln!(out, "# TYPE insitu_command_errors_total counter");
        for ((ns, cmd, f), s) in m.iter() {
            let _ = writeln!(out, "insitu_command_errors_total{{nsid=\"{ns}\",command=\"{cmd}\",function=\"{f}\"}} {}", s.errors);
        }
        let _ = writeln!(out, "# TYPE insitu_link_bytes_total counter");
        for ((ns, cmd, f), s) in m.iter() {
            let _ = writeln!(out, "insitu_link_bytes_total{{nsid=\"{ns}\",command=\"{cmd}\",function=\"{f}\"}} {}", s.link_bytes);
        }
        let _ = writeln!(out, "# TYPE insitu_media_bytes_total counter");
        for ((ns, cmd, f), s) in m.iter() {
            let _ = writeln!(out, "insitu_media_bytes_total{{nsid=\"{ns}\",command=\"{cmd}\",function=\"{f}\"}} {}", s.media_bytes);
        }
        let _ = writeln!(out, "# TYPE insitu_command_seconds histogram");
        for ((ns, cmd, f), s) in m.iter() {
            for (i, b) in BUCKETS.iter().enumerate() {
                let _ = writeln!(out, "insitu_command_seconds_bucket{{nsid=\"{ns}\",command=\"{cmd}\",function=\"{f}\",le=\"{b}\"}} {}", s.buckets[i]);
            }
            let _ = writeln!(out, "insitu_command_seconds_bucket{{nsid=\"{ns}\",command=\"{cmd}\",function=\"{f}\",le=\"+Inf\"}} {}", s.commands);
            let _ = writeln!(out, "insitu_command_seconds_sum{{nsid=\"{ns}\",command=\"{cmd}\",function=\"{f}\"}} {}", s.seconds);
            let _ = writeln!(out, "insitu_command_seconds_count{{nsid=\"{ns}\",command=\"{cmd}\",function=\"{f}\"}} {}", s.commands);
        }
        out
    }
}
