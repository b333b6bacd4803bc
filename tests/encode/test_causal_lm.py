"""Decoder-LLM backbones (lsr.encode.splade.causal) on tiny random Qwen3- and Llama-style checkpoints saved with
save_pretrained and loaded by path: equality with the plain AutoModelForCausalLM computation, padding, the
special-token mask, bidirectional attention, the printed plan, training, and the head at real LLM vocabularies."""

from __future__ import annotations

import json
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")

from lsr.encode.sparton import sparton_head, torch_sparton_head
from lsr.encode.splade.causal import CausalLMTower
from lsr.encode.splade.encoder import SpladeEncoder
from lsr.search.searcher import check_compatible
from lsr.testing import SAMPLE_TEXTS as TEXTS
from lsr.testing import write_scifact_slice
from lsr.testing_llm import DECODER_KINDS, save_tiny_decoder

MORE = [" ".join(["the white matter of the developing brain"] * 6), "diffusion tensor", "cells in culture"]


@pytest.fixture(scope="module")
def decoders(tmp_path_factory, data_dir) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tiny-decoders")
    return {k: str(save_tiny_decoder(k, root / k, data_dir)) for k in DECODER_KINDS}


def load(path: str, **kw) -> SpladeEncoder:
    return SpladeEncoder.from_pretrained(path, device="cpu", backend="torch", **kw)


