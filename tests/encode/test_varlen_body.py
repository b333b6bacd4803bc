"""Padding-free BERT / DistilBERT forward (lsr.encode.backbone.varlen_body) against Hugging Face's padded forward,
its attention twin against per-text sdpa, and the encoder's use of it (CPU: the sdpa twin; GPU: lsr's packed
attention kernel and flash attention)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from lsr.testing import save_tiny_mlm

transformers = pytest.importorskip("transformers")

from lsr.encode.backbone.varlen_body import (
    VarlenBody,
    _is_gelu,
    _Layer,
    _up_projection,
    pack_batch,
    torch_varlen_attention,
    varlen_attention,
)
from lsr.encode.splade import encoder as splade
from lsr.encode.tokenize.batching import PreparedTexts, TokenBatch
from lsr.testing import SAMPLE_TEXTS as TEXTS

HAS_CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def models(tmp_path_factory, data_dir) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tiny-varlen")
    return {k: str(save_tiny_mlm(k, root / k, data_dir)) for k in ("bert", "distilbert", "roberta")}


def packed_case(lengths: list[int], H: int = 2, Dh: int = 8, seed: int = 0, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    q, k, v = (torch.randn(T, H, Dh, generator=g).to(dtype).to(device) for _ in range(3))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    return q, k, v, cu


def test_attention_twin_matches_per_text_sdpa():
    lengths = [3, 1, 0, 7, 5]  # an empty text between others
    q, k, v, cu = packed_case(lengths)
    out = torch_varlen_attention(q, k, v, cu, max_len=9)  # max_len above the longest is allowed
    for b, (lo, hi) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        if hi == lo:
            continue
        want = F.scaled_dot_product_attention(*(t[lo:hi].transpose(0, 1)[None] for t in (q, k, v)))[0].transpose(0, 1)
        torch.testing.assert_close(out[lo:hi], want, rtol=1e-6, atol=1e-6)
    assert torch.equal(varlen_attention(q, k, v, cu, 9), out)  # CPU fp32: the twin
    assert torch_varlen_attention(q[:0], k[:0], v[:0], torch.zeros(1, dtype=torch.int32), 1).shape == (0, 2, 8)
    with pytest.raises(ValueError, match="'packed'"):
        varlen_attention(q, k, v, cu, 9, kernel="flsh")


def test_pack_batch():
    ids = torch.tensor([[5, 6, 7, 0], [8, 0, 0, 0], [0, 0, 0, 0], [1, 2, 3, 4]])
    p = pack_batch(ids, torch.tensor([3, 1, 0, 4], dtype=torch.int32), 8)
    assert p["ids"].tolist() == [5, 6, 7, 8, 1, 2, 3, 4]
    assert p["positions"].tolist() == [0, 1, 2, 0, 0, 1, 2, 3]
    assert p["segments"].tolist() == [0, 0, 0, 1, 3, 3, 3, 3] and p["segments"].dtype == torch.int32
    assert p["cu_seqlens"].tolist() == [0, 3, 4, 4, 8] and p["cu_seqlens"].dtype == torch.int32
    assert p["max_len"] == 4


@pytest.mark.parametrize("kind", ["bert", "distilbert"])
def test_body_matches_hf_at_real_positions(models, kind):
    model = transformers.AutoModelForMaskedLM.from_pretrained(models[kind], dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(models[kind])
    enc = tok(TEXTS, padding=True, truncation=True, max_length=64, return_tensors="pt")
    with torch.inference_mode():
        hidden = model.base_model(**enc).last_hidden_state
        want = (model.cls.predictions.transform(hidden) if kind == "bert"
                else model.vocab_layer_norm(model.activation(model.vocab_transform(hidden))))
        body = VarlenBody.from_model(model)
        lengths = enc["attention_mask"].sum(1)
        p = pack_batch(enc["input_ids"], lengths, int(lengths.sum()))
        got = body(p["ids"], p["positions"], p["cu_seqlens"], p["max_len"])
    real = enc["attention_mask"].bool()
    assert got.shape == (int(real.sum()), model.config.to_dict().get("hidden_size", 32))
    torch.testing.assert_close(got, want[real], rtol=1e-5, atol=1e-5)


def test_unsupported_architectures_and_weight_updates(models):
    roberta = transformers.AutoModelForMaskedLM.from_pretrained(models["roberta"], dtype=torch.float32).eval()
    assert VarlenBody.from_model(roberta) is None
    assert VarlenBody.from_model(torch.nn.Linear(2, 2)) is None
    model = transformers.AutoModelForMaskedLM.from_pretrained(models["bert"], dtype=torch.float32).eval()
    body = VarlenBody.from_model(model)
    ids = torch.tensor([[101, 2054, 2003, 102]])
    p = pack_batch(ids, torch.tensor([4]), 4)
    with torch.inference_mode():
        before = body(p["ids"], p["positions"], p["cu_seqlens"], 4)
    with torch.no_grad():  # an in-place change of a Q weight must reach the fused Q/K/V copy
        model.bert.encoder.layer[0].attention.self.query.weight.mul_(3.0)
    with torch.inference_mode():
        after = body(p["ids"], p["positions"], p["cu_seqlens"], 4)
        want = model.cls.predictions.transform(model.bert(input_ids=ids).last_hidden_state)[0]
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["bert", "distilbert"])
def test_encoder_varlen_matches_padded(models, kind):
    out = {}
    for varlen in (None, False, True):  # None on the CPU: HF's forward (no flash attention here)
        enc = splade.SpladeEncoder.from_pretrained(models[kind], device="cpu", backend="torch", batch_size=2,
                                                   varlen=varlen)
        out[varlen] = enc.encode_document(TEXTS, ids=[f"d{i}" for i in range(len(TEXTS))])
        assert enc.runs_packed("doc") is (varlen is True)  # the padding-free body runs the batches
        if varlen is True:  # prepare hands over packed tokens only; a padded batch takes the same route exactly
            prepared = enc.prepare(TEXTS, "doc")
            assert all(b._input_ids is None for b in prepared.batches)
            padded = PreparedTexts("doc", [TokenBatch(b.input_ids, b.attention_mask, b.rows, b.lengths, b.n_tokens)
                                           for b in prepared.batches], prepared.n, prepared.n_tokens, prepared.n_slots)
            assert all(b.tokens is None for b in padded.batches)
            torch.testing.assert_close(enc.encode_prepared(padded).to_dense(), enc.encode_prepared(prepared).to_dense(),
                                       rtol=0, atol=0)
    assert out[True].nnz > 0 and out[True].ids == out[False].ids
    torch.testing.assert_close(out[True].to_dense(), out[False].to_dense(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[None].to_dense(), out[False].to_dense(), rtol=0, atol=0)


def test_gelu_epilogue_covers_gelu_layers_only(models):
    from transformers.activations import ACT2FN

    for name in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
        assert _is_gelu(ACT2FN[name]), name
    for act in (ACT2FN["relu"], ACT2FN["quick_gelu"], ACT2FN["silu"], torch.relu):
        assert not _is_gelu(act), act
    assert _is_gelu(torch.nn.GELU()) and _is_gelu(torch.nn.GELU(approximate="tanh")) and _is_gelu(F.gelu)

    class GELU(torch.nn.Module):   # a GELU by name only
        def forward(self, x):
            return x

    class Scaled(torch.nn.GELU):   # a subclass may change forward
        def forward(self, x):
            return 2 * super().forward(x)

    hooked = torch.nn.GELU()
    hooked.register_forward_hook(lambda m, i, o: o * 0)
    assert not _is_gelu(GELU()) and not _is_gelu(Scaled()) and not _is_gelu(hooked)
    enc = splade.SpladeEncoder.from_pretrained(models["bert"], device="cpu", gelu_epilogue=False)
    assert enc._towers["doc"].varlen.gelu_epilogue is False
    enc = splade.SpladeEncoder.from_pretrained(models["bert"], device="cpu")
    body = enc._towers["doc"].varlen
    assert body.gelu_epilogue is True and all(layer.gelu for layer in body.layers)
    x = torch.randn(5, body.layers[0].up.in_features)
    with torch.inference_mode():  # off CUDA the model's own activation runs, fused or not
        layer = body.layers[0]
        assert torch.equal(_up_projection(layer, x, True), layer.act(F.linear(x, layer.up.weight, layer.up.bias)))


# ---------------------------------------------------------------- GPU only: the packed kernel and flash attention, bf16
@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["packed", "flash"])
def test_gpu_attention_kernels_match_twin(kernel):
    lengths = [1, 77, 0, 128, 33, 256, 5]
    q, k, v, cu = packed_case(lengths, H=12, Dh=64, seed=3, dtype=torch.bfloat16, device="cuda")
    with torch.inference_mode():
        out = varlen_attention(q, k, v, cu, 256, kernel=kernel)
        twin = torch_varlen_attention(q.float(), k.float(), v.float(), cu, 256)
        again = varlen_attention(q, k, v, cu, 256, kernel=kernel)
    assert torch.equal(out, again)
    assert (out.float() - twin).abs().max().item() < 2e-2


@pytest.mark.gpu
def test_gpu_encoder_varlen_error_within_padded_bf16(tmp_path, data_dir):
    """bf16 on the GPU: the padding-free encoder's error against an fp32 HF reference is at most twice
    the padded HF bf16 path's (the kernels' accuracy rule), and reruns are bit-identical."""
    from lsr.testing import calibrate_sparsity

    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                  intermediate_size=1024)
    model = transformers.BertForMaskedLM(cfg).eval()
    tok = transformers.AutoTokenizer.from_pretrained(data_dir / "bert-base-uncased")
    texts = [t for t in TEXTS if t] * 40 + ["a " * n for n in range(1, 200, 7)]
    calibrate_sparsity(model, tok, texts[:8])
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    runs = {}
    for name, dt, varlen in (("ref", torch.float32, False), ("hf", torch.bfloat16, False), ("varlen", torch.bfloat16, True)):
        enc = splade.SpladeEncoder.from_pretrained(tmp_path / "m", device="cuda", dtype=dt, varlen=varlen, batch_size=64)
        runs[name] = enc.encode_document(texts).to_dense().double()
        if name == "varlen":
            assert torch.equal(enc.encode_document(texts).to_dense().double(), runs[name])
    err = (runs["varlen"] - runs["ref"]).abs().max().item()
    hf_err = (runs["hf"] - runs["ref"]).abs().max().item()
    assert (runs["ref"] > 0).sum() > len(texts) and err <= 2 * hf_err + 1e-6, (err, hf_err)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.skipif(os.environ.get("DISABLE_ADDMM_CUDA_LT") == "1", reason="cuBLASLt disabled: no fused epilogue")
def test_gpu_gelu_epilogue_within_the_separate_calls_error(dtype):
    """The fused up-projection + GELU (one cuBLASLt GEMM, GELU in fp32 before rounding) against an fp32 erf-GELU
    reference: its mean error is at most 1.25x that of F.linear + the model's erf GELU in the same dtype (bf16:
    measured lower; fp16: 1.14x higher, its approximation of erf shows above fp16's finer rounding), max error no larger."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(4096, 768, device="cuda", generator=g).to(dtype)
    up = torch.nn.Linear(768, 3072, device="cuda", dtype=dtype)
    with torch.no_grad():
        up.weight.copy_(torch.randn(3072, 768, device="cuda", generator=g) * 0.04)
        up.bias.copy_(torch.randn(3072, device="cuda", generator=g) * 0.1)
    layer = _Layer(*([None] * 5), up, transformers.activations.ACT2FN["gelu"], None, None)
    with torch.inference_mode():
        ref = F.gelu(torch.addmm(up.bias.float(), x.float(), up.weight.float().t()))
        fused, separate = _up_projection(layer, x, True), _up_projection(layer, x, False)
    assert not torch.equal(fused, separate)   # the epilogue ran (the separate path would equal it)
    err_f, err_s = (fused.float() - ref).abs(), (separate.float() - ref).abs()
    assert err_f.mean() <= 1.25 * err_s.mean() and err_f.max() <= err_s.max() * 1.01, (err_f.mean(), err_s.mean())


@pytest.mark.gpu
def test_gpu_encoder_gelu_epilogue_on_and_off(tmp_path, data_dir, monkeypatch):
    """The encoder takes the fused GEMM for every BERT layer when on (bf16 CUDA), never when off."""
    calls = []
    real = torch._addmm_activation  # a spy on torch's fused GEMM + GELU: whether lsr calls it is the behaviour
    monkeypatch.setattr(torch, "_addmm_activation", lambda *a, **k: calls.append(1) or real(*a, **k))
    path = save_tiny_mlm("bert", tmp_path / "m", data_dir)
    for on in (True, False):
        calls.clear()
        enc = splade.SpladeEncoder.from_pretrained(path, device="cuda", dtype=torch.bfloat16, gelu_epilogue=on)
        out = enc.encode_document(TEXTS)
        layers = len(enc._towers["doc"].varlen.layers)
        assert out.nnz > 0 and len(calls) == (layers * len(enc.prepare(TEXTS, "doc").batches) if on else 0)
