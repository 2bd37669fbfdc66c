// SPDX-License-Identifier: Apache-2.0
//! `insitu.Session`: the user-space NVMe/TCP initiator, from Python.

use crate::{RequestError, StorageIOError, TargetError};
use insitu_initiator::{default_hostnqn, ConnectOptions, InitiatorError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict};

pub(crate) fn to_py(e: InitiatorError) -> PyErr {
    let msg = e.to_string();
    match e {
        InitiatorError::Status { .. } | InitiatorError::ConnectRefused { .. } => TargetError::new_err(msg),
        InitiatorError::InvalidArgument { .. } | InitiatorError::NoNamespace { .. } => RequestError::new_err(msg),
        _ => StorageIOError::new_err(msg),
    }
}

/// A connection to an NVMe/TCP target (admin queue and I/O queues), safe to share between
/// threads. `Session("nvme-tcp://127.0.0.1:4420/nqn.2024-01.io.insitu:target")`.
#[pyclass(module = "insitu", frozen)]
pub struct Session {
    inner: insitu_initiator::Session,
}

#[pymethods]
impl Session {
    /// Connects to `url` (`nvme-tcp://HOST:PORT/NQN`) as `hostnqn` (default: this host's
    /// stable NQN) with `queue_depth` commands per queue and `io_queues` I/O queues.
    #[new]
    #[pyo3(signature = (url, hostnqn=None, queue_depth=32, io_queues=1, digests=false))]
    fn new(py: Python<'_>, url: &str, hostnqn: Option<String>, queue_depth: u16, io_queues: u16, digests: bool) -> PyResult<Self> {
        let u = insitu_attach::TargetUrl::parse(url).map_err(|e| RequestError::new_err(e.to_string()))?;
        let mut o = ConnectOptions::new(u.address(), u.nqn);
        o.hostnqn = hostnqn.unwrap_or_else(default_hostnqn);
        o.queue_depth = queue_depth;
        o.io_queues = io_queues;
        o.digests = insitu_initiator::Digests { header: digests, data: digests };
        let inner = py.allow_threads(|| insitu_initiator::Session::connect(o)).map_err(to_py)?;
        Ok(Session { inner })
    }

