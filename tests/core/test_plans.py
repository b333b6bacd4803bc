"""The shared plan record: one format for every stage's plan, composed by ``explain``."""

from dataclasses import dataclass

from lsr.utils.plans import Plan, Step, explain


@dataclass(frozen=True)
class _Toy(Plan):
    name: str
    steps: tuple[Step, ...]

    def title(self) -> str:
        return f"toy plan: {self.name}"

    def plan_steps(self) -> tuple[Step, ...]:
        return self.steps


def test_describe_aligns_steps_and_brackets_only_the_reasons_given():
    plan = _Toy("a", (Step("route", "block", "auto: 9 docs"), Step("selection", "bucket")))
    assert str(plan).splitlines() == ["toy plan: a", "  route      block  (auto: 9 docs)", "  selection  bucket"]


def test_explain_composes_plans_in_order_and_skips_missing_ones():
    a, b = _Toy("a", (Step("x", "1"),)), _Toy("b", ())
    assert explain([a, None, b]) == "toy plan: a\n  x  1\ntoy plan: b"


def test_summary_is_one_line_for_logs():
    plan = _Toy("a", (Step("route", "block", "auto"), Step("selection", "bucket")))
    assert plan.summary() == "toy plan: a: route block (auto); selection bucket"
    assert _Toy("b", ()).summary() == "toy plan: b"
