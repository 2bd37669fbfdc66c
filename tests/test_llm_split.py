# SPDX-License-Identifier: Apache-2.0
"""A sequence's tokens split over several targets (split-K): each target attends over its
share and returns its part with the log-sum-exp of its scores, and the host merges the
parts. Dense is exact; SparF chooses its pages over the whole sequence (scores from every
target, the choice on the host) and is exact attention over them; one attention exchange
per layer and target for dense, two for SparF; f16 pages. Checked against torch on the host; embedded targets run in this process."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch", reason="the LLM extra is not installed (pip install 'insitu[llm]')")
pytest.importorskip("transformers", reason="the LLM extra is not installed (pip install 'insitu[llm]')")

import insitu  # noqa: E402
from insitu.llm import sparf  # noqa: E402
from insitu.llm.remote import TargetStore, f32_bytes  # noqa: E402
from insitu.llm.targets import TargetPool, merge  # noqa: E402

D = 64
HKV, G = 3, 3
SCALE = D**-0.5
TPP = 4096 // (4 * D)  # f32 tokens per 4 KiB page


@pytest.fixture(scope="module")
def pool3(tmp_path_factory):
    with TargetPool.embedded(3, directory=str(tmp_path_factory.mktemp("llm-split")), shared_bytes=64 << 20, private_bytes=256 << 20) as p:
        yield p


def _case(seed: int, tokens: int, rows: int = 1):
    g = torch.Generator().manual_seed(seed)
    K = torch.randn(rows, HKV, tokens, D, generator=g)
    V = torch.randn(rows, HKV, tokens, D, generator=g)
    K[..., ::29, :] *= 3  # a few strong keys, so SparF's selection has something to find
    return g, K, V


def test_merge_of_parts_is_attention_over_the_union():
    g = torch.Generator().manual_seed(5)
    q, K, V = torch.randn(4, D, generator=g), torch.randn(100, D, generator=g), torch.randn(100, D, generator=g)
    parts = [torch.arange(0, 100, 3), torch.arange(1, 100, 3), torch.arange(2, 100, 3), torch.arange(0)]
    outs, lses = [], []
    for idx in parts:
        s = (q.double() @ K[idx].double().T) * SCALE
        outs.append(torch.softmax(s, -1) @ V[idx].double() if len(idx) else torch.zeros(4, D, dtype=torch.float64))
        lses.append(torch.logsumexp(s, -1) if len(idx) else torch.full((4,), -math.inf, dtype=torch.float64))
    assert torch.allclose(merge(outs, lses), sparf.dense(q, K, V, SCALE), atol=1e-12)


def test_dense_over_a_token_split_equals_dense_over_the_whole_sequence(pool3):
    """Two rows of different lengths (the second padded), three targets, three decode steps:
    every output equals torch's dense attention over the whole row, and each step costs one
    exchange per layer and target."""
    S = 5 * TPP + 7
    g, K, V = _case(1, S, rows=2)
    valid = torch.ones(2, S, dtype=torch.bool)
    valid[1, : 2 * TPP + 3] = False  # row 1: a shorter prompt, left-padded
    store = TargetStore(pool3, 1, HKV, D, G, 2)
    assert store.split == "tokens" and len(store.targets) == 3
    try:
        store.prefill(0, K, V, valid)
        store.flush()
        Kr = [K[0], K[1][:, valid[1]]]
        Vr = [V[0], V[1][:, valid[1]]]
        for step in range(3):
            q = torch.randn(2, HKV * G, D, generator=g)
            k1, v1 = torch.randn(2, HKV, D, generator=g), torch.randn(2, HKV, D, generator=g)
            before = store.exchanges
            out = store.decode(0, q, k1, v1, SCALE)
            assert store.exchanges - before == 3, "one attention exchange per target for the layer"
            for b in range(2):
                Kr[b] = torch.cat([Kr[b], k1[b][:, None]], 1)
                Vr[b] = torch.cat([Vr[b], v1[b][:, None]], 1)
                for h in range(HKV):
                    want = sparf.dense(q[b, h * G : (h + 1) * G], Kr[b][h], Vr[b][h], SCALE)
                    assert torch.allclose(out[b, h * G : (h + 1) * G].double(), want, atol=1e-5), (step, b, h)
        # Every token is on exactly one target, the targets even to within a page.
        held = [[t.info(s)["tokens"][0] for s in store.seqs] for t in store.targets]
        assert [sum(col) for col in zip(*held)] == [S + 3, int(valid[1].sum()) + 3]
        assert held == store.held
        assert max(h[0] for h in held) - min(h[0] for h in held) <= TPP
    finally:
        store.close()


@pytest.mark.parametrize("tokens", [200, 1500])
def test_sparf_over_a_token_split_reads_the_pages_one_target_would(pool3, tokens):
    """SparF over three targets chooses its pages over the whole sequence: every target
    scores its pages, the host normalises the masses over all of them and keeps the first
    page, the last tokens' pages and the best others up to one target's page budget; the
    merged output is exact attention over the tokens of exactly those pages (checked
    against torch choosing them from the whole cache), and the three targets read what
    one target holding the sequence reads, give or take a dimension page each. Two rows
    of the same sequence choose the same pages."""
    g, K, V = _case(tokens, tokens)
    rows = 2
    K, V = K.expand(rows, -1, -1, -1).contiguous(), V.expand(rows, -1, -1, -1).contiguous()
    q = torch.randn(1, HKV * G, D, generator=g).expand(rows, -1, -1).contiguous()
    k1 = torch.randn(1, HKV, D, generator=g).expand(rows, -1, -1).contiguous()
    v1 = torch.randn(1, HKV, D, generator=g).expand(rows, -1, -1).contiguous()
    media = {}
    for n in (3, 1):
        pool = pool3 if n == 3 else TargetPool(urls=pool3.urls[:1])
        store = TargetStore(pool, 1, HKV, D, G, rows, method="sparf", ratio=0.125)
        try:
            store.prefill(0, K, V, None)
            store.flush()
            got = store.decode(0, q, k1, v1, SCALE)
            media[n] = store.stats()["media_bytes"]
        finally:
            store.close()
        if n == 3:
            out, split = got, store.split_tokens
    assert torch.equal(out[0], out[1]), "the same row dealt from another target chooses the same pages"
    Kf, Vf = torch.cat([K[1], k1[1][:, None]], 1), torch.cat([V[1], v1[1][:, None]], 1)
    total = tokens + 1
    owner = torch.tensor([split.owner(1, t // TPP) for t in range(total)])
    p = sparf.params(0.125, D, total, TPP)
    # Each target's pages: its tokens in the order it stores them, TPP at a time.
    pages = []  # (target, tokens of the page)
    for i in range(3):
        idx = torch.nonzero(owner == i).flatten()
        pages += [(i, idx[a : a + TPP]) for a in range(0, len(idx), TPP)]
    recent = set(range(total - p.local, total))
    for h in range(HKV):
        qh = q[1, h * G : (h + 1) * G]
        dims = sparf.select_dims(qh, p.r, shared=True)
        shat = sparf.approx_scores(qh, dims, Kf[h].T, SCALE)  # softmax over the whole sequence
        keep, compete = set(), []
        local_seen = {i: False for i in range(3)}
        for j, (i, t) in enumerate(pages):
            if t[0] == 0:  # the first page, on the target the row is dealt from
                keep.add(j)
            elif any(x in recent for x in t.tolist()):
                keep.add(j)
                local_seen[i] = True
        for j, (i, t) in enumerate(pages):
            # Only pages older than their target's local pages compete.
            later_local = any(k in keep and pi == i and pk[0] > t[0] and any(x in recent for x in pk.tolist()) for k, (pi, pk) in enumerate(pages))
            if j not in keep and (later_local or not local_seen[i]):
                compete.append((-float(shat[:, t].sum(-1).max()), j))
        keep |= {j for _, j in sorted(compete)[: p.pages]}
        kept = torch.cat([pages[j][1] for j in sorted(keep)]).sort().values
        want = sparf.dense(qh, Kf[h][kept], Vf[h][kept], SCALE)
        assert torch.allclose(out[1, h * G : (h + 1) * G].double(), want, atol=2e-5), (h, (out[1, h * G : (h + 1) * G].double() - want).abs().max())
    # Media: the token pages of one target's choice plus each target's dimension pages.
    assert abs(media[3] - media[1]) <= rows * (3 * HKV * 4096 * math.ceil(p.r / 2) + 2 * 4096 * HKV), media
    if tokens > 1000:
        dense_bytes = rows * 2 * HKV * total * D * 4
        assert 0 < media[3] < dense_bytes / 2


def test_f16_pages_halve_the_media_and_attend_over_the_rounded_cache(pool3):
    """f16 pages: the target stores K and V rounded to f16, reads half the bytes of f32
    pages, and the link carries the queries, the new token and the outputs as f16 too (the
    bytes of a step about halve); dense attention over them is attention over the rounded
    cache with the rounded queries, to the outputs' f16 precision."""
    S = 4 * 32  # whole f16 pages (32 tokens of 64 dimensions in 4 KiB)
    g, K, V = _case(9, S)
    q = torch.randn(1, HKV * G, D, generator=g)
    k1, v1 = torch.randn(1, HKV, D, generator=g), torch.randn(1, HKV, D, generator=g)
    outs, media, link = {}, {}, {}
    for dtype in ("f32", "f16"):
        store = TargetStore(pool3, 1, HKV, D, G, 1, split="heads", kv_dtype=dtype)
        try:
            assert store.targets[0].info(store.seqs[0])["dtype"] == dtype
            store.prefill(0, K, V, None)
            store.flush()
            before = store.stats()
            outs[dtype] = store.decode(0, q, k1, v1, SCALE)
            after = store.stats()
            media[dtype] = after["media_bytes"]
            link[dtype] = sum(after[x] - before[x] for x in ("bytes_to_host", "bytes_from_host"))
        finally:
            store.close()
    assert media["f16"] * 2 == media["f32"] > 0
    assert link["f16"] < 0.6 * link["f32"], link
    Kh = torch.cat([K[0], k1[0][:, None]], 1).half().double()
    Vh = torch.cat([V[0], v1[0][:, None]], 1).half().double()
    qh = q.half().double()
    for h in range(HKV):
        want = sparf.dense(qh[0, h * G : (h + 1) * G], Kh[h], Vh[h], SCALE)
        assert torch.allclose(outs["f16"][0, h * G : (h + 1) * G].double(), want, atol=1e-3, rtol=1e-3)
    assert not torch.allclose(outs["f16"], outs["f32"], atol=1e-7), "f16 pages should round"


