"""Length-sorted batches: packed token slices and the padded form (built now or on first access) hold
exactly the texts' ids, in length order, against a per-text reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lsr.encode.tokenize.batching import TokenBatch, length_sorted_batches
from lsr.testing import seeded_generator


def reference(flat: np.ndarray, lengths: np.ndarray, batch_size: int, max_tokens: int | None, mult: int,
              pad_id: int) -> list[tuple[list[int], np.ndarray]]:
    """(rows, padded ids) per batch, one text at a time: longest first, ties in input order."""
    starts = np.concatenate([[0], np.cumsum(lengths)])
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out, i = [], 0
    while i < len(order):
        width = -(-max(int(lengths[order[i]]), 1) // mult) * mult
        size = batch_size if max_tokens is None else max(1, min(batch_size, max_tokens // width))
        rows = order[i:i + size]
        ids = np.full((len(rows), width), pad_id, np.int64)
        for r, text in enumerate(rows):
            ids[r, :lengths[text]] = flat[starts[text]:starts[text + 1]]
        out.append((rows, ids))
        i += len(rows)
    return out


@pytest.mark.parametrize(("n", "batch_size", "max_tokens", "mult"), [
    (0, 4, None, 1), (1, 4, None, 1), (37, 4, None, 1), (37, 5, 40, 8), (200, 64, 300, 1), (50, 1, None, 3)])
def test_batches_hold_the_texts_ids(n, batch_size, max_tokens, mult):
    gen = seeded_generator(n + batch_size)
    lengths = torch.randint(0, 30, (n,), generator=gen).numpy().astype(np.int64)
    if n > 3:
        lengths[:3] = [12, 12, 0]  # ties keep input order; an empty text (a static tower adds no tokens)
    flat = torch.randint(0, 1000, (int(lengths.sum()),), generator=gen).numpy().astype(np.int32)
    want = reference(flat, lengths, batch_size, max_tokens, mult, pad_id=-7)
    eager = length_sorted_batches("doc", flat, lengths, batch_size, max_tokens, mult, -7, pin=False)
    lazy = length_sorted_batches("doc", flat, lengths, batch_size, max_tokens, mult, -7, pin=False, padded=False)
    assert eager.n == lazy.n == n and eager.n_tokens == lazy.n_tokens == int(lengths.sum())
    assert eager.n_slots == lazy.n_slots == sum(ids.size for _, ids in want)
    assert len(eager.batches) == len(lazy.batches) == len(want)
    for e, z, (rows, ids) in zip(eager.batches, lazy.batches, want):
        assert z._input_ids is None and e._input_ids is not None  # the lazy one is not padded yet
        width = ids.shape[1]
        assert z.width == width and z.n_tokens == int(lengths[rows].sum()) and z.rows.tolist() == rows
        assert z.lengths.dtype == torch.int32 and z.lengths.tolist() == lengths[rows].tolist()
        np.testing.assert_array_equal(z.tokens.numpy(), np.concatenate([flat[:0]] + [
            ids[r, :lengths[t]] for r, t in enumerate(rows)]))
        for batch in (e, z):
            assert batch.input_ids.dtype == batch.attention_mask.dtype == torch.int64
            np.testing.assert_array_equal(batch.input_ids.numpy(), ids)
            np.testing.assert_array_equal(batch.attention_mask.numpy(),
                                          (np.arange(width) < lengths[rows][:, None]).astype(np.int64))


def test_token_batch_needs_ids_or_tokens():
    ids = torch.tensor([[5, 6, 0]])
    given = TokenBatch(ids, None, torch.tensor([0]))
    assert given.width == 3 and given.input_ids is ids
    with pytest.raises(ValueError, match="without an attention_mask"):
        given.attention_mask  # noqa: B018 - the property raises
    with pytest.raises(ValueError, match="needs input_ids, or tokens with lengths and width"):
        TokenBatch(None, None, torch.tensor([0]), tokens=torch.tensor([5, 6], dtype=torch.int32))


@pytest.mark.gpu
def test_pinned_batches_for_cuda():
    gen = seeded_generator(5)
    lengths = torch.randint(1, 40, (300,), generator=gen).numpy().astype(np.int64)
    flat = torch.randint(0, 1000, (int(lengths.sum()),), generator=gen).numpy().astype(np.int32)
    lazy = length_sorted_batches("doc", flat, lengths, 64, None, 1, 0, pin=True, padded=False)
    eager = length_sorted_batches("doc", flat, lengths, 64, None, 1, 0, pin=False)
    for z, e in zip(lazy.batches, eager.batches, strict=True):
        assert z.tokens.is_pinned() and z.lengths.is_pinned() and z._input_ids is None
        assert z.input_ids.is_pinned() and z.attention_mask.is_pinned()  # padded on access, pinned too
        assert z.input_ids.equal(e.input_ids) and z.attention_mask.equal(e.attention_mask)
        on_device = z.tokens.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        assert on_device.cpu().equal(e.input_ids[e.attention_mask.bool()].to(torch.int32))
