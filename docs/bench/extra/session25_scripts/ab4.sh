#!/bin/bash
# dE live flags from the prep kernel: base (.old/base = 902f095) vs this tree, one call. $OUT/ab4.json
set -u
mkdir -p /tmp/ab
run() { # tree tag shape active
  (cd "$1" && python scripts/bench_head.py --only train --shapes "$3" --skip compile,eager,tiled,unchunked,det,_dh_part \
     --active "$4" --rep 100 --out /tmp/ab/$2 > /tmp/ab/$2.log 2>&1) || echo "FAIL $2"
}
for r in 1 2; do
  run .old/base base_t_$r 128x512x30522 1.0
  run . new_t_$r 128x512x30522 1.0
done
run .old/base base_r 64x512x250002 1.0
run . new_r 64x512x250002 1.0
run .old/base base_a 64x512x250002 0.01
run . new_a 64x512x250002 0.01
python - <<'PY'
import json, glob, os
out = {}
for f in sorted(glob.glob('/tmp/ab/*/bench_head*.json')):
    tag = f.split('/')[3]
    d = json.load(open(f))
    out[tag] = {"gpu": d.get('environment', {}).get('device'), "rows": d['rows']}
json.dump(out, open(os.environ['OUT'] + '/ab4.json', 'w'), indent=1)
keys = ('sparton', 'sparton_fwd_only', 'sparton_bwd_only', 'sparton_bwd_de_part', 'gemm_floor')
print(f"{'tag':10s} " + ' '.join(f'{k[7:19] or k:>12s}' for k in keys))
for tag, doc in out.items():
    ms = {r['impl']: r['ms'] for r in doc['rows']}
    print(f"{tag:10s} " + ' '.join(f'{ms[k]:12.3f}' if isinstance(ms.get(k), (int, float)) else f'{"-":>12s}' for k in keys))
PY
