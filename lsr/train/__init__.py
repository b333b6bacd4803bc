"""Training SPLADE models with the Sparton head: ``lsr train CONFIG.yaml`` or ``lsr.train.train(config)``.

``config`` (TrainConfig from YAML), ``data`` (examples, hard-negative mining with lsr's index, batches),
``losses`` (InfoNCE, MarginMSE, KL, FLOPS, L1), ``model`` (the trainable encoder, GradCache),
``batch_loss`` (a batch's loss function), ``eager_step`` (the step op by op), ``graph_step`` (the step replayed as
CUDA graphs), ``global_batch`` (data parallelism under torchrun: rank parts, the global batch's loss; its
collectives, DDP and FSDP2 are ``lsr.parallel.training``'s), ``state`` (checkpoints without pickle), ``output``
(the output folder), ``dev_eval`` (the dev evaluation), ``trainer`` (the loop; ``train`` runs it in a
``lsr.parallel.jobs.rank_job``). The command is ``lsr.cli.train``.
Importing this package is cheap: torch loads with ``train`` / ``Trainer``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TrainConfig", "Trainer", "load_train_config", "train"]


def __getattr__(name: str) -> Any:
    if name in ("TrainConfig", "load_train_config"):
        from lsr.train import config

        return getattr(config, name)
    if name in ("Trainer", "train"):
        from lsr.train import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'lsr.train' has no attribute {name!r}")