def causal_reference(path: str, texts: list[str], max_length: int, mask_special: bool) -> torch.Tensor:
    """The plain computation: AutoModelForCausalLM logits -> log1p(relu) -> max over attended tokens, fp32."""
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "right"
    enc = tok(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits
    y = (torch.log1p(torch.relu(logits)) * enc["attention_mask"][..., None]).amax(1)
    if mask_special:  # special tokens (the named ones and added ones flagged special), rows the tokenizer lacks
        y[:, special_ids(tok)] = 0
        y[:, len(tok):] = 0
    return y


def special_ids(tok) -> list[int]:
    return sorted(set(tok.all_special_ids) | {i for i, t in tok.added_tokens_decoder.items() if t.special})


@pytest.mark.parametrize("kind", DECODER_KINDS)
@pytest.mark.parametrize("mask_special", [True, False])
def test_matches_causal_lm_logits(decoders, kind, mask_special):
    enc = load(decoders[kind], batch_size=3, mask_special_tokens=mask_special)
    assert isinstance(enc.tower("doc"), CausalLMTower) and enc.tower("doc").attention == "causal"
    vec = enc.encode_document(TEXTS + MORE)
    vec.validate()
    ref = causal_reference(decoders[kind], TEXTS + MORE, enc.max_length_doc, mask_special)
    assert ref.shape == (len(TEXTS + MORE), enc.vocab_size) and (ref > 0).sum(1)[1] > 10  # not vacuous
    torch.testing.assert_close(vec.to_dense(), ref, atol=1e-5, rtol=1e-4)
    dense = vec.to_dense()
    tok = enc.tower("doc").tokenizer
    special = dense[:, special_ids(tok)].abs().sum() + dense[:, len(tok):].abs().sum()
    assert (special == 0) == mask_special and len(special_ids(tok)) == 3


def test_vocabulary_padding_and_pad_token(decoders):
    qwen, llama = load(decoders["qwen3"]), load(decoders["llama"])
    q_tok, l_tok = qwen.tower("doc").tokenizer, llama.tower("doc").tokenizer
    assert qwen.vocab_size == len(q_tok) + 140 and qwen.vocab[-1] == f"[id{qwen.vocab_size - 1}]"
    assert qwen.tower("doc").pad_id == q_tok.pad_token_id
    assert l_tok.pad_token_id is None and llama.tower("doc").pad_id == l_tok.eos_token_id  # Llama: eos pads


@pytest.mark.parametrize("kind", DECODER_KINDS)
@pytest.mark.parametrize("attention", ["causal", "bidirectional"])
def test_a_text_alone_equals_it_in_a_padded_batch(decoders, kind, attention):
    enc = load(decoders[kind], attention=attention, batch_size=16)
    texts = MORE + [t for t in TEXTS if t]
    batch = enc.encode_document(texts).to_dense()
    alone = torch.cat([enc.encode_document([t]).to_dense() for t in texts])
    assert len({len(enc.tokenize([t])[0]) for t in texts}) > 3  # the batch really pads
    torch.testing.assert_close(batch, alone, atol=1e-5, rtol=1e-5)


def bidirectional_reference(path: str, texts: list[str]) -> torch.Tensor:
    """Hand-built additive mask (every unpadded key, no causal part) through the decoder body, then the LM head."""
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    enc = tok(texts, padding=True, return_tensors="pt")
    width = enc["input_ids"].shape[1]
    keys = enc["attention_mask"].bool()[:, None, None, :].expand(-1, 1, width, -1)
    additive = torch.zeros(keys.shape).masked_fill(~keys, torch.finfo(torch.float32).min)
    with torch.no_grad():
        states = model.model(input_ids=enc["input_ids"], attention_mask=additive, is_causal=False).last_hidden_state
        logits = model.lm_head(states)
    return (torch.log1p(torch.relu(logits)) * enc["attention_mask"][..., None]).amax(1)


def test_bidirectional_attention_matches_a_hand_built_mask_and_is_saved(decoders, tmp_path):
    path = decoders["qwen3"]
    bi, causal = load(path, attention="bidirectional", mask_special_tokens=False), load(path)
    texts = MORE + ["cells"]
    got = bi.encode_document(texts).to_dense()
    torch.testing.assert_close(got, bidirectional_reference(path, texts), atol=1e-5, rtol=1e-4)
    assert (got - causal.encode_document(texts).to_dense()).abs().max() > 1e-3  # later tokens reach earlier ones
    assert (bi.describe()["attention"], causal.describe()["attention"]) == ("bidirectional", "causal")
    with pytest.raises(ValueError, match="attention: queries 'causal' vs index 'bidirectional'"):
        check_compatible(causal.describe(), bi.describe())  # vectors of the two settings never meet in a search
    bi.save_pretrained(tmp_path / "bi")
    assert json.loads((tmp_path / "bi" / "lsr_config.json").read_text())["attention"] == "bidirectional"
    again = load(str(tmp_path / "bi"), mask_special_tokens=False)
    assert again.tower("doc").attention == "bidirectional"
    torch.testing.assert_close(again.encode_document(texts).to_dense(), got, atol=1e-6, rtol=1e-6)


def test_explain_names_the_body_and_head_routes(decoders, tiny_bert):
    plan = load(decoders["llama"]).explain("doc", 8)
    assert plan.body == "hf-padded" and "decoder LLM, causal attention" in plan.body_reason
    assert plan.head.variant == "torch" and "LlamaForCausalLM" in str(plan) and "\n  head      torch  (" in str(plan)
    trained = SpladeEncoder.from_pretrained(decoders["llama"], device="cpu", backend="auto").explain(train=True)
    assert trained.head.variant == "torch" and trained.head.backward == "torch autograd"
    bert = SpladeEncoder.from_pretrained(tiny_bert, device="cpu", varlen=True).explain("query", 4)
    assert bert.body == "padding-free" and bert.head.variant == "packed"


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory, data_dir) -> str:
    from lsr.testing import save_tiny_mlm

    return str(save_tiny_mlm("bert", tmp_path_factory.mktemp("tiny-bert") / "bert", data_dir))


def test_masked_lm_refuses_causal_attention_and_logit_transforms_are_refused(decoders, tiny_bert, tmp_path):
    with pytest.raises(ValueError, match="attention='causal' applies to decoder LLMs"):
        load(tiny_bert, attention="causal")
    with pytest.raises(ValueError, match="attention must be 'causal' or 'bidirectional'"):
        load(decoders["qwen3"], attention="left")
    cfg = transformers.Gemma2Config(vocab_size=640, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                    num_key_value_heads=1, head_dim=16, intermediate_size=64)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / "gemma2")
    transformers.AutoTokenizer.from_pretrained(decoders["qwen3"]).save_pretrained(tmp_path / "gemma2")
    with pytest.raises(NotImplementedError, match="final_logit_softcapping"):
        load(str(tmp_path / "gemma2"))


