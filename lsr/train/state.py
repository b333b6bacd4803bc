"""Checkpoints: the model as a sentence-transformers / Hugging Face folder plus the trainer's state,
written without pickle.

    CKPT/                       SpladeEncoder.save_pretrained (HF masked LM at the root + ST modules)
    CKPT/trainer_state/
        optimizer.safetensors   every optimizer state tensor, key "<param index>.<name>"
        rng.safetensors         torch CPU / CUDA generator states (uint8)
        state.json              step, epoch, batch within the epoch, param-group settings, Python RNG,
                                the parameter names (a resume into another model fails clearly) and
                                the run's config (a resume with another lr, batch size, model or loss
                                is warned about, one line per changed key)

``trainer_state/`` is written last and atomically, so a checkpoint without it is incomplete and
ignored by ``find_checkpoint``. A damaged one (a truncated safetensors file, a state.json that does not
parse) is skipped under ``resume: auto`` with a warning naming the file, for the checkpoint before it.
"""

from __future__ import annotations

import json
import logging
import random
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from lsr.storage.files import atomic_directory
from lsr.storage.formats import check_format_version

__all__ = ["STATE_DIR", "checkpoint_problem", "config_changes", "find_checkpoint", "list_checkpoints",
           "load_trainer_state", "log_lines_up_to", "save_trainer_state"]

log = logging.getLogger("lsr.train")

STATE_DIR = "trainer_state"
STATE_VERSION = 1   # state.json's format_version: a newer lsr's checkpoint is refused, not misread
_PREFIX = "step-"
_STEP_NAME = re.compile(r"step-\d+")


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under ``root`` (those with a trainer state), oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP_NAME.fullmatch(p.name) and (p / STATE_DIR / "state.json").is_file()]
    return sorted(found, key=lambda p: int(p.name[len(_PREFIX):]))


def checkpoint_path(root: Path, step: int) -> Path:
    return root / f"{_PREFIX}{step:08d}"


def find_checkpoint(resume: str, root: Path, config: Mapping[str, Any] | None = None) -> Path | None:
    """``resume``: "auto" (the newest usable checkpoint under ``root``, None if there is none) or a folder.

    Under "auto" a damaged checkpoint (a truncated safetensors file, a state.json that does not parse) is
    skipped with a warning naming the file, for the one before it; none usable is an error naming the files.
    A folder given by name must be usable. With ``config`` (the run's, as ``TrainConfig.to_dict``), each key
    whose value differs from the config the checkpoint was written with is warned about."""
    if resume == "auto":
        found, problems = list_checkpoints(root), []
        for folder in reversed(found):
            problem = checkpoint_problem(folder)
            if problem is None:
                if problems:
                    log.warning("resuming from %s, the newest usable checkpoint", folder)
                _warn_config_changes(folder, config)
                return folder
            log.warning("skipping checkpoint %s: %s", folder, problem)
            problems.append(problem)
        if problems:
            raise ValueError(f"no usable checkpoint under {root}: {'; '.join(problems)}; remove it to start again, "
                             "or set overwrite: true")
        return None
    path = Path(resume)
    if not (path / STATE_DIR / "state.json").is_file():
        raise FileNotFoundError(f"{path} is not a complete training checkpoint (no {STATE_DIR}/state.json)")
    problem = checkpoint_problem(path)
    if problem is not None:
        raise ValueError(f"cannot resume from {path}: {problem}")
    _warn_config_changes(path, config)
    return path


_STATE_KEYS = ("progress", "param_groups", "optimizer_scalars", "parameters", "python_random")


def checkpoint_problem(folder: Path) -> str | None:
    """Why ``folder`` cannot be resumed from (naming the file), or None: every safetensors file opens and covers
    its tensors (a truncated one does not), every JSON file parses, state.json has the trainer's keys. Headers
    and small files only: nothing large is read."""
    for path in sorted(folder.rglob("*")):
        if path.suffix == ".safetensors":
            try:
                with safe_open(str(path), "pt"):
                    pass
            except Exception as e:   # safetensors raises its own error type for every damage
                return f"{path} is damaged ({' '.join(str(e).split())}; truncated?)"
        elif path.suffix == ".json":
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                return f"{path} is not valid JSON ({e})"
            if path.name == "state.json" and path.parent.name == STATE_DIR and not (
                    isinstance(doc, dict) and all(k in doc for k in _STATE_KEYS)):
                return f"{path} lacks the trainer's keys {list(_STATE_KEYS)}"
    return None


# keys that change nothing the run computes (where it goes, how it reports): no warning when they differ
_NEUTRAL_KEYS = {"resume", "overwrite", "output", "name", "schedule.progress", "schedule.log_every",
                 "schedule.save_every", "schedule.keep_checkpoints", "metadata"}


def config_changes(saved: Mapping[str, Any], current: Mapping[str, Any], prefix: str = "") -> list[str]:
    """``"key: saved -> current"`` for every dotted key (sections flattened) whose value differs, in key order,
    except the keys that do not change what is computed (``_NEUTRAL_KEYS``)."""
    out = []
    for key in sorted(set(saved) | set(current)):
        dotted, old, new = prefix + key, saved.get(key), current.get(key)
        if isinstance(old, Mapping) and isinstance(new, Mapping) and dotted not in _NEUTRAL_KEYS:
            out += config_changes(old, new, dotted + ".")
        elif dotted not in _NEUTRAL_KEYS and _plain(old) != _plain(new):
            out.append(f"{dotted}: {old!r} -> {new!r}")
    return out


def _plain(value: Any) -> Any:
    """Tuples as lists: a config's to_dict and its JSON round trip compare equal."""
    return list(value) if isinstance(value, tuple) else value