def test_flexgen_f16_blocks_halve_the_reads_and_attend_over_the_rounded_cache(pool3):
    """The FlexGen-style baseline keeps its blocks as the in-storage store keeps its pages:
    f16 blocks read back half the bytes of f32 ones, and its attention is attention over
    the cache rounded to f16 (the decode step's token, still in the host tail, as it is)."""
    from insitu.llm.flexgen import FlexGenStore

    S = 4 * 32  # whole f16 pages
    g, K, V = _case(11, S)
    q = torch.randn(1, HKV * G, D, generator=g)
    k1, v1 = torch.randn(1, HKV, D, generator=g), torch.randn(1, HKV, D, generator=g)
    outs, media = {}, {}
    for dtype in ("f32", "f16"):
        store = FlexGenStore(pool3, 1, HKV, D, G, 1, max_tokens=S + 1, split="heads", kv_dtype=dtype)
        try:
            store.prefill(0, K, V, None)
            store.flush()
            outs[dtype] = store.decode(0, q, k1, v1, SCALE)
            media[dtype] = store.stats()["media_bytes"]
        finally:
            store.close()
    assert media["f16"] * 2 == media["f32"] > 0
    Kh = torch.cat([K[0].half().double(), k1[0][:, None].double()], 1)
    Vh = torch.cat([V[0].half().double(), v1[0][:, None].double()], 1)
    for h in range(HKV):
        want = sparf.dense(q[0, h * G : (h + 1) * G].double(), Kh[h], Vh[h], SCALE)
        assert torch.allclose(outs["f16"][0, h * G : (h + 1) * G].double(), want, atol=1e-5), (h, (outs["f16"][0, h * G : (h + 1) * G] - want).abs().max())
    assert not torch.allclose(outs["f16"], outs["f32"], atol=1e-7), "f16 blocks should round"
    with pytest.raises(ValueError, match="KV dtype"):
        FlexGenStore(pool3, 1, HKV, D, G, 1, max_tokens=S, kv_dtype="bf16")


