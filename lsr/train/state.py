"""Checkpoints: the model as a sentence-transformers / Hugging Face folder plus the trainer's state,
written without pickle.

    CKPT/                       SpladeEncoder.save_pretrained (HF masked LM at the root + ST modules)
    CKPT/trainer_state/
        optimizer.safetensors   every optimizer state tensor, key "<param index>.<name>"
        rng.safetensors         torch CPU / CUDA generator states (uint8)
        state.json              step, epoch, batch within the epoch, param-group settings, Python RNG,
                                the parameter names (a resume into another model fails clearly)

``trainer_state/`` is written last and atomically, so a checkpoint without it is incomplete and
ignored by ``find_checkpoint``.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from lsr.storage.files import atomic_directory

__all__ = ["STATE_DIR", "find_checkpoint", "list_checkpoints", "load_trainer_state", "save_trainer_state"]

STATE_DIR = "trainer_state"
_PREFIX = "step-"


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under ``root`` (those with a trainer state), oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.name.startswith(_PREFIX) and (p / STATE_DIR / "state.json").is_file()]
    return sorted(found, key=lambda p: int(p.name[len(_PREFIX):]))


def checkpoint_path(root: Path, step: int) -> Path:
    return root / f"{_PREFIX}{step:08d}"


def find_checkpoint(resume: str, root: Path) -> Path | None:
    """``resume``: "auto" (the newest complete checkpoint under ``root``, None if there is none) or a folder."""
    if resume == "auto":
        found = list_checkpoints(root)
        return found[-1] if found else None
    path = Path(resume)
    if not (path / STATE_DIR / "state.json").is_file():
        raise FileNotFoundError(f"{path} is not a complete training checkpoint (no {STATE_DIR}/state.json)")
    return path


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
                       progress: dict[str, Any]) -> None:
    """Write ``folder/trainer_state`` (see the module docstring); ``progress`` holds JSON scalars."""
    sd = optimizer.state_dict()
    tensors, scalars = {}, {}
    for idx, st in sd["state"].items():
        for key, value in st.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{idx}.{key}"] = value.detach().contiguous().cpu()
            else:
                scalars[f"{idx}.{key}"] = value
    groups = [{k: v for k, v in g.items()} for g in sd["param_groups"]]
    py_version, py_state, py_gauss = random.getstate()
    with atomic_directory(folder / STATE_DIR) as tmp:
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        save_file(_rng_tensors(device), str(tmp / "rng.safetensors"))
        doc = {"progress": progress, "param_groups": groups, "optimizer_scalars": scalars, "parameters": names,
               "python_random": [py_version, list(py_state), py_gauss]}
        (tmp / "state.json").write_text(json.dumps(doc, indent=1))


def load_trainer_state(folder: Path, optimizer: torch.optim.Optimizer, names: list[str],
                       device: torch.device) -> dict[str, Any]:
    """Restore the optimizer and the random generators from ``folder/trainer_state``; returns progress."""
    d = folder / STATE_DIR
    doc = json.loads((d / "state.json").read_text())
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
    optimizer.load_state_dict({"state": state, "param_groups": doc["param_groups"]})
    rng = load_file(str(d / "rng.safetensors"))
    torch.set_rng_state(rng["torch_cpu"])
    if device.type == "cuda" and "torch_cuda" in rng:
        torch.cuda.set_rng_state(rng["torch_cuda"], device)
    version, py_state, gauss = doc["python_random"]
    random.setstate((version, tuple(py_state), gauss))
    return doc["progress"]
