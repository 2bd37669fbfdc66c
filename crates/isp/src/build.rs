// SPDX-License-Identifier: Apache-2.0
//! `docker build` on the target, with Debian's buildah.
//!
//! buildah runs as the target's root with its storage (the vfs driver), its registry
//! settings and its temporary files in a directory of the private namespace, never the
//! host's `/var/lib/containers`; `RUN` steps have no network unless the request asks for
//! the target's. A base image in the target's store is
//! handed to buildah from there (an OCI archive of the blobs as they were pulled); any
//! other is pulled by buildah from its registry, with the target's insecure registries
//! and Docker Hub mirrors. `RUN` steps run under runc (buildah's OCI isolation: chroot
//! isolation cannot take a step's network away). The result is exported as a `docker save` archive and loaded
//! into the image store, and buildah's storage is emptied: one build at a time, nothing of
//! it kept but the image.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::image::{ImageStore, Reference, RegistryConfig};

/// The network a build's `RUN` steps get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BuildNetwork {
    /// Loopback only (Docker's `networkmode=none`; the default here).
    #[default]
    None,
    /// The target's own network (`networkmode=host`).
    Host,
}

/// What to build, from a `POST /build` request.
#[derive(Debug, Clone, Default)]
pub struct BuildOptions {
    /// The Dockerfile, relative to the context (`Dockerfile`).
    pub dockerfile: String,
    /// `NAME[:TAG]` to give the result (checked by the caller).
    pub tags: Vec<String>,
    /// `ARG` values.
    pub build_args: BTreeMap<String, String>,
    /// Labels added to the image.
    pub labels: BTreeMap<String, String>,
    /// Pull base images even when the store has them.
    pub pull: bool,
    /// Build nothing from a cache (buildah keeps none between builds anyway).
    pub no_cache: bool,
    /// Remove intermediate containers after a successful build (Docker's default).
    pub rm: bool,
    /// Remove them whatever happens.
    pub force_rm: bool,
    /// The stage to build, of a multi-stage Dockerfile.
    pub target: Option<String>,
    /// The network of `RUN` steps.
    pub network: BuildNetwork,
    /// Resource limits of `RUN` steps, as buildah's options (`--memory=BYTES`, ...).
    pub limits: Vec<String>,
}

/// Runs buildah against a directory of the target's private namespace.
pub struct Builder {
    dir: PathBuf,
}

/// The base images a Dockerfile names (`FROM IMAGE [AS NAME]`), but `scratch`, earlier
/// stages and names built from `ARG`s.
pub fn base_images(dockerfile: &str) -> Vec<String> {
    let mut stages: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for line in dockerfile.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if !words.first().is_some_and(|w| w.eq_ignore_ascii_case("FROM")) {
            continue;
        }
        let mut rest = words[1..].iter().skip_while(|w| w.starts_with("--"));
        let Some(image) = rest.next() else { continue };
        let lower = image.to_ascii_lowercase();
        if lower != "scratch" && !image.contains('$') && !stages.contains(&lower) && !out.contains(&image.to_string()) {
            out.push(image.to_string());
        }
        if let (Some(kw), Some(alias)) = (rest.next(), rest.next()) {
            if kw.eq_ignore_ascii_case("AS") {
                stages.push(alias.to_ascii_lowercase());
            }
        }
    }
    out
}

/// `registries.conf` of containers/image for the target's registry settings: Docker Hub
/// with its mirrors, and each registry of `bases` that is insecure.
fn registries_conf(cfg: &RegistryConfig, bases: &[String]) -> String {
    let mut s = String::from("unqualified-search-registries = [\"docker.io\"]\nshort-name-mode = \"permissive\"\n\n");
    s.push_str("[[registry]]\nprefix = \"docker.io\"\nlocation = \"docker.io\"\n");
    for m in cfg.mirrors() {
        let host = m.split_once("://").map_or(m.as_str(), |(_, h)| h).trim_end_matches('/');
        s.push_str(&format!("\n[[registry.mirror]]\nlocation = \"{host}\"\ninsecure = {}\n", m.starts_with("http://") || cfg.insecure(host)));
    }
    let mut done = Vec::new();
    for b in bases {
        let Ok(r) = Reference::parse(b) else { continue };
        if r.registry != "docker.io" && cfg.insecure(&r.registry) && !done.contains(&r.registry) {
            s.push_str(&format!("\n[[registry]]\nlocation = \"{}\"\ninsecure = true\n", r.registry));
            done.push(r.registry);
        }
    }
    s
}

