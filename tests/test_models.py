# SPDX-License-Identifier: Apache-2.0
"""Device models from the command line: presets listed and shown, an image that carries a
model paces its embedded target (the offload takes at least the modelled time)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import INSITU, cli_json, run_cli  # noqa: E402

PRESETS = {"samsung-980pro", "instinfer-csd", "intel-p4600", "daisyplus-openssd", "newport", "smartssd"}


def test_presets_are_listed_and_shown():
    models = cli_json("model", "list")
    assert {m["name"] for m in models} == PRESETS
    for m in models:
        assert m["source"], m["name"]
        assert m["derived"]["flash_read_mb_s"] > 0
    shown = json.loads(subprocess.run([INSITU, "model", "show", "newport@500"], capture_output=True, text=True, check=True).stdout)
    assert abs(shown["derived"]["internal_read_mb_s"] - 500) < 5
    bad = run_cli("model", "show", "warp-drive", json_out=False)
    assert bad.rc == 2 and "newport" in bad.stderr


def test_an_image_model_paces_the_embedded_target(tmp_path: Path):
    img, mnt = tmp_path / "m.img", tmp_path / "mnt"
    cli_json("image", "create", img, "--size", "256M", "--model", "custom:100")
    assert (tmp_path / "m.img.model").read_text().strip() == "custom:100"
    cli_json("image", "mount", img, mnt)
    try:
        data = os.urandom(20 << 20)
        (mnt / "f").write_bytes(data)
        paced = cli_json("exec", "crc32c", mnt / "f")
        # 20 MiB at 100 MB/s cannot take less than the model's 0.21 s.
        assert paced["stats"]["seconds"] >= 0.2, paced["stats"]
        cli_json("image", "umount", mnt)
        cli_json("image", "mount", img, mnt, "--model", "none")
        assert not (tmp_path / "m.img.model").exists()
        free = cli_json("exec", "crc32c", mnt / "f")
        assert free["results"] == paced["results"]
    finally:
        run_cli("image", "umount", mnt)
    r = run_cli("image", "create", tmp_path / "x.img", "--size", "64M", "--model", "nonsense")
    assert r.rc == 2 and not (tmp_path / "x.img").exists()
