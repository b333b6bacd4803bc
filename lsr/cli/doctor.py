"""``lsr doctor``: the facts of this environment that decide lsr's routes, and the failure memories of the process.

    $ lsr doctor
    lsr doctor: what decides the routes here
      lsr              0.4.0  (python 3.11.7)
      torch            2.11.0+cu130  (CUDA 13.0)
      devices          cuda:0 NVIDIA H200 sm_90 139.8 GiB
      ...
    failure memories (lsr.utils.runtime): none disabled
      encode.flash_attention: ok (varlen_body: flash attention)
      ...

The probes are cheap: versions from the package metadata, device properties, and one tiny ``nonzero_static`` call
on a GPU (whether this torch has its CUDA kernel). The memories of a fresh process are all "ok"; a long-lived one
(a server, a notebook) shows its own through ``lsr.utils.runtime.failures()`` and the ``--explain`` outputs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
from collections.abc import Callable
from importlib import metadata

from lsr import __version__
from lsr.utils.plans import Plan, Step

__all__ = ["EnvironmentReport", "cmd_doctor", "environment", "register"]

# the modules whose failure memories the report lists (imported to register them; one that cannot be imported is
# named instead)
MEMORY_MODULES = ("lsr.encode.backbone.varlen_body", "lsr.encode.splade.extract", "lsr.encode.sparton.dispatch",
                  "lsr.encode.splade.query_graphs", "lsr.search.graphs", "lsr.train.graph_step")


class EnvironmentReport(Plan):
    """The environment's facts as plan steps (name, value, note)."""

    def __init__(self, steps: tuple[Step, ...]) -> None:
        self.steps = steps

    def title(self) -> str:
        return "lsr doctor: what decides the routes here"

    def plan_steps(self) -> tuple[Step, ...]:
        return self.steps


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _devices(torch) -> tuple[str, str]:
    if not torch.cuda.is_available():
        return "cpu only", "no CUDA device: the torch twins run, Triton kernels only under TRITON_INTERPRET=1"
    names = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        names.append(f"cuda:{i} {p.name} sm_{p.major}{p.minor} {p.total_memory / 2**30:.1f} GiB")
    return "; ".join(names), f"{len(names)} GPU(s)"


def _capability(torch) -> tuple[int, int] | None:
    return torch.cuda.get_device_capability(0) if torch.cuda.is_available() else None


def _flash(torch) -> tuple[str, str]:
    cap = _capability(torch)
    if cap is None:
        return "no", "needs a CUDA GPU"
    built = getattr(torch.backends.cuda, "is_flash_attention_available", lambda: True)()
    if not built or cap[0] < 8:
        return "no", "this torch build has no flash attention" if not built else f"sm_{cap[0]}{cap[1]} < sm_80"
    return "yes", "attention='flash' and the fp16/bf16 fall-back of the packed kernel"


def _tma(torch) -> tuple[str, str]:
    cap = _capability(torch)
    try:
        importlib.import_module("triton.tools.tensor_descriptor")
    except ImportError:
        return "no", "this triton has no tensor descriptors (>= 3.4)"
    if cap is None or cap[0] < 9:
        return "no", "needs sm_90 or later"
    return "yes", "the Sparton head's TMA config families are tried first"


def _nonzero_static(torch) -> tuple[str, str]:
    if not hasattr(torch, "nonzero_static"):
        return "no", "this torch has no nonzero_static"
    if not torch.cuda.is_available():
        return "cpu only", "on a GPU: one tiny call tells"
    try:
        torch.nonzero_static(torch.ones(2, device="cuda"), size=1)
    except (NotImplementedError, RuntimeError) as e:
        return "no", f"no CUDA kernel ({type(e).__name__}): torch.nonzero runs, one host sync a batch"
    return "yes", "encoding extracts without a host sync; query graphs hold the extraction"


def _resident(torch) -> tuple[str, str]:
    from lsr.encode.sparton import fwd_resident

    if fwd_resident.gluon is None:
        return "no", "this triton has no Gluon"
    why_not = fwd_resident.unsupported_reason(_capability(torch), torch.bfloat16, 768, True)
    return ("no", why_not) if why_not else ("yes", "the Sparton head's experimental resident-tile forward (bf16)")


def environment() -> EnvironmentReport:
    """Versions, devices, TRITON_INTERPRET and the optional kernels' availability (cheap probes)."""
    import torch

    steps = [Step("lsr", __version__, f"python {platform.python_version()}"),
             Step("torch", torch.__version__, f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA build"),
             Step("triton", _version("triton"), "the kernels' compiler"),
             Step("transformers", _version("transformers"), "Hugging Face checkpoints"),
             Step("devices", *_devices(torch)),
             Step("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "unset"),
                  "1: Triton kernels run in the interpreter, as in the CPU tests")]
    probes: tuple[tuple[str, Callable], ...] = (("flash attention", _flash), ("TMA loads", _tma),
                                                ("nonzero_static", _nonzero_static), ("resident head", _resident))
    steps += [Step(name, *probe(torch)) for name, probe in probes]
    return EnvironmentReport(tuple(steps))


def failure_report() -> str:
    """The registered failure memories, one line each (the modules that cannot be imported named)."""
    from lsr.utils.runtime import failures, memories

    missing = []
    for module in MEMORY_MODULES:
        try:
            importlib.import_module(module)
        except ImportError as e:
            missing.append(f"  {module}: not importable ({e})")
    disabled = failures()
    head = f"failure memories (lsr.utils.runtime): {len(disabled) or 'none'} disabled in this process"
    return "\n".join([head, *(f"  {m.describe()}" for m in memories()), *missing])


def cmd_doctor(args: argparse.Namespace) -> int:
    print(environment())
    print(failure_report())
    return 0


def register(sub: argparse._SubParsersAction, add_command: Callable[..., argparse.ArgumentParser]) -> None:
    add_command(sub, "doctor", "print what decides lsr's routes here (versions, devices, optional kernels) and "
                               "the routes this process disabled", cmd_doctor)
