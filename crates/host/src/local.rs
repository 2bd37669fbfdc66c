// SPDX-License-Identifier: Apache-2.0
//! The embedded default: EXEC on a file of a local image, served in this process by a
//! target that whoever builds the [`crate::Offloader`] supplies (`insitu-daemon`'s
//! `LocalEngines`), so this host library never links the target's code.

use std::path::Path;
use std::sync::Arc;

use insitu_offload::Registry;
use insitu_proto::CommandError;

use crate::OasError;

/// What one local EXEC returned.
#[derive(Debug, Clone)]
pub struct LocalOutcome {
    /// The encoded result records.
    pub result: Vec<u8>,
    /// Bytes read from the media.
    pub media_read_bytes: u64,
}

/// A target serving one image as namespace 1.
pub trait LocalTarget: Send + Sync {
    /// Runs one EXEC whose descriptor is `descriptor`.
    fn exec(&self, descriptor: &[u8]) -> Result<LocalOutcome, CommandError>;
}

/// Opens local targets.
pub trait LocalTargets: Send + Sync {
    /// A target serving `image` (a file or block device) as namespace 1 with the kernels of
    /// `registry`, paced like `model` when the image carries one (`insitu image create
    /// --model`): a model the image's sidecar names but the drive cannot have is a
    /// [`OasError::BadRequest`] naming the sidecar ([`crate::model_sidecar`]).
    fn open(&self, image: &Path, registry: Arc<Registry>, model: Option<&insitu_model::DeviceModel>) -> Result<Arc<dyn LocalTarget>, OasError>;
}
