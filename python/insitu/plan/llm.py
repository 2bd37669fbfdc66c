# SPDX-License-Identifier: Apache-2.0
"""``insitu plan llm``: DockerSSD's storage-pool model of distributed LLM inference.

P nodes serve a decoder-only model. Every decode step gives each of the ``P x
batch-per-device`` sequences one token. Four systems, as in DockerSSD's evaluation:

* ``h-nocache``: P hosts, weights in DRAM, no KV cache (DRAM is too small), so each step
  recomputes all S tokens of every sequence;
* ``h-cache``: P hosts, weights in DRAM, the KV cache on an SSD through Linux swap;
* ``d-nocache``: P computing drives, no KV cache;
* ``d-cache``: P computing drives, weights and KV cache read from their own flash.

For every split of P into data x tensor x pipeline parallelism (dp x tp x pp) the time of
one step is modelled per layer as a roofline (``max(compute / FLOP rate, bytes / memory
rate)``) plus communication (two ring all-reduces per layer for tp > 1, one activation
send per pipeline stage), with pipelining over micro-batches (sequences with a KV cache;
512-token chunks of the recomputed sequence without one). Configurations whose weights or
KV cache do not fit a node are skipped; the fastest wins (ties, within 2 %, go to the
fewest weight copies).

The numbers the paper does not give are assumptions, listed by :func:`assumptions` and in
every report; each can be changed on the command line.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Dict, Iterable, List, Optional, Tuple

from ._errors import PlanError

__all__ = ["Model", "MODELS", "Node", "NODES", "SYSTEMS", "Step", "best", "plan", "sweep", "assumptions", "SWEEPS"]

BYTES = 2  # fp16 weights, activations and KV cache
GB = 1e9


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer."""

    name: str
    layers: int
    d_model: int
    heads: int
    head_dim: int
    kv_heads: int
    d_ff: int
    #: Weight matrices in the feed-forward block: 2 (GELU) or 3 (gated: SwiGLU, GeGLU).
    ffn_mats: int
    source: str

    @property
    def attn_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def layer_params(self) -> int:
        """Weights of one layer: Q and O projections, K and V for the KV heads, the FFN."""
        return 2 * self.d_model * self.attn_dim + 2 * self.d_model * self.kv_heads * self.head_dim + self.ffn_mats * self.d_model * self.d_ff

    @property
    def params(self) -> int:
        return self.layers * self.layer_params

    def kv_bytes_per_token_layer(self) -> int:
        """K and V of one token in one layer."""
        return 2 * self.kv_heads * self.head_dim * BYTES


#: The eight models of DockerSSD's Fig. 12, with the shapes their papers publish.
MODELS: Dict[str, Model] = {
    m.name: m
    for m in [
        Model(
            "lamda-137b", 64, 8192, 128, 128, 128, 65536, 3, "LaMDA (Thoppilan et al. 2022): 64 layers, d_model 8192, 128 heads of 128, d_ff 65536, gated GELU"
        ),
        Model("gpt3-175b", 96, 12288, 96, 128, 96, 49152, 2, "GPT-3 (Brown et al. 2020): 96 layers, d_model 12288, 96 heads of 128"),
        Model("jurassic-178b", 76, 13824, 96, 144, 96, 55296, 2, "Jurassic-1 Jumbo (Lieber et al. 2021): 76 layers, d_model 13824, 96 heads"),
        Model("pangu-200b", 64, 16384, 128, 128, 128, 65536, 2, "PanGu-alpha 200B (Zeng et al. 2021): 64 layers, d_model 16384, 128 heads"),
        Model("gopher-280b", 80, 16384, 128, 128, 128, 65536, 2, "Gopher (Rae et al. 2021): 80 layers, d_model 16384, 128 heads of 128"),
        Model("turing-530b", 105, 20480, 128, 160, 128, 81920, 2, "Megatron-Turing NLG (Smith et al. 2022): 105 layers, d_model 20480, 128 heads"),
        Model("palm-540b", 118, 18432, 48, 256, 1, 73728, 3, "PaLM (Chowdhery et al. 2022): 118 layers, d_model 18432, 48 heads of 256, multi-query, SwiGLU"),
        Model("megatron-1t", 128, 25600, 160, 160, 160, 102400, 2, "Megatron-LM 1T (Narayanan et al. 2021): 128 layers, hidden 25600, 160 heads"),
    ]
}


