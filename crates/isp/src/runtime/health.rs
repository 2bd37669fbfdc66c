// SPDX-License-Identifier: Apache-2.0
//! Health checks (`Config.Healthcheck`), run as Docker runs them: while the container
//! runs, its test command is executed in it every `Interval` (`StartInterval` during the
//! `StartPeriod`), given `Timeout` to finish; a pass makes it `healthy`, `Retries`
//! failures in a row (those in the start period not counted) `unhealthy`. The last five
//! probes are kept for inspect.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::exec::{ExecSpec, ExecState};
use super::{Container, RunState, Runtime};

/// Most output kept of one probe, as Docker keeps.
const MAX_OUTPUT: usize = 4096;
/// Probes kept.
const KEPT: usize = 5;

/// A container's health check, as asked for at create.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthSpec {
    /// argv of the test (`CMD-SHELL` made into `/bin/sh -c`).
    pub argv: Vec<String>,
    /// Between probes.
    pub interval: Duration,
    /// Longest a probe may run.
    pub timeout: Duration,
    /// Failures in a row that make the container unhealthy.
    pub retries: u32,
    /// From the start, a time in which failures are not counted.
    pub start_period: Duration,
    /// Between probes during the start period.
    pub start_interval: Duration,
}

impl HealthSpec {
    /// Parses `Config.Healthcheck` (durations in nanoseconds; 0 or absent: Docker's
    /// defaults of 30 s, 30 s, 3 retries, no start period, 5 s). `None`: no check
    /// (absent, empty, or `["NONE"]`).
    pub fn parse(v: &serde_json::Value) -> Result<Option<HealthSpec>, String> {
        use serde_json::Value;
        if v.is_null() {
            return Ok(None);
        }
        let test: Vec<String> = match v.get("Test") {
            None | Some(Value::Null) => vec![],
            Some(Value::Array(a)) => {
                a.iter().map(|x| x.as_str().map(String::from).ok_or("Healthcheck.Test must be a list of strings")).collect::<Result<_, _>>()?
            }
            Some(_) => return Err("Healthcheck.Test must be a list of strings".into()),
        };
        let argv = match test.first().map(String::as_str) {
            None | Some("NONE") => return Ok(None),
            Some("CMD") if test.len() > 1 => test[1..].to_vec(),
            Some("CMD-SHELL") if test.len() == 2 => vec!["/bin/sh".into(), "-c".into(), test[1].clone()],
            Some(k) => return Err(format!("Healthcheck.Test {k:?}: NONE, CMD followed by the command, or CMD-SHELL followed by one shell command")),
        };
        let dur = |k: &str, default: Duration| -> Result<Duration, String> {
            match v.get(k) {
                None | Some(Value::Null) => Ok(default),
                Some(n) => match n.as_i64() {
                    Some(0) => Ok(default),
                    Some(n) if n >= 1_000_000 => Ok(Duration::from_nanos(n as u64)),
                    _ => Err(format!("Healthcheck.{k} must be 0 or at least 1 ms, in nanoseconds")),
                },
            }
        };
        let retries = match v.get("Retries") {
            None | Some(Value::Null) => 3,
            Some(n) => match n.as_i64() {
                Some(0) => 3,
                Some(n) if n > 0 && n <= i64::from(u32::MAX) => n as u32,
                _ => return Err("Healthcheck.Retries must not be negative".into()),
            },
        };
        Ok(Some(HealthSpec {
            argv,
            interval: dur("Interval", Duration::from_secs(30))?,
            timeout: dur("Timeout", Duration::from_secs(30))?,
            retries,
            start_period: dur("StartPeriod", Duration::ZERO)?,
            start_interval: dur("StartInterval", Duration::from_secs(5))?,
        }))
    }
}

/// One probe.
#[derive(Debug, Clone)]
pub struct Probe {
    /// When it started.
    pub start: SystemTime,
    /// When it ended.
    pub end: SystemTime,
    /// Its exit code (-1: it did not finish in time, or could not run).
    pub exit_code: i32,
    /// Its output, cut at 4 KiB.
    pub output: String,
}

/// A container's health.
#[derive(Debug, Clone)]
pub struct Health {
    /// `starting`, `healthy` or `unhealthy`.
    pub status: &'static str,
    /// Failures in a row.
    pub failing_streak: u32,
    /// The last probes, oldest first.
    pub log: VecDeque<Probe>,
}

impl Health {
    fn starting() -> Health {
        Health { status: "starting", failing_streak: 0, log: VecDeque::new() }
    }

    /// Counts a probe: a pass is healthy; failures count once out of the start period.
    fn record(&mut self, p: Probe, spec: &HealthSpec, in_start_period: bool) {
        if p.exit_code == 0 {
            self.status = "healthy";
            self.failing_streak = 0;
        } else if !in_start_period {
            self.failing_streak += 1;
            if self.failing_streak >= spec.retries {
                self.status = "unhealthy";
            }
        }
        self.log.push_back(p);
        while self.log.len() > KEPT {
            self.log.pop_front();
        }
    }
}