def test_flexgen_dense_attends_over_a_page_filled_after_its_read_began(pool3):
    """FlexGen's dense decode reads layer ``l + 1`` while layer ``l`` is attended; the
    step's token that then fills a page of layer ``l + 1`` is written after that read
    began, so the page is read on its own and attended with the pages read ahead, on the
    host's kernels over the read buffers, exactly (f32)."""
    from insitu.llm.flexgen import FlexGenStore

    S = 2 * TPP - 1  # the step's token fills the second page
    g, K, V = _case(13, S)
    K2, V2 = torch.randn(1, HKV, S, D, generator=g), torch.randn(1, HKV, S, D, generator=g)
    q = torch.randn(2, 1, HKV * G, D, generator=g)
    new = [(torch.randn(1, HKV, D, generator=g), torch.randn(1, HKV, D, generator=g)) for _ in range(2)]
    store = FlexGenStore(pool3, 2, HKV, D, G, 1, max_tokens=S + 1, split="heads", kv_dtype="f32")
    try:
        for layer, (k, v) in enumerate([(K, V), (K2, V2)]):
            store.prefill(layer, k, v, None)
        store.flush()
        outs = [store.decode(layer, q[layer], *new[layer], SCALE) for layer in range(2)]
        media = store.stats()["media_bytes"]
    finally:
        store.close()
    for layer, (k, v) in enumerate([(K, V), (K2, V2)]):
        Kl = torch.cat([k[0], new[layer][0][0][:, None]], 1).double()
        Vl = torch.cat([v[0], new[layer][1][0][:, None]], 1).double()
        for h in range(HKV):
            want = sparf.dense(q[layer, 0, h * G : (h + 1) * G].double(), Kl[h], Vl[h], SCALE)
            assert torch.allclose(outs[layer][0, h * G : (h + 1) * G].double(), want, atol=1e-5), (layer, h)
    # Layer 0 read its two pages; layer 1 one page ahead and the filled one on its own.
    assert media == 2 * 2 * HKV * 2 * 4096


