// SPDX-License-Identifier: Apache-2.0
//! `insitu._native`: the Python binding of the insitu host library and command line.
//!
//! Results cross the boundary as JSON text, the same documents `insitu ... --json` prints,
//! so the Python API and the command line cannot drift apart. Errors map to the exception
//! classes defined here and re-exported by the `insitu` package.

mod host_attend;
mod kv;
mod kv_split;
mod kv_store;
mod lock;
mod quant;
mod session;

use insitu_host::{parse_args, scrub, Mode, OasError, Offloader, Request};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use std::path::PathBuf;
use std::sync::OnceLock;

create_exception!(_native, InsituError, PyException, "Base class of every insitu error.");
create_exception!(_native, RequestError, InsituError, "The request is wrong: unknown function, bad argument, bad path.");
create_exception!(
    _native,
    NotOffloadableError,
    InsituError,
    "The file cannot be offloaded: not on an insitu device, or stored in a way the target cannot read."
);
create_exception!(_native, TargetError, InsituError, "The target refused or failed the command (the message carries the NVMe status).");
create_exception!(_native, StorageIOError, InsituError, "An I/O call on the host failed.");

fn offloader() -> &'static Offloader {
    static OFF: OnceLock<Offloader> = OnceLock::new();
    OFF.get_or_init(|| Offloader::new().with_local_targets(std::sync::Arc::new(insitu_daemon::LocalEngines)))
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
    // The console script's process ends with this call: end quietly on a closed pipe, as
    // other Unix tools do, instead of failing on the write.
    // SAFETY: restores the default action of one signal; no memory is passed.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
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

/// Runs `function` over byte ranges `(start, length)` of the file at `path`, offloaded to the
/// target that holds it; returns `{"results": [...], "stats": {...}}` as JSON, one result
/// per range.
#[pyfunction]
fn exec_ranges_json(py: Python<'_>, function: String, path: PathBuf, ranges: Vec<(u64, u64)>, args: Vec<String>) -> PyResult<String> {
    py.allow_threads(|| {
        let off = offloader();
        let args = parse_args(off.registry(), &function, &args).map_err(to_py)?;
        let (results, stats) = off.exec_ranges(&function, &args, &path, &ranges).map_err(to_py)?;
        json(&serde_json::json!({"function": function, "results": results, "stats": stats}))
    })
}

