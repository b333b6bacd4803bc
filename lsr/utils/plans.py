"""The one plan record of lsr: what a job will run, step by step, and why.

Every stage that chooses a route builds a plan before it runs anything, and its executor reads the plan's
fields instead of deciding again: the search plan of a query batch (``lsr.search.plan``), the batch plan of a
distributed search (``lsr.parallel.plan``), the encode plan of a tower (``lsr.encode.splade.forward``), the
Sparton head's plan (``lsr.encode.sparton.dispatch``) and the training step's (``lsr.train.graph_step``).
They share this record so that one ``--explain`` can print any of them, and several in a row, the same way:

    search plan: 64 queries, k=1000
      backend    gpu    (auto: CUDA device, triton imports)
      route      block  (auto: 8,841,823 docs)

A plan subclasses ``Plan`` and returns its title and its ``Step`` rows; ``describe`` / ``str`` format them (``summary``: on
one line, for logs) and ``explain`` composes several plans into one text.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Plan", "Step", "explain"]


@dataclass(frozen=True)
class Step:
    """One decision of a plan: the step, what was chosen and why (empty when nothing needs saying)."""

    name: str
    choice: str
    why: str = ""


class Plan:
    """Base of every plan: ``title()`` and ``plan_steps()`` are the plan's own, the formatting is shared."""

    def title(self) -> str:
        raise NotImplementedError

    def plan_steps(self) -> tuple[Step, ...]:
        raise NotImplementedError

    def describe(self) -> str:
        """The title, then one indented line per step: its name, its choice and (in brackets) why."""
        steps = self.plan_steps()
        if not steps:
            return self.title()
        width = max(len(s.name) for s in steps)
        lines = [self.title()]
        lines += [f"  {s.name:<{width}}  {s.choice}" + (f"  ({s.why})" if s.why else "") for s in steps]
        return "\n".join(lines)

    def summary(self) -> str:
        """The plan on one line (for logs): ``title: name choice (why); name choice``."""
        parts = [f"{s.name} {s.choice}" + (f" ({s.why})" if s.why else "") for s in self.plan_steps()]
        return f"{self.title()}: " + "; ".join(parts) if parts else self.title()

    def __str__(self) -> str:
        return self.describe()


def explain(plans: Iterable[Plan | None]) -> str:
    """The plans that are there (None skipped), one block each, in the order a job takes them."""
    return "\n".join(p.describe() for p in plans if p is not None)
