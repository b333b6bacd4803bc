"""SparseVectors: validation, conversions and row operations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lsr.sparse import SparseVectors


def random_vectors(n: int, vocab: int, seed: int, max_len: int = 12) -> SparseVectors:
    g = np.random.default_rng(seed)
    rows, cols, vals = [], [], []
    for i in range(n):
        m = int(g.integers(0, max_len + 1))
        terms = g.choice(vocab, size=min(m, vocab), replace=False)
        rows += [i] * len(terms)
        cols += terms.tolist()
        vals += g.uniform(0.01, 3.0, len(terms)).tolist()
    return SparseVectors.from_coo(rows, cols, vals, n, [f"d{i}" for i in range(n)], vocab)


def test_from_coo_sorts_and_merges_duplicates():
    v = SparseVectors.from_coo([1, 0, 1, 1], [5, 2, 3, 5], [1.0, 2.0, 0.5, 0.25], 3, vocab_size=8)
    assert v.indptr.tolist() == [0, 1, 3, 3]
    assert v.indices.tolist() == [2, 3, 5]
    assert v.values.tolist() == [2.0, 0.5, 1.25]
    assert v.indices.dtype == torch.int32 and v.indptr.dtype == torch.int64 and v.values.dtype == torch.float32


@pytest.mark.parametrize(
    "indptr, indices, values, match",
    [
        ([0, 2], [3, 1], [1.0, 1.0], "unique and ascending"),
        ([0, 2], [1, 1], [1.0, 1.0], "unique and ascending"),
        ([0, 1], [1], [float("nan")], "NaN"),
        ([0, 1], [1], [float("inf")], "NaN"),
        ([0, 1], [1], [-0.5], "> 0"),
        ([0, 1], [1], [0.0], "> 0"),
        ([0, 1], [9], [1.0], "outside the vocabulary"),
        ([0, 1], [-1], [1.0], "outside the vocabulary"),
        ([0, 3], [1, 2], [1.0, 1.0], "end at nnz"),
        ([1, 2], [1, 2], [1.0, 1.0], "start at 0"),
        ([0, 2, 1, 2], [1, 2], [1.0, 1.0], "decreases"),
    ],
)
def test_validation_rejects_bad_vectors(indptr, indices, values, match):
    n = len(indptr) - 1
    with pytest.raises(ValueError, match=match):
        SparseVectors(indptr, indices, values, ids=[str(i) for i in range(n)], vocab_size=4 if 9 in indices else 8)


def test_validation_names_the_row_and_rejects_duplicate_ids():
    with pytest.raises(ValueError, match="row 1 \\(id 'b'\\)"):
        SparseVectors([0, 1, 3], [0, 4, 2], [1.0, 1.0, 1.0], ids=["a", "b"], vocab_size=8)
    with pytest.raises(ValueError, match="duplicate id 'a'"):
        SparseVectors([0, 1, 2], [0, 1], [1.0, 1.0], ids=["a", "a"], vocab_size=8)
    with pytest.raises(ValueError, match="ids"):
        SparseVectors([0, 1, 2], [0, 1], [1.0, 1.0], ids=["a"], vocab_size=8)


def test_rows_after_a_row_start_may_decrease():
    # term ids restart in each row; a decrease across a row boundary (even after empty rows) is fine
    v = SparseVectors([0, 2, 2, 3], [3, 7, 1], [1.0, 2.0, 3.0], vocab_size=8)
    assert v.lengths.tolist() == [2, 0, 1]


def test_dict_and_dense_round_trips():
    vocab = {"apple": 0, "pear": 1, "plum": 2}
    rows = [{"pear": 0.5, "apple": 1.5}, {}, {"plum": 2.0}]
    v = SparseVectors.from_dicts(rows, vocab=vocab, ids=["q1", "q2", "q3"])
    assert v.to_dicts(["apple", "pear", "plum"]) == [{"apple": 1.5, "pear": 0.5}, {}, {"plum": 2.0}]
    with pytest.raises(ValueError, match="not in the vocabulary"):
        SparseVectors.from_dicts([{"kiwi": 1.0}], vocab=vocab)
    assert SparseVectors.from_dicts([{"kiwi": 1.0}], vocab=vocab, unknown="drop").nnz == 0
    with pytest.raises(ValueError, match="invalid weight"):
        SparseVectors.from_dicts([{"apple": float("nan")}], vocab=vocab)
    dense = v.to_dense()
    assert dense.shape == (3, 3)
    assert SparseVectors.from_dense(dense, ids=v.ids).equal(v)


def test_torch_sparse_round_trip_and_matmul():
    v = random_vectors(17, 40, seed=1)
    csr = v.to_torch_sparse()
    torch.testing.assert_close(csr.to_dense(), v.to_dense())
    assert SparseVectors.from_torch_sparse(v.to_torch_sparse(torch.sparse_coo), ids=v.ids).equal(v)
    q = torch.rand(40, 3)
    torch.testing.assert_close(torch.sparse.mm(csr, q), v.to_dense() @ q)


def test_row_selection_and_concat():
    v = random_vectors(11, 30, seed=2)
    dense = v.to_dense()
    sel = v[[7, 0, 3, 3 - 11]]
    assert sel.ids == ["d7", "d0", "d3", "d3"]
    torch.testing.assert_close(sel.to_dense(), dense[[7, 0, 3, 3]])
    torch.testing.assert_close(v[2:9].to_dense(), dense[2:9])
    torch.testing.assert_close(v[::3].to_dense(), dense[::3])
    mask = torch.zeros(11, dtype=torch.bool)
    mask[[1, 4]] = True
    assert v[mask].ids == ["d1", "d4"]
    both = SparseVectors.concat([v[:5], v[5:]])
    assert both.equal(v)
    with pytest.raises(ValueError, match="duplicate id"):
        SparseVectors.concat([v[:5], v[:5]])


def test_concat_refuses_vectors_of_different_vocabulary_sizes():
    """Rows of two encoders (different term spaces) are not joined under the larger vocabulary."""
    v = random_vectors(6, 30, seed=2)
    other = SparseVectors(v.indptr[:3], v.indices[:int(v.indptr[2])], v.values[:int(v.indptr[2])], ["x", "y"], 40)
    for parts in ([v, other], [other, v], [v[:2], v[2:], other]):
        with pytest.raises(ValueError, match=r"vocabulary sizes 30 and 40; encode all of them with one encoder"):
            SparseVectors.concat(parts)
    assert SparseVectors.concat([v[:2], v[2:]]).vocab_size == 30


def test_prune_top_k_keeps_largest_weights():
    v = random_vectors(9, 50, seed=3, max_len=20)
    p = v.prune_top_k(4)
    dense, pd = v.to_dense(), p.to_dense()
    for i in range(len(v)):
        kept = pd[i][pd[i] > 0]
        expect = torch.sort(dense[i][dense[i] > 0], descending=True).values[:4]
        torch.testing.assert_close(torch.sort(kept, descending=True).values, expect)
    assert (p.lengths <= 4).all()
    with pytest.raises(ValueError):
        v.prune_top_k(0)


@pytest.mark.gpu
def test_gpu_slices_follow_an_indptr_changed_in_place_or_replaced():
    """Slicing a CUDA batch reads a host copy of indptr kept across slices: a change of indptr in place (version
    counter), a new indptr tensor, and an inference tensor (no version counter) must each give the current rows."""
    q = SparseVectors([0, 2, 4, 6], [0, 1, 2, 3, 0, 1], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], vocab_size=4, device="cuda")
    assert q[1:2].indices.tolist() == [2, 3]
    q.indptr[1] = 1                                   # rows 0 / 1 now hold [0] / [1, 2, 3]
    assert q[1:2].indices.tolist() == [1, 2, 3] and q[1:2].values.tolist() == [2.0, 3.0, 4.0]
    q.indptr = torch.tensor([0, 3, 4, 6], device="cuda")   # rows [0, 1, 2] / [3] / [0, 1]
    assert q[1:2].indices.tolist() == [3] and q[0:1].indptr.tolist() == [0, 3]
    with torch.inference_mode():
        r = SparseVectors([0, 1, 3], [0, 1, 2], [1.0, 2.0, 3.0], vocab_size=4, device="cuda")   # rows [0] / [1, 2]
        assert r[1:2].indices.tolist() == [1, 2]
        r.indptr[1] = 2                                                   # rows [0, 1] / [2]
    assert r.indptr.is_inference()
    assert r[1:2].indices.tolist() == [2] and r[0:1].indices.tolist() == [0, 1]


def test_copies_do_not_carry_the_host_offsets():
    """The host copy of a CUDA indptr that slicing keeps is checked by the tensor's version counter, which a rebuilt
    tensor restarts: pickle and deepcopy must leave it behind (set by hand here: CPU vectors never keep one)."""
    import copy
    import pickle

    q = SparseVectors([0, 2, 3], [0, 1, 2], [1.0, 2.0, 3.0], vocab_size=4)
    q._host_indptr = (None, (0, 0), np.array([0, 9, 9]))
    for back in (pickle.loads(pickle.dumps(q)), copy.deepcopy(q), copy.copy(q)):
        assert getattr(back, "_host_indptr", None) is None
        assert back.ids == q.ids and torch.equal(back.indptr, q.indptr) and back[1:2].indices.tolist() == [2]
