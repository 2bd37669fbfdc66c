// SPDX-License-Identifier: Apache-2.0
//! In-storage containers (DockerSSD): unmodified container images run on the target, next
//! to its data, driven by the stock `docker` CLI.
//!
//! * [`image`]: the image store kept in the target's private namespace: blobs, manifests
//!   and unpacked layers; pull from an OCI/Docker registry and `docker load`.
//! * [`runtime`]: containers as runc bundles over an overlayfs of the image's layers, their
//!   logs and exit codes in the private namespace, and their state machine.
//! * [`build`]: `docker build` with buildah, its storage in the private namespace.
//! * [`api`]: the Docker Engine API subset the docker CLI needs, over HTTP.
//! * [`Service`]: all of it for one target: the private namespace mounted where only the
//!   target sees it, and the API served on an address.
#![deny(missing_docs)]
#![recursion_limit = "256"]

pub mod api;
pub mod build;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
#[path = "store/mod.rs"]
pub mod image;
pub mod runtime;
mod service;

pub use service::{Service, ServiceConfig};
