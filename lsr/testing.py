"""Shared helpers for lsr's tests and benchmarks: the float64 reference, the tie-aware exactness check,
seeded random collections, poisoned allocations for kernel tests, and tiny masked-LM checkpoints.

Pytest-independent, so benchmark scripts use the same references and models as the tests. Nothing
heavy is imported at module level: transformers and tokenizers load only when a tiny model is built.

- ``float64_scores`` / ``reference_topk``: brute-force inner products and top-k, ties by doc index.
- ``topk_violations`` / ``assert_exact_topk``: the search contract, tolerant only of float rounding among near-ties
  (like faiss's ``check_ref_knn_with_draws``).
- ``seeded_generator``, ``random_collection``, ``random_dense_rows``: reproducible data; the seed is
  printed, so pytest shows it with a failure.
- ``poisoned_allocations``: ``torch.empty`` / ``empty_like`` return NaN / junk, so an output element a
  kernel forgot to write cannot pass.
- ``sparton_case``, ``max_abs_errors``: inputs and error measure of the Sparton head tests.
- ``save_tiny_mlm`` (+ ``tiny_config``, ``calibrate_sparsity``, ``KINDS``): 2-layer BERT / DistilBERT /
  RoBERTa / ModernBERT masked LMs saved with ``save_pretrained``, sparse like trained SPLADE models.
- ``save_tiny_colbert``: a 2-layer BERT + linear projection in the PyLate or colbert-ir checkpoint layout.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lsr.sparse import SparseVectors

__all__ = [
    "free_port", "rounded_weights",
    "KINDS", "SAMPLE_TEXTS", "assert_exact_topk", "calibrate_sparsity", "float64_scores", "max_abs_errors",
    "poisoned_allocations", "random_collection", "random_dense_rows", "reference_topk", "save_tiny_colbert",
    "save_tiny_mlm", "seeded_generator", "sparton_case", "tiny_config", "topk_violations", "write_scifact_slice",
]

KINDS = ("bert", "distilbert", "roberta", "modernbert")
SAMPLE_TEXTS = [
    ("Alterations of the architecture of cerebral white matter in the developing human brain can affect "
     "cortical development and result in functional disabilities."),
    "what is the capital of france",
    "",
    "Cells!",
    "A line scan diffusion-weighted magnetic resonance imaging (MRI) sequence with diffusion tensor analysis.",
]
_CALIBRATION_TEXTS = [
    "Alterations of the architecture of cerebral white matter in the developing human brain.",
    "what is the capital of france",
    "The quick brown fox jumps over the lazy dog while the cat sleeps.",
    "Vitamin D deficiency is associated with an increased risk of infection in adults.",
]


# ----------------------------------------------------------------------------------- references
def float64_scores(queries: SparseVectors, docs: SparseVectors) -> torch.Tensor:
    """[B, N] float64 inner products of every query with every document, on the documents' device."""
    dt = docs.to_torch_sparse().to(torch.float64)
    q = queries.to(docs.indptr.device).to_dense(torch.float64)
    return torch.sparse.mm(dt, q.T.contiguous()).T


def reference_topk(queries: SparseVectors, docs: SparseVectors, k: int) -> tuple[np.ndarray, np.ndarray]:
    """float64 brute-force top-k: scores [B, k] and doc indices [B, k], ordered by (-score, doc index);
    only documents scoring > 0 count, the rest is padded with 0.0 / -1."""
    full = float64_scores(queries, docs).cpu().numpy()
    out_s = np.zeros((len(queries), k))
    out_i = np.full((len(queries), k), -1, dtype=np.int64)
    for b, row in enumerate(full):
        hits = np.nonzero(row > 0)[0]
        hits = hits[np.lexsort((hits, -row[hits]))][:k]
        out_s[b, : hits.size] = row[hits]
        out_i[b, : hits.size] = hits
    return out_s, out_i


