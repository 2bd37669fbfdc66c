// SPDX-License-Identifier: Apache-2.0
//! `BlockMatrix`: a GGUF block-quantized weight matrix the host's linear layers multiply
//! in its blocks (`insitu_quant`).

use crate::kv::{bad, f32s, to_bytes};
use insitu_quant::Format;
use pyo3::prelude::*;
use pyo3::types::PyByteArray;
use std::path::PathBuf;

/// A `rows x cols` weight matrix in a GGUF block format ("Q4_1" or "Q8_0"), row after row.
#[pyclass(module = "insitu", frozen)]
pub struct BlockMatrix {
    inner: insitu_quant::BlockMatrix,
}

#[pymethods]
impl BlockMatrix {
    #[new]
    fn new(format: &str, rows: usize, cols: usize, data: &[u8]) -> PyResult<Self> {
        let f = Format::from_name(format).ok_or_else(|| bad(format!("block format {format:?}: use \"Q4_1\" or \"Q8_0\"")))?;
        let inner = insitu_quant::BlockMatrix::new(f, rows, cols, data.to_vec()).map_err(|e| bad(e.to_string()))?;
        Ok(BlockMatrix { inner })
    }

    /// Output rows.
    #[getter]
    fn rows(&self) -> usize {
        self.inner.rows()
    }

    /// Weights per row.
    #[getter]
    fn cols(&self) -> usize {
        self.inner.cols()
    }

    /// The matrix as little-endian f32 bytes, with the GGUF reference de-quantizer's bits.
    fn dequantize<'py>(&self, py: Python<'py>) -> Bound<'py, PyByteArray> {
        let w = py.allow_threads(|| to_bytes(&self.inner.dequantize()));
        PyByteArray::new(py, &w)
    }

    /// `x · Wᵀ` for the `n` rows of `x` (little-endian f32 bytes, row after row): `n x rows`
    /// f32 values as a bytearray. The GIL is released while it computes.
    fn matmul<'py>(&self, py: Python<'py>, x: &[u8], n: usize) -> PyResult<Bound<'py, PyByteArray>> {
        let x = f32s("x", x)?;
        let y = py.allow_threads(|| self.inner.matmul(&x, n).map(|y| to_bytes(&y))).map_err(|e| bad(e.to_string()))?;
        Ok(PyByteArray::new(py, &y))
    }
}

/// The tensor directory of the GGUF file at `path`: `(architecture or None, [(name, dims
/// innermost first, block format "Q4_1"/"Q8_0" or None, byte offset of its data, its
/// length in bytes where it is whole blocks of that format or None)])`.
#[pyfunction]
pub fn gguf_tensors(py: Python<'_>, path: PathBuf) -> PyResult<GgufDirectory> {
    let d = py.allow_threads(|| insitu_quant::read_tensor_directory(&path)).map_err(|e| bad(format!("{}: {e}", path.display())))?;
    let tensors = d
        .tensors
        .into_iter()
        .map(|t| {
            let format = t.format().map(|f| format!("{f:?}"));
            let bytes = t.block_bytes();
            (t.name, t.dims, format, t.offset, bytes)
        })
        .collect();
    Ok((d.architecture, tensors))
}

type GgufDirectory = (Option<String>, Vec<(String, Vec<u64>, Option<String>, u64, Option<u64>)>);
