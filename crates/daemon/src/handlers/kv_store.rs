// SPDX-License-Identifier: Apache-2.0
//! The Key Value command set (CSI 01h) on the key-value service's namespace
//! (`docs/kv-store.md`): Store, Retrieve, List, Delete, Exist, run against the target's
//! [`KvStore`], and where that store lives (the end of the first private namespace).
//!
//! KV opcodes reuse NVM ones (Store 01h = Write, Retrieve 02h = Read), so the transport
//! sends every command for this namespace here before looking at the opcode. The
//! direction bits of the opcodes match their data (Store host to controller; Retrieve and
//! List controller to host; Delete and Exist none), so the transport moves the data as for
//! any command: Store's value arrives in the buffer the connection received it into and is
//! handed to the store from there.

use std::path::Path;
use std::sync::Arc;

use insitu_fabric::Command;
use insitu_kvstore::KvStore;
use insitu_nvmf::{CommandSetNamespace, Outcome};
use insitu_proto::kv::{encode_list, list_entry_len, status as kvs, KvCommand};
use insitu_proto::Status;

/// Data SGL Length Invalid (generic status 0Fh).
const SGL_LENGTH_INVALID: u8 = 0x0F;

/// A generic (type 0) status code, such as the KV command set's, as a completion status
/// field.
fn kv_status(sc: u8) -> u16 {
    Status { sct: 0, sc }.to_nvme_field()
}

/// A key-value store served as a namespace of the Key Value command set.
pub(crate) struct KvNamespace(pub(crate) Arc<KvStore>);

impl CommandSetNamespace for KvNamespace {
    fn csi(&self) -> u8 {
        insitu_proto::kv::CSI_KV
    }

    fn identify(&self, nguid: [u8; 16]) -> Vec<u8> {
        insitu_proto::kv::identify_namespace(self.0.capacity(), self.0.max_value() as u32, nguid)
    }

    fn execute(&self, cmd: &Command, data: &[u8], max_transfer: usize) -> Outcome {
        execute(&self.0, cmd, data, max_transfer)
    }
}

/// Runs one command addressed to the KV namespace with the data the host sent (Store's
/// value). `max_transfer` bounds what one command may return.
fn execute(store: &KvStore, cmd: &Command, data: &[u8], max_transfer: usize) -> Outcome {
    let cdw: [u32; 16] = std::array::from_fn(|i| cmd.cdw(i));
    let sgl_len = cmd.sgl().1 as usize;
    let decoded = match KvCommand::decode(cmd.opcode(), &cdw) {
        Ok(c) => c,
        // Flush (00h) has nothing to do: every change is durable when acknowledged.
        Err(_) if cmd.opcode() == 0x00 => return Outcome::ok(),
        Err(e) => return Outcome::status(kv_status(e.status())),
    };
    let outcome = match decoded {
        KvCommand::Store { key, value_size, mode } => {
            let size = value_size as usize;
            if size > store.max_value() {
                return Outcome::status(kv_status(kvs::INVALID_VALUE_SIZE));
            }
            if size != data.len() {
                return Outcome::status(kv_status(SGL_LENGTH_INVALID));
            }
            store.store(&key, data, mode).map(|()| Outcome { media_bytes: size as u64, ..Outcome::ok() })
        }
        KvCommand::Retrieve { key, buffer } => {
            let buffer = buffer as usize;
            if buffer > sgl_len || buffer > max_transfer {
                return Outcome::status(kv_status(SGL_LENGTH_INVALID));
            }
            store.retrieve(&key).map(|mut v| {
                // DW0: the value's whole size; the data: as much as the buffer takes.
                let dw0 = v.len() as u32;
                v.truncate(buffer);
                Outcome { dw0, media_bytes: v.len() as u64, data: v, ..Outcome::ok() }
            })
        }
        KvCommand::List { start, buffer } => {
            let buffer = buffer as usize;
            if buffer < 4 || buffer > max_transfer {
                return Outcome::status(Status::INVALID_FIELD.to_nvme_field());
            }
            if buffer > sgl_len {
                return Outcome::status(kv_status(SGL_LENGTH_INVALID));
            }
            let most = (buffer - 4) / list_entry_len(1); // no more keys than the shortest could fill
            store.list(start.as_ref(), most).map(|keys| {
                let (data, n) = encode_list(keys.iter().map(|k| k.as_bytes()), buffer);
                Outcome { dw0: n as u32, data, ..Outcome::ok() }
            })
        }
        KvCommand::Delete { key } => store.delete(&key).map(|()| Outcome::ok()),
        KvCommand::Exist { key } => store.exists(&key).map(|e| if e { Outcome::ok() } else { Outcome::status(kv_status(kvs::KEY_NOT_FOUND)) }),
    };
    outcome.unwrap_or_else(|e| {
        if matches!(e, insitu_kvstore::KvStoreError::Storage(_) | insitu_kvstore::KvStoreError::Full { .. }) {
            tracing::warn!("KV namespace {}: {e}", cmd.nsid());
        }
        Outcome::status(kv_status(e.status()))
    })
}

