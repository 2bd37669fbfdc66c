// SPDX-License-Identifier: Apache-2.0
//! Ether-oN on the fabric (`docs/etheron.md`): TRANSMIT_FRAME and RECEIVE_FRAME, bridged to
//! the target's TAP device by an [`insitu_etheron::Switch`].
//!
//! Both run on the connection's own thread ([`Placement::Connection`](insitu_nvmf::Placement)):
//! transmits reach the TAP device in the order the host sent them, and a receive is held
//! (like an Asynchronous Event Request) without occupying a worker. A transmit whose data
//! comes by R2T is the exception: it runs on a worker.

use std::sync::{Arc, Once, OnceLock};
use std::time::Duration;

use insitu_etheron::{
    check_receive, check_transmit, Counters, Switch, Tap, Upcall, IDLE_RECEIVE, RECEIVE_FRAME, STATUS_INTERNAL_ERROR, STATUS_NO_INTERFACE, TRANSMIT_FRAME,
};
use insitu_fabric::Command;
use insitu_nvmf::{ControllerRef, Deferred, IoContext, IoHandler, MetricsSource, Outcome, StopToken};

/// The target's Ether-oN interface, once [`Port::attach`] has given it one. Both commands
/// are registered whether or not it has one: without, they say so.
#[derive(Default)]
pub(crate) struct Port(OnceLock<Arc<Bridge>>);

pub(crate) struct Bridge {
    tap: Tap,
    switch: Switch<Held>,
    /// Starts the thread that reads the TAP device, on the first receive.
    reader: Once,
    /// The server, for the reader to stop with it.
    stop: StopToken,
}

/// A RECEIVE_FRAME held for its controller.
struct Held(Deferred);

impl Upcall for Held {
    type Owner = ControllerRef;

    fn owner(&self) -> ControllerRef {
        self.0.owner()
    }

    /// Alive while the controller's admin queue is connected.
    fn owner_alive(o: &ControllerRef) -> bool {
        o.is_connected()
    }

    fn deliver(self, frame: &[u8], seq: u32) -> bool {
        self.0.complete(0, frame.len() as u32, seq, frame)
    }

    fn refuse(self, status: u16) {
        let _ = self.0.complete(status, 0, 0, &[]);
    }
}

impl Port {
    /// Gives the target its interface: frames the kernel sends out of `tap` go to the host
    /// that posted RECEIVE_FRAME commands, TRANSMIT_FRAME data goes into `tap`. The thread
    /// that reads the device starts with the first RECEIVE_FRAME (frames before it have no
    /// host to go to), so a daemon may fork after this call. Fails if it has one already.
    pub(crate) fn attach(&self, tap: Tap, stop: StopToken, metrics: &insitu_nvmf::Metrics) -> std::io::Result<()> {
        let counters = Arc::new(Counters::default());
        let bridge = Arc::new(Bridge { tap, switch: Switch::new(counters.clone()), reader: Once::new(), stop });
        if self.0.set(bridge).is_err() {
            return Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, "this target has an Ether-oN interface already"));
        }
        metrics.add_source(Arc::new(EtherMetrics(counters)));
        Ok(())
    }
}

impl IoHandler for Port {
    fn execute(&self, ctx: &IoContext<'_>, cmd: &Command, data: &[u8]) -> Outcome {
        let bridge = self.0.get();
        match cmd.opcode() {
            RECEIVE_FRAME => {
                let Some(bridge) = bridge else { return Outcome::status(STATUS_NO_INTERFACE) };
                if let Err(e) = check_receive(cmd.sgl().1) {
                    bridge.switch.counters().refused();
                    return Outcome::status(e.status());
                }
                bridge.reader.call_once(|| start_reader(bridge.clone()));
                bridge.switch.post(Held(ctx.defer()));
                Outcome::deferred()
            }
            TRANSMIT_FRAME => Outcome::status(transmit(bridge.map(|b| &**b), cmd, data)),
            _ => unreachable!("registered for the two Ether-oN opcodes"),
        }
    }
}

/// Runs a TRANSMIT_FRAME: writes its frame to the TAP device. Returns the status field.
fn transmit(bridge: Option<&Bridge>, cmd: &Command, data: &[u8]) -> u16 {
    let Some(bridge) = bridge else { return STATUS_NO_INTERFACE };
    let frame = match check_transmit(cmd.cdw(10), data) {
        Ok(f) => f,
        Err(e) => {
            bridge.switch.counters().refused();
            return e.status();
        }
    };
    match bridge.tap.write_frame(frame) {
        Ok(()) => {
            bridge.switch.counters().from_host(frame.len());
            0
        }
        Err(e) => {
            tracing::warn!("Ether-oN: {e}");
            bridge.switch.counters().refused();
            STATUS_INTERNAL_ERROR
        }
    }
}

/// How often the TAP thread wakes with nothing to read, to expire idle receives.
const TICK: Duration = Duration::from_secs(1);

fn start_reader(bridge: Arc<Bridge>) {
    let name = bridge.tap.name().to_string();
    let run = move || {
        if let Err(e) = tap_loop(&bridge) {
            tracing::warn!("Ether-oN interface {name} stopped: {e}");
        }
    };
    if let Err(e) = std::thread::Builder::new().name("etheron-tap".into()).spawn(run) {
        tracing::error!("cannot start the Ether-oN thread: {e}");
    }
}

/// Reads frames from the TAP device for the host until the server stops; expires idle
/// receives every tick.
fn tap_loop(bridge: &Bridge) -> Result<(), insitu_etheron::EtherError> {
    let mut buf = vec![0u8; insitu_etheron::RECEIVE_BUFFER];
    let mut last_expiry = std::time::Instant::now();
    while !bridge.stop.stopped() {
        if bridge.tap.wait_readable(TICK)? {
            let n = bridge.tap.read_frame(&mut buf)?;
            if insitu_etheron::check_frame(&buf[..n]).is_ok() {
                bridge.switch.frame(&buf[..n]);
            }
        }
        if last_expiry.elapsed() >= TICK {
            bridge.switch.expire(IDLE_RECEIVE);
            last_expiry = std::time::Instant::now();
        }
    }
    Ok(())
}

/// The Ether-oN counters in the Prometheus text format.
struct EtherMetrics(Arc<Counters>);

impl MetricsSource for EtherMetrics {
    fn render(&self, out: &mut String) {
        use std::fmt::Write as _;
        let c = self.0.snapshot();
        let _ = writeln!(out, "# HELP insitu_etheron_frames_total Ethernet frames carried by Ether-oN commands.");
        let _ = writeln!(out, "# TYPE insitu_etheron_frames_total counter");
        let _ = writeln!(out, "insitu_etheron_frames_total{{direction=\"to_host\"}} {}", c.frames_to_host);
        let _ = writeln!(out, "insitu_etheron_frames_total{{direction=\"to_target\"}} {}", c.frames_from_host);
        let _ = writeln!(out, "# TYPE insitu_etheron_bytes_total counter");
        let _ = writeln!(out, "insitu_etheron_bytes_total{{direction=\"to_host\"}} {}", c.bytes_to_host);
        let _ = writeln!(out, "insitu_etheron_bytes_total{{direction=\"to_target\"}} {}", c.bytes_from_host);
        let _ = writeln!(out, "# TYPE insitu_etheron_dropped_total counter");
        let _ = writeln!(out, "insitu_etheron_dropped_total {}", c.dropped);
        let _ = writeln!(out, "# TYPE insitu_etheron_refused_total counter");
        let _ = writeln!(out, "insitu_etheron_refused_total {}", c.refused);
    }
}
