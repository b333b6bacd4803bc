"""Tiny masked-LM checkpoints for tests and CPU smoke runs (no hub access needed).

``save_tiny_mlm(kind, out_dir, data_dir)`` builds a randomly initialised BERT / DistilBERT / RoBERTa /
ModernBERT masked LM from a small config, shifts its decoder bias so that SPLADE outputs are sparse
(like a trained model: a few hundred active terms per text instead of half the vocabulary), and
saves model + tokenizer with ``save_pretrained`` so ``from_pretrained(out_dir)`` works offline.

BERT, DistilBERT and ModernBERT use the real bert-base-uncased WordPiece tokenizer (vocab 30522);
RoBERTa gets a byte-level BPE tokenizer (vocab 500, pad id 1, ``<s> … </s>``) trained here on a few
SciFact abstracts, so the non-BERT tokenizer conventions are exercised too. Pytest-independent:
``scripts/bench_encode.py --tiny`` uses it as well.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

KINDS = ("bert", "distilbert", "roberta", "modernbert")
SAMPLE_TEXTS = [
    "Alterations of the architecture of cerebral white matter in the developing human brain.",
    "what is the capital of france",
    "The quick brown fox jumps over the lazy dog while the cat sleeps.",
    "Vitamin D deficiency is associated with an increased risk of infection in adults.",
]


def _scifact_texts(data_dir: Path, n: int) -> list[str]:
    with open(data_dir / "scifact" / "corpus.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line, _ in zip(f, range(n))]


def _bpe_tokenizer(data_dir: Path):  # -> transformers tokenizer
    import transformers
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

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
    """A 2-layer, 32-wide config of the given family."""
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
    """Shift the decoder bias so that max-pooled logits of ``texts`` have about ``target_nnz``
    positive entries per text (the median text hits it exactly). Returns the shift applied.

    A random model puts about half the vocabulary above zero; trained SPLADE models activate
    ~100-200 terms per passage, which is what the shard sizes and sparse-extraction costs should see.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    enc = tokenizer(list(texts), padding=True, truncation=True, max_length=256, return_tensors="pt").to(device)
    logits = model(**enc).logits.float()  # [n, S, V]
    logits = logits.masked_fill(~enc["attention_mask"].bool()[..., None], -float("inf"))
    pooled = logits.amax(1)  # [n, V]
    k = min(target_nnz, pooled.shape[1])
    kth = torch.topk(pooled, k, dim=1).values[:, -1]
    shift = float(kth.median())
    bias = model.get_output_embeddings().bias
    bias -= shift  # in place: tied copies (e.g. BERT's cls.predictions.bias) follow
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
    calibrate_sparsity(model, tok, SAMPLE_TEXTS + _scifact_texts(data_dir, 4), target_nnz)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