/// Where a subsystem's key-value store of `bytes` goes: (index of its first private
/// namespace, byte offset in that file, length), the region 4 KiB aligned at the file's end.
pub(crate) fn kv_region(s: &crate::SubsystemConfig, bytes: u64) -> Result<(usize, u64, u64), String> {
    let Some(at) = s.namespaces.iter().position(|n| n.visibility == insitu_engine::Visibility::Private) else {
        return Err(format!(
            "subsystem {}: a key-value store (--kv-store) lives in the target's private namespace, and there is none: add --private IMG",
            s.nqn
        ));
    };
    let (offset, len) = kv_store_span(&s.namespaces[at].path, bytes)?;
    Ok((at, offset, len))
}

/// The byte offset and length in the private namespace image `path` of a key-value store
/// of `bytes`: 4 KiB aligned at the file's end, leaving at least 1 MiB to the KV cache.
fn kv_store_span(path: &Path, bytes: u64) -> Result<(u64, u64), String> {
    let file = std::fs::metadata(path).map_err(|e| format!("private namespace {}: {e}", path.display()))?.len();
    let len = bytes / 4096 * 4096;
    let min_rest = 1 << 20; // what the KV cache keeps, at least
    if len == 0 || len.saturating_add(min_rest) > file / 4096 * 4096 {
        return Err(format!(
            "--kv-store {bytes} does not fit in private namespace {} ({file} bytes): it must leave at least {min_rest} bytes to the KV cache; give a larger image or a smaller size",
            path.display()
        ));
    }
    Ok((file / 4096 * 4096 - len, len))
}

/// The file of the key-value service's store in the private namespace's file system.
pub const KV_STORE_FILE: &str = "kv.redb";
/// Buffer cache of that file system (redb keeps its own cache above it).
pub(crate) const KV_FS_CACHE: usize = 8 << 20;

/// The private data file system (accelfs) in `[offset, offset + len)` of `path`: opened,
/// or formatted when the region is blank; paced like its namespace when it has a model.
pub(crate) fn open_kv_fs(path: &Path, offset: u64, len: u64, pacing: Option<Arc<dyn insitu_media::Pacing>>) -> Result<insitu_accelfs::Fs, String> {
    let file = std::fs::OpenOptions::new().read(true).write(true).open(path).map_err(|e| format!("KV store in {}: {e}", path.display()))?;
    let mut dev: Box<dyn insitu_accelfs::BlockDevice> = Box::new(insitu_accelfs::FileDevice::new(file, offset, len, path.display().to_string()));
    if let Some(p) = pacing {
        dev = Box::new(insitu_kvstore::PacedDevice::new(dev, p, offset));
    }
    insitu_accelfs::Fs::open_or_format(dev, KV_FS_CACHE).map_err(|e| {
        format!("the KV store's file system in the last {len} bytes of {}: {e} (a store made by an older insitu, or other data: use a blank image or zero that region; `insitu target fsck` checks it)", path.display())
    })
}

/// Checks, without changing anything, the file system holding the key-value store of a
/// target started with `--private path --kv-store bytes`.
pub fn fsck_kv_store(path: &Path, bytes: u64) -> Result<insitu_accelfs::FsckReport, String> {
    let (offset, len) = kv_store_span(path, bytes)?;
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let dev = insitu_accelfs::FileDevice::new(file, offset, len, path.display().to_string());
    insitu_accelfs::fsck(&dev).map_err(|e| e.to_string())
}
