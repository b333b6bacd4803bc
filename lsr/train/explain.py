"""``lsr train CONFIG --explain``: the plans a training run follows (the encoder's routes as training runs them,
and the step's: CUDA graph or eager), composed into one text; nothing is trained or written."""

from __future__ import annotations

from lsr.train.config import TrainConfig
from lsr.utils.plans import Plan

__all__ = ["explain_training"]


def explain_training(cfg: TrainConfig, device: str, distributed: bool) -> list[Plan]:
    """The plans of ``cfg``'s training on ``device`` (``distributed``: under torchrun with several ranks): the
    document and query batches' encode plans with ``train=True`` and the step plan."""
    from lsr.encode.splade.encoder import SpladeEncoder
    from lsr.train.graph_step import plan_train_step

    enc = cfg.encoder
    encoder = SpladeEncoder.from_pretrained(enc.model, device=device, query_model=enc.query_model,
                                            max_length_query=enc.max_length_query, max_length_doc=enc.max_length_doc,
                                            backend=enc.head, attention=enc.attention)
    batch = cfg.optim.batch_size
    return [encoder.explain("doc", batch=batch, train=True), encoder.explain("query", batch=batch, train=True),
            plan_train_step(cfg, device, distributed)]
