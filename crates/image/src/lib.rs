// SPDX-License-Identifier: Apache-2.0
//! File-system images on loop devices, as the command line, the demo and the benchmarks
//! use them: [`create`] one with ext4 or XFS, [`mount`] and [`umount`] it, or take a
//! [`Scratch`] image that is removed afterwards; and sizes written the way the command
//! line takes them ([`parse_size`]: `256M`) and prints them ([`human`]).

mod image;
mod size;

pub use image::{create, mount, umount, Fs, Scratch};
pub use size::{human, parse_size};

/// What went wrong, said for a person: the command, the path, and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Error(String);

impl From<String> for Error {
    fn from(message: String) -> Self {
        Error(message)
    }
}

impl From<&str> for Error {
    fn from(message: &str) -> Self {
        Error(message.to_string())
    }
}