@dataclass(frozen=True)
class Node:
    """One node of the pool: its processor, where weights and the KV cache live, its
    network."""

    name: str
    ghz: float
    flops_per_cycle: float
    #: Share of the peak FLOP rate that matrix multiplies reach.
    efficiency: float
    #: Fast memory (DRAM): capacity and bandwidth.
    dram_gb: float
    dram_gb_s: float
    #: Where the weights are read from: "dram" or "kv" (the KV tier: the drive's flash).
    weights_in: str
    #: The tier holding the KV cache: capacity and the rate the processor reads it at.
    kv_gb: float
    kv_gb_s: float
    net_gb_s: float
    net_latency_us: float
    note: str

    @property
    def flops(self) -> float:
        return self.ghz * 1e9 * self.flops_per_cycle * self.efficiency

    @property
    def weights_gb_s(self) -> float:
        return self.dram_gb_s if self.weights_in == "dram" else self.kv_gb_s

    @property
    def weights_gb(self) -> float:
        return self.dram_gb if self.weights_in == "dram" else self.kv_gb


#: The paper's nodes. Given by DockerSSD: 3.8 GHz host with 64 GB DDR4, a 400 GB SSD for
#: swap; 2.2 GHz drive processor with 2 GB DRAM, 400 GB of flash on 12 channels (48 MLC
#: packages). Everything else is assumed (see ASSUMED).
NODES: Dict[str, Node] = {
    "host": Node(
        "host",
        ghz=3.8,
        flops_per_cycle=128,
        efficiency=0.9,
        dram_gb=64,
        dram_gb_s=51.2,
        weights_in="dram",
        kv_gb=400,
        kv_gb_s=1.0,
        net_gb_s=100 / 8 * 1460 / 1538,
        net_latency_us=10,
        note="3.8 GHz, 64 GB DDR4 (2 x DDR4-3200), KV cache swapped to a 400 GB SSD, 100 GbE",
    ),
    "drive": Node(
        "drive",
        ghz=2.2,
        flops_per_cycle=128,
        efficiency=0.9,
        dram_gb=2,
        dram_gb_s=25.6,
        weights_in="kv",
        kv_gb=400,
        kv_gb_s=9.6,
        net_gb_s=3.94,
        net_latency_us=10,
        note="2.2 GHz, 2 GB DRAM, 400 GB flash on 12 channels read in place, Ether-oN over PCIe Gen3 x4",
    ),
}

#: What the paper does not state and the model assumes (name: (value, why)).
ASSUMED = {
    "flops_per_cycle": (
        "128 on both (e.g. 16 cores x 8-wide fp16 FMA)",
        "the paper compares the processors by clock only (3.8 vs 2.2 GHz); equal width keeps that ratio",
    ),
    "efficiency": (
        "0.9 on both",
        "not stated; with 128 FLOP/cycle it puts the D-Cache/H-Cache crossover where Fig. 13a/b do (256 tokens for lamda, 1,024 for megatron), so it is fitted",
    ),
    "host dram_gb_s": ("51.2 GB/s", "two channels of the stated DDR4 at 3200 MT/s"),
    "host kv_gb_s": ("1.0 GB/s", "swap-ins are 4 KiB page faults on the 400 GB SSD; with the drive's 9.6 GB/s this is the paper's ~9.5x long-sequence limit"),
    "drive kv_gb_s": ("9.6 GB/s", "12 channels x 800 MB/s (48 MLC packages), read by the drive's own processor"),
    "drive weights": ("read from flash", "2 GB of DRAM cannot hold a share of the weights"),
    "net": ("host 100 GbE (11.9 GB/s payload), drive Ether-oN over PCIe Gen3 x4 (3.94 GB/s), 10 us", "not stated"),
    "batch": ("1 sequence per node unless --batch-per-device", "Fig. 12's setting"),
    "micro-batches": ("pipelines carry single sequences with a KV cache and 512-token chunks without", "not stated"),
    "precision": ("fp16 weights, activations and KV cache", "not stated"),
}

#: system name -> (node, KV cache?)
SYSTEMS: Dict[str, Tuple[str, bool]] = {
    "h-nocache": ("host", False),
    "h-cache": ("host", True),
    "d-nocache": ("drive", False),
    "d-cache": ("drive", True),
}

SWEEPS = ("seq-len", "batch", "devices")
#: Token chunk pipelined without a KV cache.
_CHUNK = 512
#: Configurations this close to the fastest count as ties.
_TIE = 0.02


