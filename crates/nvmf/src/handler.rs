// SPDX-License-Identifier: Apache-2.0
//! Vendor I/O commands, registered by whoever assembles the target (as SPDK's
//! `spdk_nvmf_set_custom_admin_cmd_hdlr`): the transport moves a command's data, calls its
//! [`IoHandler`], and sends the [`Outcome`] back. A handler may also hold a command and
//! complete it later ([`IoContext::defer`]), and keep state per controller
//! ([`IoContext::controller_state`]): one NVMe command moves data in one direction only, so
//! a command that needs both brings its input and leaves its output with the controller
//! for a second command to collect.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use insitu_fabric::Command;

use crate::controller::Controller;
use crate::sink::Sink;

/// What a command produced, for its completion.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// The completion's status field (0: success; see `insitu_proto::Status::to_nvme_field`).
    pub status: u16,
    /// Completion dword 0.
    pub dw0: u32,
    /// Completion dword 1.
    pub dw1: u32,
    /// Data returned to the host.
    pub data: Vec<u8>,
    /// Bytes read from or written to the media, for the metrics.
    pub media_bytes: u64,
    /// The `function` label of the command's metrics (EXEC's function; empty for others).
    /// It comes from the host: give only names the target has, or a host could grow the
    /// metrics without bound.
    pub function: String,
    /// The handler keeps the command and completes it later through a [`Deferred`].
    pub deferred: bool,
}

impl Outcome {
    /// Success with nothing more.
    pub fn ok() -> Outcome {
        Outcome::default()
    }

    /// A completion with only `status`.
    pub fn status(status: u16) -> Outcome {
        Outcome { status, ..Outcome::default() }
    }

    /// Completed later, through the [`Deferred`] the handler took.
    pub fn deferred() -> Outcome {
        Outcome { deferred: true, ..Outcome::default() }
    }
}

impl From<insitu_proto::CommandError> for Outcome {
    fn from(e: insitu_proto::CommandError) -> Outcome {
        Outcome::status(e.status.to_nvme_field())
    }
}

/// Where a handler runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// On one of the queue's worker threads: commands run concurrently.
    Worker,
    /// On the connection's own thread when the command's data is already in hand (none,
    /// or in the capsule) and [`IoHandler::execute_here`] answers it: commands run in the
    /// order the host sent them and a held command occupies no worker. Data fetched by
    /// R2T, or a command the handler declines there, runs on a worker.
    Connection,
}

/// A vendor I/O command.
pub trait IoHandler: Send + Sync {
    /// Runs `cmd` with the data the host sent.
    fn execute(&self, ctx: &IoContext<'_>, cmd: &Command, data: &[u8]) -> Outcome;

    /// Runs `cmd` on the connection's thread ([`Placement::Connection`]), or declines with
    /// `None`, having changed nothing, when it would have to wait there (on another
    /// command, say): the connection then hands it to a worker, which calls
    /// [`IoHandler::execute`]. By default every command runs.
    fn execute_here(&self, ctx: &IoContext<'_>, cmd: &Command, data: &[u8]) -> Option<Outcome> {
        Some(self.execute(ctx, cmd, data))
    }
}

/// What a handler may use of the queue a command arrived on.
pub struct IoContext<'a> {
    pub(crate) ctrl: &'a Arc<Controller>,
    pub(crate) sink: &'a Sink,
    pub(crate) cid: u16,
    pub(crate) sqhd: u16,
    pub(crate) max_transfer: usize,
}

impl IoContext<'_> {
    /// The most data one command may move.
    pub fn max_transfer(&self) -> usize {
        self.max_transfer
    }

    /// The controller's state of type `T`, made with `T::default()` on first use: what a
    /// handler keeps for the host's later commands (results waiting to be collected, say).
    /// It lives as long as the controller, so a host that goes takes its state with it.
    pub fn controller_state<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        self.ctrl.states.get()
    }

    /// This command, to complete later (return [`Outcome::deferred`]).
    pub fn defer(&self) -> Deferred {
        Deferred { sink: self.sink.clone(), cid: self.cid, sqhd: self.sqhd, owner: ControllerRef(Arc::downgrade(self.ctrl)) }
    }
}

/// A command a handler completes later.
pub struct Deferred {
    sink: Sink,
    cid: u16,
    sqhd: u16,
    owner: ControllerRef,
}

impl Deferred {
    /// Sends the completion (and `data`); false if the connection is gone.
    pub fn complete(self, status: u16, dw0: u32, dw1: u32, data: &[u8]) -> bool {
        self.sink.complete(self.cid, self.sqhd, status, dw0, dw1, data).is_ok()
    }

    /// The controller the command came from.
    pub fn owner(&self) -> ControllerRef {
        self.owner.clone()
    }
}

/// A controller, compared by identity, that does not keep it alive.
#[derive(Clone)]
pub struct ControllerRef(Weak<Controller>);

impl ControllerRef {
    /// Whether the controller is still associated with its subsystem (its admin queue is
    /// connected).
    pub fn is_connected(&self) -> bool {
        self.0.upgrade().is_some_and(|c| c.subsys.controller(c.cntlid).is_some_and(|x| Arc::ptr_eq(&x, &c)))
    }
}

impl PartialEq for ControllerRef {
    fn eq(&self, other: &ControllerRef) -> bool {
        Weak::ptr_eq(&self.0, &other.0)
    }
}

/// Handlers' state per controller, one value per type.
#[derive(Default)]
pub(crate) struct States(Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>);

impl States {
    fn get<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        let mut m = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let any = m.entry(TypeId::of::<T>()).or_insert_with(|| Arc::new(T::default())).clone();
        any.downcast::<T>().expect("stored under its own type")
    }
}

/// The handlers of one subsystem, by opcode.
pub(crate) struct Handlers(Vec<Option<(Arc<dyn IoHandler>, Placement)>>);

impl Default for Handlers {
    fn default() -> Self {
        Handlers(vec![None; 256])
    }
}

impl Handlers {
    pub(crate) fn set(&mut self, opcode: u8, handler: Arc<dyn IoHandler>, placement: Placement) -> bool {
        let slot = &mut self.0[usize::from(opcode)];
        let free = slot.is_none();
        *slot = Some((handler, placement));
        free
    }

    pub(crate) fn get(&self, opcode: u8) -> Option<&(Arc<dyn IoHandler>, Placement)> {
        self.0[usize::from(opcode)].as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[derive(Default)]
    struct Counter(AtomicU32);

    #[derive(Default)]
    struct Other(Mutex<Vec<u8>>);

    #[test]
    fn controller_state_is_one_value_per_type() {
        let s = States::default();
        s.get::<Counter>().0.fetch_add(2, Ordering::Relaxed);
        s.get::<Counter>().0.fetch_add(3, Ordering::Relaxed);
        s.get::<Other>().0.lock().unwrap().push(7);
        assert_eq!(s.get::<Counter>().0.load(Ordering::Relaxed), 5);
        assert_eq!(*s.get::<Other>().0.lock().unwrap(), vec![7]);
    }
}
