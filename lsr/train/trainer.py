"""The training loop behind ``lsr train`` and ``lsr.train.train``.

AdamW with a linear warm-up then linear decay; InfoNCE (or MarginMSE / KL against teacher scores) plus
FLOPS / L1 regularisation on SPLADE vectors computed through the Sparton head (``TrainableEncoder``);
bf16 autocast on CUDA; optional backbone activation checkpointing and GradCache chunks; on one GPU the
whole step replayed as CUDA graphs where it can (``optim.cuda_graph``, ``lsr.train.graph_step``). Every
``log_every`` steps a JSON line goes to OUTPUT/log.jsonl (loss parts, FLOPS, average non-zeros of
queries and documents, learning rate, step time, tokens/s); every ``eval_every`` steps and at the end
the dev split is searched exactly with lsr's own index (OUTPUT/eval.jsonl); every ``save_every``
steps a resumable checkpoint is written (``lsr.train.state``); the final model goes to OUTPUT/model.

Under torchrun every rank runs the loop on its part of each global batch (``lsr.train.global_batch``) in one
``lsr.parallel.jobs.rank_job`` (``train`` opens it): the ranks agree on the config and its inputs first, rank 0
alone writes the output folder (logs, evaluations, mined negatives, checkpoints, the model) while the others
wait, and a failure there fails every rank (``RankJob.on_lead``).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import random
import time
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from lsr.config import apply_overrides
from lsr.parallel.agreement import config_parts
from lsr.parallel.jobs import RankJob, rank_job
from lsr.parallel.topology import is_distributed
from lsr.parallel.training import FullStateOptimizer, full_model_state
from lsr.storage.files import atomic_write_text
from lsr.train.config import TrainConfig, load_train_config, train_config_from_dict
from lsr.train.data import Example, TrainData, epoch_batches, load_train_data, mine_negatives
from lsr.train.dev_eval import evaluate_encoder, load_dev_data
from lsr.train.eager_step import EagerStep, check_finite
from lsr.train.graph_step import GraphStep, plan_train_step
from lsr.train.model import TrainableEncoder, adamw_kernel
from lsr.train.output import claim_train_output, prepare_train_output
from lsr.train.state import (
    checkpoint_path,
    find_checkpoint,
    load_trainer_state,
    log_lines_up_to,
    prune_checkpoints,
    save_trainer_state,
)

__all__ = ["Trainer", "train"]

log = logging.getLogger("lsr.train")


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _deterministic_cublas(cfg: TrainConfig) -> None:
    if cfg.optim.deterministic:  # (read when cuBLAS starts: set before the model touches the GPU)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warm-up over ``warmup`` steps to 1, then linear decay to 0 at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


class Trainer:
    """One configured run: ``Trainer(cfg).run()`` -> the final model folder; under torchrun every rank's
    ``Trainer(cfg, job)`` inside the job's ``rank_job`` (``train`` does both)."""

    def __init__(self, cfg: TrainConfig, job: RankJob | None = None) -> None:
        from lsr.utils.devices import resolve_device

        self.cfg, self.out = cfg, Path(cfg.output)
        _deterministic_cublas(cfg)
        if job is None:
            if is_distributed():
                raise ValueError("under torchrun a Trainer trains one rank of the job: call lsr.train.train(cfg), or "
                                 "pass job= (with lsr.parallel.jobs.rank_job(device) as job: ...)")
            job = RankJob.alone(resolve_device(cfg.device))
        self.job, self.device = job, job.device
        self.rank, self.world = job.rank, job.world
        with job.agreement("read the config and its inputs") as parts:  # the same config, inputs and output
            parts += config_parts(cfg.to_dict())
        self._setup()

    def _setup(self) -> None:
        cfg = self.cfg
        if self.world > 1 and cfg.loss.in_batch_groups > 1:
            raise ValueError("config.loss.in_batch_groups splits one process's batch as that many ranks do; under "
                             "torchrun the ranks are the groups: leave it at 1")
        self.sharded = self.world > 1 and cfg.optim.sharding == "fsdp"
        self.step_plan = plan_train_step(cfg, self.device, distributed=self.world > 1)  # printable: route and why
        if self.sharded and cfg.optim.grad_cache_chunk is not None:
            raise ValueError("config.optim.grad_cache_chunk encodes outside the sharded forward: use it with "
                             "optim.sharding: ddp, or unset it with fsdp")
        self.job.on_lead("claim the output folder", lambda: claim_train_output(cfg, self.out))  # before the slow load
        _seed_everything(cfg.seed)
        self.resume_from = self._find_resume()
        with self.job.step("load the model and the training data"):
            self.model = TrainableEncoder(self._load_encoder(self.resume_from), head=cfg.encoder.head,
                                          deterministic=cfg.optim.deterministic, bf16=cfg.autocast_bf16,
                                          gradient_checkpointing=cfg.optim.gradient_checkpointing)
            self.data: TrainData = load_train_data(cfg)
        self.inference: TrainableEncoder | None = None  # FSDP: rank 0's unsharded copy (evaluation, saving)
        if self.sharded and self.rank == 0:
            self.inference = TrainableEncoder(self._load_encoder(self.resume_from), head=cfg.encoder.head)
        if self.world > 1:
            self.model.distribute(cfg.optim.sharding)
        named = self.model.named_parameters()
        self.param_names = [n for n, _ in named]
        no_decay = [p for n, p in named if p.ndim < 2]  # biases and LayerNorm weights
        decay = [p for n, p in named if p.ndim >= 2]
        graph = self.step_plan.graph
        self.optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.optim.weight_decay},
                                            {"params": no_decay, "weight_decay": 0.0}], lr=cfg.optim.lr,
                                           **adamw_kernel(self.device, cfg.optim.deterministic, capturable=graph))
        self.graph_step = GraphStep(self.model, self.optimizer, cfg.loss, cfg.optim.max_grad_norm,
                                    graph_batch=cfg.optim.batch_size) if graph else None
        self.eager_step = EagerStep(self.model, self.optimizer, cfg, self.rank, self.world)
        # what checkpoints save and load: under FSDP the full state, gathered from the shards
        self.optimizer_state = FullStateOptimizer(self.optimizer, self.model.pair) if self.sharded else self.optimizer
        self.global_batch = cfg.optim.batch_size * self.world  # the data order is the global batch's
        self.batches_per_epoch = len(self._epoch_batches(0))
        self.total_steps = cfg.optim.max_steps or cfg.optim.epochs * self.batches_per_epoch
        self.step, self.epoch, self.batch_in_epoch = 0, 0, 0
        self._eval_data: dict[str, Any] | None = None

    # ------------------------------------------------------------------ setup
    def _find_resume(self) -> Path | None:
        """The checkpoint to resume from: rank 0's choice on every rank (``resume: auto`` lists a folder)."""
        cfg = self.cfg
        if not cfg.resume:
            return None
        found = self.job.on_lead("find the checkpoint", lambda: find_checkpoint(cfg.resume, self.out / "checkpoints",
                                                                                cfg.to_dict()))
        text = self.job.from_lead(str(found) if found is not None else "")
        return Path(text) if text else None

    @property
    def lead_encoder(self) -> Any:
        """The encoder rank 0 evaluates, mines negatives with and saves (under FSDP its unsharded copy,
        refreshed by ``_gather_weights``)."""
        return self.inference.encoder if self.inference is not None else self.model.encoder

    def _gather_weights(self) -> None:
        """FSDP: the trained weights into rank 0's unsharded copy (every rank takes part); else nothing."""
        if self.sharded:
            state = full_model_state(self.model.pair)
            if self.inference is not None:
                self.inference.pair.load_state_dict(state)

    def _epoch_batches(self, epoch: int) -> list[list[Example]]:
        return epoch_batches(self.data, self.cfg, epoch, batch_size=self.global_batch)

    def _load_encoder(self, checkpoint: Path | None) -> Any:
        from lsr.encode.splade.encoder import SpladeEncoder

        cfg = self.cfg
        enc_cfg, deterministic = cfg.encoder, cfg.optim.deterministic
        source = str(checkpoint) if checkpoint is not None else enc_cfg.model
        # deterministic: eager attention (the fused sdpa backwards may accumulate with atomics)
        kw = {"device": self.device, "dtype": torch.float32, "max_length_query": enc_cfg.max_length_query,
              "max_length_doc": enc_cfg.max_length_doc, "backend": enc_cfg.head, "varlen": False,
              "attn_implementation": "eager" if deterministic else "sdpa",
              "compile": enc_cfg.compile or self.step_plan.graph,  # (graphs need the sync-free compiled body)
              "attention": enc_cfg.attention}
        enc = SpladeEncoder.from_pretrained(source, **kw)
        if cfg.optim.separate_towers and enc._towers["query"] is enc._towers["doc"]:
            enc = SpladeEncoder.from_pretrained(source, query_model=source, **kw)
        return enc

    def _negatives_for_epoch(self, epoch: int) -> None:
        """Mine (or reload the mined) hard-negative candidates this epoch uses: rank 0 mines them into the
        output folder, the other ranks read them from there."""
        cfg, neg = self.cfg, self.cfg.negatives
        if neg.mine == "none" or cfg.triples:
            return
        mined_epoch = epoch if neg.mine == "model" and neg.refresh else 0
        path = self.out / "negatives" / f"epoch-{mined_epoch}.json"
        if neg.mine == "model" and not path.is_file():
            self._gather_weights()
        self.job.on_lead("mine hard negatives", lambda: self._mine_negatives(path))
        with self.job.step("read the mined negatives"):  # (several hosts: the output folder must be shared)
            if self.rank != 0:
                self.data.candidates = json.loads(path.read_text())

    def _mine_negatives(self, path: Path) -> None:
        neg = self.cfg.negatives
        if path.is_file():
            self.data.candidates = json.loads(path.read_text())
            return
        if neg.mine == "bm25":
            from lsr.encode.bm25.lexical import LexicalEncoder

            encoder = LexicalEncoder().fit(self.data.docs.values())
        else:
            encoder = self.lead_encoder
        self.model.eval()
        with self.model.autocast():
            self.data.candidates = mine_negatives(self.data, encoder, depth=neg.depth, skip=neg.skip,
                                                  device=str(self.device))
        self.model.train()
        if self.data.teacher is not None:  # distillation needs a teacher score for every negative
            self.data.candidates = {q: [d for d in c if d in self.data.teacher.get(q, {})]
                                    for q, c in self.data.candidates.items()}
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(self.data.candidates))

    # ------------------------------------------------------------------ one step
    def train_step(self, batch: list[Example]) -> dict[str, Any]:
        """Forward, backward and optimizer step on one (global) batch; returns its log fields."""
        t0, optim = time.perf_counter(), self.cfg.optim
        lr = optim.lr * lr_factor(self.step, optim.warmup_steps, self.total_steps)
        if self.graph_step is not None:
            loss, logs, grad_norm, counts = self.graph_step.run(self.data, batch, self.step, lr)
            check_finite(loss, self.step)  # (the graph left the weights as they were: it skips a non-finite update)
        else:
            loss, logs, grad_norm, counts = self.eager_step.run(self.data, batch, self.step, lr)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        dt = time.perf_counter() - t0
        self.step += 1
        return {"step": self.step, "epoch": self.epoch, "loss": loss, **logs, "lr": lr, "grad_norm": grad_norm,
                "nnz_q": counts["nnz_q"] / max(1, counts["n_q"]), "nnz_d": counts["nnz_d"] / max(1, counts["n_d"]),
                "step_ms": dt * 1e3, "tokens_per_s": counts["tokens"] / dt}

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> dict[str, float]:
        """Encode the dev corpus and queries with the current weights, search exactly, score."""
        if self._eval_data is None:
            self._eval_data = load_dev_data(self.cfg)
        self.model.eval()
        try:
            return evaluate_encoder(self.lead_encoder, self._eval_data, self.cfg.evaluation.metrics, self.device,
                                    self.model.autocast)
        finally:
            self.model.train()

    # ------------------------------------------------------------------ checkpoints, logs
    def save_checkpoint(self) -> Path:
        """Rank 0 writes the checkpoint (the ranks hold equal weights and optimizer states), the others wait."""
        folder = checkpoint_path(self.out / "checkpoints", self.step)
        progress = {"step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
                    "global_batch_size": self.global_batch, "world_size": self.world}
        self._gather_weights()
        optimizer_state = self.optimizer_state.state_dict()  # (collective under FSDP)

        def write() -> None:
            self.lead_encoder.save_pretrained(folder, overwrite=True)
            save_trainer_state(folder, SimpleNamespace(state_dict=lambda: optimizer_state), self.param_names,
                               self.device, progress, config=self.cfg.to_dict())
            prune_checkpoints(self.out / "checkpoints", self.cfg.schedule.keep_checkpoints)
        self.job.on_lead("save a checkpoint", write)
        return folder

    def _restore(self, folder: Path) -> None:
        progress = load_trainer_state(folder, self.optimizer_state, self.param_names, self.device)
        saved_batch = progress.get("global_batch_size", self.global_batch)
        if saved_batch != self.global_batch:  # progress counts global batches: another size is another data order
            raise ValueError(f"{folder} was written with a global batch of {saved_batch} "
                             f"({progress.get('world_size', 1)} rank(s)); this run's is {self.global_batch} "
                             f"({self.world} x optim.batch_size {self.cfg.optim.batch_size}): set optim.batch_size "
                             f"so that ranks x batch_size = {saved_batch}, or start a new run from its model")
        self.step, self.epoch, self.batch_in_epoch = progress["step"], progress["epoch"], progress["batch_in_epoch"]

        def truncate_logs() -> None:  # lines past the checkpoint are about to be redone
            for name in ("log.jsonl", "eval.jsonl"):
                path = self.out / name
                if path.is_file():
                    keep = log_lines_up_to(path, self.step)
                    atomic_write_text(path, "".join(ln + "\n" for ln in keep))
        self.job.on_lead("truncate the logs", truncate_logs)
        log.info("resumed from %s at step %d", folder, self.step)

    def _append(self, name: str, row: Mapping[str, Any]) -> None:
        def write() -> None:
            with open(self.out / name, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
        self.job.on_lead(f"write {name}", write)

    def _evaluate_and_log(self, bar: Any) -> dict[str, float]:
        """Rank 0 evaluates and logs (the others wait); {} on the other ranks."""
        self._gather_weights()
        def evaluate() -> dict[str, float]:
            metrics = self.evaluate()
            with open(self.out / "eval.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": self.step, **metrics}) + "\n")
            bar.write(f"step {self.step}: " + "  ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
            return metrics
        return self.job.on_lead("evaluate", evaluate) or {}

    # ------------------------------------------------------------------ loop
    def run(self) -> Path:
        """Train to the last step; returns the final model folder (OUTPUT/model)."""
        before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
        if self.cfg.optim.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            return self._run()
        finally:  # a process-wide switch: leave it as it was
            torch.use_deterministic_algorithms(before[0], warn_only=before[1])

    def _run(self) -> Path:
        cfg, final = self.cfg, self.out / "model"
        self.job.on_lead("prepare the output folder", lambda: prepare_train_output(cfg, self.out, self.resume_from))
        if self.resume_from is not None:
            self._restore(self.resume_from)
        if self.rank == 0:
            log.info("%s", self.step_plan.summary())
        self.model.train()
        metrics: dict[str, float] = {}
        sched, evaluates = cfg.schedule, cfg.eval_data.dataset is not None
        with tqdm(total=self.total_steps, initial=self.step, unit="step", desc="train", disable=not sched.progress or self.rank > 0) as bar:
            if evaluates and self.step == 0 and sched.eval_every:
                metrics = self._evaluate_and_log(bar)
            while self.step < self.total_steps:
                self._negatives_for_epoch(self.epoch)
                batches = self._epoch_batches(self.epoch)
                while self.batch_in_epoch < len(batches) and self.step < self.total_steps:
                    row = self.train_step(batches[self.batch_in_epoch])
                    self.batch_in_epoch += 1
                    bar.update(1)
                    bar.set_postfix(loss=f"{row['loss']:.3f}", nnz_q=f"{row['nnz_q']:.0f}", nnz_d=f"{row['nnz_d']:.0f}")
                    if self.step % sched.log_every == 0 or self.step == self.total_steps:
                        self._append("log.jsonl", row)
                    if evaluates and sched.eval_every and self.step % sched.eval_every == 0:
                        metrics = self._evaluate_and_log(bar)
                    if sched.save_every and self.step % sched.save_every == 0:
                        self.save_checkpoint()
                if self.batch_in_epoch >= len(batches):
                    self.epoch, self.batch_in_epoch = self.epoch + 1, 0
            if evaluates and not (sched.eval_every and self.step % sched.eval_every == 0):
                metrics = self._evaluate_and_log(bar)

        self._gather_weights()

        def write_model() -> None:
            self.lead_encoder.save_pretrained(final, overwrite=True)
            if metrics:
                atomic_write_text(self.out / "metrics.json", json.dumps({"step": self.step, **metrics}, indent=1))
        self.job.on_lead("write the model", write_model)
        return final


def train(config: TrainConfig | Mapping[str, Any] | str | os.PathLike, overrides: list[str] | tuple[str, ...] = ()
          ) -> Path:
    """Train a SPLADE model from a TrainConfig, a nested mapping or a YAML file (+ ``section.key=value``
    overrides), in this process or on every rank of a torchrun job; returns the folder of the final model
    (loadable by ``SpladeEncoder.from_pretrained`` and by sentence-transformers' ``SparseEncoder``)."""
    if isinstance(config, TrainConfig):
        cfg = config if not overrides else train_config_from_dict(apply_overrides(config.to_dict(), overrides))
    elif isinstance(config, Mapping):
        cfg = train_config_from_dict(apply_overrides(copy.deepcopy(dict(config)), overrides))
    else:
        cfg = load_train_config(config, overrides)
    from lsr.utils.devices import resolve_device

    _deterministic_cublas(cfg)
    with rank_job(resolve_device(cfg.device)) as job:  # under torchrun: this rank of the job
        return Trainer(cfg, job).run()
