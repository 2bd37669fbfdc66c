// SPDX-License-Identifier: Apache-2.0
//! Ether-oN on the fabric (`docs/etheron.md`): TRANSMIT_FRAME and RECEIVE_FRAME, bridged to
//! the target's TAP device by an [`insitu_etheron::Switch`].
//!
//! Both commands are answered by the connection's own thread, not by the queue's workers:
//! transmits reach the TAP device in the order the host sent them, and a receive is held
//! (like an Asynchronous Event Request) without occupying a worker. A transmit whose data
//! comes by R2T is the exception: it runs on a worker through [`transmit`].

use crate::controller::Controller;
use crate::sink::Sink;
use crate::{Server, Shared};
use insitu_etheron::{
    check_receive, check_transmit, Counters, Switch, Tap, Upcall, IDLE_RECEIVE, RECEIVE_FRAME, STATUS_INTERNAL_ERROR, STATUS_NO_INTERFACE, TRANSMIT_FRAME,
};
use insitu_fabric::{Command, SGL_DATA_BLOCK_OFFSET};
use std::sync::{Arc, Once, OnceLock, Weak};
use std::time::Duration;

/// The target's Ether-oN interface, once [`Server::attach_ether`] has given it one.
#[derive(Default)]
pub(crate) struct Port(OnceLock<Arc<Bridge>>);

pub(crate) struct Bridge {
    tap: Tap,
    switch: Switch<Held>,
    /// Starts the thread that reads the TAP device, on the first receive.
    reader: Once,
    /// The server, for the reader to stop with it.
    shared: Weak<Shared>,
}

/// A controller, compared by identity.
pub(crate) struct Owner(Weak<Controller>);

impl PartialEq for Owner {
    fn eq(&self, other: &Owner) -> bool {
        Weak::ptr_eq(&self.0, &other.0)
    }
}

/// A RECEIVE_FRAME held for its controller: where and how to complete it.
pub(crate) struct Held {
    sink: Sink,
    cid: u16,
    sqhd: u16,
    owner: Weak<Controller>,
}

impl Upcall for Held {
    type Owner = Owner;

    fn owner(&self) -> Owner {
        Owner(self.owner.clone())
    }

    /// Alive while the controller is still registered with its subsystem (its admin queue
    /// is connected).
    fn owner_alive(o: &Owner) -> bool {
        o.0.upgrade().is_some_and(|c| c.subsys.controller(c.cntlid).is_some_and(|x| Arc::ptr_eq(&x, &c)))
    }

    fn deliver(self, frame: &[u8], seq: u32) -> bool {
        self.sink.complete(self.cid, self.sqhd, 0, frame.len() as u32, seq, frame).is_ok()
    }

    fn refuse(self, status: u16) {
        let _ = self.sink.complete(self.cid, self.sqhd, status, 0, 0, &[]);
    }
}

/// Handles `cmd` on an I/O queue if it is an Ether-oN command the connection answers
/// itself: a receive, or a transmit with in-capsule data. `None`: not one of those, run it
/// as usual.
pub(crate) fn on_queue(shared: &Shared, ctrl: &Arc<Controller>, sink: &Sink, cmd: &Command, sqhd: u16, data: &[u8]) -> Option<std::io::Result<()>> {
    let (cid, bridge) = (cmd.cid(), shared.ether.0.get());
    match cmd.opcode() {
        RECEIVE_FRAME => {
            let Some(bridge) = bridge else { return Some(sink.complete(cid, sqhd, STATUS_NO_INTERFACE, 0, 0, &[])) };
            if let Err(e) = check_receive(cmd.sgl().1) {
                bridge.switch.counters().refused();
                return Some(sink.complete(cid, sqhd, e.status(), 0, 0, &[]));
            }
            bridge.reader.call_once(|| start_reader(bridge.clone()));
            bridge.switch.post(Held { sink: sink.clone(), cid, sqhd, owner: Arc::downgrade(ctrl) });
            Some(Ok(()))
        }
        TRANSMIT_FRAME => {
            // Data still to come by R2T goes the usual way; so does anything malformed,
            // which the connection refuses as for any command.
            let (addr, len, ty) = cmd.sgl();
            if ty != SGL_DATA_BLOCK_OFFSET {
                return None;
            }
            let frame = data.get(usize::try_from(addr).ok()?..)?.get(..len as usize)?;
            let status = transmit(shared, cmd, frame);
            Some(sink.complete(cid, sqhd, status, 0, 0, &[]))
        }
        _ => None,
    }
}

/// Runs a TRANSMIT_FRAME: writes its frame to the TAP device. Returns the status field.
pub(crate) fn transmit(shared: &Shared, cmd: &Command, data: &[u8]) -> u16 {
    let Some(bridge) = shared.ether.0.get() else { return STATUS_NO_INTERFACE };
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
            eprintln!("insitu-target: Ether-oN: {e}");
            bridge.switch.counters().refused();
            STATUS_INTERNAL_ERROR
        }
    }
}

/// How often the TAP thread wakes with nothing to read, to expire idle receives.
const TICK: Duration = Duration::from_secs(1);

impl Server {
    /// Gives the target an Ether-oN interface: frames the kernel sends out of `tap` go to
    /// the host that posted RECEIVE_FRAME commands, TRANSMIT_FRAME data goes into `tap`.
    /// Without it, both commands complete with SCT 7 / SC 0xD0 (*no Ether-oN interface*).
    /// The thread that reads the device starts with the first RECEIVE_FRAME (frames before
    /// it have no host to go to), so a daemon may fork after this call. Fails if an
    /// interface was given already.
    pub fn attach_ether(&self, tap: Tap) -> std::io::Result<()> {
        let counters = Arc::new(Counters::default());
        let bridge = Arc::new(Bridge { tap, switch: Switch::new(counters.clone()), reader: Once::new(), shared: Arc::downgrade(&self.shared) });
        if self.shared.ether.0.set(bridge).is_err() {
            return Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, "this target has an Ether-oN interface already"));
        }
        let _ = self.shared.metrics.ether.set(counters);
        Ok(())
    }
}

fn start_reader(bridge: Arc<Bridge>) {
    let name = bridge.tap.name().to_string();
    let run = move || {
        if let Err(e) = tap_loop(&bridge) {
            eprintln!("insitu-target: Ether-oN interface {name} stopped: {e}");
        }
    };
    if let Err(e) = std::thread::Builder::new().name("etheron-tap".into()).spawn(run) {
        eprintln!("insitu-target: cannot start the Ether-oN thread: {e}");
    }
}

/// Reads frames from the TAP device for the host until the server stops; expires idle
/// receives every tick.
fn tap_loop(bridge: &Bridge) -> Result<(), insitu_etheron::EtherError> {
    let mut buf = vec![0u8; insitu_etheron::RECEIVE_BUFFER];
    let mut last_expiry = std::time::Instant::now();
    while bridge.shared.upgrade().is_some_and(|s| !s.stopping()) {
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