@pytest.mark.parametrize("kind", DECODER_KINDS)
def test_a_training_step_changes_body_and_lm_head(decoders, kind):
    from lsr.train.model import TrainableEncoder

    enc = SpladeEncoder.from_pretrained(decoders[kind], device="cpu", dtype=torch.float32, backend="torch",
                                        varlen=False)
    model = TrainableEncoder(enc, head="torch")
    params = dict(model.named_parameters())
    head = "doc.decoder.weight" if kind == "llama" else "doc.model.model.embed_tokens.weight"  # qwen3: tied
    before = {k: params[k].detach().clone() for k in (head, "doc.model.model.layers.0.self_attn.q_proj.weight")}
    opt = torch.optim.AdamW([p for _, p in model.named_parameters()], lr=1e-2)

    def loss_fn(q, d):
        scores = q @ d.t()
        return torch.nn.functional.cross_entropy(scores, torch.arange(len(q))), {}

    loss, _, q, d = model.backward(loss_fn, ["white matter", "capital of france"], MORE[:2])
    opt.step()
    assert torch.isfinite(loss) and q.shape == (2, enc.vocab_size)
    assert q[:, enc.tower("doc").term_mask].abs().sum() == 0  # masked terms stay 0 through training too
    for name, old in before.items():
        assert not torch.equal(params[name].detach(), old), name
    assert torch.equal(enc.tower("doc").weight, params[head].detach())  # inference sees the trained head


@pytest.mark.slow
def test_lsr_train_cli_trains_a_decoder_folder(decoders, data_dir, tmp_path, capsys):
    from lsr.cli import main as cli_main

    write_scifact_slice(tmp_path / "beir", data_dir, n_queries=4, n_other=8)
    out = tmp_path / "run"
    cfg = {"output": str(out), "encoder": {"model": decoders["qwen3"], "max_length_query": 16, "max_length_doc": 32,
                                           "head": "torch", "attention": "bidirectional"},
           "data": {"dataset": str(tmp_path / "beir"), "split": "test"}, "negatives": {"count": 0},
           "optim": {"batch_size": 2, "lr": 1e-2, "max_steps": 2}, "schedule": {"progress": False}}
    (tmp_path / "train.yaml").write_text(json.dumps(cfg))
    assert cli_main(["train", str(tmp_path / "train.yaml"), "--device", "cpu"]) == 0
    capsys.readouterr()
    trained = load(str(out / "model"))
    assert trained.tower("doc").architecture == "Qwen3ForCausalLM" and trained.tower("doc").attention == "bidirectional"
    start = load(decoders["qwen3"], attention="bidirectional")
    assert not torch.equal(trained.tower("doc").weight, start.tower("doc").weight)
    assert trained.encode_document(MORE).nnz > 0


@pytest.mark.gpu
@pytest.mark.parametrize("kind", DECODER_KINDS)
def test_gpu_decoder_encodes_within_bf16_tolerance_and_trains(decoders, kind):
    """CUDA: fp32 equals the reference; bf16 errs at most 2x what the plain bf16 computation errs (the Triton head,
    packed where it pays); a training step through the Triton head (bf16 autocast) gives finite, moving weights."""
    from lsr.train.model import TrainableEncoder

    texts = TEXTS + MORE
    enc32 = SpladeEncoder.from_pretrained(decoders[kind], device="cuda", dtype=torch.float32, mask_special_tokens=False)
    ref = causal_reference(decoders[kind], texts, enc32.max_length_doc, False).double()
    torch.testing.assert_close(enc32.encode_document(texts).to_dense().double(), ref, atol=1e-4, rtol=1e-3)
    enc16 = SpladeEncoder.from_pretrained(decoders[kind], device="cuda", mask_special_tokens=False)
    assert enc16.dtype == torch.bfloat16 and enc16.explain().head.variant != "torch"
    model = transformers.AutoModelForCausalLM.from_pretrained(decoders[kind], dtype=torch.bfloat16).cuda().eval()
    tok = transformers.AutoTokenizer.from_pretrained(decoders[kind])
    tok.pad_token = tok.pad_token or tok.eos_token
    batch = tok(texts, padding=True, truncation=True, max_length=enc16.max_length_doc, return_tensors="pt").to("cuda")
    with torch.no_grad():
        plain = (torch.log1p(torch.relu(model(**batch).logits)) * batch["attention_mask"][..., None]).amax(1)
    err = (enc16.encode_document(texts).to_dense().double() - ref).norm()
    assert err <= 2 * (plain.cpu().double() - ref).norm() + 1e-6
    train = TrainableEncoder(SpladeEncoder.from_pretrained(decoders[kind], device="cuda", dtype=torch.float32,
                                                           varlen=False), head="triton")
    y = train.encode("doc", MORE)
    (y.sum(0) ** 2).sum().backward()
    grads = [p.grad for _, p in train.named_parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)


