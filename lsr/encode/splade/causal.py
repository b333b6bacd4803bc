"""Decoder LLMs (Qwen3, Llama, Mistral: any ``AutoModelForCausalLM`` checkpoint) as SPLADE towers.

A causal LM's logits are its LM head (``lm_head``: tied to the input embedding or not, no bias) applied to the
final-normed states of its decoder body. ``CausalLMTower`` runs that body (``model.base_model``) through Hugging
Face's own forward and hands the LM head's weight to the Sparton head, so a text's weights are
Y[v] = max_s log1p(relu(h_s · E_v)) over its tokens, without [B, S, V] logits. The padding-free BERT body and
packed attention do not cover decoders; the head is the fused one all the same (``forward.plan_encode`` says so).

* ``attention``: "causal" (what the model was trained with; the default unless its config sets
  ``use_bidirectional_attention``) or "bidirectional": the causal mask is dropped and only padding is masked,
  as LLM-based sparse retrievers that fine-tune with bidirectional attention do (a causal checkpoint encodes
  differently that way until it is trained so).
* padding: batches pad on the right and every text gets positions 0..n-1, so with causal attention a text's
  vector does not depend on its batch; the pad id is the tokenizer's pad token, else its eos token (Llama has no
  pad token).
* ``term_mask``: the tokenizer's special tokens and the ids past its vocabulary (LLMs pad the embedding matrix:
  Qwen3 has 151,669 tokens in 151,936 rows) always get weight 0 (``mask_special_tokens=False`` keeps them).
* at load, the model's own logits on a probe text must equal the LM head applied to the body's states:
  architectures that scale or soft-cap their logits (Gemma 2/3, Cohere, Granite, MiniCPM) are refused with one line.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lsr.encode.splade.checkpoint import MaskedLMTower, resolve_local_files_only

__all__ = ["ATTENTIONS", "CausalLMTower", "DecoderBody", "is_causal_lm", "load_tower", "special_term_mask"]

ATTENTIONS = ("causal", "bidirectional")
_PROBE = "Learned sparse retrieval weighs every vocabulary term of a text."
# config fields of architectures whose logits are not lm_head(final states): max pooling would differ
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "scale_width", "dim_model_base")


def is_causal_lm(config: Any) -> bool:
    """Whether a transformers config describes a decoder LLM (loaded with AutoModelForCausalLM) rather than a masked
    LM: its ``architectures`` say ``...ForCausalLM``, or only the causal-LM auto class knows its type."""
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_FOR_MASKED_LM_MAPPING

    if any(str(a).endswith("ForCausalLM") for a in getattr(config, "architectures", None) or ()):
        return True
    return type(config) not in MODEL_FOR_MASKED_LM_MAPPING and type(config) in MODEL_FOR_CAUSAL_LM_MAPPING


def load_tower(name: str, device: torch.device, dtype: torch.dtype, local_files_only: bool | None,
               revision: str | None, attn_implementation: str | None, *, attention: str | None = None,
               mask_special_tokens: bool = True) -> MaskedLMTower:
    """A masked-LM or decoder-LLM checkpoint (HF id or folder) as a tower, by its config. ``attention``: decoders
    only, "causal" | "bidirectional" (None: the model's own); ``mask_special_tokens``: decoders only."""
    from transformers import AutoConfig

    if attention is not None and attention not in ATTENTIONS:
        raise ValueError(f"attention must be 'causal' or 'bidirectional', got {attention!r}")
    MaskedLMTower.check_folder(name)
    offline = resolve_local_files_only(name, local_files_only, revision)
    config = AutoConfig.from_pretrained(name, revision=revision, local_files_only=offline)
    if is_causal_lm(config):
        return CausalLMTower(name, device, dtype, offline, revision, attn_implementation, attention=attention,
                             mask_special_tokens=mask_special_tokens)
    if attention == "causal":
        raise ValueError(f"{name}: attention='causal' applies to decoder LLMs; {type(config).__name__} is a masked "
                         "LM (bidirectional by construction): leave attention unset")
    return MaskedLMTower(name, device, dtype, offline, revision, attn_implementation)


class DecoderBody(nn.Module):
    """A causal LM's decoder body: forward(input_ids [B, L], attention_mask [B, L]) -> output whose ``.logits`` are
    the final-normed states [B, L, D] (the LM head's input), as a masked-LM tower's body returns its transformed
    states. ``bidirectional``: attend to every unpadded position instead of the earlier ones only."""

    def __init__(self, model: nn.Module, bidirectional: bool) -> None:
        super().__init__()
        self.decoder = model.base_model
        self.bidirectional = bidirectional

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
        from transformers.modeling_outputs import MaskedLMOutput

        if not self.bidirectional:
            out = self.decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        else:
            from transformers.masking_utils import create_bidirectional_mask

            embeds = self.decoder.get_input_embeddings()(input_ids)
            # materialised (no skip): with no mask at all, sdpa and flash attention fall back to the module's causal flag
            mask = create_bidirectional_mask(config=self.decoder.config, inputs_embeds=embeds,
                                             attention_mask=attention_mask, allow_is_bidirectional_skip=False)
            out = self.decoder(inputs_embeds=embeds, attention_mask=mask, is_causal=False, use_cache=False)
        return MaskedLMOutput(logits=out.last_hidden_state)


def special_term_mask(tokenizer: Any, vocab_size: int) -> torch.Tensor:
    """bool [vocab_size]: True for the tokenizer's special tokens and for ids it does not have."""
    known = torch.zeros(vocab_size, dtype=torch.bool)
    ids = [i for i in tokenizer.get_vocab().values() if 0 <= i < vocab_size]
    known[ids] = True
    special = set(tokenizer.all_special_ids)
    special |= {i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if getattr(t, "special", False)}
    drop = ~known
    drop[[i for i in special if 0 <= i < vocab_size]] = True
    return drop


class CausalLMTower(MaskedLMTower):
    """One decoder-LLM checkpoint as a SPLADE tower (see the module doc): ``model`` (the causal LM, its LM head
    replaced by an identity), ``body`` (``DecoderBody``), ``weight`` [V, D] (the LM head's, tied or not), ``bias``
    None, ``attention``, ``term_mask`` and the tokenizer facts of ``MaskedLMTower``."""

    auto_class = "AutoModelForCausalLM"

    def __init__(self, name: str, device: torch.device, dtype: torch.dtype, local_files_only: bool | None,
                 revision: str | None, attn_implementation: str | None, *, attention: str | None = None,
                 mask_special_tokens: bool = True) -> None:
        super().__init__(name, device, dtype, local_files_only, revision, attn_implementation)
        config = self.model.config
        own = "bidirectional" if getattr(config, "use_bidirectional_attention", False) else "causal"
        self.attention = attention or own
        self.varlen = None  # the padding-free body covers BERT / DistilBERT only
        self.body = DecoderBody(self.model, self.attention == "bidirectional")
        tok = self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.pad_id = pad if pad is not None else getattr(config, "eos_token_id", None) or 0
        if isinstance(self.pad_id, list):  # configs may list several eos ids
            self.pad_id = self.pad_id[0]
        self.term_mask = special_term_mask(tok, self.weight.shape[0]).to(device) if mask_special_tokens else None
        self._check_logits()

    def _check_logits(self) -> None:
        """Refuse models whose logits are not ``lm_head(final states)`` (max pooling of those would not be theirs)."""
        config = self.model.config
        transforms = [f for f in _LOGIT_TRANSFORMS if getattr(config, f, None) not in (None, 1, 1.0)]
        if not transforms:
            ids = self.tokenizer(_PROBE, add_special_tokens=True)["input_ids"][:16] or [self.pad_id]
            probe = torch.tensor([ids], device=self.weight.device)
            with torch.no_grad(), self.decoder_attached() as model:
                ref = model(input_ids=probe, use_cache=False).logits.float()
            with torch.no_grad():  # the model's own (causal) attention on both sides
                states = self.model.base_model(input_ids=probe, use_cache=False).last_hidden_state
                ours = torch.nn.functional.linear(states, self.weight).float()
            tol = (1e-3 if self.weight.dtype == torch.float32 else 2e-2) * max(1.0, float(ref.abs().max()))
            if ref.shape == ours.shape and float((ref - ours).abs().max()) <= tol:
                return
            transforms = ["its logits differ from lm_head(final hidden states)"]
        raise NotImplementedError(f"{self.name}: {self.architecture} transforms its logits ({', '.join(transforms)}); "
                                  "lsr's SPLADE head pools lm_head(final hidden states) and supports decoders whose "
                                  "logits are exactly that (Qwen, Llama, Mistral)")
