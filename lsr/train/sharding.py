"""FSDP (torch's FSDP2 ``fully_shard``) for ``optim.sharding: fsdp``: parameters, gradients and optimizer
state sharded over the ranks, each transformer layer gathered only while it runs.

What the rest of training needs from a sharded model goes through full (unsharded) state dicts, gathered
by every rank and handed to rank 0: the weights for rank 0's dev evaluation, negative mining and model
writing (``full_model_state``, loaded into an unsharded inference copy of the encoder), and the
optimizer state for checkpoints (``FullStateOptimizer``: what ``lsr.train.state`` saves and loads, in the
one-process layout, so a checkpoint resumes with or without sharding and on any world size).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["FullStateOptimizer", "full_model_state", "shard_modules"]


def shard_modules(pair: nn.Module) -> None:
    """``fully_shard`` every transformer layer (the members of the towers' layer lists), then the rest."""
    from torch.distributed.fsdp import fully_shard

    for tower in pair.towers:
        layer_lists = [m for m in tower.modules() if isinstance(m, nn.ModuleList)]
        for layer in (layer_lists[0] if layer_lists else []):
            fully_shard(layer)
    fully_shard(pair)


def _options(**kw: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def full_model_state(pair: nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded weights of ``pair`` on rank 0's CPU ({} on the others); collective."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(pair, options=_options(cpu_offload=True))


class FullStateOptimizer:
    """An optimizer over sharded parameters seen through full state dicts in ``torch.optim``'s layout
    (parameters by index): ``state_dict()`` (collective; full on rank 0) and ``load_state_dict(sd)``
    (every rank passes the same full state; each keeps its shards)."""

    def __init__(self, optimizer: torch.optim.Optimizer, pair: nn.Module) -> None:
        self.optimizer, self.pair = optimizer, pair
        name_of = {id(p): n for n, p in pair.named_parameters()}
        self.names = [name_of[id(p)] for g in optimizer.param_groups for p in g["params"]]

    def _by_index(self, groups: list[dict]) -> list[dict]:
        out, start = [], 0
        for group, live in zip(groups, self.optimizer.param_groups, strict=True):
            n = len(live["params"])
            out.append({**group, "params": list(range(start, start + n))})
            start += n
        return out

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        sd = get_optimizer_state_dict(self.pair, self.optimizer, options=_options(cpu_offload=True))
        if not sd:  # (ranks other than 0)
            return {"state": {}, "param_groups": []}
        index = {n: i for i, n in enumerate(self.names)}
        return {"state": {index[n]: st for n, st in sd.get("state", {}).items()},
                "param_groups": self._by_index(sd.get("param_groups", self.optimizer.param_groups))}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        groups = [{**g, "params": [self.names[i] for i in g["params"]]} for g in sd["param_groups"]]
        state = {self.names[i]: {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in st.items()}
                 for i, st in sd["state"].items()}
        set_optimizer_state_dict(self.pair, self.optimizer, {"state": state, "param_groups": groups},
                                 options=_options())
