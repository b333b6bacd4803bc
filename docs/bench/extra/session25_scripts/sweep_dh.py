"""Throwaway: the backward's parts at 64x512x250002 (random weights) and a dH tile sweep. $OUT/sweep_dh.json"""
import json, os, sys, itertools
import torch, triton
sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lsr.encode.sparton.fwd_padded import triton_sparton_fwd
from lsr.encode.sparton import bwd as sb

from exp_fwd import bench  # the runs used a local copy of it with warm=2 (rep as passed)

def main():
    B, S, V, D = 64, 512, 250002, 768
    torch.manual_seed(0)
    h = torch.randn(B, S, D, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(V, D, device="cuda") * 0.05).to(torch.bfloat16)
    m = torch.ones(B, S, dtype=torch.bool, device="cuda")
    dy = torch.randn(B, V, device="cuda", dtype=torch.bfloat16)
    _, y32, arg = triton_sparton_fwd(h, w, None, m, need_fp32=True)
    res = {"gpu": torch.cuda.get_device_name()}
    res["bwd_all"] = bench(lambda: sb.triton_sparton_bwd(dy, h, w, y32, arg))
    res["bwd_dh_only"] = bench(lambda: sb.triton_sparton_bwd(dy, h, w, y32, arg, need_dw=False, need_db=False))
    res["bwd_de_only"] = bench(lambda: sb.triton_sparton_bwd(dy, h, w, y32, arg, need_dh=False))
    results = {}
    for rows in (16, 32):
        n_groups = triton.cdiv(B * S, rows)
        g = torch.empty(B, V, device="cuda")
        counts = torch.zeros(n_groups + 1, dtype=torch.int32, device="cuda")
        def prep():
            counts.zero_()
            sb._bwd_prep_kernel[(B, triton.cdiv(V, 1024))](dy, y32, arg, g, counts[1:], S, V, dy.stride(0), COUNT=True,
                                                           ROWS=rows, BLOCK=1024)
        res[f"prep_rows{rows}"] = bench(prep)
        prep()
        offsets = torch.cumsum(counts, 0, dtype=torch.int32)
        tv = torch.empty(B * V, dtype=torch.int32, device="cuda"); gs = torch.empty(B * V, device="cuda")
        def bucket():
            cursor = offsets[:-1].clone()
            sb._bwd_bucket_kernel[(B, triton.cdiv(V, 1024))](g, arg, cursor, tv, gs, S, V, ROWS=rows, TAG=31 - rows.bit_length() + 1, BLOCK=1024)
        res[f"bucket_rows{rows}"] = bench(bucket)
        bucket()
        ref = None
        for bn, bd, warps, st in itertools.product((16, 32, 64), (64, 128, 256), (4, 8), (2, 3)):
            if rows * bd // (32 * warps) < 2 and warps == 8:
                continue
            dh = torch.empty_like(h)
            f = lambda: sb._bwd_dh_kernel[(n_groups, triton.cdiv(D, bd))](w, tv, gs, offsets, dh, D, B * S, w.stride(0),
                    INPUT_PRECISION="tf32x3", SPLIT_BF16=True, DOT_FP32=False, NUM_STAGES=st, ROWS=rows, TAG=31 - rows.bit_length() + 1,
                    BLOCK_N=bn, BLOCK_D=bd, num_warps=warps)
            try:
                t = bench(f, rep=10)
            except Exception as ex:
                results[f"r{rows}_n{bn}_d{bd}_w{warps}_s{st}"] = f"ERR {type(ex).__name__}"
                continue
            if ref is None:
                ref = dh.float().clone()
            err = (dh.float() - ref).abs().max().item() / (ref.abs().max().item())
            results[f"r{rows}_n{bn}_d{bd}_w{warps}_s{st}"] = [t, err]
    res["dh_sweep"] = results
    json.dump(res, open(os.environ.get("OUT", "/tmp") + "/sweep_dh.json", "w"), indent=1)
    for k, v in res.items():
        if k != "dh_sweep": print(k, v)
    best = sorted((v[0], k) for k, v in results.items() if isinstance(v, list))
    for t, k in best[:10]: print(f"{k:24s} {t:.3f} err {results[k][1]:.1e}")
    print("current r16_n32_d128_w4_s2", results.get("r16_n32_d128_w4_s2"))

main()
