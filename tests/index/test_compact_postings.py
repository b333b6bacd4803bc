"""Compact postings (lsr.index.compact): 4 bytes per posting, the same search bits as float32 postings.

Build (compact arrays decode to the float32 layout's), disk format (version 2, one-line errors for
edited or truncated files), the block scorers on compact postings (Triton kernel vs torch twin under
TRITON_INTERPRET=1, at small awkward shapes) and gpu_search / Searcher against lsr.testing's float64
reference. The ``gpu`` test here checks the searcher on CUDA (the CUDA kernel's compact variant against the
twin: tests/search/test_kernels_search.py::test_gpu_cuda_block_kernel_matches_twin).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

from lsr.index.compact import compact_weight_dtype, decode_postings
from lsr.index.inverted import InvertedIndex
from lsr.search.config import SearchConfig
from lsr.search.gpu_search import gpu_search
from lsr.search.kernels import block, topk
from lsr.search.kernels.fixed import query_scales
from lsr.search.spans import span_offsets
from lsr.sparse import SparseVectors
from lsr.testing import (
    assert_exact_topk,
    float64_scores,
    poisoned_allocations,
    random_dense_rows,
    rounded_weights,
    seeded_generator,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def bf16_rows(n: int, vocab: int, density: float, gen: torch.Generator, **kw) -> SparseVectors:
    return rounded_weights(random_dense_rows(n, vocab, density, gen, **kw)).to(DEV)


def both_layouts(docs: SparseVectors, bs: int) -> tuple[InvertedIndex, InvertedIndex]:
    return (InvertedIndex.build(docs, device=DEV, block_size=bs, postings="float32"),
            InvertedIndex.build(docs, device=DEV, block_size=bs, postings="compact"))


def csr_of(q: SparseVectors):
    return q.indptr, q.indices, q.values


@pytest.fixture
def gen() -> torch.Generator:
    return seeded_generator()


# --------------------------------------------------------------------------------------- build
@pytest.mark.parametrize("bs,budget", [(32, None), (64, 4096), (1 << 16, None)])
def test_compact_arrays_decode_to_the_float32_layout(gen, bs, budget):
    docs = bf16_rows(300, 40, 0.2, gen, empty_rows=4)
    plain = InvertedIndex.build(docs, device=DEV, block_size=bs, postings="float32")
    comp = InvertedIndex.build(docs, device=DEV, block_size=bs, postings="compact", max_memory_bytes=budget)
    assert comp.postings == "compact" and plain.postings == "float32"
    assert comp.doc_ids.dtype == torch.int16 and comp.scores.dtype == torch.bfloat16
    assert comp.doc_ids.element_size() + comp.scores.element_size() == 4
    for f in ("offsets", "lengths", "padded_lengths", "max_scores", "block_offsets"):
        assert torch.equal(getattr(comp, f), getattr(plain, f)), f
    d, w = decode_postings(comp.doc_ids, comp.scores, comp.block_offsets, bs)
    assert torch.equal(d, plain.doc_ids) and torch.equal(w, plain.scores)
    t = int(plain.lengths.argmax())
    assert all(torch.equal(a, b) for a, b in zip(comp.term_postings(t), plain.term_postings(t)))
    comp.check()
    comp.check_ids()


def test_weight_type_is_the_first_exact_one():
    assert compact_weight_dtype(torch.tensor([0.5, 3.0, 2.0 ** 100])) == torch.bfloat16
    assert compact_weight_dtype(torch.tensor([1.0 + 2 ** -10, 0.25])) == torch.float16   # 11 mantissa bits
    with pytest.raises(ValueError, match=r"weight 1\.000244\d* is not: use the float32 posting layout"):
        compact_weight_dtype(torch.tensor([0.5, 1.0 + 2 ** -12, 0.1]), chunk=2)
    assert compact_weight_dtype(torch.tensor([0.5, 3.0, 1.0 + 2 ** -10]), chunk=1) == torch.float16
    g = torch.Generator().manual_seed(0)
    docs = rounded_weights(random_dense_rows(50, 20, 0.3, g), torch.float16)
    if compact_weight_dtype(docs.values) == torch.float16:   # (a draw that happens to be bf16-exact is fine too)
        assert InvertedIndex.build(docs, block_size=32, postings="compact").scores.dtype == torch.float16


def test_compact_build_rejects_what_it_cannot_hold(gen):
    docs = random_dense_rows(40, 20, 0.3, gen)
    with pytest.raises(ValueError, match="exactly representable"):
        InvertedIndex.build(docs, block_size=32, postings="compact")
    for bs in (16, 1 << 17):
        with pytest.raises(ValueError, match="block_size between 32 and 65536"):
            InvertedIndex.build(rounded_weights(docs), block_size=bs, postings="compact")
    with pytest.raises(ValueError, match="postings must be one of"):
        InvertedIndex.build(docs, block_size=32, postings="int8")


def test_auto_layout_is_compact_where_it_holds_the_weights(gen):
    """The default ("auto"): compact for bf16 / fp16-exact weights and a block size it allows, float32 else."""
    exact, inexact = bf16_rows(60, 20, 0.3, gen), random_dense_rows(60, 20, 0.3, gen)
    assert InvertedIndex.build(exact, block_size=64).postings == "compact"
    assert InvertedIndex.build(exact, block_size=64, postings="auto").scores.dtype == torch.bfloat16
    fp16 = InvertedIndex.build(rounded_weights(inexact, torch.float16), block_size=64)
    assert fp16.postings == "compact" and fp16.scores.dtype == torch.float16   # bf16 cannot hold 11-bit mantissas
    assert InvertedIndex.build(inexact, block_size=64).postings == "float32"
    assert InvertedIndex.build(exact, block_size=1 << 17).postings == "float32"   # uint16 local ids cannot
    assert InvertedIndex.build(exact, block_size=64, postings="float32").postings == "float32"
    empty = SparseVectors.from_dense(torch.zeros(3, 20))
    assert InvertedIndex.build(empty, block_size=64).postings == "float32"


# --------------------------------------------------------------------------------------- disk
@pytest.fixture
def saved(tmp_path, gen):
    docs = bf16_rows(120, 30, 0.2, gen)
    index = InvertedIndex.build(docs, device="cpu", block_size=64, postings="compact")   # load() gives CPU tensors
    return index, index.save(tmp_path / "idx")


def _rewrite(path, name: str, edit) -> None:
    """Edit one .npy of a saved index and update its checksum (an edit that checksums cannot catch)."""
    f = path / name
    a = np.load(f)
    edit(a)
    np.save(f, a)
    meta = json.loads((path / "meta.json").read_text())
    meta["files"][name]["sha256"] = hashlib.sha256(f.read_bytes()).hexdigest()
    (path / "meta.json").write_text(json.dumps(meta))


def test_compact_index_roundtrips_with_version_2(saved, tmp_path):
    index, path = saved
    meta = json.loads((path / "meta.json").read_text())
    assert (meta["version"], meta["postings"], meta["weight_dtype"]) == (2, "compact", "bfloat16")
    for mmap in (True, False):
        back = InvertedIndex.load(path, mmap=mmap)
        assert back.postings == "compact"
        assert torch.equal(back.doc_ids, index.doc_ids) and torch.equal(back.scores, index.scores)
    plain = InvertedIndex.build(index.docs, device="cpu", block_size=64, postings="float32").save(tmp_path / "plain")
    assert json.loads((plain / "meta.json").read_text())["version"] == 1, "float32 indexes stay readable by old lsr"


@pytest.mark.parametrize("name,edit,message", [
    ("doc_ids.npy", lambda a: a.__setitem__(0, 100), "local doc ids reach 100"),
    ("scores.npy", lambda a: a.__setitem__(slice(None), 0), "non-zero posting weights"),
    ("scores.npy", lambda a: a.__setitem__(0, np.int16(-32640)), "finite and >= 0"),   # bf16 bits of -inf
])
def test_edited_compact_arrays_fail_on_load(saved, name, edit, message):
    _, path = saved
    _rewrite(path, name, edit)
    with pytest.raises(ValueError, match=message):
        InvertedIndex.load(path)


def test_truncated_or_mislabelled_compact_files_are_one_line_errors(saved):
    _, path = saved
    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**meta, "weight_dtype": "float8"}))
    with pytest.raises(ValueError, match="weight dtype 'float8' are not supported"):
        InvertedIndex.load(path)
    # int16 files under a float32 label
    (path / "meta.json").write_text(json.dumps({**meta, "postings": "float32", "weight_dtype": "float32"}))
    with pytest.raises(ValueError, match=r"doc_ids\.npy holds int16"):
        InvertedIndex.load(path, verify=False)
    (path / "meta.json").write_text(json.dumps(meta))
    f = path / "scores.npy"
    f.write_bytes(f.read_bytes()[:-10])
    with pytest.raises(ValueError, match=r"scores\.npy") as e:
        InvertedIndex.load(path, verify=False)
    assert "\n" not in str(e.value)


# --------------------------------------------------------------------------------------- kernels
@pytest.mark.parametrize("bs,span,group,rows,chunk,weights", [(32, 32, 1, 4, 32, torch.bfloat16),
                                                              (64, 32, 2, 2, 32, torch.bfloat16),
                                                              (128, 64, 4, 8, 64, torch.float16)])
@pytest.mark.slow
def test_block_kernel_on_compact_postings_matches_twin(gen, bs, span, group, rows, chunk, weights):
    # 150 docs: the last block is partial; bf16 cases: quantised weights (ties); fp16: not bf16-exact
    docs = rounded_weights(random_dense_rows(150, 28, 0.3, gen, quantized=weights == torch.bfloat16), weights)
    q = random_dense_rows(5, 28, 0.35, gen, quantized=True, empty_rows=1).to(DEV)
    plain, comp = both_layouts(docs.to(DEV), bs)
    assert comp.scores.dtype == weights
    off = span_offsets(comp, span)
    assert torch.equal(off, span_offsets(plain, span)), "the span table reads local ids like global ones"
    scale, inv = query_scales(*csr_of(q), comp.max_scores)
    spans = torch.arange(off.shape[1] - 1, device=DEV)
    kw = {"group": group, "rows": rows, "chunk": chunk, "readout": 32, "n_programs": 3}

    def run(scorer, index, width, **opt):
        items = block.span_items(5, spans, group, width)
        return scorer(index.doc_ids, index.scores, off, *csr_of(q), scale, inv, span, items,
                      5 * spans.numel() * width, **opt, **kw)

    with poisoned_allocations():
        maxima, _ = run(block.triton_block_candidates, comp, span // topk.ROW)
    assert torch.equal(maxima, run(block.torch_block_candidates, comp, span // topk.ROW)[0])
    assert torch.equal(maxima, run(block.torch_block_candidates, plain, span // topk.ROW)[0])
    theta = topk.kth_threshold(maxima.view(5, -1), 6)
    with poisoned_allocations():
        got = run(block.triton_block_candidates, comp, 4, theta=theta, cap=4)
    for want in (run(block.torch_block_candidates, comp, 4, theta=theta, cap=4),
                 run(block.torch_block_candidates, plain, 4, theta=theta, cap=4)):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert bool((got[1] > 0).any()), "the case emits something"


def test_coarse_twin_on_compact_postings(gen):
    docs = bf16_rows(300, 40, 0.2, gen)
    q = random_dense_rows(6, 40, 0.3, gen, empty_rows=1).to(DEV)
    plain, comp = both_layouts(docs, 128)
    off = span_offsets(comp, 64)
    scale, inv = query_scales(*csr_of(q), comp.max_scores)
    floor = torch.full((6,), 3, dtype=torch.int64, device=DEV)
    items = block.span_items(6, torch.arange(off.shape[1] - 1, device=DEV), 1, 64)
    size = 6 * (off.shape[1] - 1) * 64
    a = block.torch_block_candidates(comp.doc_ids, comp.scores, off, *csr_of(q), scale, inv, 64, items, size,
                                     cap=64, coarse_lo=floor)
    b = block.torch_block_candidates(plain.doc_ids, plain.scores, off, *csr_of(q), scale, inv, 64, items, size,
                                     cap=64, coarse_lo=floor)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and bool((a[0] >= 0).any())


# --------------------------------------------------------------------------------------- search
BLOCK = SearchConfig(route="block")
CONFIGS = [BLOCK.replace(triton={"span": 32, "group": 2, "rows": 4}),
           BLOCK.replace(triton={"span": 64, "rows": 2, "readout": 32}),
           BLOCK.replace(triton={"span": 256, "group": 4, "rows": 8, "chunk": 64},   # 256 > block: capped at it
                         pass1={"sample_every": 2})]


@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.slow
def test_compact_search_is_exact_and_identical_to_float32(gen, quantized):
    docs = bf16_rows(170, 40, 0.2, gen, quantized=quantized, empty_rows=3)
    q = random_dense_rows(5, 40, 0.25, gen, quantized=quantized, empty_rows=1).to(DEV)
    plain, comp = both_layouts(docs, 64)
    ref = float64_scores(q, docs)
    k = 25
    want = gpu_search(plain, q, k, SearchConfig(route="dense-scatter"))
    for cfg in [SearchConfig()] + CONFIGS:
        s, d = gpu_search(comp, q, k, cfg)
        assert_exact_topk(s, d, ref, k)
        assert torch.equal(s, want[0]) and torch.equal(d, want[1]), cfg
    again = gpu_search(comp, q, k, CONFIGS[0])
    assert torch.equal(again[0], want[0]) and torch.equal(again[1], want[1]), "bit-identical run to run"
    with pytest.raises(ValueError, match="reads float32 postings"):
        gpu_search(comp, q, k, SearchConfig(route="dense-scatter"))


def test_compact_search_k_beyond_matches_and_empty_queries(gen):
    docs = bf16_rows(90, 30, 0.05, gen)
    q = random_dense_rows(1, 30, 0.1, gen).to(DEV)
    _, comp = both_layouts(docs, 32)
    k = 120
    s, d = gpu_search(comp, q, k, BLOCK.replace(triton={"span": 32}))
    assert_exact_topk(s, d, float64_scores(q, docs), k)
    empty = SparseVectors([0, 0, 0], [], [], vocab_size=30, device=DEV)
    s, d = gpu_search(comp, empty, 5, BLOCK.replace(triton={"span": 32}))
    assert bool((d == -1).all()) and bool((s == 0).all())


@pytest.mark.slow
def test_compact_coarse_pass_matches_exact(gen):
    """The coarse pass 2 (CUDA in production; the twin here) on compact postings gives the exact bits."""
    docs = bf16_rows(600, 30, 0.2, gen)
    q = random_dense_rows(7, 30, 0.3, gen, empty_rows=1).to(DEV)
    plain, comp = both_layouts(docs, 128)
    cfg = BLOCK.replace(triton={"span": 64}, pass1={"sample_every": 2}, coarse={"sample_every": 2, "min_batch": 1},
                        graphs={"enabled": False})
    want = gpu_search(plain, q, 6, cfg)
    got = gpu_search(comp, q, 6, cfg.replace(scorer="torch", coarse={"span": 128}))   # the twin runs the coarse passes
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_searcher_on_a_saved_compact_index(saved):
    from lsr.search.searcher import Searcher
    index, path = saved
    q = random_dense_rows(4, 30, 0.3, seeded_generator(1)).to("cpu")
    ref = float64_scores(q, index.docs)
    back = InvertedIndex.load(path, device=DEV)   # the Triton backend: CUDA, or the interpreter on the CPU
    for backend in ("torch", "gpu"):
        s, d = Searcher(back, backend=backend).search(q, k=7)
        assert_exact_topk(s.cpu(), d.cpu(), ref, 7)


def test_cli_index_postings_option(tmp_path, capsys, gen):
    from lsr.cli import main
    from lsr.index.sharded import ShardedIndex
    from lsr.search.factory import open_searcher
    from lsr.storage.shards import write_vectors
    docs = bf16_rows(80, 25, 0.2, gen).to("cpu")
    write_vectors(tmp_path / "vec", docs)
    base = ["index", "--vectors", str(tmp_path / "vec"), "--device", "cpu", "--block-size", "64"]
    assert main(base + ["--out", str(tmp_path / "idx"), "--postings", "compact"]) == 0
    assert InvertedIndex.load(tmp_path / "idx").postings == "compact"
    assert main(base + ["--out", str(tmp_path / "auto")]) == 0   # the default: compact where exact
    assert InvertedIndex.load(tmp_path / "auto").postings == "compact"
    assert main(base + ["--out", str(tmp_path / "f32"), "--postings", "float32"]) == 0
    assert InvertedIndex.load(tmp_path / "f32").postings == "float32"
    assert main(base + ["--out", str(tmp_path / "parts"), "--postings", "compact", "--partitions", "2"]) == 0
    sharded = ShardedIndex.load(tmp_path / "parts", device=DEV)
    q = random_dense_rows(3, 25, 0.3, gen)
    s, d = open_searcher(sharded, backend="gpu").search(q, k=9)
    assert_exact_topk(s, d, float64_scores(q, docs), 9)
    write_vectors(tmp_path / "vec32", random_dense_rows(20, 25, 0.3, gen))
    capsys.readouterr()
    assert main(["index", "--vectors", str(tmp_path / "vec32"), "--out", str(tmp_path / "no"), "--device", "cpu",
                 "--postings", "compact"]) == 1
    err = capsys.readouterr().err.strip()
    assert "exactly representable" in err and "\n" not in err and not (tmp_path / "no").exists()


def test_in_memory_sharded_index_takes_the_posting_layout(gen):
    from lsr.index.sharded import ShardedIndex
    from lsr.search.factory import open_searcher
    docs = bf16_rows(90, 30, 0.2, gen).to("cpu")
    q = random_dense_rows(4, 30, 0.3, gen)
    sharded = ShardedIndex.from_vectors(docs, 3, device=DEV, block_size=64, postings="compact")
    assert {part.postings for part in sharded.partitions} == {"compact"}
    s, d = open_searcher(sharded, backend="gpu").search(q, k=11)
    assert_exact_topk(s, d, float64_scores(q, docs), 11)


def test_pipeline_config_takes_the_posting_layout():
    from pathlib import Path

    from lsr.config import load_config
    quickstart = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"
    assert load_config(quickstart, ["index.postings=compact"]).index.postings == "compact"
    assert load_config(quickstart).index.postings == "auto"
    with pytest.raises(ValueError, match="config.index.postings must be one of auto, float32, compact"):
        load_config(quickstart, ["index.postings=int8"])


# --------------------------------------------------------------------------------------- GPU only
@pytest.mark.gpu
@pytest.mark.parametrize("B,k,bs,weights", [(1, 10, 1 << 16, torch.bfloat16), (37, 100, 8192, torch.bfloat16),
                                             (64, 1000, 1 << 16, torch.bfloat16), (500, 1000, 8192, torch.bfloat16),
                                             (64, 1000, 8192, torch.float16), (500, 100, 1 << 16, torch.float16)])
def test_gpu_compact_search_matches_float64_and_float32_layout(B, k, bs, weights):
    from lsr.benchmarks.synth import synth_docs, synth_queries
    from lsr.search.plan import plan_search
    from lsr.search.searcher import Searcher
    docs = rounded_weights(synth_docs(60_000, device="cuda"), weights)
    q = synth_queries(B, device="cuda")
    plain, comp = both_layouts(docs, bs)
    assert comp.scores.dtype == weights
    assert plan_search(comp, q, k, BLOCK).scorer == "cuda", "the compact CUDA kernel compiles and serves"
    s, d = Searcher(comp).search(q, k=k)
    assert_exact_topk(s, d, float64_scores(q, docs), k)
    s2, d2 = Searcher(plain).search(q, k=k)
    assert torch.equal(s, s2) and torch.equal(d, d2)
    s3, d3 = Searcher(comp).search(q, k=k)
    assert torch.equal(s, s3) and torch.equal(d, d3)
