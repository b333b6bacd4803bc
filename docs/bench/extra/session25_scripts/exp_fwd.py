"""Throwaway: where does the 250K forward's time go? (ceilings, epilogue cost, warp specialization, gluon API)"""
import json, os, sys, time, inspect
import torch, triton, triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor
sys.path.insert(0, os.getcwd())
from lsr.encode.sparton.fwd_padded import triton_sparton_fwd
from lsr.utils.kernels import grouped_program_ids, fold_row_max

res = {"triton": triton.__version__, "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}

def bench(fn, rep=20, warm=3):
    for _ in range(warm): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(rep):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record(); fn(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))
    ts.sort(); return ts[len(ts)//2]

@triton.jit
def fwd_var(h_desc, e_desc, y_ptr, arg_ptr, B, S, V, D, EPI: tl.constexpr, WS: tl.constexpr,
            BLOCK_V: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, GROUP_B: tl.constexpr):
    b, vt = grouped_program_ids(tl.program_id(0), B, tl.cdiv(V, BLOCK_V), GROUP_B)
    offs_v = vt * BLOCK_V + tl.arange(0, BLOCK_V)
    run_max = tl.full([BLOCK_V], float("-inf"), tl.float32)
    run_arg = tl.zeros([BLOCK_V], tl.int32)
    acc = tl.zeros([BLOCK_V, BLOCK_S], tl.float32)
    keep = tl.arange(0, BLOCK_S) >= 0
    for s0 in tl.range(0, S, BLOCK_S, warp_specialize=WS):
        if EPI > 0:
            acc = tl.zeros([BLOCK_V, BLOCK_S], tl.float32)
        for d0 in range(0, D, BLOCK_D):
            e = e_desc.load([vt * BLOCK_V, d0])
            h = tl.trans(h_desc.load([b * S + s0, d0]))
            acc = tl.dot(e, h, acc)
        if EPI == 1:
            run_max = tl.maximum(run_max, tl.max(acc, axis=1))
        if EPI == 2:
            run_max, run_arg = fold_row_max(acc, keep, run_max, run_arg, s0, True)
    if EPI == 0:
        run_max = tl.max(acc, axis=1)
    out = b.to(tl.int64) * V + offs_v
    tl.store(y_ptr + out, run_max, mask=offs_v < V)
    if EPI == 2:
        tl.store(arg_ptr + out, run_arg, mask=offs_v < V)

def main():
    B, S, V, D = 64, 512, 250002, 768
    torch.manual_seed(0)
    dev = "cuda"
    h = torch.randn(B, S, D, device=dev, dtype=torch.bfloat16)
    e = (torch.randn(V, D, device=dev) * 0.05).to(torch.bfloat16)
    mask = torch.ones(B, S, dtype=torch.bool, device=dev)
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16); bm = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    t = bench(lambda: a @ bm, rep=10); res["cublas_8192^3_ms"] = t; res["cublas_8192^3_tflops"] = 2*8192**3/t/1e9
    del a, bm
    hf = h.view(B*S, D)
    t = bench(lambda: e @ hf.t(), rep=5); res["cublas_EHt_ms"] = t; res["cublas_EHt_tflops"] = 2*B*S*V*D/t/1e9
    torch.cuda.empty_cache()
    t = bench(lambda: triton_sparton_fwd(h, e, None, mask, need_fp32=True), rep=10); res["fwd_train_ms"] = t
    t = bench(lambda: triton_sparton_fwd(h, e, None, mask, need_fp32=False, need_argmax=False), rep=10); res["fwd_infer_ms"] = t
    y = torch.empty(B, V, device=dev); arg = torch.empty(B, V, dtype=torch.int32, device=dev)
    for (bv, bs, bd, w, st) in [(256, 128, 64, 8, 3), (256, 128, 64, 8, 4), (128, 128, 64, 8, 4), (128, 256, 64, 8, 3)]:
        hd = TensorDescriptor.from_tensor(hf, [bs, bd]); ed = TensorDescriptor.from_tensor(e, [bv, bd])
        for epi in (0, 1, 2):
            for ws in (False, True):
                key = f"var_{bv}x{bs}x{bd}_w{w}_s{st}_epi{epi}_ws{int(ws)}"
                try:
                    f = lambda: fwd_var[(B * triton.cdiv(V, bv),)](hd, ed, y, arg, B, S, V, D, EPI=epi, WS=ws, BLOCK_V=bv,
                                         BLOCK_S=bs, BLOCK_D=bd, GROUP_B=8, num_warps=w, num_stages=st)
                    res[key] = bench(f, rep=5, warm=1)
                except Exception as ex:
                    res[key] = f"ERR {type(ex).__name__}: {str(ex)[:200]}"
                print(key, res[key], flush=True)
    try:
        import triton.experimental.gluon.language as gl
        import triton.experimental.gluon.language.nvidia.hopper as hp
        res["gluon_hopper"] = dir(hp)
        res["gluon_gl"] = [n for n in dir(gl) if not n.startswith("_")]
        res["gluon_tma"] = dir(hp.tma); res["gluon_mbarrier"] = dir(hp.mbarrier)
        for name in ("warpgroup_mma", "warpgroup_mma_wait"):
            res["sig_" + name] = str(inspect.signature(getattr(hp, name)))
        res["sig_warp_specialize"] = str(inspect.signature(gl.warp_specialize))
        res["sig_tma_copy"] = str(inspect.signature(hp.tma.async_copy_global_to_shared))
        res["sig_alloc_smem"] = str(inspect.signature(gl.allocate_shared_memory))
        res["gluon_files"] = os.listdir(os.path.dirname(gl.__file__))
    except Exception as ex:
        res["gluon"] = f"ERR {ex}"
    out = os.environ.get("OUT", "/tmp")
    json.dump(res, open(f"{out}/exp_fwd.json", "w"), indent=1)
    for k, v in res.items():
        if not isinstance(v, list): print(k, v)

if __name__ == "__main__":
    main()
