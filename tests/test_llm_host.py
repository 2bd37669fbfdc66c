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
