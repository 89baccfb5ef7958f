#!/usr/bin/env python3
"""One answer: diagnose and recommend on every eval text give the same cause and the same line
(the recommendation value as a set of keys). Prints each text where they differ.

    scripts/one_answer.py BIN
"""
import json,subprocess,sys,glob,os
b=sys.argv[1]; diff=0; n=0
for f in sorted(glob.glob('fixtures/eval/*.txt')):
    n+=1
    d=json.loads(subprocess.run([b,'diagnose',f,'--format','json'],capture_output=True,text=True).stdout)
    r=subprocess.run([b,'recommend',f,'--format','json'],capture_output=True,text=True)
    try: rj=json.loads(r.stdout)
    except Exception: print('noparse',f); continue
    dl=(d.get('recommendation') or {}).get('value')
    if 'not_replayed' in rj: rl=((rj.get('answer') or {}).get('recommendation') or {}).get('value')
    else: rl=(rj.get('recommendation') or {}).get('value')
    key=lambda v: sorted(v.split(',')) if v else None
    if key(dl)!=key(rl) or d.get('cause')!=(rj.get('answer') or {}).get('cause'):
        diff+=1; print('DIFF',os.path.basename(f),'diagnose',dl,d.get('cause'),'| recommend',rl,(rj.get('answer') or {}).get('cause'),'exit',r.returncode)
print(f'{diff} of {n} differ')
