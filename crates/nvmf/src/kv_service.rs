// SPDX-License-Identifier: Apache-2.0
//! The Key Value command set (CSI 01h) on the key-value service's namespace
//! (`docs/kv-store.md`): Store, Retrieve, List, Delete, Exist, run against the target's
//! [`KvStore`](insitu_kvstore::KvStore).
//!
//! KV opcodes reuse NVM ones (Store 01h = Write, Retrieve 02h = Read), so the I/O path
//! sends every command for this namespace here before looking at the opcode. The
//! direction bits of the opcodes match their data (Store host to controller; Retrieve and
//! List controller to host; Delete and Exist none), so the transport moves the data as for
//! any command: Store's value arrives in the buffer the connection received it into and is
//! handed to the store from there.

use crate::controller::status;
use insitu_fabric::Command;
use insitu_kvstore::KvStore;
use insitu_proto::kv::{encode_list, list_entry_len, status as kvs, KvCommand};

/// Data SGL Length Invalid.
const SGL_LENGTH_INVALID: u16 = status(0, 0x0F);
/// Invalid Field in Command.
const INVALID_FIELD: u16 = status(0, 0x02);

/// What a KV command produced: status, dword 0, data to return, bytes the media saw.
pub(crate) struct KvServiceDone {
    pub(crate) status: u16,
    pub(crate) dw0: u32,
    pub(crate) data: Option<Vec<u8>>,
    pub(crate) media: u64,
}

impl KvServiceDone {
    fn status(status: u16) -> KvServiceDone {
        KvServiceDone { status, dw0: 0, data: None, media: 0 }
    }

    fn ok() -> KvServiceDone {
        KvServiceDone::status(0)
    }
}

/// A KV status (type 0) as a completion status field.
fn kv_status(sc: u8) -> u16 {
    status(0, sc)
}

/// Runs one command addressed to the KV namespace with the data the host sent (Store's
/// value). `max_transfer` bounds what one command may return.
pub(crate) fn execute(store: &KvStore, cmd: &Command, data: &[u8], max_transfer: usize) -> KvServiceDone {
    let cdw: [u32; 16] = std::array::from_fn(|i| cmd.cdw(i));
    let sgl_len = cmd.sgl().1 as usize;
    let decoded = match KvCommand::decode(cmd.opcode(), &cdw) {
        Ok(c) => c,
        // Flush (00h) has nothing to do: every change is durable when acknowledged.
        Err(_) if cmd.opcode() == 0x00 => return KvServiceDone::ok(),
        Err(e) => return KvServiceDone::status(kv_status(e.status())),
    };
    let outcome = match decoded {
        KvCommand::Store { key, value_size, mode } => {
            let size = value_size as usize;
            if size > store.max_value() {
                return KvServiceDone::status(kv_status(kvs::INVALID_VALUE_SIZE));
            }
            if size != data.len() {
                return KvServiceDone::status(SGL_LENGTH_INVALID);
            }
            store.store(&key, data, mode).map(|()| KvServiceDone { media: size as u64, ..KvServiceDone::ok() })
        }
        KvCommand::Retrieve { key, buffer } => {
            let buffer = buffer as usize;
            if buffer > sgl_len || buffer > max_transfer {
                return KvServiceDone::status(SGL_LENGTH_INVALID);
            }
            store.retrieve(&key).map(|mut v| {
                // DW0: the value's whole size; the data: as much as the buffer takes.
                let dw0 = v.len() as u32;
                v.truncate(buffer);
                KvServiceDone { dw0, media: v.len() as u64, data: Some(v), ..KvServiceDone::ok() }
            })
        }
        KvCommand::List { start, buffer } => {
            let buffer = buffer as usize;
            if buffer < 4 || buffer > max_transfer {
                return KvServiceDone::status(INVALID_FIELD);
            }
            if buffer > sgl_len {
                return KvServiceDone::status(SGL_LENGTH_INVALID);
            }
            let most = (buffer - 4) / list_entry_len(1); // no more keys than the shortest could fill
            store.list(start.as_ref(), most).map(|keys| {
                let (data, n) = encode_list(keys.iter().map(|k| k.as_bytes()), buffer);
                KvServiceDone { dw0: n as u32, data: Some(data), ..KvServiceDone::ok() }
            })
        }
        KvCommand::Delete { key } => store.delete(&key).map(|()| KvServiceDone::ok()),
        KvCommand::Exist { key } => store.exists(&key).map(|e| if e { KvServiceDone::ok() } else { KvServiceDone::status(kv_status(kvs::KEY_NOT_FOUND)) }),
    };
    outcome.unwrap_or_else(|e| {
        if matches!(e, insitu_kvstore::KvStoreError::Storage(_) | insitu_kvstore::KvStoreError::Full { .. }) {
            eprintln!("insitu-target: KV namespace {}: {e}", cmd.nsid());
        }
        KvServiceDone::status(kv_status(e.status()))
    })
}
