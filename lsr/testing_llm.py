"""Tiny decoder-LLM checkpoints for tests and examples (the masked-LM ones are in ``lsr.testing``).

``save_tiny_decoder(kind, out_dir, data_dir)`` writes a 2-layer random-weight Qwen3- or Llama-style causal LM built
from its ``transformers`` config, with a byte-level BPE tokenizer trained on SciFact abstracts that follows the
family's conventions, so a test loads it by path the way a user loads a real one:

* ``qwen3``: no BOS, ``<|endoftext|>`` as pad and eos, tied LM head, and more embedding rows (``vocab_size``) than
  tokenizer entries, as Qwen3 pads its 151,669 tokens to 151,936 rows;
* ``llama``: ``<|begin_of_text|>`` prepended, ``<|end_of_text|>`` eos, **no pad token**, untied LM head, one row
  per token.

``save_random_decoder(config, ...)`` does the same for any config (benchmarks: a Qwen3-0.6B-shaped model).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

__all__ = ["DECODER_KINDS", "save_random_decoder", "save_tiny_decoder", "tiny_decoder_config"]

DECODER_KINDS = ("qwen3", "llama")
_BPE_SIZE = 500
_SPECIALS = {"qwen3": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
             "llama": ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>"]}


def tiny_decoder_config(kind: str, vocab_size: int, *, hidden_size: int = 32, layers: int = 2):
    """A ``layers``-layer causal-LM config of ``kind`` (see ``DECODER_KINDS``), 2 query / 1 key-value heads."""
    import transformers as tf

    small = {"vocab_size": vocab_size, "hidden_size": hidden_size, "num_hidden_layers": layers,
             "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": hidden_size // 2,
             "intermediate_size": 2 * hidden_size, "max_position_embeddings": 512}
    if kind == "qwen3":
        return tf.Qwen3Config(tie_word_embeddings=True, **small)
    if kind == "llama":
        return tf.LlamaConfig(tie_word_embeddings=False, **small)
    raise ValueError(f"unknown kind {kind!r}; expected one of {DECODER_KINDS}")


def _tokenizer(kind: str, data_dir: Path):  # -> a transformers fast tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    with open(data_dir / "scifact" / "corpus.jsonl", encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line, _ in zip(f, range(200))]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=_BPE_SIZE, special_tokens=_SPECIALS[kind],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    if kind == "qwen3":
        return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                       model_max_length=512)
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>",
                                   additional_special_tokens=["<|reserved_special_token_0|>"], model_max_length=512)


def save_random_decoder(config, out_dir: str | Path, data_dir: str | Path, *, seed: int = 0,
                        head_std: float | None = None, device: str = "cpu", dtype: torch.dtype = torch.float32) -> Path:
    """A random-weight causal LM of any ``config`` (Qwen3 conventions for ``model_type`` "qwen3", else Llama's) + the
    tiny tokenizer, saved to ``out_dir``; ``config.vocab_size`` may exceed the tokenizer (placeholder rows).
    ``head_std``: redraw the LM head with this standard deviation; ``device`` / ``dtype``: where it is built, saved as."""
    from transformers import AutoModelForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer("qwen3" if config.model_type == "qwen3" else "llama", Path(data_dir))
    if config.vocab_size < len(tok):
        raise ValueError(f"vocab_size {config.vocab_size} is below the tokenizer's {len(tok)} entries")
    config.eos_token_id, config.bos_token_id, config.pad_token_id = tok.eos_token_id, tok.bos_token_id, tok.pad_token_id
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if head_std is not None:
        with torch.no_grad():
            model.get_output_embeddings().weight.normal_(0.0, head_std)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def save_tiny_decoder(kind: str, out_dir: str | Path, data_dir: str | Path, *, seed: int = 0,
                      extra_rows: int = 140) -> Path:
    """Write a tiny random ``kind`` causal LM + tokenizer to ``out_dir`` with ``save_pretrained``; returns it.
    ``data_dir``: the repository's data/ folder (SciFact); ``extra_rows``: qwen3's embedding rows past the tokenizer."""
    if kind not in DECODER_KINDS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {DECODER_KINDS}")
    # the tokenizer has _BPE_SIZE entries, its special tokens among them
    config = tiny_decoder_config(kind, _BPE_SIZE + (extra_rows if kind == "qwen3" else 0))
    # the default init (std 0.02) gives near-zero logits: a wider head keeps rankings from being ties
    return save_random_decoder(config, out_dir, data_dir, seed=seed, head_std=0.3)