def test_partial_requests_and_bad_split_options(pool3):
    kv = insitu.KvTarget(pool3.urls[0])
    kv.create(77, 1, 1, D)
    kv.create(78, 1, 1, D)
    try:
        k = torch.randn(1, 20, D)
        kv.append(77, 0, 20, f32_bytes(k), f32_bytes(k))
        q = torch.randn(2, 1, 2, D)
        out, stats, lse = kv.attend(0, [77, 78], f32_bytes(q), 2, SCALE, partial=True)
        lse = torch.frombuffer(bytearray(lse), dtype=torch.float64).view(2, 2)
        s = (q[0, 0].double() @ k[0].double().T) * SCALE
        assert torch.allclose(lse[0], torch.logsumexp(s, -1))
        assert torch.isinf(lse[1]).all() and (lse[1] < 0).all(), "sequence 78 holds nothing here: an empty part"
        assert stats["rows_used"] == 2 * 20  # K and V rows of sequence 77 only
        o = torch.frombuffer(bytearray(out), dtype=torch.float32).view(2, 2, D)
        assert torch.allclose(o[0].double(), torch.softmax(s, -1) @ k[0].double(), atol=1e-6) and not o[1].any()
        # Not partial: the empty sequence is an error, as before.
        with pytest.raises(insitu.TargetError, match="malformed"):
            kv.attend(0, [77, 78], f32_bytes(q), 2, SCALE)
        with pytest.raises(insitu.TargetError, match="malformed"):
            kv.attend(0, [77], f32_bytes(q[:1]), 2, SCALE, "sparf", 2, 4, 1, mean_v=True, partial=True)
        assert kv.info(77)["tokens"] == [20] and kv.info(78)["tokens"] == [0]
        # A new token for sequence 78 alone rides with the request for both.
        k1 = torch.randn(1, 1, D)
        out, _, lse = kv.attend(0, [77, 78], f32_bytes(q), 2, SCALE, new_k=f32_bytes(k1), new_v=f32_bytes(k1), partial=True, new_rows=[1])
        assert kv.info(77)["tokens"] == [20] and kv.info(78)["tokens"] == [1]
        o = torch.frombuffer(bytearray(out), dtype=torch.float32).view(2, 2, D)
        assert torch.allclose(o[1], k1[0].expand(2, D)), "one token: its V is the output"
        for rows, why in [([1, 0], "ascending"), ([2], "ascending"), ([], "at least one")]:
            with pytest.raises(insitu.RequestError, match=why):
                kv.attend(0, [77, 78], f32_bytes(q), 2, SCALE, new_k=f32_bytes(k1), new_v=f32_bytes(k1), partial=True, new_rows=rows)
        with pytest.raises(insitu.TargetError):  # one token's K for two sequences
            kv.attend(0, [77, 78], f32_bytes(q), 2, SCALE, new_k=f32_bytes(k1), new_v=f32_bytes(k1), partial=True, new_rows=[0, 1])
        assert kv.info(77)["tokens"] == [20] and kv.info(78)["tokens"] == [1], "a refused request appends nothing"
    finally:
        kv.free(77)
        kv.free(78)
        kv.disconnect()
    with pytest.raises(ValueError, match="split"):
        TargetStore(pool3, 1, HKV, D, G, 1, split="layers")
    with pytest.raises(ValueError, match="KV dtype"):
        TargetStore(pool3, 1, HKV, D, G, 1, kv_dtype="bf16")
    with pytest.raises(ValueError, match="mean of V"):
        TargetStore(pool3, 1, HKV, D, G, 1, method="sparf", ratio=0.125, mean_v=True, split="tokens")


