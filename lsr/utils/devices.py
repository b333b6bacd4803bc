"""The device names lsr accepts, checked in one place: the CLI's ``--device`` (``lsr.cli.args``), the run
config's ``device`` (``lsr.config``), ``resolve_device`` and the searchers' ``device`` argument, so a typo such
as ``"gpu"`` gets the same one-line answer everywhere instead of torch's parser error."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - torch is imported only where a torch.device is made
    import torch

__all__ = ["DEVICE_HELP", "check_device", "is_device_name", "resolve_device", "torch_device"]

DEVICE_HELP = "auto | cpu | cuda | cuda:N"
_DEVICE_NAME = re.compile(r"auto|cpu|cuda(:\d+)?")


def is_device_name(name: Any, auto: bool = True) -> bool:
    """Whether ``name`` is "cpu", "cuda" or "cuda:N", or (``auto``) "auto"."""
    return isinstance(name, str) and _DEVICE_NAME.fullmatch(name) is not None and (auto or name != "auto")


def check_device(name: Any) -> str:
    """``name`` when it is "auto", "cpu", "cuda" or "cuda:N"; else a one-line ValueError."""
    if not is_device_name(name):
        raise ValueError(f"unknown device {name!r}; use {DEVICE_HELP} (e.g. \"cuda:1\")")
    return name


def torch_device(device: str | int | torch.device) -> torch.device:
    """``device`` as a torch.device: a torch.device, "cpu", "cuda", "cuda:N" or a GPU number N (as torch reads
    one); else a one-line ValueError (searchers take no "auto": ``resolve_device`` picks one)."""
    import torch

    if isinstance(device, torch.device):
        return device
    if isinstance(device, int) and not isinstance(device, bool) and device >= 0:
        return torch.device("cuda", device)
    if not is_device_name(device, auto=False):
        raise ValueError(f"a searcher cannot run on device {device!r}; use \"cpu\", \"cuda\", \"cuda:N\", a GPU "
                         "number or a torch.device")
    return torch.device(device)


def resolve_device(device: str | None) -> str:
    """"auto"/None -> "cuda" when a GPU is visible, else "cpu"; a one-line ValueError for a malformed name."""
    import torch

    if device is not None:
        check_device(str(device))  # str: a torch.device passes as its name
    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device={device!r} was asked for but no CUDA GPU is visible")
    return str(device)
