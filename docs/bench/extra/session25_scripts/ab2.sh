#!/bin/bash
# A/B of the forward split: base tree (.old/base = 75c8dca) vs this tree, alternating, one call. Writes $OUT/ab2.json
set -u
mkdir -p /tmp/ab
run() { # tree tag only shape
  (cd "$1" && python scripts/bench_head.py --only "$3" --shapes "$4" --skip compile,eager,tiled,unchunked,det,_part \
     --rep 100 --out /tmp/ab/$2 > /tmp/ab/$2.log 2>&1) || echo "FAIL $2"
}
for r in 1 2; do
  run .old/base base_r_$r train 64x512x250002
  run . new_r_$r train 64x512x250002
done
run .old/base base_f30k fwd 320x512x30522
run . new_f30k fwd 320x512x30522
run .old/base base_t30k train 128x512x30522
run . new_t30k train 128x512x30522
python - <<'PY'
import json, glob, os
out = {}
for f in sorted(glob.glob('/tmp/ab/*/bench_head*.json')):
    tag = f.split('/')[3]
    d = json.load(open(f))
    out[tag] = [{k: r.get(k) for k in ('mode', 'B', 'S', 'V', 'impl', 'ms', 'peak_extra_mb', 'status')} for r in d['rows']]
json.dump(out, open(os.environ['OUT'] + '/ab2.json', 'w'), indent=1)
keys = ('sparton', 'sparton_head', 'sparton_fwd_only', 'sparton_bwd_only', 'gemm_floor')
print(f"{'tag':12s} " + ' '.join(f'{k[:14]:>14s}' for k in keys))
for tag, rows in out.items():
    ms = {r['impl']: r['ms'] for r in rows}
    print(f"{tag:12s} " + ' '.join(f'{ms[k]:14.2f}' if isinstance(ms.get(k), (int, float)) else f'{"-":>14s}' for k in keys))
PY