/// Runs `function` on the host over byte strings, with the kernel a target runs; returns
/// the list of results as JSON, one per input.
#[pyfunction]
fn run_json(py: Python<'_>, function: String, inputs: Vec<PyBackedBytes>, args: Vec<String>) -> PyResult<String> {
    py.allow_threads(|| {
        let off = offloader();
        let args = parse_args(off.registry(), &function, &args).map_err(to_py)?;
        let slices: Vec<&[u8]> = inputs.iter().map(|b| &b[..]).collect();
        json(&insitu_host::run_in_memory(off.registry(), &function, &args, &slices).map_err(to_py)?)
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
    let d = insitu_proto::Descriptor::decode(bytes, &insitu_proto::Limits::default()).map_err(|e| RequestError::new_err(e.to_string()))?;
    let value = |v: &insitu_proto::Value| -> serde_json::Value {
        use insitu_proto::Value as V;
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
    let object = |o: &insitu_proto::VirtualObject| {
        let extents: Vec<serde_json::Value> = o
            .extents
            .iter()
            .map(|e| {
                let kind = if e.kind == insitu_proto::ExtentKind::Data { "data" } else { "zero" };
                serde_json::json!({"kind": kind, "start_sector": e.start_sector, "sectors": e.sectors})
            })
            .collect();
        {
            // `offset` appears only where it is set, so whole-file objects read as before.
            let mut j = serde_json::json!({"length": o.length, "extents": extents});
            if o.offset != 0 {
                j["offset"] = o.offset.into();
            }
            j
        }
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

/// Encodes a descriptor given as JSON text in the shape of `docs/vectors/vectors.json`
/// (the inverse of `decode_descriptor`); returns the bytes.
#[pyfunction]
fn encode_descriptor(py: Python<'_>, text: &str) -> PyResult<PyObject> {
    use insitu_proto::{Extent, Value as V, VirtualObject};
    let bad = |m: String| RequestError::new_err(format!("descriptor JSON: {m}"));
    let j: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    let object = |o: &serde_json::Value| -> PyResult<VirtualObject> {
        let extents = o["extents"].as_array().ok_or_else(|| bad("object without extents".into()))?;
        let mut out = Vec::new();
        for e in extents {
            let sectors = e["sectors"].as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| bad("extent sectors".into()))?;
            out.push(match e["kind"].as_str() {
                Some("zero") => Extent::zero(sectors),
                _ => Extent::data(e["start_sector"].as_u64().ok_or_else(|| bad("extent start_sector".into()))?, sectors),
            });
        }
        let offset = o["offset"].as_u64().unwrap_or(0).try_into().map_err(|_| bad("object offset".into()))?;
        Ok(VirtualObject { offset, length: o["length"].as_u64().ok_or_else(|| bad("object length".into()))?, extents: out })
    };
    let objects = |key: &str| -> PyResult<Vec<VirtualObject>> { j[key].as_array().map(|a| a.iter().map(object).collect()).unwrap_or(Ok(Vec::new())) };
    let mut args = Vec::new();
    for a in j["args"].as_array().cloned().unwrap_or_default() {
        let key = a[0].as_str().ok_or_else(|| bad("argument key".into()))?.to_owned();
        let v = &a[1]["value"];
        let value = match a[1]["type"].as_str() {
            Some("u64") => V::U64(v.as_u64().ok_or_else(|| bad(format!("{key}: not a u64")))?),
            Some("i64") => V::I64(v.as_i64().ok_or_else(|| bad(format!("{key}: not an i64")))?),
            Some("str") => V::Str(v.as_str().ok_or_else(|| bad(format!("{key}: not a string")))?.to_owned()),
            Some("bool") => V::Bool(v.as_bool().ok_or_else(|| bad(format!("{key}: not a bool")))?),
            Some("u64-list") => V::U64List(v.as_array().map(|l| l.iter().filter_map(|x| x.as_u64()).collect()).unwrap_or_default()),
            Some("bytes") => {
                let h = v.as_str().unwrap_or_default();
                let bytes: Option<Vec<u8>> = (0..h.len()).step_by(2).map(|i| h.get(i..i + 2).and_then(|x| u8::from_str_radix(x, 16).ok())).collect();
                V::Bytes(bytes.ok_or_else(|| bad(format!("{key}: not hex")))?)
            }
            other => return Err(bad(format!("{key}: unknown type {other:?}"))),
        };
        args.push((key, value));
    }
    let d = insitu_proto::Descriptor {
        function: j["function"].as_str().ok_or_else(|| bad("function".into()))?.to_owned(),
        args,
        inputs: objects("inputs")?,
        outputs: objects("outputs")?,
        result: if j["result"].is_null() { None } else { Some(object(&j["result"])?) },
    };
    // The encoder panics on lengths the format cannot hold; refuse them first.
    if d.function.len() > 32 || d.args.len() > 32 || d.args.iter().any(|(k, _)| k.len() > 32) || d.inputs.len() + d.outputs.len() > 1024 {
        return Err(bad("a name, argument list or object list is longer than the format allows".into()));
    }
    // Encode what decodes: refuse what the target would refuse as malformed.
    let bytes = d.encode();
    insitu_proto::Descriptor::decode(&bytes, &insitu_proto::Limits::default()).map_err(|e| bad(e.to_string()))?;
    Ok(pyo3::types::PyBytes::new(py, &bytes).into())
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

/// The device model `spec` names (`instinfer-csd`, `custom:25`, ...), as `insitu model
/// show SPEC --json` prints it; a spec that names no model raises `ValueError`.
#[pyfunction]
fn device_model_json(spec: &str) -> PyResult<String> {
    insitu_model::parse(spec).map(|m| m.to_json()).map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("device model {spec:?}: {e}")))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cli, m)?)?;
    m.add_class::<session::Session>()?;
    m.add_class::<kv::KvTarget>()?;
    m.add_class::<kv::EmbeddedTarget>()?;
    m.add_class::<kv::Pending>()?;
    m.add_function(wrap_pyfunction!(kv::attend_all, m)?)?;
    m.add_function(wrap_pyfunction!(kv_split::sparf_split, m)?)?;
    m.add_function(wrap_pyfunction!(kv_split::choose_split_pages, m)?)?;
    m.add_function(wrap_pyfunction!(host_attend::attend_page_pairs, m)?)?;
    m.add_function(wrap_pyfunction!(host_attend::sparf_components, m)?)?;
    m.add_function(wrap_pyfunction!(host_attend::page_masses_from_runs, m)?)?;
    m.add_function(wrap_pyfunction!(host_attend::attend_chosen_pages, m)?)?;
    m.add_class::<kv_store::KvNamespace>()?;
    m.add_class::<quant::BlockMatrix>()?;
    m.add_function(wrap_pyfunction!(quant::gguf_tensors, m)?)?;
    m.add_function(wrap_pyfunction!(exec_json, m)?)?;
    m.add_function(wrap_pyfunction!(scrub_json, m)?)?;
    m.add_function(wrap_pyfunction!(exec_ranges_json, m)?)?;
    m.add_function(wrap_pyfunction!(run_json, m)?)?;
    m.add_function(wrap_pyfunction!(decode_descriptor, m)?)?;
    m.add_function(wrap_pyfunction!(encode_descriptor, m)?)?;
    m.add_function(wrap_pyfunction!(functions_json, m)?)?;
    m.add_function(wrap_pyfunction!(device_model_json, m)?)?;
    lock::register(m)?;
    let py = m.py();
    m.add("InsituError", py.get_type::<InsituError>())?;
    m.add("RequestError", py.get_type::<RequestError>())?;
    m.add("NotOffloadableError", py.get_type::<NotOffloadableError>())?;
    m.add("TargetError", py.get_type::<TargetError>())?;
    m.add("StorageIOError", py.get_type::<StorageIOError>())?;
    Ok(())
}
