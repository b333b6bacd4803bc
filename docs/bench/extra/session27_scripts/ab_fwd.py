"""Session 26's lockstep resident forward against the shipped warp-specialized one: bit parity (mixed masks, an odd
number of rows, fp16 without bias, the benchmark shapes) and three alternating rounds of the forward alone."""
import json
import os

import torch
from common import OUT, median_ms
import sparton_resident_lockstep as LOCKSTEP  # git show 1595d57:lsr/encode/sparton/fwd_resident.py
from lsr.encode.sparton import fwd_resident as SHIPPED

res = {"gpu": torch.cuda.get_device_name(), "parity": {}, "timing": {}}


def call(mod, h, e, b, mask, train):
    B, S, _ = h.shape
    pos = torch.arange(1, S + 1, dtype=torch.int32, device=h.device)
    lengths = torch.where(mask, pos, 0).amax(1).to(torch.int32)
    ok = mask.sum(1, dtype=torch.int32) == lengths  # rows with holes stay with the tl kernel
    y = torch.full((B, e.shape[0]), float("nan"), dtype=h.dtype, device=h.device)
    y32 = torch.full_like(y, float("nan"), dtype=torch.float32) if train else None
    arg = torch.full(y.shape, -7, dtype=torch.int32, device=h.device) if train else None
    mod.resident_fwd(h, e, b, lengths, ok, y, y32, arg)
    return [t for t in (y, y32, arg) if t is not None], ok


def parity(name, h, e, b, mask, train):
    (ref, ok), (got, _) = call(LOCKSTEP, h, e, b, mask, train), call(SHIPPED, h, e, b, mask, train)
    res["parity"][name] = {"equal": all(torch.equal(x[ok], z[ok]) for x, z in zip(got, ref)),
                           "untouched": bool(torch.isnan(got[0][~ok].float()).all())}
    print(name, res["parity"][name], flush=True)


def mk(B, S, V, dt=torch.bfloat16, bias=True):
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(B, S, 768, device="cuda", dtype=dt, generator=g)
    e = (torch.randn(V, 768, device="cuda", generator=g) * 0.05).to(dt)
    return h, e, (torch.randn(V, device="cuda", generator=g) * 0.1) if bias else None


h, e, b = mk(7, 300, 3001)
m = torch.ones(7, 300, dtype=torch.bool, device="cuda")
m[1, 129:] = False; m[2, :] = False; m[3, 50:60] = False; m[4, :7] = False; m[5, 1:] = False; m[6, 256:] = False
h[0, 5] = h[0, 6]  # a tie across positions
parity("mixed7", h, e, b, m, True)
h, e, _ = mk(6, 512, 5003, dt=torch.float16, bias=False)
m = torch.zeros(6, 512, dtype=torch.bool, device="cuda")
m[0, :] = True; m[1, :1] = True; m[2, :300] = True; m[2, 10] = False; m[4, :129] = True; m[5, :200] = True
parity("odd6_fp16_train", h, e, None, m, True)
parity("odd6_fp16_infer", h, e, None, m, False)
for B, S, V, train in ((64, 512, 250002, True), (32, 512, 250002, False)):
    h, e, b = mk(B, S, V)
    b = b.to(torch.bfloat16)
    m = torch.ones(B, S, dtype=torch.bool, device="cuda")
    name = f"{B}x{S}x{V}_{'train' if train else 'infer'}"
    parity(name, h, e, b, m, train)
    t = {"lockstep": [], "warp_specialized": []}
    for _ in range(3):
        t["lockstep"].append(median_ms(lambda: call(LOCKSTEP, h, e, b, m, train)))
        t["warp_specialized"].append(median_ms(lambda: call(SHIPPED, h, e, b, m, train)))
    res["timing"][name] = t
    print(name, t, flush=True)
json.dump(res, open(os.path.join(OUT, "ab_fwd.json"), "w"), indent=1)