def test_attend_all_sends_to_every_target_at_once_and_answers_as_attend_does(pool3):
    kvs = [insitu.KvTarget(u) for u in pool3.urls]
    g = torch.Generator().manual_seed(11)
    try:
        for i, kv in enumerate(kvs):
            kv.create(90, 1, 1, D)
            k = torch.randn(1, 10 + i, D, generator=g)
            kv.append(90, 0, 10 + i, f32_bytes(k), f32_bytes(k))
        q = torch.randn(1, 1, 2, D, generator=g)
        one = [kv.attend(0, [90], f32_bytes(q), 2, SCALE, partial=True) for kv in kvs]
        pending = [kv.attend(0, [90], f32_bytes(q), 2, SCALE, partial=True, send=False) for kv in kvs]
        assert all(kv.info(90)["tokens"] == [10 + i] for i, kv in enumerate(kvs)), "nothing is sent before attend_all"
        both = insitu._native.attend_all(pending)
        assert [(o, lse) for o, _, lse in both] == [(o, lse) for o, _, lse in one]
        assert [s["rows_used"] for _, s, _ in both] == [2 * (10 + i) for i in range(3)]
        assert insitu._native.attend_all([]) == []
        # One refused request raises its error; the others were still answered.
        bad = kvs[1].attend(0, [90], f32_bytes(q), 2, SCALE, "sparf", 2, 4, 1, mean_v=True, partial=True, send=False)
        with pytest.raises(insitu.TargetError, match="malformed"):
            insitu._native.attend_all([pending[0], bad, pending[2]])
    finally:
        for kv in kvs:
            kv.free(90)
            kv.disconnect()


@pytest.mark.parametrize("vectors", ["f32", "f16"])
def test_reduced_page_scores_equal_the_full_ones_in_fewer_link_bytes(pool3, vectors):
    kv = insitu.KvTarget(pool3.urls[1])
    kv.create(91, 1, HKV, D, vectors)
    try:
        k, v = torch.randn(HKV, 300, D), torch.randn(HKV, 300, D)
        kv.append(91, 0, 300, f32_bytes(k), f32_bytes(v))
        q = torch.randn(1, HKV, G, D)
        r = 8

        def scores(**kw):
            before = kv.stats()["bytes_sent"]
            groups, _, masses = kv.attend(0, [91], f32_bytes(q), G, SCALE, "sparf", r, 1, 0, page_scores=True, vectors=vectors, **kw)
            return groups, bytes(masses), kv.stats()["bytes_sent"] - before

        full, reduced = scores(), scores(reduced=True)
        assert full[:2] == reduced[:2], "the same pages and the same masses, bit for bit"
        # Up: r of D components per row, the shared components and an f64 norm per row.
        size = 2 if vectors == "f16" else 4
        assert full[2] - reduced[2] == HKV * G * (D - r) * size - HKV * r * 2 - HKV * G * 8
        with pytest.raises(insitu.RequestError, match="page_scores"):
            kv.attend(0, [91], f32_bytes(q), G, SCALE, "sparf", r, 8, 1, reduced=True)
        with pytest.raises(insitu.RequestError, match="page_scores"):
            kv.attend(0, [91], f32_bytes(q), G, SCALE, "dense", page_scores=True, reduced=True)
    finally:
        kv.free(91)
        kv.disconnect()


