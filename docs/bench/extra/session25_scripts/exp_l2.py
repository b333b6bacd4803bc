"""Throwaway: L2 read bandwidth (TMA tiles and plain loads from a buffer that fits L2) and the forward's epilogue
cost, interleaved rounds. Writes $OUT/exp_l2.json."""
import json, os, sys
import torch, triton, triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor
sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), ".old/exp"))
from lsr.encode.sparton.fwd_padded import triton_sparton_fwd
from exp_fwd import fwd_var, bench  # noqa: E402  (exp_fwd runs main() on import: guarded below)

@triton.jit
def l2_tma(desc, out_ptr, N_TILES, ITERS, BM: tl.constexpr, BK: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BM, BK], tl.float32)
    for i in range(ITERS):
        t = (pid * 7 + i) % N_TILES
        acc += desc.load([t * BM, 0]).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))

def main():
    res = {"gpu": torch.cuda.get_device_name()}
    # 16 MB buffer (fits L2), tiles [128, 64] bf16 = 16 KB
    BM, BK = 128, 64
    n_tiles = 16 * 2**20 // (BM * BK * 2)
    buf = torch.randn(n_tiles * BM, BK, device="cuda").to(torch.bfloat16)
    desc = TensorDescriptor.from_tensor(buf, [BM, BK])
    out = torch.empty(132 * 64, device="cuda")
    iters = 512
    for progs in (132 * 4, 132 * 8, 132 * 16):
        for w in (4, 8):
            t = bench(lambda: l2_tma[(progs,)](desc, out, n_tiles, iters, BM=BM, BK=BK, num_warps=w, num_stages=4), rep=20)
            res[f"l2_tma_p{progs}_w{w}_TBps"] = progs * iters * BM * BK * 2 / t / 1e9
            print(f"l2_tma p{progs} w{w}", res[f"l2_tma_p{progs}_w{w}_TBps"], flush=True)
    B, S, V, D = 64, 512, 250002, 768
    torch.manual_seed(0)
    h = torch.randn(B, S, D, device="cuda", dtype=torch.bfloat16)
    e = (torch.randn(V, D, device="cuda") * 0.05).to(torch.bfloat16)
    mask = torch.ones(B, S, dtype=torch.bool, device="cuda")
    hf = h.view(B * S, D)
    y = torch.empty(B, V, device="cuda"); arg = torch.empty(B, V, dtype=torch.int32, device="cuda")
    hd = TensorDescriptor.from_tensor(hf, [128, 64]); ed = TensorDescriptor.from_tensor(e, [256, 64])
    fns = {f"epi{epi}": (lambda epi=epi: fwd_var[(B * triton.cdiv(V, 256),)](hd, ed, y, arg, B, S, V, D, EPI=epi, WS=False,
            BLOCK_V=256, BLOCK_S=128, BLOCK_D=64, GROUP_B=8, num_warps=8, num_stages=3)) for epi in (0, 1, 2)}
    fns["real_train"] = lambda: triton_sparton_fwd(h, e, None, mask, need_fp32=True)
    fns["real_infer"] = lambda: triton_sparton_fwd(h, e, None, mask, need_argmax=False)
    fns["cublas_EHt"] = lambda: e @ hf.t()
    for r in range(3):
        for k, f in fns.items():
            res.setdefault(k, []).append(bench(f, rep=20))
    for k in fns:
        v = sorted(res[k]); print(f"{k:12s} median {v[1]:.2f} ms  all {['%.2f' % x for x in res[k]]}")
    json.dump(res, open(os.environ.get("OUT", "/tmp") + "/exp_l2.json", "w"), indent=1)

if __name__ == "__main__":
    main()
