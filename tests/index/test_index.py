"""InvertedIndex: build against a naive Python reference, layout invariants, save/load and corruption."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from lsr.index import PAD, InvertedIndex, build_postings
from lsr.sparse import SparseVectors
from lsr.storage.shards import write_vectors
from lsr.testing import random_collection

FIELDS = ("doc_ids", "scores", "offsets", "lengths", "padded_lengths", "max_scores", "block_offsets")


def reference_layout(v: SparseVectors, block_size: int) -> dict[str, np.ndarray]:
    """The documented layout, built with plain Python loops over terms and blocks."""
    n, V = len(v), v.vocab_size
    nb = max(1, -(-n // block_size))
    postings: list[list[tuple[int, float]]] = [[] for _ in range(V)]
    ip, ix, val = v.indptr.tolist(), v.indices.tolist(), v.values.tolist()
    for d in range(n):
        for j in range(ip[d], ip[d + 1]):
            postings[ix[j]].append((d, val[j]))
    doc_ids: list[int] = []
    scores: list[float] = []
    offsets, lengths, padded, max_scores = [], [], [], []
    block_offsets = np.zeros((V, nb + 1), dtype=np.int64)
    for t in range(V):
        offsets.append(len(doc_ids))
        for b in range(nb):
            block_offsets[t, b] = len(doc_ids)
            seg = [(d, w) for d, w in postings[t] if d // block_size == b]
            doc_ids += [d for d, _ in seg] + [-1] * (-len(seg) % PAD)
            scores += [w for _, w in seg] + [0.0] * (-len(seg) % PAD)
        block_offsets[t, nb] = len(doc_ids)
        lengths.append(len(postings[t]))
        padded.append(len(doc_ids) - offsets[-1])
        max_scores.append(max((w for _, w in postings[t]), default=0.0))
    return {"doc_ids": np.array(doc_ids, np.int32), "scores": np.array(scores, np.float32),
            "offsets": np.array(offsets, np.int64), "lengths": np.array(lengths, np.int32),
            "padded_lengths": np.array(padded, np.int32), "max_scores": np.array(max_scores, np.float32),
            "block_offsets": block_offsets}


def assert_index_equal(a: InvertedIndex, b: InvertedIndex) -> None:
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and torch.equal(x.cpu(), y.cpu()), f
    assert a.docs.equal(b.docs.to("cpu") if b.device != a.device else b.docs)
    assert (a.vocab_size, a.n_docs, a.block_size, a.n_blocks, a.metadata) == \
        (b.vocab_size, b.n_docs, b.block_size, b.n_blocks, b.metadata)


@pytest.mark.parametrize("n,vocab,block_size,seed", [
    (1, 5, 1, 0), (37, 40, 16, 1), (300, 90, 64, 2), (257, 33, 256, 3), (500, 70, 65536, 4),
    (200, 41, 1, 5), (0, 7, 8, 6),
])
def test_build_matches_python_reference(n, vocab, block_size, seed):
    v = random_collection(n, vocab, seed)
    idx = InvertedIndex.build(v, block_size=block_size)
    ref = reference_layout(v, block_size)
    for f in FIELDS:
        got = getattr(idx, f)
        assert got.dtype == torch.from_numpy(ref[f]).dtype, f
        np.testing.assert_array_equal(got.numpy(), ref[f], err_msg=f)
    assert idx.n_blocks == max(1, -(-n // block_size)) and idx.n_docs == n
    assert idx.n_postings == v.nnz and idx.docnos == v.ids
    idx.check()


@pytest.mark.parametrize("vocab", [40_000, 70_000])  # int16 key with offset, int32 key
def test_large_vocabularies_match_reference(vocab):
    v = random_collection(60, vocab, seed=vocab, density=0.002)
    ref = reference_layout(v, 16)
    arrays = build_postings(v, 16)
    for f in FIELDS:
        np.testing.assert_array_equal(getattr(arrays, f).numpy(), ref[f], err_msg=f)


@pytest.mark.parametrize("budget", [1, 3000, 40_000])
def test_chunked_build_is_identical(budget):
    v = random_collection(400, 50, seed=budget)
    whole = build_postings(v, 32, max_memory_bytes=1 << 30)
    chunked = build_postings(v, 32, max_memory_bytes=budget)
    for f in FIELDS:
        assert torch.equal(getattr(whole, f), getattr(chunked, f)), f


def test_padding_and_block_invariants():
    v = random_collection(700, 60, seed=11)
    idx = InvertedIndex.build(v, block_size=128)
    bo = idx.block_offsets
    seg_len = bo[:, 1:] - bo[:, :-1]
    assert bool((seg_len % PAD == 0).all()) and int(bo[-1, -1]) == idx.doc_ids.numel()
    assert torch.equal(idx.padded_lengths.long(), bo[:, -1] - bo[:, 0])
    assert bool((idx.padded_lengths % PAD == 0).all())
    pad = idx.doc_ids < 0
    assert bool((idx.doc_ids[pad] == -1).all()) and bool((idx.scores[pad] == 0).all())
    assert bool((idx.scores[~pad] > 0).all())
    for t in torch.randperm(idx.vocab_size)[:15].tolist():
        for b in range(idx.n_blocks):
            seg = idx.doc_ids[bo[t, b]:bo[t, b + 1]]
            real = seg[seg >= 0]
            assert bool((seg[: real.numel()] >= 0).all())  # padding only at the end of a segment
            assert bool((real // 128 == b).all()) and bool((real[1:] > real[:-1]).all())
        d, s = idx.term_postings(t)
        assert d.numel() == int(idx.lengths[t])
        assert float(idx.max_scores[t]) == (float(s.max()) if s.numel() else 0.0)


def test_bad_block_sizes_rejected():
    v = random_collection(10, 5, seed=0)
    for bs in (0, 3, 48, 1 << 21, -4):
        with pytest.raises(ValueError, match="power of two"):
            InvertedIndex.build(v, block_size=bs)


def test_build_from_vector_directory_keeps_metadata(tmp_path):
    v = random_collection(50, 30, seed=12)
    write_vectors(tmp_path / "vec", v, {"kind": "splade", "model": "m"}, shard_rows=16)
    idx = InvertedIndex.build(tmp_path / "vec", block_size=16)
    assert idx.metadata == {"kind": "splade", "model": "m"}
    assert_index_equal(idx, InvertedIndex.build(v, block_size=16, metadata={"kind": "splade", "model": "m"}))


# ---------------------------------------------------------------------- disk format
@pytest.fixture
def saved(tmp_path):
    v = random_collection(120, 45, seed=int.from_bytes(os.urandom(2), "little"))
    idx = InvertedIndex.build(v, block_size=32, metadata={"kind": "test", "n": 1})
    path = idx.save(tmp_path / "index")
    return idx, path


@pytest.mark.parametrize("mmap", [True, False])
def test_save_load_round_trip(saved, mmap):
    idx, path = saved
    back = InvertedIndex.load(path, mmap=mmap)
    assert_index_equal(idx, back)
    assert back.memory_bytes() == idx.memory_bytes() > 0
    meta = json.loads((path / "meta.json").read_text())
    assert meta["format"] == "lsr-index" and meta["padding"] == 32 and meta["block_size"] == 32
    assert meta["n_postings"] == idx.n_postings and meta["n_docs"] == 120
    assert sorted(meta["files"]) == sorted([f"{f}.npy" for f in FIELDS] + ["doc_indptr.npy", "doc_indices.npy",
                                                                           "doc_values.npy", "docnos.arrow"])
    assert not list(path.parent.glob("*.tmp-*"))
    t = int(torch.argmax(idx.lengths))
    assert all(torch.equal(a, b) for a, b in zip(idx.term_postings(t), back.term_postings(t)))


def test_save_refuses_overwrite_and_replaces_atomically(saved, monkeypatch):
    idx, path = saved
    with pytest.raises(FileExistsError):
        idx.save(path)
    other = InvertedIndex.build(random_collection(30, 45, seed=99), block_size=8)
    # a write that fails half-way leaves the old index intact and no temporary directory behind
    from lsr.index import inverted

    calls = {"n": 0}
    real_save = np.save

    def failing_save(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 4:
            raise OSError("disk full")
        return real_save(*a, **kw)

    monkeypatch.setattr(inverted.np, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        other.save(path, overwrite=True)
    monkeypatch.undo()
    assert_index_equal(idx, InvertedIndex.load(path))
    assert sorted(p.name for p in path.parent.iterdir()) == ["index"]
    other.save(path, overwrite=True)
    assert_index_equal(other, InvertedIndex.load(path))
    assert sorted(p.name for p in path.parent.iterdir()) == ["index"]


def test_save_never_overwrites_a_foreign_directory(tmp_path):
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "thesis.tex").write_text("x")
    idx = InvertedIndex.build(random_collection(10, 8, seed=1), block_size=4)
    with pytest.raises(ValueError, match="not an lsr index"):
        idx.save(tmp_path / "precious", overwrite=True)
    assert (tmp_path / "precious" / "thesis.tex").read_text() == "x"


def _flip_byte(f, from_end: int = 1) -> None:
    data = bytearray(f.read_bytes())
    data[-from_end] ^= 0xFF
    f.write_bytes(bytes(data))


@pytest.mark.parametrize("name", ["doc_ids.npy", "block_offsets.npy", "doc_values.npy", "docnos.arrow"])
def test_corrupt_file_is_named(saved, name):
    _, path = saved
    _flip_byte(path / name, from_end=3)
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        InvertedIndex.load(path)


@pytest.mark.parametrize("mmap", [True, False])
def test_truncated_file_without_verify_is_named(saved, mmap):
    _, path = saved
    f = path / "scores.npy"
    f.write_bytes(f.read_bytes()[:-10])
    with pytest.raises(ValueError, match=r"scores\.npy"):
        InvertedIndex.load(path, mmap=mmap, verify=False)


def test_missing_files_are_named(saved, tmp_path):
    _, path = saved
    (path / "lengths.npy").unlink()
    with pytest.raises(FileNotFoundError, match=r"lengths\.npy"):
        InvertedIndex.load(path)
    (path / "meta.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"meta\.json"):
        InvertedIndex.load(path)
    with pytest.raises(FileNotFoundError, match="no index directory"):
        InvertedIndex.load(tmp_path / "nowhere")


def _edit_meta(path, edit) -> None:
    meta = json.loads((path / "meta.json").read_text())
    edit(meta)
    (path / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("edit,match", [
    (lambda m: m.update(format="other"), "format"),
    (lambda m: m.update(version=99), "version"),
    (lambda m: m.pop("n_docs"), "n_docs"),
    (lambda m: m.update(n_docs=m["n_docs"] + 1), r"doc_indptr\.npy"),
    (lambda m: m.update(padding=16), "padding"),
    (lambda m: m["files"].pop("offsets.npy"), r"offsets\.npy"),
])
def test_bad_meta_is_reported(saved, edit, match):
    _, path = saved
    _edit_meta(path, edit)
    with pytest.raises(ValueError, match=match):
        InvertedIndex.load(path)


def test_invalid_json_and_wrong_dtype(saved):
    idx, path = saved
    meta_text = (path / "meta.json").read_text()
    (path / "meta.json").write_text(meta_text[: len(meta_text) // 2])
    with pytest.raises(ValueError, match=r"meta\.json"):
        InvertedIndex.load(path)
    (path / "meta.json").write_text(meta_text)
    # a well-formed file of the wrong dtype, with a matching checksum, is still rejected
    np.save(path / "offsets.npy", idx.offsets.numpy().astype(np.int32))
    from lsr.storage.shards import sha256_file

    _edit_meta(path, lambda m: m["files"]["offsets.npy"].update(sha256=sha256_file(path / "offsets.npy")))
    with pytest.raises(ValueError, match=r"offsets\.npy.*int32"):
        InvertedIndex.load(path)


def test_inconsistent_offsets_are_detected(saved):
    idx, path = saved
    bad = idx.offsets.numpy().copy()
    bad[1] += PAD
    np.save(path / "offsets.npy", bad)
    with pytest.raises(ValueError, match="offsets"):
        InvertedIndex.load(path, verify=False)


@pytest.mark.gpu
def test_cuda_build_is_bit_identical_to_cpu():
    v = random_collection(3000, 500, seed=21, density=0.05)
    cpu = InvertedIndex.build(v, block_size=256)
    gpu = InvertedIndex.build(v, device="cuda", block_size=256)
    assert gpu.device.type == "cuda"
    assert_index_equal(cpu, gpu)
    chunked = InvertedIndex.build(v, device="cuda", block_size=256, max_memory_bytes=50_000)
    assert_index_equal(cpu, chunked)