def test_flexgen_splits_tokens_as_the_targets_do(pool3):
    """The FlexGen baseline over a token split stores the same tokens on the same targets
    and, reading them back, computes what the targets compute (dense and SparF); it moves
    the pages over the link, the targets only q, k, v and outputs."""
    from insitu.llm.flexgen import FlexGenStore

    S = 700
    g, K, V = _case(3, S)
    q = torch.randn(1, HKV * G, D, generator=g)
    k1, v1 = torch.randn(1, HKV, D, generator=g), torch.randn(1, HKV, D, generator=g)
    for ratio in (None, 0.125):
        method = "sparf" if ratio else "dense"
        target = TargetStore(pool3, 1, HKV, D, G, 1, method=method, ratio=ratio)
        flex = FlexGenStore(pool3, 1, HKV, D, G, 1, max_tokens=S + 1, ratio=ratio)
        try:
            outs = []
            for store in (target, flex):
                assert store.split == "tokens"
                store.prefill(0, K, V, None)
                store.flush()
                outs.append(store.decode(0, q, k1, v1, SCALE))
            assert target.held == flex.split_tokens.held
            ts, fs = target.stats(), flex.stats()
        finally:
            target.close()
            flex.close()
        assert torch.allclose(outs[0].double(), outs[1].double(), atol=2e-5), (method, (outs[0] - outs[1]).abs().max())
        assert fs["bytes_to_host"] > 10 * ts["bytes_to_host"], method


def test_every_layer_puts_a_forward_s_tokens_where_layer_0_put_them():
    """A forward of several new tokens calls each layer once per token: the j-th token of
    every layer goes to the target layer 0 chose for its j-th, so the layers' shares agree;
    each token goes to the target owning its page, sequence by sequence."""
    from insitu.llm.targets import TokenSplit

    split = TokenSplit(3, 2, TPP)
    split.deal([0, 0], [TPP - 2, TPP])  # sequence 0 short of a page, sequence 1 one page

    def placed(layer):
        out = []
        for _ in range(3):
            asked = split.decode(layer)
            assert set(split.step_owners) <= set(asked)
            assert all(b in split.new_rows(o) for b, o in enumerate(split.step_owners))
            out.append(list(split.step_owners))
        return out

    # Each token on its page's target, sequence b dealt from target b: sequence 0's page 1
    # is on target 1, sequence 1's on target 2.
    assert placed(0) == [[0, 2], [0, 2], [1, 2]]
    assert placed(1) == placed(2) == [[0, 2], [0, 2], [1, 2]]
    assert split.held == [[TPP, 0], [1, TPP], [0, 3]]  # counted once, at layer 0
    assert split.recent(0, 0, 2) == 1 and split.recent(1, 0, 2) == 1
    assert placed(0) == [[1, 2], [1, 2], [1, 2]]  # the next forward places anew
    assert TokenSplit(3, 2, TPP, first=2).owner(1, 0) == 0, "a split may deal its first sequence from any target"


def test_micro_batches_split_a_batch_evenly_and_never_leave_one_empty():
    from insitu.llm.run import micro_batch_sizes

    assert micro_batch_sizes(4, 2) == [2, 2]
    assert micro_batch_sizes(5, 2) == [3, 2]
    assert micro_batch_sizes(3, 8) == [1, 1, 1]
    assert micro_batch_sizes(4, 1) == [4]
    assert micro_batch_sizes(2, 0) == [2]


