// SPDX-License-Identifier: Apache-2.0
//! From a [`TargetSpec`] to a serving target: the spec checked and turned into the
//! transport's configuration, then the target bound and its services started.

use std::path::{Path, PathBuf};

use crate::{NamespaceSpec, SubsystemConfig, Target, TargetConfig};
use serde_json::{json, Value};

use crate::{containers, file_name, metrics, Error, TargetSpec, RUN_DIR};

/// A checked spec, ready to assemble.
pub(crate) struct Plan {
    pub(crate) spec: TargetSpec,
    cfg: TargetConfig,
    containers: Option<insitu_isp::ServiceConfig>,
}

/// A target bound and with its services started; [`Target::run`] serves it.
pub struct Assembled {
    /// The target, bound to its address.
    pub server: Target,
}

impl Plan {
    /// Checks `spec` (paths made absolute, private namespaces enough for what was asked)
    /// and derives the transport's and the container service's configuration.
    pub(crate) fn new(spec: TargetSpec) -> Result<Plan, Error> {
        if spec.namespaces.is_empty() {
            return Err("give at least one --namespace PATH (a file or block device)".to_string().into());
        }
        // Absolute paths: the record must mean the same from any working directory.
        let absolute = |p: &PathBuf| std::fs::canonicalize(p).map_err(|e| format!("namespace {}: {e}", p.display()));
        let spec = TargetSpec {
            namespaces: spec.namespaces.iter().map(absolute).collect::<Result<_, _>>()?,
            private: spec.private.iter().map(absolute).collect::<Result<_, _>>()?,
            ..spec
        };
        let mut namespaces: Vec<NamespaceSpec> = spec.namespaces.iter().map(NamespaceSpec::sharable).collect();
        // With --docker the last private namespace holds a file system of the container
        // service; the fabric (and its KV cache) keeps the others.
        let fabric_private = if spec.docker.is_some() {
            if spec.private.is_empty() {
                return Err("--docker needs a private namespace for images and containers: add --private IMG (a blank image is formatted)".to_string().into());
            }
            &spec.private[..spec.private.len() - 1]
        } else {
            &spec.private[..]
        };
        if spec.kv_store.is_some() && fabric_private.is_empty() {
            let why = if spec.private.is_empty() { "" } else { " (with --docker the last --private namespace holds the containers, so give one more)" };
            return Err(format!(
                "--kv-store keeps the key-value store in the first private namespace: add --private IMG (a file or block device larger than the store){why}"
            )
            .into());
        }
        if spec.kv_store == Some(0) {
            return Err("--kv-store 0: give the store's size, e.g. --kv-store 64M".to_string().into());
        }
        namespaces.extend(fabric_private.iter().map(NamespaceSpec::private));
        let model = spec.model.as_deref().map(insitu_model::parse).transpose().map_err(|e| e.to_string())?;
        if spec.docker.is_none() && !(spec.registry_mirrors.is_empty() && spec.insecure_registries.is_empty()) {
            return Err("--registry-mirror and --insecure-registry are settings of the container service: add --docker ADDR:PORT".to_string().into());
        }
        let registries = insitu_isp::image::RegistryConfig::new(&spec.registry_mirrors, &spec.insecure_registries)?;
        let containers = spec.docker.map(|listen| insitu_isp::ServiceConfig {
            listen,
            private: spec.private.last().cloned().unwrap_or_default(),
            sharable: spec.namespaces.first().cloned(),
            state_dir: Path::new(RUN_DIR).join(format!("isp-{}", file_name(&listen))),
            limits: containers::limits(model.as_ref()),
            // Set when the containers start, once the KV store's directory is mounted.
            kv_dir: None,
            registries,
        });
        let cfg = TargetConfig {
            model,
            listen: spec.listen,
            subsystems: vec![SubsystemConfig { nqn: spec.nqn.clone(), namespaces, allow_hosts: spec.allow_hosts.clone() }],
            kv_store: spec.kv_store,
            direct_reads: spec.direct_reads,
            ..TargetConfig::default()
        };
        Ok(Plan { spec, cfg, containers })
    }

    /// The record a daemon leaves under [`RUN_DIR`] (without its pid and log).
    pub(crate) fn record(&self) -> Value {
        let s = &self.spec;
        json!({
            "ether": s.ether,
            "listen": s.listen.to_string(), "nqn": s.nqn, "namespaces": s.namespaces, "private": s.private,
            "allow_hosts": s.allow_hosts, "metrics": s.metrics.map(|m| m.to_string()), "model": s.model,
            "docker": s.docker.map(|d| d.to_string()), "kv_store": s.kv_store, "direct_reads": s.direct_reads,
            "registry_mirrors": s.registry_mirrors, "insecure_registries": s.insecure_registries,
        })
    }

    /// Binds the target and starts its services: Ether-oN, metrics and containers;
    /// `bound` runs between binding and starting them (a daemon moves its output to its
    /// log there).
    pub(crate) fn assemble(self, bound: impl FnOnce(&Target)) -> Result<Assembled, Error> {
        let listen = self.cfg.listen;
        // Before the target starts any thread: with containers, SIGTERM and SIGINT are taken
        // by one thread that stops them first, so every other thread must block both.
        let stop_signals = self.containers.is_some().then(containers::block_stop_signals);
        let server = Target::bind(self.cfg).map_err(|e| format!("cannot start the target on {listen}: {e}"))?;
        bound(&server);
        if let Some(spec) = self.spec.ether.as_deref() {
            let cidr: insitu_etheron::Cidr = spec.parse().map_err(|e: insitu_etheron::EtherError| format!("--ether: {e}"))?;
            let tap = insitu_etheron::Tap::create(&cidr, None).map_err(|e| format!("--ether: {e}"))?;
            server.attach_ether(tap).map_err(|e| format!("--ether: {e}"))?;
        }
        if let Some(m) = self.spec.metrics {
            metrics::serve(m, server.metrics())?;
        }
        if let (Some(cfg), Some(set)) = (self.containers, stop_signals) {
            containers::start(&server, cfg, set)?;
        }
        Ok(Assembled { server })
    }
}
