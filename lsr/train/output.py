"""The output folder of ``lsr train``: which folders it may write into, and an earlier run's files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from lsr.storage.files import atomic_write_text
from lsr.train.config import TrainConfig

__all__ = ["TRAIN_MARKER", "claim_train_output", "prepare_train_output"]

TRAIN_MARKER = ".lsr-train.json"   # written first into an output folder: the folder is lsr train's to reuse


def claim_train_output(cfg: TrainConfig, out: Path) -> None:
    """Refuse an output folder inside an input (the dataset, the triples, the model) or one lsr train did not
    write (it would overwrite a user's config.yaml and add files beside theirs) unless ``overwrite`` is set."""
    from lsr.storage.provenance import check_not_inside

    inputs = [cfg.data.dataset, cfg.eval_data.dataset, cfg.triples, cfg.encoder.model]
    inputs += [str(i).rsplit(":", 1)[0] for i in inputs if i]   # "folder:split" dataset specs
    check_not_inside(out, inputs, "output folder")
    earlier = [out / name for name in (TRAIN_MARKER, "model", "log.jsonl", "checkpoints", "negatives")]
    ours = any(p.exists() for p in earlier)   # (runs from before the marker have these)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not ours and not cfg.overwrite:
        raise FileExistsError(f"{out} exists and was not written by lsr train (no {TRAIN_MARKER}); choose a new "
                              "output folder, or set overwrite: true (--overwrite) to write into it")


def prepare_train_output(cfg: TrainConfig, out: Path, resume_from: Path | None) -> None:
    """Refuse or clear an earlier run in ``out`` (a new run; ``resume: auto`` before any checkpoint starts
    again), then write the marker and the run's config.yaml."""
    final = out / "model"
    earlier = [p for p in (final, out / "log.jsonl", out / "checkpoints", out / "negatives") if p.exists()]
    if resume_from is None and earlier:
        if not (cfg.overwrite or (cfg.resume == "auto" and not final.exists())):
            raise FileExistsError(f"{out} holds an earlier run ({earlier[0].name}); set resume: auto to "
                                  "continue it, overwrite: true to start again, or choose another output")
        for name in ("log.jsonl", "eval.jsonl"):
            (out / name).unlink(missing_ok=True)
        for name in ("checkpoints", "negatives"):
            shutil.rmtree(out / name, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / TRAIN_MARKER, json.dumps({"writer": "lsr train"}))
    cfg.save(out / "config.yaml")
