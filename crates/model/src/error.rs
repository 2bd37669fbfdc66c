// SPDX-License-Identifier: Apache-2.0
//! The error type shared by every model in the crate.

use thiserror::Error;

/// Why a model could not be built or a model name could not be resolved.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ModelError {
    /// A [`FlashConfig`](crate::FlashConfig) field is out of range.
    #[error("invalid flash configuration: `{field}` {reason}")]
    Flash {
        /// The offending field.
        field: &'static str,
        /// What is wrong with it, including the value given.
        reason: String,
    },
    /// A [`LinkConfig`](crate::LinkConfig) field is out of range.
    #[error("invalid link configuration: `{field}` {reason}")]
    Link {
        /// The offending field.
        field: &'static str,
        /// What is wrong with it, including the value given.
        reason: String,
    },
    /// A [`ComputeConfig`](crate::ComputeConfig) field is out of range.
    #[error("invalid compute configuration: `{field}` {reason}")]
    Compute {
        /// The offending field.
        field: &'static str,
        /// What is wrong with it, including the value given.
        reason: String,
    },
    /// The drive would need more flash pages than the 32-bit page map can address.
    #[error(
        "a drive of {logical_bytes} bytes with {page_bytes}-byte pages needs {pages} physical pages, \
         more than the page map can address ({max}); use a larger page_bytes or a smaller drive"
    )]
    TooLarge {
        /// Logical capacity asked for.
        logical_bytes: u64,
        /// Flash page size of the configuration.
        page_bytes: u32,
        /// Physical pages that would be needed.
        pages: u64,
        /// Largest number of physical pages supported.
        max: u64,
    },
    /// No preset or named link has this name.
    #[error("unknown {kind} `{name}`; known: {known}")]
    Unknown {
        /// What was looked up: "device model" or "link".
        kind: &'static str,
        /// The name given.
        name: String,
        /// The names that exist, comma-separated.
        known: String,
    },
    /// A model specification string could not be parsed.
    #[error("bad device model specification `{spec}`: {reason}")]
    Spec {
        /// The specification given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Checks that `v` is finite and strictly positive.
pub(crate) fn positive(v: f64) -> Result<(), String> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(format!("must be a finite number > 0 (got {v})"))
    }
}

/// Checks that `v` is finite and not negative.
pub(crate) fn non_negative(v: f64) -> Result<(), String> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(format!("must be a finite number >= 0 (got {v})"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_field_and_value() {
        let e = ModelError::Flash { field: "channels", reason: "must be at least 1 (got 0)".into() };
        assert_eq!(e.to_string(), "invalid flash configuration: `channels` must be at least 1 (got 0)");
        assert!(positive(0.0).unwrap_err().contains("got 0"));
        assert!(positive(f64::NAN).is_err());
        assert!(non_negative(0.0).is_ok());
        assert!(non_negative(-1.0).is_err());
    }
}