    /// Identify Controller, as a dict.
    fn identify_controller<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = py.allow_threads(|| self.inner.identify_controller()).map_err(to_py)?;
        let d = PyDict::new(py);
        d.set_item("cntlid", c.cntlid)?;
        d.set_item("serial", c.serial)?;
        d.set_item("model", c.model)?;
        d.set_item("firmware", c.firmware)?;
        d.set_item("mdts_bytes", c.mdts_bytes)?;
        d.set_item("namespaces", c.nn)?;
        d.set_item("subnqn", c.subnqn)?;
        d.set_item("maxcmd", c.maxcmd)?;
        Ok(d)
    }

    /// Identify Namespace: `{"nsid", "blocks", "lba_size", "size"}`.
    fn identify_namespace<'py>(&self, py: Python<'py>, nsid: u32) -> PyResult<Bound<'py, PyDict>> {
        let n = py.allow_threads(|| self.inner.identify_namespace(nsid)).map_err(to_py)?;
        let d = PyDict::new(py);
        d.set_item("nsid", n.nsid)?;
        d.set_item("blocks", n.nsze)?;
        d.set_item("lba_size", n.lba_size)?;
        d.set_item("size", n.size_bytes())?;
        Ok(d)
    }

    /// NSIDs of the active (sharable) namespaces.
    fn active_namespaces(&self, py: Python<'_>) -> PyResult<Vec<u32>> {
        py.allow_threads(|| self.inner.active_namespaces()).map_err(to_py)
    }

    /// Reads `nlb` logical blocks from `slba`.
    fn read<'py>(&self, py: Python<'py>, nsid: u32, slba: u64, nlb: u32) -> PyResult<Bound<'py, PyBytes>> {
        let lba = py.allow_threads(|| self.inner.lba_size(nsid)).map_err(to_py)?;
        let len = usize::try_from(u64::from(nlb) * u64::from(lba)).map_err(|_| RequestError::new_err("read too large"))?;
        // Straight into the bytes object Python gets: a large read (a FlexGen layer) is
        // copied once on its way from the socket, not twice.
        PyBytes::new_with(py, len, |buf| py.allow_threads(|| self.inner.read_into(nsid, slba, buf)).map_err(to_py))
    }

    /// Reads whole logical blocks from `slba` into `buffer`, a `bytearray` whose length is
    /// a multiple of the block size: a caller reading the same amount again and again
    /// (a FlexGen layer) reuses one buffer, with no allocation, zeroing or copy after the
    /// socket's. The bytearray must not be resized while the read runs.
    fn read_into(&self, py: Python<'_>, nsid: u32, slba: u64, buffer: &Bound<'_, PyByteArray>) -> PyResult<()> {
        let lba = py.allow_threads(|| self.inner.lba_size(nsid)).map_err(to_py)?;
        let len = buffer.len();
        if len == 0 || len % lba as usize != 0 {
            return Err(RequestError::new_err(format!("read_into: a {len}-byte buffer is not whole {lba}-byte blocks")));
        }
        let ptr = buffer.data() as usize;
        py.allow_threads(|| {
            // SAFETY: the bytearray is borrowed for this call and not resized during it
            // (the caller's promise): its `len` bytes at `ptr` stay valid until we return.
            let out = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) };
            self.inner.read_into(nsid, slba, out)
        })
        .map_err(to_py)
    }

    /// Reads the runs `(slba, nlb)` of `runs` into `buffer`, back to back in the order
    /// given, all in flight at once (several runs spread over the session's I/O queues):
    /// `buffer`'s length must be their total size. The bytearray must not be resized
    /// while the read runs.
    fn read_runs_into(&self, py: Python<'_>, nsid: u32, runs: Vec<(u64, u64)>, buffer: &Bound<'_, PyByteArray>) -> PyResult<()> {
        let (ptr, len) = (buffer.data() as usize, buffer.len());
        py.allow_threads(|| {
            // SAFETY: as for `read_into`: the bytearray is borrowed for this call and not
            // resized during it.
            let out = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) };
            self.inner.read_runs_into(nsid, &runs, out)
        })
        .map_err(to_py)
    }

    /// Writes whole logical blocks at `slba`.
    fn write(&self, py: Python<'_>, nsid: u32, slba: u64, data: &[u8]) -> PyResult<()> {
        py.allow_threads(|| self.inner.write(nsid, slba, data)).map_err(to_py)
    }

    /// Makes completed writes durable.
    fn flush(&self, py: Python<'_>, nsid: u32) -> PyResult<()> {
        py.allow_threads(|| self.inner.flush(nsid)).map_err(to_py)
    }

    /// Sends EXEC with a descriptor (see `insitu._native.encode_descriptor`); returns
    /// `(result_length, media_kib)` from completion dwords 0 and 1. The result is in the
    /// descriptor's result object: read it with `read`.
    #[pyo3(signature = (nsid, descriptor, idempotent=true))]
    fn exec(&self, py: Python<'_>, nsid: u32, descriptor: &[u8], idempotent: bool) -> PyResult<(u32, u32)> {
        let c =
            py.allow_threads(|| if idempotent { self.inner.exec_idempotent(nsid, descriptor) } else { self.inner.exec(nsid, descriptor) }).map_err(to_py)?;
        Ok((c.dw0, c.dw1))
    }

    /// Bytes sent and received on the wire, and reconnects, so far.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        d.set_item("bytes_sent", s.bytes_sent)?;
        d.set_item("bytes_received", s.bytes_received)?;
        d.set_item("reconnects", s.reconnects)?;
        Ok(d)
    }

    /// Shuts the controller down and closes the connections.
    fn disconnect(&self, py: Python<'_>) -> PyResult<()> {
        py.allow_threads(|| self.inner.disconnect()).map_err(to_py)
    }
}
