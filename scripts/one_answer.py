#!/usr/bin/env python3
"""One answer: diagnose and recommend on every eval text give the same cause and the same line
(the recommendation value as a set of keys), and `validate --conf LINE` on the line diagnose
prints does not call it failing (exit 1). Prints each text where they differ.

    scripts/one_answer.py BIN
"""
import json, subprocess, sys, glob, os

b = sys.argv[1]
diff = fails = n = 0
key = lambda v: sorted(v.split(',')) if v else None
for f in sorted(glob.glob('fixtures/eval/*.txt')):
    n += 1
    d = json.loads(subprocess.run([b, 'diagnose', f, '--format', 'json'], capture_output=True, text=True).stdout)
    r = subprocess.run([b, 'recommend', f, '--format', 'json'], capture_output=True, text=True)
    try:
        rj = json.loads(r.stdout)
    except Exception:
        print('noparse', f)
        continue
    dl = (d.get('recommendation') or {}).get('value')
    if 'not_replayed' in rj:
        rl = ((rj.get('answer') or {}).get('recommendation') or {}).get('value')
    else:
        rl = (rj.get('recommendation') or {}).get('value')
    if key(dl) != key(rl) or d.get('cause') != (rj.get('answer') or {}).get('cause'):
        diff += 1
        print('DIFF', os.path.basename(f), 'diagnose', dl, d.get('cause'), '| recommend', rl,
              (rj.get('answer') or {}).get('cause'), 'exit', r.returncode)
    if dl is not None:
        v = subprocess.run([b, 'validate', f, '--conf', dl, '--format', 'json'], capture_output=True, text=True)
        if v.returncode == 1:
            fails += 1
            verdict = (json.loads(v.stdout).get('verdict') or '')[:160] if v.stdout else v.stderr[:160]
            print('FAILS', os.path.basename(f), 'validate --conf', dl, 'exit 1:', verdict)
print(f'{diff} of {n} differ; validate fails the line diagnose prints on {fails}')
