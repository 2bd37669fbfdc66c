// SPDX-License-Identifier: Apache-2.0
//! The NVMe Key Value command set on a [`Session`]: Store, Retrieve, Delete, Exist and
//! List against a target's key-value namespace (`docs/kv-store.md`).

use crate::assoc::run_one;
use crate::{InitiatorError, Session};
use insitu_fabric::{Command, Completion};
use insitu_proto::kv::{decode_list, status, Key, KvCommand, StoreMode};

/// Bytes asked for per List command.
const LIST_BUFFER: usize = 64 << 10;

impl Session {
    /// Stores `value` under `key` (1–16 bytes) on KV namespace `nsid`, as `mode` allows.
    /// Returns once the target has made it durable. A `MustNotExist` store of a present
    /// key fails with [`InitiatorError::KeyExists`], a `MustExist` store of an absent one
    /// with [`InitiatorError::KeyNotFound`].
    pub fn kv_store(&self, nsid: u32, key: &[u8], value: &[u8], mode: StoreMode) -> Result<(), InitiatorError> {
        const C: &str = "KV Store";
        let key = kv_key(C, key)?;
        let value_size = u32::try_from(value.len())
            .map_err(|_| InitiatorError::InvalidArgument { command: C, detail: format!("a value of {} bytes is too large", value.len()) })?;
        self.kv_check_transfer(C, value.len())?;
        self.kv_run(C, false, KvCommand::Store { key, value_size, mode }, nsid, value, 0).map(|_| ())
    }

    /// The value of `key` on KV namespace `nsid`; [`InitiatorError::KeyNotFound`] when
    /// absent. Values over 4 KiB take a second command (the first learns their size).
    pub fn kv_retrieve(&self, nsid: u32, key: &[u8]) -> Result<Vec<u8>, InitiatorError> {
        const C: &str = "KV Retrieve";
        let key = kv_key(C, key)?;
        let mut buffer = 4096usize.min(self.max_transfer());
        loop {
            let (cqe, mut data) = self.kv_run(C, true, KvCommand::Retrieve { key, buffer: buffer as u32 }, nsid, &[], buffer)?;
            let size = cqe.dw0 as usize;
            if size <= buffer {
                data.truncate(size);
                return Ok(data);
            }
            if size > self.max_transfer() {
                return Err(InitiatorError::Protocol {
                    command: C,
                    detail: format!("the value has {size} bytes, more than one transfer ({}) can carry", self.max_transfer()),
                });
            }
            buffer = size;
        }
    }

    /// Deletes `key` on KV namespace `nsid`; [`InitiatorError::KeyNotFound`] when absent.
    pub fn kv_delete(&self, nsid: u32, key: &[u8]) -> Result<(), InitiatorError> {
        const C: &str = "KV Delete";
        let key = kv_key(C, key)?;
        self.kv_run(C, false, KvCommand::Delete { key }, nsid, &[], 0).map(|_| ())
    }

    /// Whether `key` exists on KV namespace `nsid`.
    pub fn kv_exist(&self, nsid: u32, key: &[u8]) -> Result<bool, InitiatorError> {
        const C: &str = "KV Exist";
        let key = kv_key(C, key)?;
        match self.kv_run(C, true, KvCommand::Exist { key }, nsid, &[], 0) {
            Ok(_) => Ok(true),
            Err(InitiatorError::KeyNotFound { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Every key on KV namespace `nsid` that starts with `prefix` (empty: all), in byte
    /// order, gathered with as many List commands as it takes.
    pub fn kv_list(&self, nsid: u32, prefix: &[u8]) -> Result<Vec<Vec<u8>>, InitiatorError> {
        const C: &str = "KV List";
        if prefix.len() > insitu_proto::kv::MAX_KEY_LEN {
            return Ok(Vec::new()); // no key is that long
        }
        let buffer = LIST_BUFFER.min(self.max_transfer());
        let mut out: Vec<Vec<u8>> = Vec::new();
        let mut start = if prefix.is_empty() { None } else { Some(kv_key(C, prefix)?) };
        loop {
            let (_, data) = self.kv_run(C, true, KvCommand::List { start, buffer: buffer as u32 }, nsid, &[], buffer)?;
            let keys = decode_list(&data).map_err(|e| InitiatorError::Protocol { command: C, detail: e.to_string() })?;
            let mut last = None;
            let mut progressed = false;
            for k in keys {
                // Each List starts at the last key of the one before: skip it.
                if out.last() == Some(&k) {
                    continue;
                }
                progressed = true;
                if !k.starts_with(prefix) {
                    return Ok(out);
                }
                last = Some(k.clone());
                out.push(k);
            }
            match last {
                Some(k) if progressed => start = Some(kv_key(C, &k)?),
                _ => return Ok(out),
            }
        }
    }

    /// The NSID of the target's key-value namespace: the first active namespace whose
    /// Namespace Identification Descriptors (Identify CNS 03h) carry Command Set
    /// Identifier 01h (Key Value). `None` when the target serves no KV namespace (it was
    /// started without a key-value store).
    pub fn kv_namespace(&self) -> Result<Option<u32>, InitiatorError> {
        for nsid in self.active_namespaces()? {
            if self.namespace_command_set(nsid)? == crate::CommandSet::KeyValue {
                return Ok(Some(nsid));
            }
        }
        Ok(None)
    }

    fn kv_check_transfer(&self, command: &'static str, len: usize) -> Result<(), InitiatorError> {
        let max = self.max_transfer();
        if len > max {
            return Err(InitiatorError::InvalidArgument {
                command,
                detail: format!("a value of {len} bytes exceeds the controller's maximum transfer of {max} bytes per command"),
            });
        }
        Ok(())
    }

    fn kv_run(
        &self,
        command: &'static str,
        retryable: bool,
        kv: KvCommand,
        nsid: u32,
        out: &[u8],
        data_in: usize,
    ) -> Result<(Completion, Vec<u8>), InitiatorError> {
        self.require_io(command)?;
        let (op, cdw) = kv.encode();
        let mut c = Command::zeroed();
        c.set_opcode(op).set_nsid(nsid);
        for (i, v) in cdw.iter().enumerate().skip(2) {
            if (2..=3).contains(&i) || (10..=15).contains(&i) {
                c.set_cdw(i, *v);
            }
        }
        let (cqe, data, n) = self.run(command, retryable, |a| run_one(self.pick(a), c, out, data_in, false))?;
        kv_check(command, &cqe)?;
        let mut data = data;
        data.truncate(n);
        Ok((cqe, data))
    }
}

/// A key argument, or an error that says what keys may be.
fn kv_key(command: &'static str, key: &[u8]) -> Result<Key, InitiatorError> {
    Key::new(key).map_err(|_| InitiatorError::InvalidArgument { command, detail: format!("a key of {} bytes is invalid: keys are 1 to 16 bytes", key.len()) })
}

/// The error of a KV completion: key absent and key present get their own variants.
fn kv_check(command: &'static str, cqe: &Completion) -> Result<(), InitiatorError> {
    let (sct, sc) = (((cqe.status >> 8) & 7) as u8, (cqe.status & 0xFF) as u8);
    match (sct, sc) {
        (0, status::KEY_NOT_FOUND) => Err(InitiatorError::KeyNotFound { command }),
        (0, status::KEY_EXISTS) => Err(InitiatorError::KeyExists { command }),
        _ => crate::session::check(command, cqe),
    }
}
