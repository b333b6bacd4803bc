"""HEAD's backward (sparton_bwd_old.py) against the working tree's with a variant applied: outputs (dE / db equal,
dH close, deterministic mode equal) and three alternating rounds of the whole backward and of its dH part."""
import json
import os

import torch
from common import CASES, OUT, head_case, median_ms
import sparton_bwd_old as OLD  # git show cf3b413:lsr/encode/sparton/bwd.py
from lsr.encode.sparton import bwd as NEW

res = {"gpu": torch.cuda.get_device_name(), "cases": {}}
for case in CASES:
    c = head_case(*case)
    args = (c["dy"], c["h"], c["w"], c["y32"], c["arg"])
    o, n = OLD.triton_sparton_bwd(*args), NEW.triton_sparton_bwd(*args)
    od, nd = OLD.triton_sparton_bwd(*args, deterministic=True), NEW.triton_sparton_bwd(*args, deterministic=True)
    r = {"dE_equal": torch.equal(o[1], n[1]), "db_equal": torch.equal(o[2], n[2]),
         "dH_maxdiff": float((o[0].float() - n[0].float()).abs().max()),
         "det_all_equal": all(torch.equal(a, b) for a, b in zip(od, nd)), "old": [], "new": [], "old_dh": [], "new_dh": []}
    for _ in range(3):
        for name, mod in (("old", OLD), ("new", NEW)):
            r[name].append(median_ms(lambda: mod.triton_sparton_bwd(*args)))
            r[name + "_dh"].append(median_ms(lambda: mod.triton_sparton_bwd(*args, need_dw=False, need_db=False)))
    res["cases"][c["key"]] = r
    print(c["key"], r, flush=True)
json.dump(res, open(os.path.join(OUT, "bwd_ab.json"), "w"), indent=1)