def test_all_waiting_is_the_time_every_micro_batch_waits_at_once():
    from insitu.llm.bench import all_waiting

    # One micro-batch: all of its waits.
    assert all_waiting([[(0.0, 1.0), (2.0, 2.5)]]) == pytest.approx(1.5)
    # Two: only where both wait, [0.5, 1] and [2.2, 2.5].
    a = [(0.0, 1.0), (2.0, 2.5)]
    b = [(0.5, 1.5), (2.2, 3.0)]
    assert all_waiting([a, b]) == pytest.approx(0.8)
    assert all_waiting([b, a]) == pytest.approx(0.8)
    # Waits that never overlap: the host always computes something.
    assert all_waiting([[(0.0, 1.0)], [(1.0, 2.0)]]) == 0.0
    assert all_waiting([a, []]) == 0.0
    assert all_waiting([]) == 0.0


def test_auto_micro_batches_overlap_only_when_the_drive_outlasts_the_host():
    from insitu.llm.bench import auto_micro_batches

    assert auto_micro_batches(0.8, 0.1) == 4  # the drive is the limit: keep it fed
    assert auto_micro_batches(0.47, 0.1) == 4
    assert auto_micro_batches(0.26, 0.1) == 4  # four targets' SparF at 4 x 1,024 on custom:25
    assert auto_micro_batches(0.24, 0.1) == 2
    assert auto_micro_batches(0.14, 0.1) == 2
    assert auto_micro_batches(0.12, 0.1) == 1
    assert auto_micro_batches(0.084, 0.1) == 1
    assert auto_micro_batches(0.004, 0.1) == 1


def test_a_row_is_limited_by_the_drive_at_its_bound_or_as_driven_else_by_the_larger_of_host_and_attention():
    from insitu.llm.bench import AT_BOUND, LIMITS, limit_of

    # Within 1.15x of the bound: the larger of the modelled flash and link times.
    assert limit_of(1.0, 0.9, link_s=0.1, flash_s=0.8) == "flash"
    assert limit_of(AT_BOUND * 0.9, 0.5, link_s=0.6, flash_s=0.3) == "link"
    # Beyond it: the host's model when it takes more of the step than attention does.
    assert limit_of(1.0, 0.3, link_s=0.1, flash_s=0.1) == "host"
    assert limit_of(1.0, 0.7, link_s=0.1, flash_s=0.1) == "cpu"
    assert limit_of(1.0, None, link_s=0.0, flash_s=0.0) == "host"
    # Attention mostly spent waiting on the drive after the engines: the drive.
    assert limit_of(1.0, 0.7, link_s=0.1, flash_s=0.1, drive_wait_s=0.35) == "drive"
    assert limit_of(1.0, 0.7, link_s=0.1, flash_s=0.1, drive_wait_s=0.3) == "cpu"
    assert limit_of(1.0, 0.3, link_s=0.1, flash_s=0.1, drive_wait_s=0.2) == "drive"
    assert {"flash", "link", "drive", "host", "cpu"} == set(LIMITS)


def test_bench_images_go_in_memory_where_there_is_room(tmp_path, monkeypatch):
    """`insitu bench llm` puts its images on tmpfs unless told otherwise, so that a disk's
    direct reads weigh on the in-storage engine only where asked; a path's file system is
    that of the longest mount point above it, spaces escaped as /proc/mounts writes them."""
    from insitu.llm import bench

    mounts = tmp_path / "mounts"
    lines = [
        "/dev/vda / ext4 rw 0 0",
        "tmpfs /dev/shm tmpfs rw 0 0",
        "tmpfs /srv/my\\040ram tmpfs rw 0 0",
        "/dev/vdb /dev/shm/disk xfs rw 0 0",
        "garbage",
    ]
    mounts.write_text("\n".join(lines) + "\n")
    m = str(mounts)
    assert bench.in_memory("/dev/shm", m)
    assert bench.in_memory("/dev/shm/insitu-bench/not/made/yet", m)
    assert not bench.in_memory("/dev/shmem", m)  # a prefix of the name, not a parent
    assert not bench.in_memory("/dev/shm/disk/x", m)
    assert not bench.in_memory("/work/.insitu/bench", m)
    assert bench.in_memory("/srv/my ram/images", m)
    assert not bench.in_memory("/dev/shm", str(tmp_path / "no-such-file"))

    monkeypatch.setattr(bench, "in_memory", lambda path, mounts="/proc/mounts": True)
    free = lambda avail: type("St", (), {"f_bavail": avail, "f_frsize": 4096})()  # noqa: E731
    monkeypatch.setattr(bench.os, "statvfs", lambda path: free(1000))
    assert bench.default_dir(2000 * 4096) == bench.DISK_DIR  # no room for twice the cache
    assert bench.default_dir(500 * 4096) == bench.SHM_DIR
    monkeypatch.setattr(bench, "in_memory", lambda path, mounts="/proc/mounts": False)
    assert bench.default_dir(1) == bench.DISK_DIR  # /dev/shm on a disk


