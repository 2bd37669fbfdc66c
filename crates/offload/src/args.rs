// SPDX-License-Identifier: Apache-2.0
//! Typed access to a descriptor's arguments, checked against a kernel's parameter list.

use crate::KernelError;
use insitu_proto::Value;

/// The type a parameter accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamType {
    /// A UTF-8 string.
    Str,
    /// An unsigned integer.
    U64,
    /// A boolean.
    Bool,
}

impl ParamType {
    /// Name used in messages and `--help`.
    pub fn name(self) -> &'static str {
        match self {
            ParamType::Str => "string",
            ParamType::U64 => "unsigned integer",
            ParamType::Bool => "boolean",
        }
    }

    fn accepts(self, v: &Value) -> bool {
        matches!((self, v), (ParamType::Str, Value::Str(_)) | (ParamType::U64, Value::U64(_)) | (ParamType::Bool, Value::Bool(_)))
    }
}

/// One parameter a kernel accepts.
#[derive(Debug, Clone, Copy)]
pub struct Param {
    /// The key.
    pub key: &'static str,
    /// Its type.
    pub ty: ParamType,
    /// Whether a descriptor must carry it.
    pub required: bool,
    /// What it does, and its default when optional.
    pub doc: &'static str,
}

/// A descriptor's arguments.
#[derive(Debug, Clone, Copy)]
pub struct Args<'a> {
    list: &'a [(String, Value)],
}

impl<'a> Args<'a> {
    /// Wraps a decoded argument list.
    pub fn new(list: &'a [(String, Value)]) -> Self {
        Args { list }
    }

    /// The raw value of `key`.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.list.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Refuses unknown keys, missing required keys and values of the wrong type.
    pub fn check(&self, params: &[Param]) -> Result<(), KernelError> {
        for (key, value) in self.list {
            let Some(p) = params.iter().find(|p| p.key == key) else {
                let known: Vec<&str> = params.iter().map(|p| p.key).collect();
                return Err(KernelError::BadArgument {
                    key: key.clone(),
                    detail: format!("unknown argument; this function accepts: {}", if known.is_empty() { "none".into() } else { known.join(", ") }),
                });
            };
            if !p.ty.accepts(value) {
                return Err(KernelError::BadArgument { key: key.clone(), detail: format!("expected a {}, got a {}", p.ty.name(), value.type_name()) });
            }
        }
        for p in params.iter().filter(|p| p.required) {
            if self.get(p.key).is_none() {
                return Err(KernelError::BadArgument { key: p.key.into(), detail: format!("required: {}", p.doc) });
            }
        }
        Ok(())
    }

    /// A string argument, if present.
    pub fn str(&self, key: &str) -> Option<&'a str> {
        match self.get(key) {
            Some(Value::Str(s)) => Some(s),
            _ => None,
        }
    }

    /// An integer argument, or `default`.
    pub fn u64_or(&self, key: &str, default: u64) -> u64 {
        match self.get(key) {
            Some(Value::U64(v)) => *v,
            _ => default,
        }
    }

    /// A boolean argument, or `default`.
    pub fn bool_or(&self, key: &str, default: bool) -> bool {
        match self.get(key) {
            Some(Value::Bool(v)) => *v,
            _ => default,
        }
    }
}