impl Builder {
    /// A builder keeping its state under `dir` (in the private namespace).
    pub fn new(dir: &Path) -> Builder {
        Builder { dir: dir.to_path_buf() }
    }

    /// Where build contexts are unpacked (emptied by every build).
    pub fn scratch_dir(&self) -> PathBuf {
        self.dir.join("tmp")
    }

    /// buildah with the storage, registry settings and policy of this builder.
    fn buildah(&self) -> Command {
        let mut c = Command::new("buildah");
        c.arg("--root").arg(self.dir.join("storage")).arg("--runroot").arg(self.dir.join("run")).args([
            "--storage-driver",
            "vfs",
            "--cgroup-manager",
            "cgroupfs",
        ]);
        c.arg("--registries-conf").arg(self.dir.join("conf/registries.conf"));
        c.env("CONTAINERS_STORAGE_CONF", self.dir.join("conf/storage.conf")).env("TMPDIR", self.scratch_dir()).env("BUILDAH_ISOLATION", "oci");
        c.stdin(Stdio::null());
        c
    }

    fn policy(&self) -> String {
        self.dir.join("conf/policy.json").to_string_lossy().into_owned()
    }

    /// Runs buildah to the end; its standard output, or what it said on failure.
    fn run(&self, args: &[&str]) -> Result<String, String> {
        let out = self.buildah().args(args).output().map_err(|e| format!("cannot run buildah: {e} (install Debian's buildah on the target)"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(last_error(&String::from_utf8_lossy(&out.stderr)))
        }
    }

    /// Empties buildah's storage: its containers and images, whatever a build left.
    fn clean(&self) {
        let _ = self.run(&["rm", "--all"]);
        let _ = self.run(&["rmi", "--all", "--force"]);
    }

    /// Builds the context in `context` (a directory of [`Builder::scratch_dir`]), telling
    /// buildah's output line by line to `out` (unless `quiet`), and loads the image into
    /// `images` under `opts.tags`. Returns the image's id; on failure nothing is stored.
    pub fn build(&self, images: &ImageStore, context: &Path, opts: &BuildOptions, quiet: bool, out: &mut dyn FnMut(String)) -> Result<String, String> {
        let _lock = self.lock()?;
        for d in ["storage", "run", "conf"] {
            std::fs::create_dir_all(self.dir.join(d)).map_err(|e| format!("{}: {e}", self.dir.join(d).display()))?;
        }
        let dockerfile = context.join(&opts.dockerfile);
        let text = std::fs::read_to_string(&dockerfile).map_err(|e| format!("the Dockerfile {:?} of the build context: {e}", opts.dockerfile))?;
        let bases = base_images(&text);
        let conf = self.dir.join("conf");
        let storage = format!("[storage]\ndriver = \"vfs\"\nrunroot = {:?}\ngraphroot = {:?}\n", self.dir.join("run"), self.dir.join("storage"));
        for (name, body) in [
            ("storage.conf", storage),
            ("registries.conf", registries_conf(images.registries(), &bases)),
            ("policy.json", r#"{"default":[{"type":"insecureAcceptAnything"}]}"#.to_string()),
        ] {
            std::fs::write(conf.join(name), body).map_err(|e| format!("{}: {e}", conf.join(name).display()))?;
        }
        self.clean();
        let r = self.build_clean(images, context, &dockerfile, &bases, opts, quiet, out);
        self.clean();
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn build_clean(
        &self,
        images: &ImageStore,
        context: &Path,
        dockerfile: &Path,
        bases: &[String],
        opts: &BuildOptions,
        quiet: bool,
        out: &mut dyn FnMut(String),
    ) -> Result<String, String> {
        let scratch = self.scratch_dir();
        if !opts.pull {
            for b in bases {
                self.hand_over(images, b, &scratch.join("base.tar"));
            }
        }
        let internal = format!("localhost/insitu-build-{}", std::process::id());
        let policy = self.policy();
        let mut args: Vec<String> = vec![
            "bud".into(),
            "--isolation".into(),
            "oci".into(),
            "--signature-policy".into(),
            policy.clone(),
            "--retry".into(),
            "0".into(),
            "--network".into(),
            match opts.network {
                BuildNetwork::None => "none".into(),
                BuildNetwork::Host => "host".into(),
            },
            format!("--pull={}", if opts.pull { "always" } else { "false" }),
            // Intermediate images of this build only: the storage is emptied after it.
            "--layers".into(),
            format!("--rm={}", opts.rm),
            format!("--force-rm={}", opts.force_rm),
            "--format".into(),
            "docker".into(),
            "-f".into(),
            dockerfile.to_string_lossy().into_owned(),
            "-t".into(),
            internal.clone(),
        ];
        if opts.no_cache {
            args.push("--no-cache".into());
        }
        args.extend(opts.limits.iter().cloned());
        if let Some(t) = &opts.target {
            args.extend(["--target".into(), t.clone()]);
        }
        for (k, v) in &opts.build_args {
            args.extend(["--build-arg".into(), format!("{k}={v}")]);
        }
        for (k, v) in &opts.labels {
            args.extend(["--label".into(), format!("{k}={v}")]);
        }
        args.push(context.to_string_lossy().into_owned());
        let mut child = self
            .buildah()
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run buildah: {e} (install Debian's buildah on the target)"))?;
        // Both streams, as lines, in the order they come.
        let (tx, rx) = std::sync::mpsc::channel::<(bool, String)>();
        let readers: Vec<_> = [child.stdout.take().map(|s| Box::new(s) as Box<dyn std::io::Read + Send>), child.stderr.take().map(|s| Box::new(s) as Box<_>)]
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(i, s)| {
                let tx = tx.clone();
                std::thread::spawn(move || {
                    for line in BufReader::new(s).lines().map_while(Result::ok) {
                        let _ = tx.send((i == 1, line));
                    }
                })
            })
            .collect();
        drop(tx);
        let mut errors = String::new();
        for (is_err, line) in rx {
            if is_err {
                errors.push_str(&line);
                errors.push('\n');
            }
            if !quiet && shown(&line, &internal) {
                out(format!("{line}\n"));
            }
        }
        readers.into_iter().for_each(|t| {
            let _ = t.join();
        });
        let status = child.wait().map_err(|e| format!("buildah: {e}"))?;
        if !status.success() {
            return Err(format!("the build failed: {}", last_error(&errors)));
        }
        let archive = scratch.join("image.tar");
        self.run(&["push", "--signature-policy", &policy, &internal, &format!("docker-archive:{}", archive.display())])?;
        let loaded = std::fs::File::open(&archive)
            .map_err(|e| format!("{}: {e}", archive.display()))
            .and_then(|mut f| images.load(&mut f, &mut |_| {}).map_err(|e| format!("loading the built image: {e}")));
        let _ = std::fs::remove_file(&archive);
        let id = loaded?.into_iter().next().ok_or("buildah exported no image")?;
        let id = images.get(&id).map_err(|e| e.to_string())?.id;
        for t in &opts.tags {
            let r = Reference::parse(t).map_err(|e| e.to_string())?;
            images.tag(&id, &r.familiar_name(), r.tag.as_deref()).map_err(|e| e.to_string())?;
        }
        Ok(id)
    }

    /// Gives buildah the base image `name` from the store, when the store has it with
    /// the blobs it was pulled with; otherwise buildah pulls it itself.
    fn hand_over(&self, images: &ImageStore, name: &str, archive: &Path) {
        let Ok(r) = Reference::parse(name) else { return };
        if images.get(name).is_err() {
            return;
        }
        let saved = std::fs::File::create(archive).map_err(|e| e.to_string()).and_then(|f| images.save(&[name.to_string()], f).map_err(|e| e.to_string()));
        if saved.is_ok() {
            let full = match (&r.tag, &r.digest) {
                (Some(t), _) => format!("{}/{}:{t}", r.registry, r.repository),
                (None, Some(d)) => format!("{}/{}@{d}", r.registry, r.repository),
                (None, None) => format!("{}/{}", r.registry, r.repository),
            };
            if let Ok(id) = self.run(&["pull", "--quiet", "--signature-policy", &self.policy(), &format!("oci-archive:{}", archive.display())]) {
                let _ = self.run(&["tag", id.trim(), &full]);
            }
        }
        let _ = std::fs::remove_file(archive);
    }

    fn lock(&self) -> Result<std::fs::File, String> {
        use std::os::fd::AsRawFd;
        std::fs::create_dir_all(&self.dir).map_err(|e| format!("{}: {e}", self.dir.display()))?;
        let p = self.dir.join(".lock");
        let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        // SAFETY: the descriptor is open for the duration of the call; flock has no other
        // memory effects.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(format!("{}: {}", p.display(), std::io::Error::last_os_error()));
        }
        Ok(f)
    }
}

/// Whether a line of buildah's output is worth a client's eyes: not the internal name it
/// commits under, nor the id of buildah's own copy (the store's differs).
fn shown(line: &str, internal: &str) -> bool {
    !(line.contains(internal) || (line.len() == 64 && line.bytes().all(|b| b.is_ascii_hexdigit())) || line.starts_with("--> "))
}

/// The last line of buildah's errors that says something (its `Error: ...`).
fn last_error(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let pick =
        lines.iter().rev().find(|l| l.starts_with("Error:") || l.starts_with("error")).or(lines.last()).copied().unwrap_or("buildah failed without a message");
    pick.strip_prefix("Error: ").unwrap_or(pick).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_images_skip_scratch_stages_and_args() {
        let df = "ARG V=1\nFROM --platform=linux/amd64 127.0.0.1:5000/busybox:latest AS build\nRUN x\nfrom build\nFROM scratch\nFROM alpine:$V\nFROM busybox\nCOPY --from=build /x /x\n";
        assert_eq!(base_images(df), ["127.0.0.1:5000/busybox:latest", "busybox"]);
        assert!(base_images("").is_empty());
    }

    #[test]
    fn registries_conf_names_insecure_bases_and_mirrors() {
        let cfg = RegistryConfig::new(&["http://127.0.0.1:5001".into()], &[]).unwrap();
        let conf = registries_conf(&cfg, &["127.0.0.1:5000/x".into(), "busybox".into(), "10.1.1.1:5000/y".into()]);
        assert!(conf.contains("location = \"127.0.0.1:5001\"\ninsecure = true"), "{conf}");
        assert!(conf.contains("location = \"127.0.0.1:5000\"\ninsecure = true"), "{conf}");
        assert!(!conf.contains("10.1.1.1"), "{conf}");
    }

    #[test]
    fn errors_keep_buildahs_reason() {
        assert_eq!(last_error("STEP 1\nError: building at STEP \"FOO\": unknown instruction\n"), "building at STEP \"FOO\": unknown instruction");
        assert_eq!(last_error(""), "buildah failed without a message");
    }

    proptest::proptest! {
        #[test]
        fn random_dockerfiles_never_panic(s in "(?s).{0,200}") {
            let _ = base_images(&s);
        }
    }
}
