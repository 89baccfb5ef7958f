#!/usr/bin/env python3
"""Groups the outputs scripts/verdict_diff.sh found changed by the issue-26 item (or issue 25/27 change) that explains them.

    scripts/verdict_causes.py OLDDIR NEWDIR   # the two directories of `verdict_diff.sh run`
"""
import json,os,sys,collections
old,new=sys.argv[1],sys.argv[2]
def load(p):
    try: return json.load(open(p))
    except Exception: return None
def flat(v,pre=""):
    if isinstance(v,dict):
        for k,x in v.items(): yield from flat(x,f"{pre}.{k}" if pre else k)
    elif isinstance(v,list):
        for i,x in enumerate(v): yield from flat(x,f"{pre}[{i}]")
    else: yield pre,v
cats=collections.defaultdict(list)
for cmd in ("validate","recommend"):
    for f in sorted(os.listdir(f"{old}/{cmd}")):
        if not f.endswith(".json"): continue
        o,n=f"{old}/{cmd}/{f}",f"{new}/{cmd}/{f}"
        ro=open(o[:-5]+".rc").read().strip(); rn=open(n[:-5]+".rc").read().strip()
        a,b=load(o),load(n)
        if open(o).read()==open(n).read() and ro==rn: continue
        fa=dict(flat(a)) if a else {}; fb=dict(flat(b)) if b else {}
        ch={k for k in set(fa)|set(fb) if fa.get(k,'<absent>')!=fb.get(k,'<absent>')}
        top={k.split('.')[0].split('[')[0] for k in ch}
        name=f.replace('.json','')
        if rn=='5': c="exit %s->5: nothing to replay (item 1)"%ro
        elif ro=='1' and rn=='0' and b and 'No OOM to avoid' in (b.get('verdict') or ''): c="exit 1->0: a summary with no OOM keeps the config in use (item 1)"
        elif rn=='4' and ro!='4': c="exit %s->4: uncertain (item 4: no cudaMalloc/cudaFree differs, or too few plausible workloads)"%ro
        elif ro!=rn: c=f"exit {ro}->{rn}: other"
        elif any(k.startswith('answer.diagnosis') or k.startswith('answer.cause') for k in ch): c="same exit, the rules' diagnosis changed (issues 25/27: every device's OOM, observer dumps as full cards, device errors, fills)"
        elif any(k.startswith('candidates[') for k in ch) and a and b and len(a.get('candidates',[]))!=len(b.get('candidates',[])): c="same exit, a different search space (item 3: one PyTorch version; 2.0+ read as 2.6)"
        elif any(k.startswith('candidates[') or k.startswith('search') for k in ch): c="same exit, candidates ranked or replayed differently (item 5: failures ranked by how far they got; bisection past the request)"
        elif 'verdict' in ch or 'strength' in ch: c="same exit, verdict wording (item 2/8: one sentence first, details below; no contradictions)"
        elif any('events' in k for k in ch): c="same exit, the runs the verdict judged (item 2: validate shows the continued probe)"
        elif any(k.startswith('answer') for k in ch): c="same exit, the rules' answer text (overrides/recommendation wording)"
        else: c="other: "+",".join(sorted(top))
        cats[c].append(f"{cmd} {name}")
for c,v in sorted(cats.items(),key=lambda x:-len(x[1])):
    print(f"{len(v):4d}  {c}\n       e.g. {v[0]}" + (f"; {v[1]}" if len(v)>1 else ""))