LLM_VOCABS = [151936, 128256]  # Qwen3, Llama 3
# under the interpreter a program costs ~0.1 s whatever its size: a wide vocabulary tile keeps the forward to 19 programs
INTERPRETER_TILE = {"BLOCK_V": 8192, "BLOCK_S": 8, "BLOCK_D": 64, "GROUP_B": 1}


def triton_or_skip() -> str:
    pytest.importorskip("triton")
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.slow
@pytest.mark.parametrize("V", LLM_VOCABS)
def test_head_kernels_at_llm_vocabularies(V, poison):
    """The forward and dH kernels at B=1, L=8, D=64 against the torch twin (dE at these V: the gpu test below; its
    interpreter grid of ~38,000 vocabulary tiles takes minutes)."""
    from lsr.encode.sparton.bwd import triton_sparton_bwd
    from lsr.encode.sparton.fwd_padded import triton_sparton_fwd

    dev = triton_or_skip()
    g = torch.Generator().manual_seed(V)
    h = torch.randn(1, 8, 64, generator=g).to(dev).requires_grad_()
    w = (torch.randn(V, 64, generator=g) * 0.1).to(dev)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0]], dtype=torch.bool, device=dev)
    y, y32, arg = triton_sparton_fwd(h.detach(), w, None, mask, need_fp32=True, _blocks=INTERPRETER_TILE)
    dy = torch.zeros(1, V)
    picked = torch.cat([torch.randint(0, V, (62,), generator=g), torch.tensor([V - 2, V - 1])])
    dy[0, picked] = torch.randn(64, generator=g)  # the top of the vocabulary included
    dh, _, _ = triton_sparton_bwd(dy.to(dev), h.detach(), w, y32, arg, need_dw=False, need_db=False)
    ref = torch_sparton_head(h, w, None, mask)
    (ref_dh,) = torch.autograd.grad(ref, h, dy.to(dev))
    assert (ref > 0).sum() > V // 4 and (ref_dh != 0).any()
    torch.testing.assert_close(y, ref.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dh, ref_dh, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("V", LLM_VOCABS)
@pytest.mark.parametrize("D", [64, 1024])
def test_gpu_head_at_llm_vocabularies_within_2x_torch(V, D):
    """sparton_head forward + backward (dH, dE) in bf16 at LLM vocabularies: the accuracy rule against fp64."""
    triton_or_skip()
    g = torch.Generator().manual_seed(V + D)
    h = torch.randn(2, 8, D, generator=g).cuda().bfloat16()
    w = (torch.randn(V, D, generator=g) * D ** -0.5).cuda().bfloat16()
    mask = torch.ones(2, 8, dtype=torch.bool, device="cuda")
    mask[1, 5:] = False
    dy = torch.randn(2, V, generator=g).cuda().bfloat16()

    def run(fn, dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (h, w)]
        y = fn(*leaves, None, mask)
        return [y.detach(), *torch.autograd.grad(y, leaves, dy.to(y.dtype))]

    ref = run(torch_sparton_head, torch.float64)
    got = run(lambda *a: sparton_head(*a, backend="triton"), torch.bfloat16)
    same = run(lambda *a: torch_sparton_head(*a, upcast=False), torch.bfloat16)
    for i, (x, r, t) in enumerate(zip(got, ref, same, strict=True)):
        err, torch_err = (x.double() - r).norm() / r.norm(), (t.double() - r).norm() / r.norm()
        assert err <= 2 * torch_err + 1e-7, (i, float(err), float(torch_err))
