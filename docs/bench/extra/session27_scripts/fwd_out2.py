"""The shipped forward (one MMA group in flight) against a copy with two (sparton_res_exp.py, out2=True): parity and
three alternating rounds at 64x512x250002 with the training outputs."""
import json
import os

import torch
from common import OUT, head_case, median_ms
import sparton_res_exp as RX
from lsr.encode.sparton import fwd_resident as R

B, S, V = 64, 512, 250002
c = head_case(B, S, V)
lengths = torch.full((B,), S, dtype=torch.int32, device="cuda")
lengths[3], lengths[10] = 200, 0
ok = torch.ones(B, dtype=torch.bool, device="cuda")
outs = []
for fn in (lambda *o: R.resident_fwd(c["h"], c["w"], c["bias"], lengths, ok, *o),
           lambda *o: RX.resident_fwd(c["h"], c["w"], c["bias"], lengths, ok, *o, out2=True)):
    o = (torch.empty(B, V, dtype=torch.bfloat16, device="cuda"), torch.empty(B, V, device="cuda"),
         torch.empty(B, V, dtype=torch.int32, device="cuda"))
    fn(*o)
    outs.append(o)
res = {"gpu": torch.cuda.get_device_name(), "equal": all(torch.equal(x, z) for x, z in zip(*outs)),
       "ms": {"wait1": [], "wait2": []}}
for _ in range(3):
    res["ms"]["wait1"].append(median_ms(lambda: R.resident_fwd(c["h"], c["w"], c["bias"], lengths, ok, *outs[0])))
    res["ms"]["wait2"].append(median_ms(lambda: RX.resident_fwd(c["h"], c["w"], c["bias"], lengths, ok, *outs[0],
                                                                out2=True)))
json.dump(res, open(os.path.join(OUT, "fwd_out2.json"), "w"), indent=1)
print(res)
