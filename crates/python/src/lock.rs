// SPDX-License-Identifier: Apache-2.0
//! `insitu.lock(path)`, `insitu.unlock(path)`, `insitu.locks()`: host/container locks
//! (DockerSSD's inode lock) from Python, over `insitu_host::lock`.
//!
//! ```python
//! with insitu.lock("/mnt/remote/input.csv") as l:   # host writers now get EROFS
//!     run_container_on(l.url)
//! # released: the host may write again, the target's containers see its changes
//! ```

use crate::{json, RequestError, StorageIOError, TargetError};
use insitu_host::lock as host_lock;
use insitu_host::lock::{LockError, LockHandle};
use pyo3::prelude::*;
use pyo3::types::PyModule;
use std::path::PathBuf;
use std::sync::Mutex;

fn to_py(e: LockError) -> PyErr {
    let msg = e.to_string();
    match e {
        LockError::Target { .. } => TargetError::new_err(msg),
        LockError::Host { .. } => StorageIOError::new_err(msg),
        _ => RequestError::new_err(msg),
    }
}

/// A lock on a path of an attached file system, as `insitu.lock` returns it. While held,
/// the host cannot modify the path; `unlock()` (or leaving a `with` block) releases it.
/// Dropping the object does not release the lock: locks outlive processes until
/// `insitu unlock` or a target restart.
#[pyclass(module = "insitu", name = "Lock", frozen)]
pub struct Lock {
    handle: LockHandle,
    released: Mutex<bool>,
}

#[pymethods]
impl Lock {
    /// The locked path (canonical).
    #[getter]
    fn path(&self) -> PathBuf {
        self.handle.path.clone()
    }

    /// The lock id the target returned.
    #[getter]
    fn id(&self) -> u64 {
        self.handle.id
    }

    /// The target namespace's URL.
    #[getter]
    fn url(&self) -> String {
        self.handle.url.clone()
    }

    /// The namespace.
    #[getter]
    fn nsid(&self) -> u32 {
        self.handle.nsid
    }

    /// Extents fenced on the target.
    #[getter]
    fn extents(&self) -> usize {
        self.handle.extents
    }

    /// Bytes fenced on the target.
    #[getter]
    fn bytes(&self) -> u64 {
        self.handle.bytes
    }

    /// True until `unlock()`.
    #[getter]
    fn held(&self) -> bool {
        !*self.released.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Releases the lock; returns a dict (`lock`, `target_held`, `note`). Releasing twice
    /// is an error.
    fn unlock(&self, py: Python<'_>) -> PyResult<PyObject> {
        let mut released = self.released.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if *released {
            return Err(RequestError::new_err(format!("{}: this lock was released already", self.handle.path.display())));
        }
        let u = py.allow_threads(|| host_lock::unlock(&self.handle.path)).map_err(to_py)?;
        *released = true;
        loads(py, &json(&u)?)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        if self.held() {
            self.unlock(py)?;
        }
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!("<insitu.Lock {} id={:#x} {}>", self.handle.path.display(), self.handle.id, if self.held() { "held" } else { "released" })
    }
}

/// Locks `path` for the target's containers (`insitu lock`). Returns a `Lock`.
#[pyfunction]
fn lock(py: Python<'_>, path: PathBuf) -> PyResult<Lock> {
    let handle = py.allow_threads(|| host_lock::lock(&path)).map_err(to_py)?;
    Ok(Lock { handle, released: Mutex::new(false) })
}

/// Releases the lock on `path` taken by any process (`insitu unlock`); returns a dict
/// (`lock`, `target_held`, `note`).
#[pyfunction]
fn unlock(py: Python<'_>, path: PathBuf) -> PyResult<PyObject> {
    let u = py.allow_threads(|| host_lock::unlock(&path)).map_err(to_py)?;
    loads(py, &json(&u)?)
}

/// The locks this host holds (`insitu lock --list`), as a list of dicts.
#[pyfunction]
fn locks(py: Python<'_>) -> PyResult<PyObject> {
    loads(py, &json(&host_lock::held())?)
}

fn loads(py: Python<'_>, text: &str) -> PyResult<PyObject> {
    Ok(py.import("json")?.call_method1("loads", (text,))?.unbind())
}

/// Adds the lock API to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Lock>()?;
    m.add_function(wrap_pyfunction!(lock, m)?)?;
    m.add_function(wrap_pyfunction!(unlock, m)?)?;
    m.add_function(wrap_pyfunction!(locks, m)?)?;
    Ok(())
}
