// SPDX-License-Identifier: Apache-2.0
//! The offload engine's CPU budget: host threads that run kernels charge the CPU time they
//! used and stall so that, together, they use no more than an embedded processor could.
//!
//! A [`ComputeConfig`] of `workers` × `cpu_share` allows `rate = workers × cpu_share` CPU
//! nanoseconds per wall nanosecond. [`ComputeBudget`] is a leaky bucket on a virtual clock:
//! a charge of `c` ns for work that began at `s` is scheduled at
//! `start = max(s, end of the previous charge)` and ends at `start + c / rate`; the caller
//! stalls until then. Charges from many threads queue behind each other, so over any period
//! the CPU time charged never exceeds `rate ×` the wall time (the budget cannot bank idle
//! time from before the work began). With [`ComputeBudget::charge`], the work is assumed to
//! have begun `c` ns ago (true for a thread that computed the whole time);
//! [`ComputeBudget::run`] measures the real start.
//!
//! The engine should run `workers` threads, each behaving like one embedded core.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::positive;
use crate::ModelError;

/// CPU resources of an offload engine, relative to one host core.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComputeConfig {
    /// Embedded cores (and engine threads). Default 4.
    pub workers: usize,
    /// Speed of one embedded core as a fraction of one host core (0.1 = ten times slower).
    /// Default 0.1 (a 1 GHz Cortex-A53 against a ~3 GHz x86 core; see the `newport` preset).
    pub cpu_share: f64,
}

impl Default for ComputeConfig {
    fn default() -> Self {
        ComputeConfig { workers: 4, cpu_share: 0.1 }
    }
}

impl ComputeConfig {
    /// Host-core equivalents of the whole engine: `workers × cpu_share`.
    pub fn rate(&self) -> f64 {
        self.workers as f64 * self.cpu_share
    }

    /// Checks both fields; the error names the field and the value.
    pub fn validate(&self) -> Result<(), ModelError> {
        if self.workers == 0 {
            return Err(ModelError::Compute { field: "workers", reason: "must be at least 1 (got 0)".into() });
        }
        positive(self.cpu_share).map_err(|reason| ModelError::Compute { field: "cpu_share", reason })
    }
}

#[derive(Debug, Default)]
struct BudgetState {
    /// Virtual time, ns since the epoch, at which charged work is done.
    next_free: u64,
    charged: u64,
    stalled: u64,
}

/// A shared CPU budget; see the module docs for the rule.
#[derive(Debug)]
pub struct ComputeBudget {
    cfg: ComputeConfig,
    rate: f64,
    epoch: Instant,
    state: Mutex<BudgetState>,
}

impl ComputeBudget {
    /// A budget whose clock starts now.
    pub fn new(cfg: ComputeConfig) -> Result<ComputeBudget, ModelError> {
        cfg.validate()?;
        Ok(ComputeBudget { rate: cfg.rate(), cfg, epoch: Instant::now(), state: Mutex::default() })
    }

    /// The configuration the budget was built with.
    pub fn config(&self) -> &ComputeConfig {
        &self.cfg
    }

    /// Deterministic core of the budget, on the caller's clock (ns): charges `cpu_ns` for
    /// work that began at `start_ns` and is reported at `now_ns`; returns how long to stall,
    /// ns.
    pub fn charge_at(&self, start_ns: u64, now_ns: u64, cpu_ns: u64) -> u64 {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let begin = s.next_free.max(start_ns);
        s.next_free = begin + (cpu_ns as f64 / self.rate).ceil() as u64;
        let stall = s.next_free.saturating_sub(now_ns);
        s.charged += cpu_ns;
        s.stalled += stall;
        stall
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Charges `cpu_ns` of CPU used just now (assumed to have run for the last `cpu_ns`) and
    /// returns how long the caller should stall. Does not sleep.
    pub fn charge(&self, cpu_ns: u64) -> Duration {
        let now = self.now_ns();
        Duration::from_nanos(self.charge_at(now.saturating_sub(cpu_ns), now, cpu_ns))
    }

    /// [`charge`](Self::charge), then sleeps for the stall.
    pub fn throttle(&self, cpu_ns: u64) {
        let stall = self.charge(cpu_ns);
        if !stall.is_zero() {
            std::thread::sleep(stall);
        }
    }

    /// Runs `f` on this thread, charges the thread CPU time it used (from
    /// [`thread_cpu_ns`]) for work that began when `f` was called, and sleeps for the stall.
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> T {
        let start = self.now_ns();
        let cpu0 = thread_cpu_ns();
        let out = f();
        let used = thread_cpu_ns().saturating_sub(cpu0);
        let stall = self.charge_at(start, self.now_ns(), used);
        if stall > 0 {
            std::thread::sleep(Duration::from_nanos(stall));
        }
        out
    }

    /// CPU time charged so far, ns.
    pub fn charged_ns(&self) -> u64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).charged
    }

    /// Stall time handed out so far, ns (summed over callers).
    pub fn stalled_ns(&self) -> u64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).stalled
    }
}