@dataclass(frozen=True)
class Step:
    """One decode step with one parallel configuration."""

    dp: int
    tp: int
    pp: int
    step_s: float
    compute_s: float
    memory_s: float
    comm_s: float
    weights_gb_per_node: float
    kv_gb_per_node: float

    def as_dict(self) -> dict:
        d = asdict(self)
        d["dominant"] = (
            "pipeline"
            if self.pp > max(self.tp, self.dp)
            else "tensor"
            if self.tp >= max(self.pp, self.dp) and self.tp > 1
            else "data"
            if self.dp > 1
            else "none"
        )
        return d


def _allreduce_s(nbytes: float, n: int, node: Node) -> float:
    """A ring all-reduce of ``nbytes`` over ``n`` nodes."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / (node.net_gb_s * GB) + 2 * (n - 1) * node.net_latency_us * 1e-6


def step(model: Model, node: Node, cache: bool, seq: int, batch: int, dp: int, tp: int, pp: int) -> Optional[Step]:
    """One decode step of ``batch`` sequences at context ``seq`` on dp x tp x pp nodes, or
    None when it does not fit."""
    per_replica = batch // dp
    stage_layers = math.ceil(model.layers / pp)
    # Heads (and, for multi-query models, the shared KV heads) split over tp.
    kv_shard = min(tp, model.kv_heads)
    w_layer = model.layer_params * BYTES / tp
    weights_gb = w_layer * stage_layers / GB
    kv_token_layer = model.kv_bytes_per_token_layer() / kv_shard
    kv_gb = kv_token_layer * seq * per_replica * stage_layers / GB if cache else 0.0
    if weights_gb > node.weights_gb or (node.weights_in == "kv" and weights_gb + kv_gb > node.kv_gb) or kv_gb > node.kv_gb:
        return None
    if cache:
        # Decode: one new token per sequence; micro-batches of whole sequences.
        micro = min(per_replica, pp) if pp > 1 else 1
        tokens = per_replica / micro  # tokens per micro-batch (one per sequence)
        flops = (2 * model.layer_params * tokens + 4 * model.attn_dim * seq * tokens) / tp
        mem_s = w_layer / (node.weights_gb_s * GB) + kv_token_layer * seq * tokens / (node.kv_gb_s * GB)
    else:
        # No KV cache: the whole sequence goes through every layer again, pipelined in
        # chunks; causal attention averages seq/2 keys per token.
        chunks = max(1, seq // _CHUNK)
        micro = per_replica * chunks if pp > 1 else 1
        tokens = per_replica * seq / micro
        flops = (2 * model.layer_params * tokens + 4 * model.attn_dim * (seq / 2) * tokens) / tp
        mem_s = w_layer / (node.weights_gb_s * GB) + 2 * tokens * model.d_model * BYTES / tp / (node.dram_gb_s * GB)
    comp_s = flops / node.flops
    act = tokens * model.d_model * BYTES
    comm_layer = 2 * _allreduce_s(act, tp, node)
    send = act / tp / (node.net_gb_s * GB) + node.net_latency_us * 1e-6 if pp > 1 else 0.0
    stage_s = stage_layers * (max(comp_s, mem_s) + comm_layer) + send
    slots = micro + pp - 1
    return Step(
        dp, tp, pp, slots * stage_s, slots * stage_layers * comp_s, slots * stage_layers * mem_s, slots * (stage_layers * comm_layer + send), weights_gb, kv_gb
    )


def _divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def configurations(model: Model, devices: int) -> Iterable[Tuple[int, int, int]]:
    """Every dp x tp x pp = devices with tp <= heads and pp <= layers."""
    for tp in _divisors(devices):
        if tp > model.heads:
            continue
        for pp in _divisors(devices // tp):
            if pp <= model.layers:
                yield devices // (tp * pp), tp, pp


def best(model: Model, node: Node, cache: bool, seq: int, batch: int, devices: int) -> Optional[Step]:
    """The fastest configuration (ties within 2 % go to the fewest weight copies); None
    when nothing fits."""
    steps = [s for dp, tp, pp in configurations(model, devices) if batch % dp == 0 for s in [step(model, node, cache, seq, batch, dp, tp, pp)] if s]
    if not steps:
        return None
    fastest = min(s.step_s for s in steps)
    # Within the model's precision the cheaper configuration wins: data parallelism
    # stores one more copy of the weights per replica.
    near = [s for s in steps if s.step_s <= fastest * (1 + _TIE)]
    return min(near, key=lambda s: (s.dp, s.step_s))


def _model(name: str) -> Model:
    if name not in MODELS:
        raise PlanError(f"--model {name}: unknown; choose from {', '.join(MODELS)} or all")
    return MODELS[name]


def plan(model: str, devices: int, seq: int, batch_per_device: int, nodes: Dict[str, Node], systems: Iterable[str] = tuple(SYSTEMS)) -> dict:
    """Every system's best configuration and time per step, and the speedups between them."""
    m = _model(model)
    batch = devices * batch_per_device
    out: Dict[str, Optional[dict]] = {}
    for sysname in systems:
        node, cache = SYSTEMS[sysname]
        s = best(m, nodes[node], cache, seq, batch, devices)
        out[sysname] = None if s is None else {**s.as_dict(), "tokens_per_s": batch / s.step_s}
    t = {k: v["step_s"] for k, v in out.items() if v}

    def ratio(a: str, b: str) -> Optional[float]:
        return t[a] / t[b] if a in t and b in t else None

    return {
        "model": m.name,
        "params_b": m.params / 1e9,
        "devices": devices,
        "seq_len": seq,
        "batch_per_device": batch_per_device,
        "batch": batch,
        "systems": out,
        "speedup": {
            "h_cache_over_h_nocache": ratio("h-nocache", "h-cache"),
            "d_cache_over_d_nocache": ratio("d-nocache", "d-cache"),
            "d_cache_over_h_cache": ratio("h-cache", "d-cache"),
            "d_cache_over_h_nocache": ratio("h-nocache", "d-cache"),
            "h_nocache_over_d_nocache": ratio("d-nocache", "h-nocache"),
        },
    }


