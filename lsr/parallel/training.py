"""What data-parallel training needs of torch.distributed, behind plain functions (``lsr.train`` calls them).

* **wrapping** a model for the ranks: ``data_parallel`` (DDP: rank 0's weights broadcast at construction, the
  gradients averaged during the backward) or ``shard_model`` (FSDP2 ``fully_shard``: parameters, gradients and
  optimizer state sharded over the ranks, each listed layer gathered only while it runs);
* **full state dicts** of a sharded model, gathered by every rank and handed to rank 0 (``full_model_state``,
  ``FullStateOptimizer``: the optimizer state in the one-process layout, so a checkpoint resumes with or without
  sharding and on any world size);
* **the global batch**: ``gather_rows``, the all-gather of every rank's embeddings whose backward sums every
  rank's gradient of each part back to its owner (``loss.gather_across_ranks``);
* **reductions**: ``sum_over_ranks`` (a step's loss parts and counts, in one all-reduce) and
  ``average_gradients`` (the GradCache step, whose chunks run outside DDP's forward).

Collective tensors are staged on ``lsr.parallel.topology.comm_device`` (the rank's GPU under NCCL, the host under
gloo, which also serves ranks sharing one GPU).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from lsr.parallel.topology import comm_device

__all__ = ["FullStateOptimizer", "average_gradients", "data_parallel", "full_model_state", "gather_rows",
           "shard_model", "sum_over_ranks"]


# ----------------------------------------------------------------------------------- wrapping
def data_parallel(module: nn.Module, device: torch.device) -> nn.Module:
    """``module`` under DDP on ``device`` (its constructor broadcasts rank 0's weights); buffers are not
    broadcast per forward, and the gradients are bucket views (no copy into the buckets)."""
    from torch.nn.parallel import DistributedDataParallel

    ids = [device] if device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=ids, broadcast_buffers=False, gradient_as_bucket_view=True)


def shard_model(root: nn.Module, layers: Iterable[nn.Module]) -> None:
    """FSDP2: ``fully_shard`` each of ``layers`` (gathered only while it runs), then ``root`` (the rest)."""
    from torch.distributed.fsdp import fully_shard

    for layer in layers:
        fully_shard(layer)
    fully_shard(root)


# ----------------------------------------------------------------------------------- full state dicts
def _options(**kw: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded weights of a sharded ``model`` on rank 0's CPU ({} on the others); collective."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options(cpu_offload=True))


class FullStateOptimizer:
    """An optimizer over sharded parameters seen through full state dicts in ``torch.optim``'s layout
    (parameters by index): ``state_dict()`` (collective; full on rank 0) and ``load_state_dict(sd)``
    (every rank passes the same full state; each keeps its shards)."""

    def __init__(self, optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
        self.optimizer, self.model = optimizer, model
        name_of = {id(p): n for n, p in model.named_parameters()}
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

        sd = get_optimizer_state_dict(self.model, self.optimizer, options=_options(cpu_offload=True))
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
        set_optimizer_state_dict(self.model, self.optimizer, {"state": state, "param_groups": groups},
                                 options=_options())


# ----------------------------------------------------------------------------------- the global batch
class _GatherRows(torch.autograd.Function):
    """All-gather of equal-shaped [n, ...] tensors along rows; backward: every rank's gradient of the
    gathered tensor summed, each rank keeping its own rows."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.device = x.device
        staged = x.detach().to(comm_device()).contiguous()
        parts = [torch.empty_like(staged) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, staged)
        return torch.cat(parts).to(x.device)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        world, rank = dist.get_world_size(), dist.get_rank()
        n = grad.shape[0] // world
        staged = grad.to(comm_device()).contiguous()
        if dist.get_backend() == "nccl":
            out = torch.empty_like(staged[:n])
            dist.reduce_scatter_tensor(out, staged)
        else:  # gloo has no reduce-scatter: the whole sum, then this rank's rows
            staged = staged.clone()
            dist.all_reduce(staged)
            out = staged[rank * n:(rank + 1) * n]
        return out.to(ctx.device)


def gather_rows(x: torch.Tensor) -> torch.Tensor:
    """Every rank's ``x`` [n, ...] (equal shapes) stacked in rank order [W·n, ...], differentiable: the
    gradient of each rank's rows, summed over the ranks, flows back to the rank that owns them."""
    return _GatherRows.apply(x)


# ----------------------------------------------------------------------------------- reductions
def sum_over_ranks(values: Sequence[float]) -> list[float]:
    """Each of ``values`` summed over the ranks (float64, one all-reduce)."""
    buf = torch.tensor(list(values), dtype=torch.float64, device=comm_device())
    dist.all_reduce(buf)
    return buf.tolist()


def average_gradients(params: Sequence[torch.nn.Parameter]) -> None:
    """Average ``.grad`` over the ranks in one all-reduce (the GradCache step, which encodes in chunks
    outside DDP's forward, synchronises this way)."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1).float() for g in grads]).to(comm_device())
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for p, g in zip(params, grads, strict=True):
        mean = flat[offset:offset + g.numel()].view_as(g)
        if p.grad is None:
            p.grad = mean.to(device=g.device, dtype=g.dtype)
        else:  # in place: DDP's gradient buckets may be views of it
            p.grad.copy_(mean)
        offset += g.numel()
