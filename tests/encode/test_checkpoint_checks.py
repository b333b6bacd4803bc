"""Loading refuses checkpoints that would load only in part (lsr.encode.splade.load_checks): a masked LM or decoder
missing its head or input embedding, a tokenizer with more ids than the embedding has rows, a config.json whose
vocab_size does not fit the weights; each is one line naming the folder, what is wrong and the fix. A tied head
that the checkpoint leaves out (as save_pretrained does) is recognised as tied and loads.

The damaged checkpoints are copies of real tiny ones (data/models/splade-tiny, lsr.testing_llm decoders) with a
tensor deleted from model.safetensors, config.json edited or tokens added to the tokenizer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file

from lsr.encode.splade.encoder import SpladeEncoder
from lsr.testing import write_scifact_slice
from lsr.testing_llm import save_tiny_decoder

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def models(tmp_path_factory, data_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpt")
    out = {k: save_tiny_decoder(k, root / k, data_dir) for k in ("qwen3", "llama")}
    return {**out, "bert": data_dir / "models" / "splade-tiny"}


def damaged(src: Path, dst: Path, *, drop: str | None = None, config: dict | None = None,
            tokens: list[str] | None = None) -> Path:
    """A copy of checkpoint ``src``: without tensor ``drop``, with ``config`` merged into config.json, with
    ``tokens`` added to its tokenizer."""
    shutil.copytree(src, dst)
    if drop is not None:
        state = load_file(str(dst / "model.safetensors"))
        assert drop in state, f"{drop} is not in {src}"
        del state[drop]
        save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    if config:
        cfg = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**cfg, **config}))
    if tokens:
        tok = transformers.AutoTokenizer.from_pretrained(dst)
        tok.add_tokens(tokens)
        tok.save_pretrained(dst)
    return dst


def load(path: Path) -> SpladeEncoder:
    return SpladeEncoder.from_pretrained(path, device="cpu", backend="torch")


def refused(path: Path, *needles: str) -> str:
    with pytest.raises(ValueError) as e:  # CheckpointError, a ValueError
        load(path)
    text = str(e.value)
    assert "\n" not in text and text.startswith(f"{path}: ")
    for needle in needles:
        assert needle in text, text
    return text


@pytest.mark.parametrize("kind, key, what", [
    ("llama", "lm_head.weight", "the LM head"),
    ("llama", "model.embed_tokens.weight", "the input embedding"),
    ("qwen3", "model.embed_tokens.weight", "the LM head and the input embedding"),  # tied: both are gone
    ("bert", "cls.predictions.bias", "the MLM head"),
    ("bert", "cls.predictions.transform.dense.weight", "the MLM head"),
    ("bert", "bert.embeddings.word_embeddings.weight", "the MLM head and the input embedding"),
])
def test_a_checkpoint_missing_its_head_or_embedding_is_refused(models, tmp_path, kind, key, what):
    bad = damaged(models[kind], tmp_path / "bad", drop=key)
    refused(bad, f"lacks {what} (", key, "at random", "re-save the complete model with save_pretrained")


def test_an_untied_decoder_missing_its_head_is_told_about_tying(models, tmp_path):
    bad = damaged(models["llama"], tmp_path / "bad", drop="lm_head.weight")
    refused(bad, '"tie_word_embeddings": true')
    # the advice works: the same weights with the head declared tied load, and the head is the embedding
    tied = damaged(bad, tmp_path / "tied", config={"tie_word_embeddings": True})
    tower = load(tied).tower("doc")
    embedding = load_file(str(tied / "model.safetensors"))["model.embed_tokens.weight"]
    assert torch.equal(tower.weight, embedding)


def test_a_tied_head_the_checkpoint_leaves_out_loads(models):
    """Qwen3-style: tie_word_embeddings, and save_pretrained wrote no lm_head.weight: not a missing head."""
    state = load_file(str(models["qwen3"] / "model.safetensors"))
    assert "lm_head.weight" not in state and json.loads((models["qwen3"] / "config.json").read_text())[
        "tie_word_embeddings"]
    tower = load(models["qwen3"]).tower("doc")
    assert torch.equal(tower.weight, state["model.embed_tokens.weight"])
    assert tower.weight.data_ptr() == tower.model.get_input_embeddings().weight.data_ptr()


@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_a_tokenizer_larger_than_the_embedding_is_refused(models, tmp_path, kind):
    rows = json.loads((models[kind] / "config.json").read_text())["vocab_size"]
    bad = damaged(models[kind], tmp_path / "bad", tokens=["zqxj", "qzxv", "xvqz"])
    refused(bad, f"the tokenizer has {rows + 3} tokens but the model's embedding has {rows} rows",
            "resize_token_embeddings")


@pytest.mark.parametrize("kind, delta", [("bert", -22), ("qwen3", 7), ("llama", 7)])
def test_a_vocab_size_that_does_not_fit_the_weights_is_refused(models, tmp_path, kind, delta):
    rows = json.loads((models[kind] / "config.json").read_text())["vocab_size"]
    bad = damaged(models[kind], tmp_path / "bad", config={"vocab_size": rows + delta})
    refused(bad, f"config.json says vocab_size {rows + delta} but the weights have {rows} rows",
            f'set "vocab_size": {rows} in its config.json')


@pytest.mark.slow  # a fresh interpreter per case (~12 s): stderr must be the one error line, nothing else
@pytest.mark.parametrize("kind, key, needle", [
    ("llama", "lm_head.weight", "lacks the LM head"),
    ("bert", "cls.predictions.bias", "lacks the MLM head"),
])
def test_the_cli_reports_a_broken_checkpoint_in_one_line(models, tmp_path, data_dir, kind, key, needle):
    bad = damaged(models[kind], tmp_path / "bad", drop=key)
    write_scifact_slice(tmp_path / "beir", data_dir, n_queries=1, n_other=2)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "lsr", "encode", "--encoder", "splade", "--model", str(bad),
                           "--dataset", str(tmp_path / "beir"), "--out", str(tmp_path / "vec"), "--device", "cpu"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"lsr encode: error: {bad}: "), proc.stderr
    assert needle in proc.stderr and not (tmp_path / "vec").exists()
