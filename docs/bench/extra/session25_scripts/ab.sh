#!/bin/bash
# A/B of the backward: base tree (.old/base) vs this tree, alternating, one call. Writes $OUT/ab.json
set -u
mkdir -p /tmp/ab
run() { # tree tag shape active
  (cd "$1" && python scripts/bench_head.py --only train --shapes "$3" --skip compile,eager,tiled,unchunked,det \
     --active "$4" --rep 100 --out /tmp/ab/$2 > /tmp/ab/$2.log 2>&1) || echo "FAIL $2"
}
for r in 1 2; do
  run .old/base base_r_$r 64x512x250002 1.0
  run . new_r_$r 64x512x250002 1.0
done
run .old/base base_a 64x512x250002 0.01
run . new_a 64x512x250002 0.01
run .old/base base_30k 128x512x30522 1.0
run . new_30k 128x512x30522 1.0
python - <<'PY'
import json, glob, os
out = {}
for f in sorted(glob.glob('/tmp/ab/*/bench_head*.json')):
    tag = f.split('/')[3]
    d = json.load(open(f))
    rows = d.get('rows', d)
    out[tag] = [{k: r.get(k) for k in ('mode', 'B', 'S', 'V', 'impl', 'ms', 'peak_extra_mb', 'status')} for r in rows]
json.dump(out, open(os.environ['OUT'] + '/ab.json', 'w'), indent=1)
print(f"{'tag':14s} " + ' '.join(f'{k[:14]:>14s}' for k in ('fwdbwd', 'fwd_only', 'bwd_only', 'dh_part', 'de_part')))
for tag, rows in out.items():
    ms = {r['impl']: r['ms'] for r in rows}
    vals = [ms.get(k) for k in ('sparton', 'sparton_fwd_only', 'sparton_bwd_only', 'sparton_bwd_dh_part', 'sparton_bwd_de_part')]
    print(f"{tag:14s} " + ' '.join(f'{v:14.2f}' if isinstance(v, (int, float)) else f'{str(v):>14s}' for v in vals))
PY
