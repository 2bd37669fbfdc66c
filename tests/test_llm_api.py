# SPDX-License-Identifier: Apache-2.0
"""The LLM integration below the model: the KV commands' errors, the torch SparF reference
against the target's engine, the FlexGen baseline's host-side SparF against both, the head
partition, and the command line's usage errors. No model is loaded; embedded targets run
in this process."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the LLM extra is not installed (pip install 'insitu[llm]')")
pytest.importorskip("transformers", reason="the LLM extra is not installed (pip install 'insitu[llm]')")

import insitu  # noqa: E402
from insitu.llm import sparf  # noqa: E402
from insitu.llm.flexgen import FlexGenStore  # noqa: E402
from insitu.llm.remote import TargetStore, f32_bytes  # noqa: E402
from insitu.llm.targets import TargetPool, partition  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import INSITU  # noqa: E402

D = 64


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    with TargetPool.embedded(2, directory=str(tmp_path_factory.mktemp("llm-api")), shared_bytes=256 << 20, private_bytes=256 << 20) as p:
        yield p


def test_heads_are_split_in_contiguous_ranges():
    assert partition(3, 2) == [range(0, 2), range(2, 3)]
    assert partition(3, 1) == [range(0, 3)]
    assert partition(3, 4) == [range(0, 1), range(1, 2), range(2, 3)]  # the fourth target is not used
    assert partition(8, 3) == [range(0, 3), range(3, 6), range(6, 8)]
    with pytest.raises(ValueError):
        partition(0, 2)


def test_bad_input_gets_a_clear_error(pool):
    kv = insitu.KvTarget(pool.urls[0])
    q = torch.randn(1, 2, 3, D)
    with pytest.raises(insitu.TargetError, match="unknown sequence"):
        kv.attend(0, [987654321], f32_bytes(q), 3, D**-0.5)
    kv.create(41, 2, 2, D)
    try:
        with pytest.raises(insitu.InsituError, match="head|values per token|KV heads"):
            kv.append(41, 0, 4, f32_bytes(torch.randn(2, 4, 32)), f32_bytes(torch.randn(2, 4, 32)))
        with pytest.raises(insitu.InsituError, match="q holds|values"):
            kv.attend(0, [41], f32_bytes(torch.randn(1, 2, 3, 32)), 3, D**-0.5)
        with pytest.raises(insitu.TargetError, match="exists"):
            kv.create(41, 2, 2, D)
        assert kv.info(41)["tokens"] == [0, 0]  # nothing was stored by the refused commands
    finally:
        kv.free(41)
    with pytest.raises(insitu.TargetError, match="unknown sequence"):
        kv.info(41)
    with pytest.raises(insitu.InsituError):
        insitu.KvTarget("nvme-tcp://127.0.0.1:1/nqn.2024-01.io.insitu:nobody")


def test_sequences_live_with_their_connection_unless_kept(pool):
    """A sequence goes with the connection that created it; a kept one stays, for another
    connection to use and free."""
    first = insitu.KvTarget(pool.urls[1])
    first.create(61, 1, 2, D)
    first.create(62, 1, 2, D, kept=True)
    first.fork(62, 63)
    first.fork(61, 64, kept=True)
    second = insitu.KvTarget(pool.urls[1])
    try:
        assert second.info(61)["tokens"] == [0]  # another connection sees it while it lives
        first.disconnect()
        deadline = time.monotonic() + 10
        while True:
            try:
                second.info(61)
            except insitu.TargetError as e:
                assert "unknown sequence" in str(e)
                break
            assert time.monotonic() < deadline, "sequence 61 outlived its connection"
            time.sleep(0.02)
        with pytest.raises(insitu.TargetError, match="unknown sequence"):
            second.info(63)
        for kept in (62, 64):
            assert second.info(kept)["tokens"] == [0]
            second.free(kept)
    finally:
        second.disconnect()


def _fill(store, K, V):
    """Prefills layer 0 of a one-row store with ``K``, ``V`` (``[Hkv, S, D]``)."""
    store.prefill(0, K[None], V[None], None)
    store.flush()


@pytest.mark.parametrize("tokens, mean_v", [(40, False), (700, False), (1500, False), (1500, True)])
def test_sparf_reference_target_and_flexgen_agree(pool, tokens, mean_v):
    """The same SparF on the same inputs three ways: torch on whole tensors, the target's
    engine (page cap included), and FlexGen's host-side SparF over pages read back; with
    the kept tokens carrying all the weight, and mixed with the mean of V."""
    g = torch.Generator().manual_seed(tokens)
    Hkv, G = 3, 3
    K = torch.randn(Hkv, tokens, D, generator=g)
    V = torch.randn(Hkv, tokens, D, generator=g)
    # A few strong keys, so the selection has something to find.
    K[:, ::37] *= 3
    q = torch.randn(1, Hkv * G, D, generator=g)
    k1, v1 = torch.randn(1, Hkv, D, generator=g), torch.randn(1, Hkv, D, generator=g)
    scale = D**-0.5
    # Heads over the two targets: each KV head's whole sequence in one place, so its SparF
    # is the reference's (a token split selects per share: tests/test_llm_split.py).
    target = TargetStore(pool, 1, Hkv, D, G, 1, method="sparf", ratio=0.125, mean_v=mean_v, split="heads")
    flex = FlexGenStore(pool, 1, Hkv, D, G, 1, max_tokens=tokens + 1, ratio=0.125, mean_v=mean_v, split="heads")
    try:
        outs = []
        for store in (target, flex):
            _fill(store, K, V)
            outs.append(store.decode(0, q, k1, v1, scale))
        ts, fs = target.stats(), flex.stats()
    finally:
        target.close()
        flex.close()
    Kf, Vf = torch.cat([K, k1[0][:, None]], 1), torch.cat([V, v1[0][:, None]], 1)
    p = sparf.params(0.125, D, tokens + 1, mean_v=mean_v)
    want = torch.cat([sparf.sparf(q[0, h * G : (h + 1) * G], Kf[h], Vf[h], scale, *p) for h in range(Hkv)])
    assert torch.allclose(outs[0][0].double(), want, atol=2e-5), (outs[0][0].double() - want).abs().max()
    assert torch.allclose(outs[1][0].double(), want, atol=2e-5), (outs[1][0].double() - want).abs().max()
    if p.k < tokens + 1:
        dense = sparf.dense(q[0, :G], Kf[0], Vf[0], scale)
        assert not torch.allclose(want[:G], dense, atol=1e-3), "the sparse result should differ from dense"
    # Both read pages SparF selected, far fewer than dense's K and V (the dimension-indexed
    # runs differ a little: FlexGen writes them back every 128 tokens, the target keeps a
    # dimension page in its DRAM buffer until 1024 tokens fill it).
    if p.k < tokens + 1:
        dense_bytes = 2 * Hkv * (tokens + 1) * D * 4
        assert 0 < ts["media_bytes"] < dense_bytes / 2 and 0 < fs["media_bytes"] < dense_bytes / 2


def test_sparf_params_follow_the_ratio():
    q = sparf.params(0.125, 64, 1024, paged=False)
    assert (q.r, q.k, q.local) == (8, 64, 16)
    # SparQ: r·S + 2·k·D is the ratio of dense's 2·S·D elements.
    assert q.r * 1024 + 2 * q.k * 64 == 0.125 * 2 * 1024 * 64
    # SparF: 9/8 of the ratio of the token pages, and every token of the pages in reach
    # (the first, the chosen and the local tokens' pages).
    p = sparf.params(0.125, 64, 1024)
    assert (p.r, p.local, p.pages) == (8, 16, 9)
    assert p.k == (9 + 2) * 16 + 16
    assert sparf.params(0.125, 64, 3) == (8, 3 * 16 + 1, 1, 1, False)
    assert sparf.params(0.125, 64, 3, mean_v=True).mean_v
    with pytest.raises(ValueError, match="ratio"):
        sparf.params(0, 64, 10)


def test_sparf_keeping_every_token_is_dense():
    g = torch.Generator().manual_seed(1)
    q, K, V = torch.randn(3, D, generator=g), torch.randn(50, D, generator=g), torch.randn(50, D, generator=g)
    assert torch.allclose(sparf.sparf(q, K, V, 0.125, 8, 50, 1), sparf.dense(q, K, V, 0.125))
    # All dimensions and all tokens through the sparse path: α = 1, exact.
    dims = sparf.select_dims(q, D)
    toks, alpha = sparf.select_tokens(sparf.approx_scores(q, dims, K.T, 0.125), 50, 1)
    assert torch.allclose(alpha, torch.ones(3, dtype=torch.float64))
    out = sparf.attend_selected(q, toks, alpha, K, V, V.double().mean(0), 0.125)
    assert torch.allclose(out, sparf.dense(q, K, V, 0.125))


@pytest.mark.parametrize(
    "args, message",
    [
        (["llm", "generate", "--prompt", "x", "--max-new-tokens", "2", "--attention", "insitu", "--sparf", "2"], "not in (0, 1]"),
        (["llm", "generate", "--prompt", "x", "--max-new-tokens", "0", "--attention", "memory"], "use 1 or more"),
        (["llm", "generate", "--max-new-tokens", "2", "--attention", "memory"], "--prompt"),
        (["llm", "eval", "--text", "f", "--attention", "gpu"], "invalid choice"),
        (["llm", "eval", "--text", "f", "--attention", "memory", "--start", "-1"], "use 0 or more"),
        (["llm", "generate", "--prompt", "x", "--per-line", "--max-new-tokens", "2", "--attention", "memory"], "--per-line needs"),
        (["llm", "generate", "--prompt", "x", "--max-new-tokens", "2", "--attention", "insitu", "--kv-dtype", "f64"], "invalid choice"),
        (["bench", "llm", "--kv-dtype", "bf16"], "invalid choice"),
    ],
)
def test_cli_usage_errors(args, message):
    p = subprocess.run([INSITU, *args], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert message in p.stderr


def test_cli_help_lists_llm_commands():
    p = subprocess.run([INSITU, "llm", "--help"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "generate" in p.stdout and "eval" in p.stdout
    p = subprocess.run([INSITU, "bench", "llm", "--help"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "--host-budget" in p.stdout