def topk_violations(scores: torch.Tensor, idx: torch.Tensor, ref: torch.Tensor, k: int,
                    rtol: float = 1e-6) -> list[str]:
    """What breaks the search contract in one query's top-k (empty when exact): ``scores`` / ``idx``
    [k] against ``ref`` [N], its float64 scores of every document. The contract: scores equal the
    float64 inner products within ``rtol``, descending, exact ties by ascending doc index, every doc
    clearly above the k-th score returned, the lowest doc ids among those tied with it, and -1 / 0.0 padding
    when fewer than k documents score > 0."""
    s, d, r = scores.double().cpu(), idx.cpu(), ref.double().cpu()
    m = min(k, int((r > 0).sum()))
    if not (bool((d[m:] == -1).all()) and bool((s[m:] == 0).all())):
        return ["padding"]
    d, s = d[:m], s[:m]
    if not (bool((d >= 0).all()) and d.unique().numel() == m):
        return ["missing or repeated documents"]
    bad = []
    if not torch.allclose(s, r[d], rtol=rtol, atol=0):
        bad.append("scores differ from the float64 inner products")
    if not bool((s[1:] <= s[:-1]).all()):
        bad.append("not descending")
    rd = r[d]
    same = rd[1:] == rd[:-1]  # exact float64 ties (near-ties may follow the exact scores' order)
    if not bool((d[1:][same] > d[:-1][same]).all()):
        bad.append("ties not by ascending doc index")
    if m:
        kth = float(s[-1])
        if not bool(torch.isin(torch.nonzero(r > kth * (1 + rtol)).flatten(), d).all()):
            bad.append("a doc clearly above the k-th score is missing")
        tied = torch.nonzero(r == rd[-1]).flatten()
        n_tied_in = int(torch.isin(d, tied).sum())
        if not bool(torch.equal(d[torch.isin(d, tied)], tied[:n_tied_in])):
            bad.append("not the lowest doc ids among ties with the k-th score")
    return bad


def assert_exact_topk(scores: torch.Tensor, idx: torch.Tensor, ref: torch.Tensor, k: int,
                      rtol: float = 1e-6) -> None:
    """Assert ``topk_violations`` is empty for every query of [B, k] results against ``ref`` =
    ``float64_scores(...)`` [B, N]; the message names the query and what broke."""
    assert scores.shape == idx.shape == (ref.shape[0], k)
    assert scores.dtype == torch.float32 and idx.dtype == torch.int64
    for b, (s, d, r) in enumerate(zip(scores, idx, ref)):
        bad = topk_violations(s, d, r, k, rtol)
        assert not bad, f"query {b}: {'; '.join(bad)}"


# ----------------------------------------------------------------------------------- random data
def seeded_generator(seed: int | None = None) -> torch.Generator:
    """A CPU generator; a fresh random seed when ``seed`` is None. The seed is printed so that pytest
    shows it with a failure and the case can be replayed."""
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
    print(f"lsr.testing seed={seed}")
    return torch.Generator().manual_seed(seed)


