// SPDX-License-Identifier: Apache-2.0
//! Subsystems: what an NVM subsystem serves ([`NvmSubsystem`], given by whoever assembles
//! the target) and the live controllers of each.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};

use insitu_proto::opcode::IoOpcode;

use crate::controller::Controller;
use crate::handler::Handlers;
use crate::identify;
use crate::{BlockNamespaces, CommandSetNamespace, IoHandler, Placement};

/// An NVM subsystem: its NQN, the hosts it admits, its block namespaces, namespaces of
/// other command sets, and the handlers of its vendor I/O commands.
pub struct NvmSubsystem {
    pub(crate) nqn: String,
    pub(crate) allow_hosts: Vec<String>,
    pub(crate) blocks: Arc<dyn BlockNamespaces>,
    /// NSIDs after the block namespaces, in this order.
    command_sets: Vec<Arc<dyn CommandSetNamespace>>,
    pub(crate) handlers: Handlers,
}

impl NvmSubsystem {
    /// A subsystem `nqn` serving `blocks` to any host, with no vendor commands.
    pub fn new(nqn: impl Into<String>, blocks: Arc<dyn BlockNamespaces>) -> NvmSubsystem {
        NvmSubsystem { nqn: nqn.into(), allow_hosts: Vec::new(), blocks, command_sets: Vec::new(), handlers: Handlers::default() }
    }

    /// Admits only these host NQNs (all when empty).
    pub fn with_allowed_hosts(mut self, hosts: Vec<String>) -> NvmSubsystem {
        self.allow_hosts = hosts;
        self
    }

    /// Its NQN.
    pub fn nqn(&self) -> &str {
        &self.nqn
    }

    /// Serves `ns` as the next namespace after every one so far; returns its NSID.
    pub fn add_command_set(&mut self, ns: Arc<dyn CommandSetNamespace>) -> u32 {
        self.command_sets.push(ns);
        self.namespace_count()
    }

    /// Runs I/O commands with `opcode` (on any namespace but a command set's) through
    /// `handler`. Panics for the NVM opcodes the transport runs itself, and for an opcode
    /// registered twice: both are mistakes in the code that assembles the target.
    pub fn handle(&mut self, opcode: u8, handler: Arc<dyn IoHandler>, placement: Placement) -> &mut NvmSubsystem {
        let builtin = matches!(IoOpcode::from(opcode), IoOpcode::Read | IoOpcode::Write | IoOpcode::Flush | IoOpcode::WriteZeroes | IoOpcode::Dsm);
        assert!(!builtin, "opcode {opcode:#04x} is an NVM command the transport runs itself");
        assert!(self.handlers.set(opcode, handler, placement), "opcode {opcode:#04x} has a handler already");
        self
    }

    /// The namespace of another command set at `nsid`.
    pub(crate) fn command_set(&self, nsid: u32) -> Option<&Arc<dyn CommandSetNamespace>> {
        let first = self.blocks.count() as u32 + 1;
        nsid.checked_sub(first).and_then(|i| self.command_sets.get(i as usize))
    }

    /// Every NSID, private namespaces included (NSIDs are `1..=count`).
    pub(crate) fn namespace_count(&self) -> u32 {
        (self.blocks.count() + self.command_sets.len()) as u32
    }

    /// The NSIDs a host may address: sharable block namespaces and command sets'.
    pub(crate) fn host_namespaces(&self) -> Vec<u32> {
        let blocks = (1..=self.blocks.count() as u32).filter(|n| self.blocks.namespace(*n).is_some_and(|ns| ns.sharable));
        blocks.chain(self.blocks.count() as u32 + 1..=self.namespace_count()).collect()
    }

    /// Whether `nsid` names a namespace of this subsystem (of any kind).
    pub(crate) fn has(&self, nsid: u32) -> bool {
        nsid >= 1 && nsid <= self.namespace_count()
    }
}

/// What a subsystem serves.
pub(crate) enum Kind {
    /// An NVM subsystem.
    Nvm(NvmSubsystem),
    /// The discovery subsystem.
    Discovery,
}

/// An NVM or discovery subsystem and its live controllers.
pub(crate) struct Subsystem {
    pub(crate) nqn: String,
    pub(crate) kind: Kind,
    pub(crate) allow_hosts: Vec<String>,
    pub(crate) serial: String,
    next_cntlid: AtomicU16,
    controllers: Mutex<HashMap<u16, Arc<Controller>>>,
}

impl Subsystem {
    pub(crate) fn new(nqn: &str, kind: Kind, allow_hosts: Vec<String>) -> Subsystem {
        let g = identify::guid(nqn);
        let serial: String = g[..10].iter().map(|b| format!("{b:02x}")).collect();
        Subsystem { nqn: nqn.into(), kind, allow_hosts, serial, next_cntlid: AtomicU16::new(1), controllers: Mutex::new(HashMap::new()) }
    }

    /// Whether `hostnqn` may connect.
    pub(crate) fn admits(&self, hostnqn: &str) -> bool {
        self.allow_hosts.is_empty() || self.allow_hosts.iter().any(|h| h == hostnqn)
    }

    pub(crate) fn nvm(&self) -> Option<&NvmSubsystem> {
        match &self.kind {
            Kind::Nvm(t) => Some(t),
            Kind::Discovery => None,
        }
    }

    /// Creates a controller for `hostnqn` (dynamic controller model).
    pub(crate) fn add_controller(self: &Arc<Self>, hostnqn: &str, hostid: [u8; 16], kato_ms: u32) -> Option<Arc<Controller>> {
        let mut ctrls = self.controllers.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..0xFFEF {
            let id = self.next_cntlid.fetch_add(1, Ordering::Relaxed) % 0xFFEF + 1;
            if let std::collections::hash_map::Entry::Vacant(slot) = ctrls.entry(id) {
                let c = Arc::new(Controller::new(id, self.clone(), hostnqn, hostid, kato_ms));
                slot.insert(c.clone());
                return Some(c);
            }
        }
        None
    }

    pub(crate) fn controller(&self, cntlid: u16) -> Option<Arc<Controller>> {
        self.controllers.lock().unwrap_or_else(|e| e.into_inner()).get(&cntlid).cloned()
    }

    pub(crate) fn remove_controller(&self, cntlid: u16) {
        self.controllers.lock().unwrap_or_else(|e| e.into_inner()).remove(&cntlid);
    }
}
