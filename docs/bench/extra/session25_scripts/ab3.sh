#!/bin/bash
# Session 25 start (beff6cf, .old/base) vs end (this tree), alternating three times at 64x512x250002. $OUT/ab3.json
set -u
mkdir -p /tmp/ab
run() { # tree tag shape active
  (cd "$1" && python scripts/bench_head.py --only train --shapes "$3" --skip compile,eager,tiled,unchunked,det \
     --active "$4" --rep 100 --out /tmp/ab/$2 > /tmp/ab/$2.log 2>&1) || echo "FAIL $2"
}
for r in 1 2 3; do
  run .old/base base_r_$r 64x512x250002 1.0
  run . new_r_$r 64x512x250002 1.0
done
run .old/base base_a 64x512x250002 0.01
run . new_a 64x512x250002 0.01
python - <<'PY'
import json, glob, os
out = {}
for f in sorted(glob.glob('/tmp/ab/*/bench_head*.json')):
    tag = f.split('/')[3]
    d = json.load(open(f))
    out[tag] = {"rows": d['rows'], "environment": d.get('environment')}
json.dump(out, open(os.environ['OUT'] + '/ab3.json', 'w'), indent=1)
keys = ('sparton', 'sparton_fwd_only', 'sparton_bwd_only', 'sparton_bwd_dh_part', 'sparton_bwd_de_part', 'gemm_floor')
print(f"{'tag':10s} " + ' '.join(f'{k[7:19] or k:>12s}' for k in keys) + '  peakMB')
for tag, doc in out.items():
    ms = {r['impl']: r['ms'] for r in doc['rows']}
    mb = {r['impl']: r['peak_extra_mb'] for r in doc['rows']}
    print(f"{tag:10s} " + ' '.join(f'{ms[k]:12.2f}' if isinstance(ms.get(k), (int, float)) else f'{"-":>12s}' for k in keys)
          + f"  {mb.get('sparton')}")
PY
