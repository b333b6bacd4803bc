"""Sparse extraction of the head's [B, V] weights: counts behind an event, the window's trip to the host, and
the stacking of windows (lsr.encode.splade.extract), against plain per-row references."""

from __future__ import annotations

import pytest
import torch

from lsr.encode.splade.extract import CountedRows, VectorsBuilder, rows_to_input_order, to_csr
from lsr.sparse import SparseVectors
from lsr.testing import seeded_generator


def _weights(B: int, V: int, density: float, seed: int, device: str = "cpu") -> torch.Tensor:
    g = seeded_generator(seed)
    y = torch.rand(B, V, generator=g)
    y = torch.where(torch.rand(B, V, generator=g) < density, (y * 8).round() / 8, torch.zeros(()))  # ties
    y[1] = 0  # a row without terms
    return y.to(torch.bfloat16).to(device)


def _reference(y: torch.Tensor, top_k: int | None) -> tuple[list[int], list[int], list[float]]:
    counts, terms, weights = [], [], []
    for row in y.float().cpu():
        kept = [(-float(w), t) for t, w in enumerate(row.tolist()) if w != 0]
        kept = sorted(sorted(kept)[:top_k] if top_k is not None else kept, key=lambda p: p[1])
        counts.append(len(kept))
        terms += [t for _, t in kept]
        weights += [-w for w, _ in kept]
    return counts, terms, weights


@pytest.mark.parametrize("top_k", [None, 3, 1000])
def test_counted_rows_match_a_per_row_reference(top_k):
    y = _weights(7, 37, 0.3, seed=top_k or 0)
    counts, terms, weights = CountedRows(y, top_k).csr()
    want = _reference(y, top_k)
    assert counts.tolist() == want[0] and terms.tolist() == want[1] and weights.tolist() == want[2]
    assert terms.dtype == torch.int32 and weights.dtype == torch.float32 and counts.dtype == torch.int64
    assert [t.tolist() for t in to_csr(y, top_k)] == [counts.tolist(), terms.tolist(), weights.tolist()]


def _window(y: torch.Tensor, order: torch.Tensor, ids: list[str], finite: bool = True, **kw):
    counts, terms, weights = CountedRows(y, None).csr()
    flag = torch.tensor(finite, device=y.device)
    return rows_to_input_order(counts, terms, weights, order, ids, y.shape[1], flag, "boom: NaN", **kw)


def test_rows_come_back_in_input_order_and_nan_raises_on_read():
    y = _weights(6, 20, 0.4, seed=3)
    order = torch.tensor([4, 0, 5, 2, 1, 3])  # row j of y is text order[j]
    ids = [f"d{i}" for i in range(6)]
    got = _window(y, order, ids).result()
    dense = torch.zeros(6, 20)
    dense[order] = y.float()
    assert got.ids == ids and torch.equal(got.to_dense(), dense)
    pending = _window(y, order, ids, finite=False)
    with pytest.raises(FloatingPointError, match="boom"):
        pending.result()


def test_builder_stacks_windows_and_grows_past_its_estimate():
    # the first window is sparse, the later ones dense: the first estimate is too small
    windows = [_weights(n, 30, d, seed=s) for s, (n, d) in enumerate([(5, 0.05), (4, 0.9), (6, 0.5), (3, 0.95)])]
    ids = [f"q{i}" for i in range(sum(len(w) for w in windows))]
    builder, parts, start = VectorsBuilder(len(ids), ids, 30), [], 0
    for y in windows:
        pending = _window(y, torch.arange(len(y)), ids[start:start + len(y)])
        parts.append(pending.result())
        builder.append(pending)
        start += len(y)
    got, want = builder.result(), SparseVectors.concat(parts)
    assert got.equal(want) and got.ids == ids
    got.validate()
    empty = VectorsBuilder(0, [], 30).result()
    assert len(empty) == 0 and empty.nnz == 0


@pytest.mark.gpu
def test_cuda_extraction_matches_the_cpu():
    y = _weights(64, 3000, 0.02, seed=9)
    order = torch.randperm(64, generator=seeded_generator(1))
    ids = [str(i) for i in range(64)]
    assert _window(y.cuda(), order, ids).result().equal(_window(y, order, ids).result())  # small: copied at once
    on_gpu = _window(y.cuda(), order, ids, async_min_nnz=1)  # the pinned side-stream path even for this window
    assert on_gpu.wait()[1].is_pinned()
    got = on_gpu.result()
    assert not got.indices.is_pinned() and got.device.type == "cpu"
    assert got.equal(_window(y, order, ids).result())
    for k in (None, 5):
        assert [t.cpu().tolist() for t in CountedRows(y.cuda(), k).csr()] == [list(x) for x in _reference(y, k)]


@pytest.mark.slow
def test_windows_grow_from_the_first_one_and_give_the_same_vectors(tmp_path, data_dir):
    from lsr.encode.splade.encoder import SpladeEncoder
    from lsr.encode.stream import encode_windows, window_spans
    from lsr.testing import SAMPLE_TEXTS, save_tiny_mlm

    assert window_spans(23, 8, 2) == [(0, 2), (2, 4), (6, 8), (14, 8), (22, 1)]
    assert window_spans(5, 8, 100) == [(0, 5)] and window_spans(0, 8, 2) == []
    enc = SpladeEncoder.from_pretrained(save_tiny_mlm("bert", tmp_path / "bert", data_dir), device="cpu", batch_size=3)
    texts = [f"{t} {i}" for i in range(3) for t in SAMPLE_TEXTS]
    whole = enc.encode_document(texts)
    grown = encode_windows(enc, texts, None, "doc", 3, window=8, first_window=2, tokenize_workers=0)
    assert grown.ids == whole.ids and torch.equal(grown.indptr, whole.indptr)
    assert torch.equal(grown.indices, whole.indices)
    torch.testing.assert_close(grown.values, whole.values, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_cuda_windows_equal_one_call(monkeypatch, tmp_path, data_dir):
    from lsr.encode.splade import extract
    from lsr.encode.splade.encoder import SpladeEncoder
    from lsr.encode.stream import encode_windows
    from lsr.testing import SAMPLE_TEXTS, save_tiny_mlm

    # the encoder's windows keep their default thresholds: this forces the pinned side-stream copy for the tiny
    # model's small windows (a module constant, no encoder option; GPU only)
    monkeypatch.setattr(extract, "ASYNC_MIN_NNZ", 1)
    enc = SpladeEncoder.from_pretrained(save_tiny_mlm("bert", tmp_path / "bert", data_dir), device="cuda",
                                        batch_size=7)
    texts = [f"{t} {i}" for i in range(40) for t in SAMPLE_TEXTS]
    one = enc.encode_prepared(enc.prepare(texts))
    grown = encode_windows(enc, texts, None, "doc", 7, window=64, first_window=16, tokenize_workers=0)
    assert grown.ids == one.ids
    # bf16 batches of other shapes: a weight may round differently (or to zero)
    torch.testing.assert_close(grown.to_dense(), one.to_dense(), rtol=2e-2, atol=2e-2)
