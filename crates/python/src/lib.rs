// SPDX-License-Identifier: Apache-2.0
//! `insitu._native`: the Python binding of the insitu host library and command line.
//!
//! Results cross the boundary as JSON text, the same documents `insitu ... --json` prints,
//! so the Python API and the command line cannot drift apart. Errors map to the exception
//! classes defined here and re-exported by the `insitu` package.

use insitu_host::{parse_args, scrub, Mode, OasError, Offloader, Request};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::OnceLock;

create_exception!(_native, InsituError, PyException, "Base class of every insitu error.");
create_exception!(_native, RequestError, InsituError, "The request is wrong: unknown function, bad argument, bad path.");
create_exception!(_native, NotOffloadableError, InsituError, "The file cannot be offloaded: not on an insitu device, or stored in a way the target cannot read.");
create_exception!(_native, TargetError, InsituError, "The target refused or failed the command (the message carries the NVMe status).");
create_exception!(_native, StorageIOError, InsituError, "An I/O call on the host failed.");

fn offloader() -> &'static Offloader {
    static OFF: OnceLock<Offloader> = OnceLock::new();
    OFF.get_or_init(Offloader::new)
}

fn to_py(e: OasError) -> PyErr {
    let msg = e.to_string();
    match e {
        OasError::BadRequest(_) => RequestError::new_err(msg),
        OasError::NotInsituDevice { .. } | OasError::NotOffloadable { .. } | OasError::Fiemap { .. } => NotOffloadableError::new_err(msg),
        OasError::Target { .. } => TargetError::new_err(msg),
        _ => StorageIOError::new_err(msg),
    }
}

fn json<T: serde::Serialize>(v: &T) -> PyResult<String> {
    serde_json::to_string(v).map_err(|e| InsituError::new_err(e.to_string()))
}

/// Runs the `insitu` command line with `argv` (program name first); returns the exit code.
#[pyfunction]
fn cli(py: Python<'_>, argv: Vec<String>) -> i32 {
    py.allow_threads(|| insitu_cli::run(argv))
}

/// Runs `function` over `paths`; `args` are `key=value` strings. Returns the report as JSON.
#[pyfunction]
#[pyo3(signature = (function, paths, args, conventional=false, output=None, force=false))]
fn exec_json(
    py: Python<'_>,
    function: String,
    paths: Vec<PathBuf>,
    args: Vec<String>,
    conventional: bool,
    output: Option<PathBuf>,
    force: bool,
) -> PyResult<String> {
    py.allow_threads(|| {
        let off = offloader();
        let args = parse_args(off.registry(), &function, &args).map_err(to_py)?;
        let mode = if conventional { Mode::Conventional } else { Mode::Offload };
        let report = off.exec(&Request { function, args, paths, output, mode, force }).map_err(to_py)?;
        json(&report)
    })
}

/// Creates (`create=True`) or verifies a scrub manifest; returns the report as JSON.
#[pyfunction]
#[pyo3(signature = (directory, manifest, create=false, function="blake3".to_string(), conventional=false))]
fn scrub_json(py: Python<'_>, directory: PathBuf, manifest: PathBuf, create: bool, function: String, conventional: bool) -> PyResult<String> {
    py.allow_threads(|| {
        let mode = if conventional { Mode::Conventional } else { Mode::Offload };
        let off = offloader();
        let report = if create { scrub::create(off, &directory, &manifest, &function, mode) } else { scrub::verify(off, &directory, &manifest, mode) };
        json(&report.map_err(to_py)?)
    })
}

/// Decodes a compute descriptor (bytes) into the JSON shape of `docs/vectors/vectors.json`.
#[pyfunction]
fn decode_descriptor(bytes: &[u8]) -> PyResult<String> {
    let d = insitu_wire::Descriptor::decode(bytes, &insitu_wire::Limits::default()).map_err(|e| RequestError::new_err(e.to_string()))?;
    let value = |v: &insitu_wire::Value| -> serde_json::Value {
        use insitu_wire::Value as V;
        let (t, val) = match v {
            V::U64(n) => ("u64", serde_json::json!(n)),
            V::I64(n) => ("i64", serde_json::json!(n)),
            V::Str(s) => ("str", serde_json::json!(s)),
            V::Bytes(b) => ("bytes", serde_json::json!(b.iter().map(|x| format!("{x:02x}")).collect::<String>())),
            V::Bool(b) => ("bool", serde_json::json!(b)),
            V::U64List(l) => ("u64-list", serde_json::json!(l)),
        };
        serde_json::json!({"type": t, "value": val})
    };
    let object = |o: &insitu_wire::VirtualObject| {
        let extents: Vec<serde_json::Value> = o
            .extents
            .iter()
            .map(|e| {
                let kind = if e.kind == insitu_wire::ExtentKind::Data { "data" } else { "zero" };
                serde_json::json!({"kind": kind, "start_sector": e.start_sector, "sectors": e.sectors})
            })
            .collect();
        serde_json::json!({"length": o.length, "extents": extents})
    };
    let doc = serde_json::json!({
        "function": d.function,
        "args": d.args.iter().map(|(k, v)| serde_json::json!([k, value(v)])).collect::<Vec<_>>(),
        "inputs": d.inputs.iter().map(object).collect::<Vec<_>>(),
        "outputs": d.outputs.iter().map(object).collect::<Vec<_>>(),
        "result": d.result.as_ref().map(object),
    });
    json(&doc)
}

/// The functions of the standard registry, as JSON (`insitu functions --json`).
#[pyfunction]
fn functions_json() -> PyResult<String> {
    let list: Vec<serde_json::Value> = offloader()
        .registry()
        .iter()
        .map(|k| {
            let params: Vec<serde_json::Value> =
                k.params().iter().map(|p| serde_json::json!({"key": p.key, "type": p.ty.name(), "required": p.required, "doc": p.doc})).collect();
            serde_json::json!({"name": k.name(), "summary": k.summary(), "outputs": k.output_count(), "args": params})
        })
        .collect();
    json(&list)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cli, m)?)?;
    m.add_function(wrap_pyfunction!(exec_json, m)?)?;
    m.add_function(wrap_pyfunction!(scrub_json, m)?)?;
    m.add_function(wrap_pyfunction!(decode_descriptor, m)?)?;
    m.add_function(wrap_pyfunction!(functions_json, m)?)?;
    let py = m.py();
    m.add("InsituError", py.get_type::<InsituError>())?;
    m.add("RequestError", py.get_type::<RequestError>())?;
    m.add("NotOffloadableError", py.get_type::<NotOffloadableError>())?;
    m.add("TargetError", py.get_type::<TargetError>())?;
    m.add("StorageIOError", py.get_type::<StorageIOError>())?;
    Ok(())
}
