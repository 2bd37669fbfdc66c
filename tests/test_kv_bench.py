# SPDX-License-Identifier: Apache-2.0
"""`insitu bench kv` on small data: every workload on every stack (direct, redirect through
`insitu attach`, syscall over ext4 on a loop device), the contract's JSON keys, and clear
errors for bad flags. Size belongs in the benchmark run, not here.
"""

from __future__ import annotations

import os

import pytest

from helpers import cli_error, cli_json

WORKLOADS = ["a", "b", "c", "d", "e", "f"]
DB = [f"{w}-{n}" for w in ("fillseq", "fillrandom", "readseq", "readrandom") for n in (100, 4096)]
SYSTEMS = ["direct", "redirect", "syscall"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the redirection and syscall stacks need root (attach, loop devices)")


def test_every_workload_on_every_stack_with_the_contract_keys():
    r = cli_json("bench", "kv", "--records", 1500, "--operations", 120, timeout=600)
    rows = {(x["workload"], x["system"]): x for x in r["results"]}
    assert set(rows) == {(w, s) for w in WORKLOADS + DB for s in SYSTEMS}, sorted(rows)
    for (w, s), x in rows.items():
        assert x["ops_per_s"] > 0 and 0 < x["p50_us"] <= x["p99_us"], (w, s, x)
        # db_bench entries and YCSB operations are what was asked for.
        assert x["operations"] == 120, x
        # Every key a YCSB read or a db_bench read asked for was written before (records,
        # or earlier inserts), so none may be missing.
        assert x["not_found"] == 0, x
    assert r["verified"] is True
    # One drive model governs every stack (HAYAGUI's drive class by default).
    assert r["drive"] == "samsung-980pro" and r["drive_model"]["flash"]["page_bytes"] > 0
    assert set(r["drive_applied"]) == set(SYSTEMS)
    assert "flush" in r["drive_applied"]["syscall"], r["drive_applied"]
    for w in WORKLOADS + DB:
        ratio = r["ratios"][w]
        assert set(ratio) == {"direct_to_redirect", "direct_to_syscall"}
        assert ratio["direct_to_redirect"] == pytest.approx(rows[(w, "direct")]["ops_per_s"] / rows[(w, "redirect")]["ops_per_s"])


def test_a_subset_runs_only_what_was_asked():
    r = cli_json("bench", "kv", "--records", 500, "--operations", 50, "--workloads", "c,readrandom", "--systems", "direct", timeout=300)
    assert sorted((x["workload"], x["system"]) for x in r["results"]) == [("c", "direct"), ("readrandom-100", "direct"), ("readrandom-4096", "direct")]


def test_without_a_drive_model_every_stack_runs_at_real_speed():
    r = cli_json("bench", "kv", "--records", 200, "--operations", 20, "--workloads", "c", "--drive", "none", timeout=300)
    assert r["drive"] == "none" and r["drive_model"] is None
    assert r["drive_applied"] == {s: "real speed" for s in SYSTEMS}


def test_insitu_kv_bench_is_the_same_benchmark():
    r = cli_json("kv", "bench", "--records", 300, "--operations", 20, "--workloads", "a,fillseq", "--systems", "direct,syscall", timeout=300)
    assert sorted((x["workload"], x["system"]) for x in r["results"]) == sorted(
        (w, s) for w in ("a", "fillseq-100", "fillseq-4096") for s in ("direct", "syscall")
    )
    assert set(r["ratios"]["a"]) == {"direct_to_syscall"}


@pytest.mark.parametrize(
    "flags,words",
    [
        (["--records", "10", "--workloads", "g"], ["unknown workload", "fillseq"]),
        (["--records", "10", "--systems", "spdk"], ["unknown system", "redirect"]),
        (["--records", "0"], ["at least 1"]),
        (["--records", "10", "--link", "warp"], ["warp"]),
        (["--records", "10", "--drive", "warp9"], ["--drive warp9"]),
    ],
)
def test_bad_flags_say_what_is_wrong(flags, words):
    msg = cli_error("bench", "kv", "--operations", 10, *flags)
    for w in words:
        assert w in msg, msg