def test_split_sparf_calls_refuse_inconsistent_arguments(pool3):
    """The native split-SparF calls check their arguments before anything is sent: a
    sink, local pages and an owner per sequence, a target index in range, whole f32
    values; a bad one is a clear RequestError and appends nothing."""
    from insitu import _native

    kv = insitu.KvTarget(pool3.urls[0])
    kv.create(81, 1, HKV, D)
    try:
        q = f32_bytes(torch.randn(1, HKV, G, D))
        kv1 = f32_bytes(torch.randn(1, HKV, D))
        good = dict(sinks=[0], local_from=[[None]], held=[[1]], tokens_per_page=TPP, new_k=kv1, new_v=kv1, owners=[0])
        for bad, why in [
            (dict(sinks=[0, 0]), "a sink"),
            (dict(owners=[1]), "by their index"),
            (dict(local_from=[[None, None]]), "per target"),
            (dict(new_k=kv1[:-1]), "whole number of f32"),
            (dict(tokens_per_page=0), "page size"),
        ]:
            with pytest.raises(insitu.RequestError, match=why):
                _native.sparf_split([kv], 0, [81], q, G, SCALE, 8, 2, **{**good, **bad})
        assert kv.info(81)["tokens"] == [0], "a refused call appends nothing"
        out, rounds = _native.sparf_split([kv], 0, [81], q, G, SCALE, 8, 2, **good)
        assert len(out) == len(q) and [len(r) for r in rounds] == [1, 1] and kv.info(81)["tokens"] == [1]
        with pytest.raises(insitu.RequestError, match="heads x rows"):
            _native.choose_split_pages([([2], b"\0" * 4)], HKV, G, [0], [[None]], 1)
        assert _native.choose_split_pages([([2], f32_bytes(torch.tensor([0.0, -1.0] * HKV * G)))], HKV, G, [0], [[1]], 0) == [[[0, 1]] * HKV]
    finally:
        kv.free(81)
        kv.disconnect()


def test_bench_scaling_is_each_backends_throughput_over_its_fewest_targets():
    from insitu.llm.bench import scaling

    def row(backend, targets, tps, context=1024):
        return {"backend": backend, "batch": 4, "context": context, "targets": targets, "tokens_per_s": tps}

    r = {
        "rows": [
            row("memory", 0, 40.0),
            row("insitu-sparf", 1, 4.0),
            row("insitu-sparf", 2, 7.2),
            row("insitu-sparf", 4, 12.8),
            row("flexgen", 2, 2.0),
            row("flexgen", 4, 3.0),
            row("insitu", 4, 1.0, context=2048),
        ]
    }
    got = {(x["backend"], x["context"], x["targets"]): x for x in scaling(r)}
    assert set(got) == {("insitu-sparf", 1024, 2), ("insitu-sparf", 1024, 4), ("flexgen", 1024, 4)}
    assert got[("insitu-sparf", 1024, 4)]["ratio"] == pytest.approx(3.2)
    assert got[("insitu-sparf", 1024, 2)]["base_targets"] == 1
    # No 1-target row: over the fewest there are, and the record says which.
    assert got[("flexgen", 1024, 4)] == {"backend": "flexgen", "batch": 4, "context": 1024, "targets": 4, "base_targets": 2, "ratio": pytest.approx(1.5)}
    rows = r["rows"]
    assert rows[0]["scaling"] is None and rows[0]["scaling_base_targets"] is None  # the in-memory row
    assert rows[1]["scaling"] == 1.0 and rows[6]["scaling"] == 1.0  # the base itself
    assert rows[3]["scaling"] == pytest.approx(3.2) and rows[3]["scaling_base_targets"] == 1