def sweep(
    param: str, values: List[int], model: str, devices: int, seq: int, batch_per_device: int, nodes: Dict[str, Node], systems: Iterable[str] = tuple(SYSTEMS)
) -> dict:
    """:func:`plan` over sequence lengths, batch sizes per device or pool sizes."""
    if param not in SWEEPS:
        raise PlanError(f"--sweep {param}: choose from {', '.join(SWEEPS)}")
    pts = []
    for v in values:
        args = {"seq": seq, "batch_per_device": batch_per_device, "devices": devices}
        args[{"seq-len": "seq", "batch": "batch_per_device", "devices": "devices"}[param]] = int(v)
        r = plan(model, nodes=nodes, systems=systems, **args)
        pt = {param: int(v), "speedup": r["speedup"]}
        for k, s in r["systems"].items():
            pt[k] = None if s is None else {x: s[x] for x in ("step_s", "tokens_per_s", "dp", "tp", "pp", "compute_s", "memory_s")}
        pts.append(pt)
    return {"sweep": param, "model": model, "devices": devices, "seq_len": seq, "batch_per_device": batch_per_device, "points": pts}


def assumptions(nodes: Dict[str, Node]) -> dict:
    """The nodes as used and what was assumed."""
    return {"nodes": {k: asdict(v) for k, v in nodes.items()}, "assumed": {k: {"value": v, "why": w} for k, (v, w) in ASSUMED.items()}}


def nodes_with(overrides: Dict[str, Dict[str, float]], calibration: Optional[dict] = None) -> Dict[str, Node]:
    """The paper's nodes with ``overrides`` ({node: {field: value}}); with a calibration,
    the host is this machine (its matrix-multiply rate and memory copy bandwidth) and the
    drive keeps the paper's 2.2/3.8 clock ratio to it."""
    nodes = dict(NODES)
    if calibration is not None:
        h = calibration.get("host") or {}
        if not h.get("gemm_gflops") or not h.get("memory_copy_gb_s"):
            raise PlanError("the calibration has no host measurements (matrix multiply needs numpy); run `insitu plan calibrate` without --skip-host")
        host = nodes["host"]
        fpc = h["gemm_gflops"] * 1e9 / (host.ghz * 1e9)
        nodes["host"] = replace(
            host, flops_per_cycle=fpc, efficiency=1.0, dram_gb_s=h["memory_copy_gb_s"], note=host.note + "; processor and DRAM rate measured here"
        )
        nodes["drive"] = replace(nodes["drive"], flops_per_cycle=fpc, efficiency=1.0, note=nodes["drive"].note + "; processor as wide as this machine's")
    for name, fields in overrides.items():
        try:
            nodes[name] = replace(nodes[name], **fields)
        except TypeError as e:
            raise PlanError(f"cannot set {fields} on the {name} node: {e}") from None
    return nodes
