"""The Sparton dispatch: which forward ``plan_head`` picks for representative inputs, and why.

The CUDA cases pass the GPU's facts (compute capability, SM count) to the decision function, so they run on any
machine; ``interpret=False`` asks about a real GPU rather than Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from lsr.encode.sparton import (
    DEFAULT_DISPATCH,
    HeadFacts,
    SpartonPlan,
    explain_sparton_head,
    fwd_resident,
    plan_head,
    sparton_head,
    torch_sparton_head,
)

needs_gluon = pytest.mark.skipif(fwd_resident.gluon is None, reason="triton's Gluon is not installed")
BF16 = torch.bfloat16


def gpu(B: int, S: int, V: int, *, cap=(9, 0), sms: int = 132, dtype=BF16, D: int = 768, grad: bool = False,
        aligned: bool = True) -> HeadFacts:
    return HeadFacts("cuda", dtype, B, S, D, V, needs_grad=grad, capability=cap, sm_count=sms, aligned=aligned,
                     interpret=False)


@pytest.mark.parametrize("facts,kw,variant,reason", [
    (HeadFacts("cpu", torch.float32, 4, 32, 64, 1000), {}, "cpu_tiled", "CPU inference"),
    (HeadFacts("cpu", torch.float32, 4, 32, 64, 1000, needs_grad=True), {}, "torch", "gradient is needed"),
    (HeadFacts("cpu", torch.float32, 4, 32, 64, 1000), {"backend": "torch"}, "torch", "backend='torch'"),
    (gpu(8, 64, 30522), {}, "padded", "below"),  # small: one launch, fixed config
    (gpu(64, 512, 250002), {}, "resident", "experimental"),
    (gpu(64, 512, 250002, grad=True), {}, "resident", "waves"),  # training takes it too
    (gpu(320, 512, 30522), {}, "padded", "waves"),  # 239 vocabulary tiles: under 8 waves of 132 SMs
    (gpu(64, 512, 250002, cap=(8, 0)), {}, "padded", "sm_80"),
    (gpu(64, 512, 250002, dtype=torch.float32), {}, "padded", "bf16/fp16"),
    (gpu(64, 512, 250002, D=100), {}, "padded", "width 100"),
    (gpu(64, 512, 250002, aligned=False), {}, "padded", "aligned"),
    (gpu(64, 512, 250002), {"min_waves": 100}, "padded", "under 100"),
    (gpu(64, 512, 250002), {"failed": {"resident": "RuntimeError: boom"}}, "padded", "boom"),
    (gpu(1024, 100, 30522), {"packed": True}, "packed", "width 100"),
    (gpu(1024, 128, 30522), {"packed": True}, "padded", "waves"),  # a full tile: packing does not pay
    (gpu(1024, 100, 30522, grad=True), {"packed": True}, "padded", "waves"),  # packed has no backward
])
@needs_gluon
def test_plan_names_the_variant_and_why(facts, kw, variant, reason):
    plan = plan_head(facts, **kw)
    assert isinstance(plan, SpartonPlan) and plan.variant == variant and reason in plan.reason
    assert str(plan).startswith(f"sparton head plan\n  forward   {variant}  (") and "\n  backward  " in str(plan)
    assert ("none" in plan.backward) is (not facts.needs_grad)


def test_forced_variants_run_or_say_why_not():
    big = gpu(64, 512, 250002)
    assert plan_head(big, variant="padded").reason == "forced by variant='padded'"
    assert plan_head(HeadFacts("cpu", torch.float32, 2, 4, 8, 5), variant="torch").variant == "torch"
    with pytest.raises(ValueError, match="variant='resident' cannot run these inputs: needs sm_90"):
        plan_head(gpu(64, 512, 250002, cap=(8, 9)), variant="resident")
    with pytest.raises(ValueError, match="splits rows only from"):
        plan_head(gpu(2, 8, 100), variant="resident")
    with pytest.raises(ValueError, match="inference-only"):
        plan_head(gpu(2, 8, 100, grad=True), variant="packed")
    with pytest.raises(ValueError, match="cannot run with backend='triton'"):
        plan_head(big, backend="triton", variant="cpu_tiled")
    with pytest.raises(ValueError, match="variant must be"):
        plan_head(big, variant="fast")


def test_explain_and_run_follow_the_same_plan():
    g = torch.Generator().manual_seed(3)
    h, w = torch.randn(3, 5, 8, generator=g), torch.randn(11, 8, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 1, 1, 1], [0, 0, 0, 0, 0]])
    assert explain_sparton_head(h, w).variant == "cpu_tiled"
    assert explain_sparton_head(h, w, backend="triton").variant == "padded"  # the interpreter: a fixed config
    before = DEFAULT_DISPATCH.runs.copy()
    ref = torch_sparton_head(h, w, None, mask)
    with torch.no_grad():
        for variant in ("torch", "cpu_tiled", "padded", "packed"):
            torch.testing.assert_close(sparton_head(h, w, None, mask, variant=variant), ref, rtol=1e-5, atol=1e-6)
    assert DEFAULT_DISPATCH.runs - before == {"torch": 1, "cpu_tiled": 1, "padded": 1, "packed": 1}