def random_collection(n: int, vocab: int, seed: int, density: float = 0.1, quantized: bool = False,
                      device: str = "cpu") -> SparseVectors:
    """Random documents with awkward features: a skewed term distribution, ~10% empty documents,
    unused terms, and term ``vocab - 1`` always in use.

    ``quantized`` draws weights from multiples of 1/8: many exact score ties, and float32 sums stay exact.
    """
    g = torch.Generator().manual_seed(seed)
    nnz_target = max(1, int(n * vocab * density))
    rows = torch.randint(0, max(n, 1), (nnz_target,), generator=g)
    cols = (torch.rand(nnz_target, generator=g) ** 3 * vocab).long().clamp_(max=vocab - 1)
    if n:
        rows = torch.cat([rows, torch.randint(0, n, (3,), generator=g)])
        cols = torch.cat([cols, torch.full((3,), vocab - 1)])
        empty = torch.randperm(n, generator=g)[: max(1, n // 10)]
        keep = ~torch.isin(rows, empty)
        rows, cols = rows[keep], cols[keep]
    else:
        rows, cols = rows[:0], cols[:0]
    if quantized:
        vals = torch.randint(1, 17, (rows.numel(),), generator=g).float() / 8
    else:
        vals = torch.rand(rows.numel(), generator=g) + 1e-3
    ids = [f"doc-{seed}-{i}" for i in range(n)]
    return SparseVectors.from_coo(rows, cols, vals, n, ids, vocab, reduce="max", device=device)


def random_dense_rows(n: int, vocab: int, density: float, gen: torch.Generator, quantized: bool = False,
                      empty_rows: int = 0, device: str = "cpu") -> SparseVectors:
    """Random rows drawn densely (small vocabularies): the density varies per row; quantized weights
    (multiples of 1/4) make ties, otherwise log-normal-like SPLADE weights."""
    mask = torch.rand(n, vocab, generator=gen) < density * 2 * torch.rand(n, 1, generator=gen)
    if quantized:
        w = torch.randint(1, 9, (n, vocab), generator=gen).float() / 4
    else:
        w = torch.exp(torch.randn(n, vocab, generator=gen)).log1p() + 0.01
    dense = torch.where(mask, w, torch.zeros(()))
    if empty_rows:
        dense[torch.randperm(n, generator=gen)[:empty_rows]] = 0
    return SparseVectors.from_dense(dense).to(device)


def rounded_weights(vectors: SparseVectors, dtype: torch.dtype = torch.bfloat16) -> SparseVectors:
    """The vectors with weights rounded to ``dtype`` (what an encoder running in it stores; weights
    that would round to 0 become its smallest normal): a collection the compact posting layout holds."""
    w = vectors.values.to(dtype).to(torch.float32)
    w = torch.where(w > 0, w, torch.full_like(w, torch.finfo(dtype).tiny))
    return SparseVectors(vectors.indptr, vectors.indices, w, vectors.ids, vectors.vocab_size, validate=False)


@contextlib.contextmanager
def poisoned_allocations() -> Iterator[None]:
    """Within the block ``torch.empty`` / ``torch.empty_like`` return NaN-filled floats and
    max-value integers (bools untouched), so an element a launcher allocates and a kernel forgets to
    write shows up in the result."""
    empty, empty_like = torch.empty, torch.empty_like

    def fill(t: torch.Tensor) -> torch.Tensor:
        if t.dtype == torch.bool:
            return t
        return t.fill_(float("nan")) if t.is_floating_point() else t.fill_(torch.iinfo(t.dtype).max)

    torch.empty = lambda *a, **k: fill(empty(*a, **k))
    torch.empty_like = lambda *a, **k: fill(empty_like(*a, **k))
    try:
        yield
    finally:
        torch.empty, torch.empty_like = empty, empty_like


# ----------------------------------------------------------------------------------- Sparton head
def sparton_case(B: int, S: int, V: int, D: int, dtype: torch.dtype, bias: bool, mask_kind: str, seed: int,
                 noncontig: bool = False, device: str = "cpu"):
    """Inputs of the Sparton head: hidden [B, S, D], weight [V, D], bias [V] or None, mask [B, S].

    ``mask_kind``: "full"; "padded" (random right padding, row 0 fully masked when B > 1); "holes"
    (padding plus random holes, as an int64 HF-style attention mask). ``noncontig`` gives the same
    values in strided storage."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, S, D, generator=g)
    weight = torch.randn(V, D, generator=g) * D ** -0.5
    b = torch.randn(V, generator=g) * 0.5 if bias else None
    if mask_kind == "full":
        mask = torch.ones(B, S, dtype=torch.bool)
    else:
        lengths = torch.randint(1, S + 1, (B,), generator=g)
        mask = torch.arange(S)[None, :] < lengths[:, None]
        if B > 1:
            mask[0] = False
        if mask_kind == "holes":
            mask &= torch.rand(B, S, generator=g) > 0.3
            mask = mask.to(torch.int64)
    hidden, weight = hidden.to(dtype).to(device), weight.to(dtype).to(device)
    if noncontig:
        hidden = hidden.transpose(0, 1).contiguous().transpose(0, 1)
        weight = torch.cat([weight, weight[:, :3]], dim=1)[:, :D]
        assert not hidden.is_contiguous() and not weight.is_contiguous()
    return hidden, weight, (b.to(device) if b is not None else None), mask.to(device)


def max_abs_errors(got: Sequence[torch.Tensor | None], ref: Sequence[torch.Tensor]) -> list[float]:
    """Max |got - ref| per pair, in float64 (0.0 where ``got`` is None)."""
    return [(g.double() - r).abs().max().item() if g is not None else 0.0 for g, r in zip(got, ref, strict=False)]


# ----------------------------------------------------------------------------------- tiny models
def _scifact_texts(data_dir: Path, n: int) -> list[str]:
    with open(data_dir / "scifact" / "corpus.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line, _ in zip(f, range(n))]


def _bpe_tokenizer(data_dir: Path):  # -> a transformers tokenizer
    """A byte-level BPE tokenizer (vocab 500, pad id 1, ``<s> … </s>``) trained on SciFact abstracts,
    so that RoBERTa's tokenizer conventions are exercised without downloading one."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_scifact_texts(data_dir, 200), trainer)
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    cls = getattr(transformers, "RobertaTokenizerFast", None) or transformers.RobertaTokenizer
    return cls(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
               unk_token="<unk>", pad_token="<pad>", mask_token="<mask>", model_max_length=512)


def tiny_config(kind: str, vocab_size: int = 30522):
    """A 2-layer, 32-wide transformers config of the given family (RoBERTa: the 500-token BPE vocabulary)."""
    import transformers as tf

    small = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
    if kind == "bert":
        return tf.BertConfig(vocab_size=vocab_size, **small)
    if kind == "distilbert":
        return tf.DistilBertConfig(vocab_size=vocab_size, dim=32, n_layers=2, n_heads=2, hidden_dim=64)
    if kind == "roberta":
        return tf.RobertaConfig(vocab_size=500, max_position_embeddings=514, pad_token_id=1, bos_token_id=0,
                                eos_token_id=2, **small)
    if kind == "modernbert":
        return tf.ModernBertConfig(vocab_size=vocab_size, pad_token_id=0, bos_token_id=101, eos_token_id=102,
                                   cls_token_id=101, sep_token_id=102, **small)
    raise ValueError(f"unknown kind {kind!r}; expected one of {KINDS}")


@torch.no_grad()
def calibrate_sparsity(model, tokenizer, texts: Sequence[str], target_nnz: int = 150) -> float:
    """Shift the decoder bias so that max-pooled logits of ``texts`` have about ``target_nnz`` positive
    entries per text (the median text hits it exactly), as a trained SPLADE model activates ~100-200
    terms per passage where a random one activates half the vocabulary. Returns the shift applied."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    enc = tokenizer(list(texts), padding=True, truncation=True, max_length=256, return_tensors="pt").to(device)
    logits = model(**enc).logits.float()
    logits = logits.masked_fill(~enc["attention_mask"].bool()[..., None], -float("inf"))
    pooled = logits.amax(1)
    k = min(target_nnz, pooled.shape[1])
    shift = float(torch.topk(pooled, k, dim=1).values[:, -1].median())
    model.get_output_embeddings().bias -= shift  # in place: tied copies (BERT's cls.predictions.bias) follow
    model.train(was_training)
    return shift


def save_tiny_mlm(kind: str, out_dir: str | Path, data_dir: str | Path, *, seed: int = 0,
                  target_nnz: int = 150) -> Path:
    """Create a tiny random masked LM of ``kind`` (see KINDS) + tokenizer in ``out_dir``; returns it.

    ``data_dir`` is the repository's data/ folder (bert-base-uncased tokenizer, SciFact)."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    data_dir, out = Path(data_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = _bpe_tokenizer(data_dir) if kind == "roberta" else AutoTokenizer.from_pretrained(data_dir / "bert-base-uncased")
    torch.manual_seed(seed)
    model = AutoModelForMaskedLM.from_config(tiny_config(kind))
    calibrate_sparsity(model, tok, _CALIBRATION_TEXTS + _scifact_texts(data_dir, 4), target_nnz)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def write_scifact_slice(folder: str | Path, data_dir: str | Path, n_queries: int = 6,
                        n_other: int = 40) -> tuple[int, int]:
    """A BEIR folder with SciFact's first test queries, their relevant abstracts and ``n_other`` more
    (a job small enough for a CPU test); returns (n_docs, n_queries)."""
    folder, scifact = Path(folder), Path(data_dir) / "scifact"
    rows = (scifact / "qrels" / "test.tsv").read_text().splitlines()[1:]
    qids = list(dict.fromkeys(r.split("\t")[0] for r in rows))[:n_queries]
    qrels = [r for r in rows if r.split("\t")[0] in qids]
    wanted = {r.split("\t")[1] for r in qrels}
    docs = [ln for ln in (scifact / "corpus.jsonl").read_text().splitlines()
            if json.loads(ln)["_id"] in wanted or (n_other := n_other - 1) >= 0]
    queries = [ln for ln in (scifact / "queries.jsonl").read_text().splitlines() if json.loads(ln)["_id"] in qids]
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("\n".join(docs) + "\n")
    (folder / "queries.jsonl").write_text("\n".join(queries) + "\n")
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(qrels) + "\n")
    return len(docs), len(qids)


def save_tiny_colbert(out_dir: str | Path, data_dir: str | Path, *, layout: str = "pylate", dim: int = 16,
                      seed: int = 0, query_length: int = 12, document_length: int = 40) -> Path:
    """A tiny random ColBERT (2-layer BERT, projection to ``dim``, bert-base-uncased tokenizer with its
    [unused0] / [unused1] markers) saved in ``out_dir``; returns it. ``layout``: "pylate" (modules.json =
    [Transformer, Dense] + config_sentence_transformers.json) or "colbert" (colbert-ir HF_ColBERT: ``bert.*`` +
    ``linear.weight`` in one model.safetensors, settings in artifact.metadata). The same seed gives the same
    weights in both layouts."""
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, BertModel

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    body = BertModel(tiny_config("bert"), add_pooling_layer=False)
    linear = torch.randn(dim, body.config.hidden_size) * body.config.hidden_size ** -0.5
    AutoTokenizer.from_pretrained(Path(data_dir) / "bert-base-uncased").save_pretrained(out)
    if layout == "pylate":
        body.save_pretrained(out)
        (out / "1_Dense").mkdir(exist_ok=True)
        save_file({"linear.weight": linear.contiguous()}, str(out / "1_Dense" / "model.safetensors"))
        (out / "1_Dense" / "config.json").write_text(json.dumps({
            "in_features": body.config.hidden_size, "out_features": dim, "bias": False,
            "activation_function": "torch.nn.modules.linear.Identity"}))
        (out / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"}]))
        (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": document_length - 1}))
        (out / "config_sentence_transformers.json").write_text(json.dumps({
            "query_prefix": "[unused0]", "document_prefix": "[unused1]", "query_length": query_length,
            "document_length": document_length, "attend_to_expansion_tokens": False, "do_query_expansion": True,
            "skiplist_words": list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")}))
    elif layout == "colbert":
        body.config.architectures = ["HF_ColBERT"]
        body.config.save_pretrained(out)
        state = {f"bert.{k}": v.contiguous() for k, v in body.state_dict().items()}
        save_file(state | {"linear.weight": linear.contiguous()}, str(out / "model.safetensors"))
        (out / "artifact.metadata").write_text(json.dumps({
            "query_token_id": "[unused0]", "doc_token_id": "[unused1]", "query_maxlen": query_length,
            "doc_maxlen": document_length, "mask_punctuation": True, "attend_to_mask_tokens": False, "dim": dim}))
    else:
        raise ValueError(f"unknown layout {layout!r}; expected 'pylate' or 'colbert'")
    return out


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (for a test's process group or server)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join_or_kill(ctx: Any, timeout_s: float) -> bool:
    """Wait for the processes of ``torch.multiprocessing.spawn(..., join=False)``; past ``timeout_s`` kill them
    and return False (a hang), else True (a failing rank raises from ``ctx.join``)."""
    import time

    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            return False
    return True
