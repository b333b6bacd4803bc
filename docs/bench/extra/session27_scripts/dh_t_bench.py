"""The dH kernel transposed (sparton_bwd_dh_transposed.diff: dHᵀ = Eᵀ·W with M = BLOCK_D, so triton emits wgmma reading
the gathered tile from shared memory) against the shipped one, alone on the same buckets, over 44 tiles."""
import itertools
import json
import os

import torch
import triton
from common import CASES, OUT, SB, buckets, median_ms, shipped_dh

res = {"gpu": torch.cuda.get_device_name(), "cases": {}}
for case in CASES:
    c, (o16, v16, g16), ref, shipped = shipped_dh(case)
    h, w, g, arg = c["h"], c["w"], c["g"], c["arg"]
    B, S, _ = h.shape
    r = {"shipped": shipped, "t": {}}
    dh = torch.empty_like(h)
    for rows in (16, 32):
        o, vs, gs = (o16, v16, g16) if rows == 16 else buckets(g, arg, S, rows)
        for bn, bd, warps, st in itertools.product((32, 64, 128), (128, 256), (4, 8), (2, 3)):
            if bd == 256 and warps == 4 and bn == 128:
                continue
            run = lambda: SB._bwd_dh_kernel_t[(o.numel() - 1, triton.cdiv(768, bd))](
                w, vs, gs, o, dh, 768, B * S, 768, NUM_STAGES=st, ROWS=rows, TAG=27, BLOCK_N=bn, BLOCK_D=bd,
                num_warps=warps)
            run()
            r["t"][f"{rows},{bn},{bd},{warps},{st}"] = {"ms": median_ms(run),
                                                       "maxdiff": float((dh.float() - ref.float()).abs().max())}
    r["best"] = sorted(r["t"].items(), key=lambda kv: kv[1]["ms"])[:5]
    r["shipped2"] = [median_ms(lambda: SB._hidden_grads(h, w, v16, g16, o16)) for _ in range(2)]
    res["cases"][c["key"]] = r
    print(c["key"], r["shipped"] + r["shipped2"], r["best"][:3], flush=True)
json.dump(res, open(os.path.join(OUT, "dh_t.json"), "w"), indent=1)
