// SPDX-License-Identifier: Apache-2.0
//! The insitu offload engine: a registry of compute kernels that stream over virtual objects.
//!
//! A [`Kernel`] is looked up by name in a [`Registry`]. [`Kernel::prepare`] validates and
//! compiles the descriptor's arguments (a bad regex or predicate is refused *before* any
//! media is read) and returns a [`Job`]; [`Job::run`] then pulls each input object's bytes
//! chunk by chunk from an [`InputStream`] and writes large results to [`OutputSink`]s. No
//! kernel copies a whole object into memory except `sort`, whose output needs every line.
//!
//! The same kernels run on the target (over extents read from the media) and on the host for
//! the conventional path (over a file read through the file system), so a disagreement
//! between the two paths points at the data path, and the kernels themselves are checked
//! against the standard tools (`sha256sum`, `grep`, `wc`, `sort`, `zstd`).
//!
//! ```
//! use insitu_offload::{Registry, SliceInput, Args};
//! use insitu_proto::Value;
//!
//! let registry = Registry::standard();
//! let kernel = registry.get("wc").unwrap();
//! let job = kernel.prepare(&Args::new(&[])).unwrap();
//! let mut input = SliceInput::new(b"hello world\nbye\n", 4);
//! let records = job.run(&mut [&mut input], &mut []).unwrap();
//! assert_eq!(records[0].iter().find(|(k, _)| k == "lines").unwrap().1, Value::U64(2));
//! ```
#![deny(missing_docs)]

mod analytics;
mod args;
mod checksum;
mod csv_piece;
mod csv_select;
mod grep;
mod rs_encode;
mod sort;
mod stream;
#[cfg(test)]
mod testutil;
mod wc;
mod zstd_compress;

use std::collections::BTreeMap;

pub use args::{Args, Param, ParamType};
pub use insitu_proto::{Record, Value};
pub use stream::{InputStream, OutputSink, SliceInput, VecSink};

/// Why a kernel refused its arguments or failed on the data.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// An argument is missing, unknown, of the wrong type, or has an invalid value.
    #[error("argument {key:?}: {detail}")]
    BadArgument {
        /// The argument's key.
        key: String,
        /// What is wrong and what is accepted.
        detail: String,
    },
    /// The descriptor has the wrong number of input or output objects for this kernel.
    #[error("{0}")]
    BadShape(String),
    /// An output object cannot hold the result.
    #[error("output object {index} holds {capacity} bytes but the result needs more")]
    OutputTooSmall {
        /// Index of the output object.
        index: usize,
        /// Its capacity in bytes.
        capacity: u64,
    },
    /// The data cannot be processed (e.g. malformed CSV), with the reason.
    #[error("{0}")]
    Failed(String),
    /// Reading an input or writing an output failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

/// Refuses a run whose object counts don't fit the kernel: `inputs` is the exact number of
/// input objects wanted, or `None` for "one or more"; `outputs` is the exact number of
/// output objects.
pub(crate) fn check_shape(
    kernel: &str,
    inputs: &[&mut dyn InputStream],
    outputs: &[&mut dyn OutputSink],
    want_inputs: Option<usize>,
    want_outputs: usize,
) -> Result<(), KernelError> {
    let ok = match want_inputs {
        Some(n) => inputs.len() == n,
        None => !inputs.is_empty(),
    };
    if !ok {
        let want = want_inputs.map_or_else(|| "one or more".to_string(), |n| n.to_string());
        return Err(KernelError::BadShape(format!("{kernel} takes {want} input object(s), the descriptor has {}", inputs.len())));
    }
    if outputs.len() != want_outputs {
        return Err(KernelError::BadShape(format!("{kernel} takes {want_outputs} output object(s), the descriptor has {}", outputs.len())));
    }
    Ok(())
}

/// A compute function the offload engine can run.
///
/// Implementations are stateless; all per-command state lives in the [`Job`].
pub trait Kernel: Send + Sync {
    /// The name a descriptor uses, e.g. `"crc32c"`.
    fn name(&self) -> &'static str;
    /// One line for `--help` and `insitu functions`.
    fn summary(&self) -> &'static str;
    /// The arguments this kernel accepts; [`Args::check`] refuses others. Default: none.
    fn params(&self) -> &'static [Param] {
        &[]
    }
    /// How many output objects a descriptor must carry: 0 for kernels whose whole result is
    /// inline, 1 for kernels that write a result object (compress, sort, select). Default 0.
    fn output_count(&self) -> usize {
        0
    }
    /// Most input objects one command may carry. Default: no limit beyond the descriptor's.
    fn max_inputs(&self) -> usize {
        usize::MAX
    }
    /// The output capacity the host must provide when the inputs total `input_len` bytes
    /// (an upper bound of the result size). Default 0, for kernels without outputs.
    fn output_capacity(&self, _args: &Args<'_>, _input_len: u64) -> u64 {
        0
    }
    /// Validates and compiles the arguments. Errors here are reported before any data is read.
    fn prepare(&self, args: &Args<'_>) -> Result<Box<dyn Job>, KernelError>;
}

/// A prepared kernel invocation.
pub trait Job: Send {
    /// Runs over the inputs, writing to the outputs.
    ///
    /// Returns one record per input for kernels with no outputs, or one record (holding at
    /// least `output_length`) for kernels that write an output object.
    fn run(self: Box<Self>, inputs: &mut [&mut dyn InputStream], outputs: &mut [&mut dyn OutputSink]) -> Result<Vec<Record>, KernelError>;
}

/// Kernels by name.
pub struct Registry {
    kernels: BTreeMap<&'static str, Box<dyn Kernel>>,
}

impl Registry {
    /// An empty registry.
    pub fn empty() -> Self {
        Registry { kernels: BTreeMap::new() }
    }

    /// The standard kernels: `crc32c`, `xxh3`, `sha256`, `blake3`, `md5`, `grep`, `wc`,
    /// `zstd`, `rs-encode`, `sort`, `csv-select`, `csv-select-piece`, and the analysis kernels `count`, `vector-add`, `array-merge`,
    /// `pagerank`.
    pub fn standard() -> Self {
        let mut r = Registry::empty();
        for k in checksum::kernels() {
            r.register(k);
        }
        r.register(Box::new(grep::Grep));
        r.register(Box::new(wc::Wc));
        r.register(Box::new(zstd_compress::Zstd));
        r.register(Box::new(rs_encode::RsEncode));
        r.register(Box::new(sort::Sort));
        r.register(Box::new(csv_select::CsvSelect));
        r.register(Box::new(csv_piece::CsvPiece));
        r.register(Box::new(analytics::Count));
        r.register(Box::new(analytics::VECTOR_ADD));
        r.register(Box::new(analytics::ARRAY_MERGE));
        r.register(Box::new(analytics::PageRank));
        r
    }

    /// Adds a kernel, replacing any of the same name.
    pub fn register(&mut self, kernel: Box<dyn Kernel>) {
        self.kernels.insert(kernel.name(), kernel);
    }

    /// The kernel called `name`.
    pub fn get(&self, name: &str) -> Option<&dyn Kernel> {
        self.kernels.get(name).map(|k| k.as_ref())
    }

    /// All kernels, by name.
    pub fn iter(&self) -> impl Iterator<Item = &dyn Kernel> {
        self.kernels.values().map(|k| k.as_ref())
    }
}
