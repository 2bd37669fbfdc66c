# SPDX-License-Identifier: Apache-2.0
"""A GGUF model de-quantized once and kept as a transformers directory.

transformers reads a GGUF file's metadata three times (for the config, the tokenizer and
the weights), each time parsing its whole 49,152-entry vocabulary element by element, and
then de-quantizes every tensor: about 30 s for SmolLM2-135M on 2 cores, paid by every
``insitu llm`` command. The same model saved as safetensors loads in under a second.

So the first load of a GGUF file saves what it built (f32 weights, config, tokenizer) to
``$INSITU_MODEL_CACHE`` (default ``$XDG_CACHE_HOME/insitu/models``, else
``~/.cache/insitu/models``), in a directory named by the file's SHA-256 and the
transformers version that converted it, and later loads read that directory. The weights
are the same floats to the last bit. A directory appears whole or not at all (written
aside, then renamed), so processes loading side by side, or one killed while saving, never
see half of one. ``INSITU_MODEL_CACHE=`` (empty) turns the cache off.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from typing import Any, Optional

__all__ = ["root", "directory", "plain", "keep"]


def root() -> Optional[str]:
    """The directory converted models are kept in, or None when the cache is off."""
    explicit = os.environ.get("INSITU_MODEL_CACHE")
    if explicit is not None:
        return explicit or None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "insitu", "models")


def directory(gguf_path: str) -> Optional[str]:
    """Where the conversion of ``gguf_path`` is (or would be) kept; None when the cache is off."""
    top = root()
    if top is None:
        return None
    import transformers

    h = hashlib.sha256()
    with open(gguf_path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    stem = os.path.splitext(os.path.basename(gguf_path))[0]
    return os.path.join(top, f"{stem}-{h.hexdigest()[:24]}-transformers-{transformers.__version__}")


def plain(model: Any) -> Any:
    """Makes a model loaded from a GGUF file the plain f32 model it is by now: transformers
    leaves it marked as GGUF-quantized, which makes it refuse to be saved and differ in its
    config from the same weights loaded as safetensors."""
    model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    return model


def keep(model: Any, tokenizer: Any, target: str) -> None:
    """Saves a model loaded from a GGUF file (made :func:`plain`), and its tokenizer, as ``target``. A failure
    (a read-only or full disk) is reported on stderr and otherwise ignored: the model in
    hand is already loaded."""
    parent = os.path.dirname(target)
    tmp = None
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".converting-", dir=parent)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.rename(tmp, target)
            tmp = None
        except OSError:
            if not os.path.isdir(target):
                raise
            # Another process kept the same conversion first.
    except Exception as e:  # noqa: BLE001 - a cache that cannot be written is not an error
        sys.stderr.write(f"insitu: the converted model is not kept in {parent} ({e}); the next load converts it again\n")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