impl Runtime {
    /// The health of container `cid`, if it has a check and has run.
    pub fn health(&self, cid: &str) -> Option<Health> {
        self.health.lock().unwrap_or_else(|e| e.into_inner()).get(cid).cloned()
    }

    /// After a start: probes the container while this run lasts.
    pub(super) fn watch_health(self: &Arc<Self>, c: &Arc<Container>) {
        let Some(spec) = c.spec.health.clone() else { return };
        self.health.lock().unwrap_or_else(|e| e.into_inner()).insert(c.id.clone(), Health::starting());
        let (rt, c) = (self.clone(), c.clone());
        let run = c.exits.borrow().exits;
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            loop {
                let in_start = started.elapsed() < spec.start_period;
                tokio::time::sleep(if in_start { spec.start_interval.min(spec.interval) } else { spec.interval }).await;
                let this_run = || c.exits.borrow().exits == run && !c.exits.borrow().removed && matches!(c.state(), RunState::Running { .. });
                if !this_run() {
                    return;
                }
                if c.paused() {
                    continue;
                }
                let in_start = started.elapsed() < spec.start_period;
                let p = rt.health_probe(&c, &spec).await;
                if !this_run() {
                    return;
                }
                if let Some(h) = rt.health.lock().unwrap_or_else(|e| e.into_inner()).get_mut(&c.id) {
                    h.record(p, &spec, in_start);
                }
            }
        });
    }

    async fn health_probe(&self, c: &Container, spec: &HealthSpec) -> Probe {
        let start = SystemTime::now();
        let es = ExecSpec { cmd: spec.argv.clone(), attach_stdout: true, attach_stderr: true, ..Default::default() };
        let run = async {
            let e = self.exec_create(&c.id, es).map_err(|e| e.to_string())?;
            let mut io = self.exec_start(&e).await.map_err(|e| e.to_string())?;
            let mut out = Vec::new();
            while let Some((_, d)) = io.output.recv().await {
                if out.len() < MAX_OUTPUT {
                    out.extend_from_slice(&d[..d.len().min(MAX_OUTPUT - out.len())]);
                }
            }
            let mut w = e.watch();
            let code = match *w.wait_for(|s| matches!(s, ExecState::Exited { .. })).await.map_err(|e| e.to_string())? {
                ExecState::Exited { code } => code,
                _ => -1,
            };
            Ok::<_, String>((code, String::from_utf8_lossy(&out).into_owned()))
        };
        let (exit_code, output) = match tokio::time::timeout(spec.timeout, run).await {
            Ok(Ok(r)) => r,
            Ok(Err(m)) => (-1, m),
            Err(_) => (-1, format!("Health check exceeded timeout ({:?})", spec.timeout)),
        };
        Probe { start, end: SystemTime::now(), exit_code, output }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn checks_parse_with_docker_defaults_and_bad_ones_are_refused() {
        assert_eq!(HealthSpec::parse(&json!({"Test": ["NONE"]})).unwrap(), None);
        assert_eq!(HealthSpec::parse(&json!({})).unwrap(), None);
        let h = HealthSpec::parse(&json!({"Test": ["CMD-SHELL", "echo hi"], "Interval": 1_000_000_000i64, "Retries": 1})).unwrap().unwrap();
        assert_eq!((h.argv.len(), h.interval, h.timeout, h.retries), (3, Duration::from_secs(1), Duration::from_secs(30), 1));
        for bad in [
            json!({"Test": "true"}),
            json!({"Test": ["BOGUS"]}),
            json!({"Test": ["CMD"]}),
            json!({"Test": ["CMD", "true"], "Interval": 5}),
            json!({"Test": ["CMD", "true"], "Retries": -1}),
        ] {
            assert!(HealthSpec::parse(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn retries_failures_in_a_row_make_it_unhealthy_and_a_pass_heals() {
        let spec = HealthSpec::parse(&json!({"Test": ["CMD", "x"], "Retries": 2})).unwrap().unwrap();
        let p = |code| Probe { start: SystemTime::now(), end: SystemTime::now(), exit_code: code, output: String::new() };
        let mut h = Health::starting();
        h.record(p(1), &spec, true);
        assert_eq!((h.status, h.failing_streak), ("starting", 0));
        h.record(p(1), &spec, false);
        assert_eq!(h.status, "starting");
        h.record(p(1), &spec, false);
        assert_eq!(h.status, "unhealthy");
        h.record(p(0), &spec, false);
        assert_eq!((h.status, h.failing_streak), ("healthy", 0));
        for _ in 0..10 {
            h.record(p(0), &spec, false);
        }
        assert_eq!(h.log.len(), KEPT);
    }
}
