"""dH tile A/B at 64x512x250002 (random weights): BLOCK_N 32 vs 64, alternating rounds in one process."""
import json, os, sys
import torch
sys.path.insert(0, os.getcwd())
from lsr.encode.sparton import bwd as sb
from lsr.encode.sparton.fwd_padded import triton_sparton_fwd
sys.path.insert(0, os.path.join(os.getcwd(), ".old/exp"))
from gl_bench import bench
B, S, V = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "64x512x250002").split("x")]
D = 768
ACTIVE = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
torch.manual_seed(0)
h = torch.randn(B, S, D, device="cuda", dtype=torch.bfloat16)
w = (torch.randn(V, D, device="cuda") * 0.05).to(torch.bfloat16)
m = torch.ones(B, S, dtype=torch.bool, device="cuda")
dy = torch.randn(B, V, device="cuda", dtype=torch.bfloat16)
bias = torch.randn(V, device="cuda") * 0.1
bias[torch.rand(V, device="cuda") >= ACTIVE] = -100.0
_, y32, arg = triton_sparton_fwd(h, w, bias.to(torch.bfloat16), m, need_fp32=True)
res = {"gpu": torch.cuda.get_device_name(), "ms": {}}
ref = None
for tile in ((32, 128), (64, 128)):
    sb._DH_TILE = tile
    dh = sb.triton_sparton_bwd(dy, h, w, y32, arg, need_dw=False, need_db=False, deterministic=True)[0]
    if ref is None: ref = dh
    res[f"equal_det_{tile}"] = bool(torch.equal(dh, ref))
    res[f"maxdiff_{tile}"] = float((dh.float() - ref.float()).abs().max())
for r in range(3):
    for tile in ((32, 128), (64, 128)):
        sb._DH_TILE = tile
        res["ms"].setdefault(str(tile), []).append(bench(lambda: sb.triton_sparton_bwd(dy, h, w, y32, arg, need_dw=False, need_db=False), rep=10))
        res["ms"].setdefault("all_" + str(tile), []).append(bench(lambda: sb.triton_sparton_bwd(dy, h, w, y32, arg), rep=10))
res["case"] = [B, S, V, ACTIVE]
json.dump(res, open(os.environ.get("OUT", "/tmp") + f"/dh_ab_{B}x{S}x{V}_{ACTIVE}.json", "w"), indent=1)
print(B, S, V, ACTIVE, {k: [round(x, 3) for x in v] for k, v in res["ms"].items()})
