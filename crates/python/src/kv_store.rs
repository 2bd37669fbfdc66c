// SPDX-License-Identifier: Apache-2.0
//! `insitu._native.KvNamespace`: a target's key-value namespace (NVMe Key Value command
//! set, `docs/kv-store.md`) from Python. `insitu.kv(url)` wraps it in a
//! `collections.abc.MutableMapping` (`python/insitu/_kv_store.py`); this module keeps to
//! plain bytes. Every call releases the GIL while it waits for the target.
//!
//! (Not to be confused with `kv.rs`, the LLM KV *cache*.)

use crate::session::to_py;
use insitu_initiator::{default_hostnqn, ConnectOptions, InitiatorError, Session, StoreMode};
use pyo3::exceptions::{PyKeyError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Longest key the Key Value command set carries.
const MAX_KEY: usize = 16;

/// A connection to one key-value namespace of an NVMe/TCP target. Safe to share between
/// threads. Use `insitu.kv(url)` for the dict-like interface.
#[pyclass(module = "insitu", frozen)]
pub struct KvNamespace {
    inner: Session,
    nsid: u32,
    url: String,
}

/// A ValueError that says what keys may be, for a key that is empty or too long.
fn check_key(key: &[u8]) -> PyResult<()> {
    if key.is_empty() || key.len() > MAX_KEY {
        return Err(PyValueError::new_err(format!(
            "a key of {} bytes is invalid: keys are 1 to {MAX_KEY} bytes (the NVMe Key Value command set carries them in the command)",
            key.len()
        )));
    }
    Ok(())
}

/// KeyError(key) for an absent key, the usual mapping of other errors otherwise.
fn key_error(py: Python<'_>, key: &[u8], e: InitiatorError) -> PyErr {
    match e {
        InitiatorError::KeyNotFound { .. } => PyKeyError::new_err(PyBytes::new(py, key).unbind()),
        e => to_py(e),
    }
}

#[pymethods]
impl KvNamespace {
    /// Connects to `url` (`nvme-tcp://HOST:PORT/NQN[/NSID]`) as `hostnqn` (default: this
    /// host's stable NQN). Without NSID, uses the namespace whose Identify reports the Key
    /// Value command set; raises `RequestError` when the target serves none.
    #[new]
    #[pyo3(signature = (url, hostnqn=None))]
    fn new(py: Python<'_>, url: &str, hostnqn: Option<String>) -> PyResult<Self> {
        let u = insitu_attach::TargetUrl::parse(url).map_err(|e| crate::RequestError::new_err(e.to_string()))?;
        let mut o = ConnectOptions::new(u.address(), u.nqn.clone());
        o.hostnqn = hostnqn.unwrap_or_else(default_hostnqn);
        let (inner, nsid) = py
            .allow_threads(|| {
                let s = Session::connect(o)?;
                let nsid = match u.nsid {
                    Some(n) => Some(n),
                    None => s.kv_namespace()?,
                };
                Ok::<_, InitiatorError>((s, nsid))
            })
            .map_err(to_py)?;
        let nsid = nsid.ok_or_else(|| {
            crate::RequestError::new_err(format!(
                "{} at {} serves no key-value namespace; start the target with `insitu target start --private IMG --kv-store SIZE`",
                u.nqn,
                u.address()
            ))
        })?;
        Ok(KvNamespace { inner, nsid, url: url.to_string() })
    }

    /// The NSID of the key-value namespace.
    #[getter]
    fn nsid(&self) -> u32 {
        self.nsid
    }

    /// The URL it was opened with.
    #[getter]
    fn url(&self) -> &str {
        &self.url
    }

    /// Stores `value` under `key` (replacing any value); returns once the target has made
    /// it durable.
    fn store(&self, py: Python<'_>, key: &[u8], value: &[u8]) -> PyResult<()> {
        check_key(key)?;
        py.allow_threads(|| self.inner.kv_store(self.nsid, key, value, StoreMode::Upsert)).map_err(to_py)
    }

    /// The value of `key`; KeyError when absent.
    fn retrieve<'py>(&self, py: Python<'py>, key: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
        check_key(key)?;
        let v = py.allow_threads(|| self.inner.kv_retrieve(self.nsid, key)).map_err(|e| key_error(py, key, e))?;
        Ok(PyBytes::new(py, &v))
    }

    /// Deletes `key`; KeyError when absent.
    fn delete(&self, py: Python<'_>, key: &[u8]) -> PyResult<()> {
        check_key(key)?;
        py.allow_threads(|| self.inner.kv_delete(self.nsid, key)).map_err(|e| key_error(py, key, e))
    }

    /// Whether `key` exists.
    fn exists(&self, py: Python<'_>, key: &[u8]) -> PyResult<bool> {
        check_key(key)?;
        py.allow_threads(|| self.inner.kv_exist(self.nsid, key)).map_err(to_py)
    }

    /// Every key starting with `prefix` (empty: all), in byte order.
    #[pyo3(signature = (prefix=b"".as_slice()))]
    fn keys<'py>(&self, py: Python<'py>, prefix: &[u8]) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let keys = py.allow_threads(|| self.inner.kv_list(self.nsid, prefix)).map_err(to_py)?;
        Ok(keys.iter().map(|k| PyBytes::new(py, k)).collect())
    }

    /// Shuts the controller down and closes the connection.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.allow_threads(|| self.inner.disconnect()).map_err(to_py)
    }
}