/// CPU time consumed by the calling thread, ns (`CLOCK_THREAD_CPUTIME_ID`); 0 if the clock
/// is unavailable.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a valid, exclusive pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Where code that stands for a drive's weaker cores charges the CPU time it spent: told
/// how much, an implementation may stall the calling thread to keep within its budget.
/// The offload engine charges its kernels' time through one (`Engine::with_compute_budget`).
pub trait ChargeCpu: Send + Sync {
    /// The calling thread spent `cpu_ns` of CPU time computing since its last charge.
    fn charge(&self, cpu_ns: u64);
}

impl ChargeCpu for ComputeBudget {
    fn charge(&self, cpu_ns: u64) {
        self.throttle(cpu_ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn twice_the_allowed_cpu_over_a_window_stalls_one_more_window() {
        let b = ComputeBudget::new(ComputeConfig { workers: 4, cpu_share: 0.1 }).unwrap();
        // Allowed over a 10 ms window: 0.4 × 10 = 4 ms. Charging 8 ms must end at 20 ms.
        assert_eq!(b.charge_at(0, 10 * MS, 8 * MS), 10 * MS);
        assert_eq!(b.charged_ns(), 8 * MS);
        assert_eq!(b.stalled_ns(), 10 * MS);
    }

    #[test]
    fn concurrent_charges_queue_behind_each_other() {
        let b = ComputeBudget::new(ComputeConfig { workers: 2, cpu_share: 0.25 }).unwrap();
        // Two threads each used 5 ms in parallel between 0 and 5 ms; at rate 0.5 the pair
        // needs 20 ms: the first ends at 10 ms, the second at 20 ms.
        assert_eq!(b.charge_at(0, 5 * MS, 5 * MS), 5 * MS);
        assert_eq!(b.charge_at(0, 5 * MS, 5 * MS), 15 * MS);
        // Work within the budget after an idle gap does not stall: 1 ms at 100 ms takes 2 ms
        // of budget but began 3 ms earlier.
        assert_eq!(b.charge_at(97 * MS, 100 * MS, MS), 0);
        // And idle time before the work began is not banked.
        assert_eq!(b.charge_at(199 * MS, 200 * MS, MS), MS);
    }

    #[test]
    fn a_fast_engine_never_stalls_a_single_thread() {
        let b = ComputeBudget::new(ComputeConfig { workers: 8, cpu_share: 0.5 }).unwrap();
        assert_eq!(b.charge_at(0, 10 * MS, 10 * MS), 0);
        assert_eq!(b.config().rate(), 4.0);
    }

    #[test]
    fn wall_clock_charge_and_thread_clock_work() {
        let b = ComputeBudget::new(ComputeConfig { workers: 1, cpu_share: 0.5 }).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        // 4 ms at rate 0.5 is 8 ms of budget begun 4 ms ago: 4 ms left.
        assert_eq!(b.charge(4 * MS), Duration::from_millis(4));
        let before = thread_cpu_ns();
        let sum = b.run(|| (0..200_000u64).fold(0u64, |a, x| a.wrapping_add(x * x)));
        assert!(sum > 0 && thread_cpu_ns() > before && b.charged_ns() > 4 * MS);
    }

    #[test]
    fn bad_configs_name_the_field() {
        let e = ComputeBudget::new(ComputeConfig { workers: 0, cpu_share: 0.1 }).unwrap_err().to_string();
        assert!(e.contains("workers"), "{e}");
        let e = ComputeConfig { workers: 1, cpu_share: f64::INFINITY }.validate().unwrap_err().to_string();
        assert!(e.contains("cpu_share"), "{e}");
    }
}
