"""Compile-only check of the Gluon kernel against triton 3.6 on a CPU host (fake CUDA target)."""
import sys, torch, triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.driver import CudaDriver
import triton.runtime.driver as drv

class Fake(CudaDriver):
    def __init__(self):
        self.utils = None
    def get_current_target(self): return GPUTarget("cuda", 90, 32)
    def get_current_device(self): return 0
    def get_current_stream(self, device=None): return 0
    def get_device_capability(self, device=0): return (9, 0)
    def get_active_torch_device(self): return torch.device("cpu")
    @staticmethod
    def is_active(): return True
drv.driver.set_active(Fake()) if hasattr(drv, "driver") and hasattr(drv.driver, "set_active") else triton.runtime.driver.set_active(Fake())
sys.path.insert(0, ".")
from lsr.encode.sparton import fwd_resident as R
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
B, S, V, D = 4, 256, 1000, 768
bs, bk, st, rk = [int(x) for x in sys.argv[1:5]]
h = torch.empty(B * S, D, dtype=torch.bfloat16); e = torch.empty(V, D, dtype=torch.bfloat16)
ed = TensorDescriptor.from_tensor(e, [128, bk], gl.NVMMASharedLayout.get_default_for([128, bk], gl.bfloat16))
hd = TensorDescriptor.from_tensor(h, [bs, bk], gl.NVMMASharedLayout.get_default_for([bs, bk], gl.bfloat16))
i32 = torch.empty(10, dtype=torch.int32); y = torch.empty(B, V, dtype=torch.bfloat16); f = torch.empty(B, V)
k = R._resident_fwd_kernel.warmup(ed, hd, i32, i32, i32, f, y, f, i32, S, V, V, HAS_BIAS=True, STORE_FP32=True,
        STORE_ARGMAX=True, NUM_K=D // bk, REG_K=rk, STAGES=st, EXP_EPI=int(sys.argv[5]), num_warps=8, grid=(1,))
print("shared", k.metadata.shared, "regs?", getattr(k, "n_regs", None))
open(f"/tmp/gl_{bs}_{bk}_{st}_{rk}.ptx", "w").write(k.asm["ptx"])
open(f"/tmp/gl_{bs}_{bk}_{st}_{rk}.ttgir", "w").write(k.asm["ttgir"])