def _warn_config_changes(folder: Path, config: Mapping[str, Any] | None) -> None:
    if config is None:
        return
    saved = json.loads((folder / STATE_DIR / "state.json").read_text(encoding="utf-8")).get("config")
    if saved is None:   # written before checkpoints kept their config
        log.warning("%s does not record its training config: changes to it cannot be checked", folder)
        return
    for change in config_changes(saved, config):
        log.warning("resuming %s with a changed config: %s", folder, change)


def log_lines_up_to(path: Path, step: int) -> list[str]:
    """The lines of a JSON-lines log (log.jsonl, eval.jsonl) about steps <= ``step``: those past a resumed
    checkpoint are about to be redone. A last line cut short by a kill during its write is dropped with a
    warning; a damaged line elsewhere is an error naming the file and line."""
    lines = path.read_text(encoding="utf-8").splitlines()
    keep = []
    for n, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines):
                log.warning("%s:%d: dropping a line cut short (the run was killed while writing it)", path, n)
                break
            raise ValueError(f"{path}:{n}: not a JSON line; remove it to resume") from None
        if not isinstance(row, dict) or not isinstance(row.get("step", 0), int):
            raise ValueError(f"{path}:{n}: expected a JSON object with an integer 'step'; remove it to resume")
        if row.get("step", 0) <= step:
            keep.append(line)
    return keep


def prune_checkpoints(root: Path, keep: int | None) -> None:
    if keep is None:
        return
    for old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old)


def _rng_tensors(device: torch.device) -> dict[str, torch.Tensor]:
    out = {"torch_cpu": torch.get_rng_state()}
    if device.type == "cuda":
        out["torch_cuda"] = torch.cuda.get_rng_state(device)
    return out


def save_trainer_state(folder: Path, optimizer: torch.optim.Optimizer, names: list[str], device: torch.device,
                       progress: dict[str, Any], config: Mapping[str, Any] | None = None) -> None:
    """Write ``folder/trainer_state`` (see the module docstring); ``progress`` holds JSON scalars, ``config``
    the run's config (``TrainConfig.to_dict``: a resume with another one is warned about)."""
    sd = optimizer.state_dict()
    tensors, scalars = {}, {}
    for idx, st in sd["state"].items():
        for key, value in st.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{idx}.{key}"] = value.detach().contiguous().cpu()
            else:
                scalars[f"{idx}.{key}"] = value
    # (a CUDA-graph step's learning rate is a 0-d device tensor: saved as its number)
    groups = [{k: v.item() if isinstance(v, torch.Tensor) else v for k, v in g.items()} for g in sd["param_groups"]]
    py_version, py_state, py_gauss = random.getstate()
    with atomic_directory(folder / STATE_DIR) as tmp:
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        save_file(_rng_tensors(device), str(tmp / "rng.safetensors"))
        doc = {"format_version": STATE_VERSION, "progress": progress, "param_groups": groups,
               "optimizer_scalars": scalars, "parameters": names,
               "python_random": [py_version, list(py_state), py_gauss], "config": config}
        (tmp / "state.json").write_text(json.dumps(doc, indent=1))


# param-group keys that are this run's, not the checkpoint's: the optimizer's implementation (the eager step's
# fused AdamW, or the CUDA-graph step's capturable one) and its learning-rate object (a graph reads its tensor;
# every step rewrites the value)
_RUN_OWN = ("lr", "fused", "foreach", "capturable", "differentiable")


def load_trainer_state(folder: Path, optimizer: torch.optim.Optimizer, names: list[str],
                       device: torch.device) -> dict[str, Any]:
    """Restore the optimizer and the random generators from ``folder/trainer_state``; returns progress
    (the optimizer keeps its own implementation flags and learning-rate object: ``_RUN_OWN``)."""
    d = folder / STATE_DIR
    doc = json.loads((d / "state.json").read_text())
    # (checkpoints from before the version field are version 1)
    check_format_version(d / "state.json", doc.get("format_version", 1), STATE_VERSION,
                         rebuild="resume from a checkpoint this lsr wrote, or start the run again")
    if doc["parameters"] != names:
        raise ValueError(f"{folder}: the checkpoint's parameters differ from this model's (another model or "
                         "tower layout); resume with the config that wrote it")
    tensors = load_file(str(d / "optimizer.safetensors"))
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = value.to(device) if name != "step" else value
    for key, value in doc["optimizer_scalars"].items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = value
    own = [{k: g[k] for k in _RUN_OWN if k in g} for g in getattr(optimizer, "param_groups", ())]
    optimizer.load_state_dict({"state": state, "param_groups": doc["param_groups"]})
    _keep_run_settings(optimizer, own)
    rng = load_file(str(d / "rng.safetensors"))
    torch.set_rng_state(rng["torch_cpu"])
    if device.type == "cuda" and "torch_cuda" in rng:
        torch.cuda.set_rng_state(rng["torch_cuda"], device)
    version, py_state, gauss = doc["python_random"]
    random.setstate((version, tuple(py_state), gauss))
    return doc["progress"]


def _keep_run_settings(optimizer: Any, own: list[dict[str, Any]]) -> None:
    """Put back this run's ``_RUN_OWN`` keys after loading a checkpoint's param groups; a fused or capturable
    group's step counts then live on its parameters' device (a CPU run's checkpoint holds them on the host).
    (FSDP's full-state wrapper has no param groups: nothing to do.)"""
    for group, kept in zip(getattr(optimizer, "param_groups", ()), own, strict=True):
        group.update(kept)
        if group.get("fused") or group.get("capturable"):
            for p in group["params"]:
                state = optimizer.state.get(p)
                if state and isinstance(state.get("step"), torch.Tensor):
                    state["step"] = state["step"].to(p.device, torch.float32)
