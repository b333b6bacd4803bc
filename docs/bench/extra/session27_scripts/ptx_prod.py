import subprocess, sys
import torch
exec(open(".old/exp/compile36.py").read().split("sys.path.insert")[0])
sys.path.insert(0, ".")
from lsr.encode.sparton import fwd_resident as R
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
B, S, V = 4, 256, 1000
for D in (768, 512, 384):
  for dt, gdt in ((torch.bfloat16, gl.bfloat16), (torch.float16, gl.float16)):
    for flags in ((True, True, True), (False, False, False)):
      if dt == torch.float16 and D != 768: continue
      h = torch.empty(B * S, D, dtype=dt); e = torch.empty(V, D, dtype=dt)
      ed = TensorDescriptor.from_tensor(e, [128, 64], gl.NVMMASharedLayout.get_default_for([128, 64], gdt))
      hd = TensorDescriptor.from_tensor(h, [128, 64], gl.NVMMASharedLayout.get_default_for([128, 64], gdt))
      i32 = torch.empty(10, dtype=torch.int32); y = torch.empty(B, V, dtype=dt); f = torch.empty(B, V)
      k = R._resident_fwd_kernel.warmup(ed, hd, i32, i32, i32, i32, f, y, f, i32, S, V, V, HAS_BIAS=flags[0], STORE_FP32=flags[1],
            STORE_ARGMAX=flags[2], NUM_K=D // 64, REG_K=2, STAGES=R.ring_stages(D // 64, 2), CONSUMER_REGS=R.CONSUMER_REGS,
            PRODUCER_REGS=R.PRODUCER_REGS, num_warps=4, maxnreg=R.MAXNREG, grid=(1,))
      open("/tmp/p.ptx", "w").write(k.asm["ptx"])
      out = subprocess.run(["/tmp/t36/triton/backends/nvidia/bin/ptxas", "-arch=sm_90a", "-v", "/tmp/p.ptx", "-o", "/tmp/p.cubin"], capture_output=True, text=True).stderr
      print(D, dt, flags, "shared", k.metadata.shared, [l.strip() for l in out.splitlines() if "spill" in l or "warn" in l.lower()], flush=True)
