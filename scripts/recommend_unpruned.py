#!/usr/bin/env python3
# Usage: scripts/recommend_unpruned.py BIN TRACE RECOMMEND_JSON [CAPACITY] (from `BIN recommend TRACE --capacity CAPACITY --format json`;
# CAPACITY defaults to 80GiB)
# Every config of a recommend JSON replayed on its own (allocdoc replay, unbounded), ranked like
# RunFigures::rank then fewer keys; compared with recommend's ranking.
import json, subprocess, sys, functools
binary, trace, rec = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
capacity = sys.argv[4] if len(sys.argv) > 4 else '80GiB'
confs = [c['conf'] for c in rec['candidates']]
runs = {}
for c in confs:
    out = subprocess.run([binary, 'replay', trace, '--capacity', capacity, '--conf', c, '--format', 'json'],
                         capture_output=True, text=True).stdout  # exit 1: the run ran out of memory
    r = json.loads(out)['runs'][0]
    runs[c] = r
def keys(c): return 0 if c == '' else len(c.split(','))
def cmp(a, b):
    ra, rb = runs[a], runs[b]
    oa, ob = ra['oom'], rb['oom']
    if oa is None and ob is not None: return -1
    if oa is not None and ob is None: return 1
    if oa is not None and ob is not None and oa['event_index'] != ob['event_index']:
        return -1 if oa['event_index'] > ob['event_index'] else 1
    ka = (ra['peak_reserved_bytes'], ra['device_allocs'] + ra['device_frees'], ra['alloc_retries'], ra['synchronizations'], keys(a))
    kb = (rb['peak_reserved_bytes'], rb['device_allocs'] + rb['device_frees'], rb['alloc_retries'], rb['synchronizations'], keys(b))
    return (ka > kb) - (ka < kb)
full = sorted(confs, key=functools.cmp_to_key(cmp))  # stable, like Rust's sort_by
fields = ['oom', 'peak_reserved_bytes', 'peak_allocated_bytes', 'device_allocs', 'device_frees', 'alloc_retries', 'synchronizations', 'events']
finished = [c for c in rec['candidates'] if 'stopped_early_at_event' not in c]
print('winner: recommend', repr(rec['candidates'][0]['conf']), 'unpruned', repr(full[0]))
same_figs = all(all(c[f] == runs[c['conf']][f] for f in fields) for c in finished)
print('finished configs', len(finished), 'figures equal to their own unbounded run:', same_figs)
order = [c for c in full if c in {x['conf'] for x in finished}]
print('finished in the unpruned order:', order == [c['conf'] for c in finished])
stopped = [c['conf'] for c in rec['candidates'] if 'stopped_early_at_event' in c]
print('stopped', len(stopped), 'all below the unpruned winner:', all(full.index(c) > 0 for c in stopped))
