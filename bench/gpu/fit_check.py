#!/usr/bin/env python3
"""`allocdoc fit` against a real GPU (run by bench/gpu/run.sh; NOT YET RUN on a GPU).

A small Transformer in plain torch (a training step: forward, backward, AdamW), on a card made
small with torch.cuda.set_per_process_memory_fraction:
  1. records one step at batch 2 and batch 4 (allocdoc.capture.record_sizes: a warm-up each);
  2. runs `allocdoc fit` on them: the predicted peaks at batch 8, 16 and 24, and the largest batch
     that fits the capped card under the defaults and under expandable_segments:True;
  3. runs each of those batches, and the predicted largest and one above it, in a fresh process
     per config (PYTORCH_CUDA_ALLOC_CONF is read once per process), measuring
     max_memory_allocated(), max_memory_reserved() and whether it ran out of memory;
  4. writes predicted against measured to OUT/fit/compare.json and a table to compare.txt.

usage: python3 bench/gpu/fit_check.py OUT_DIR BIN
       python3 bench/gpu/fit_check.py --child BATCH FRACTION   (one measured run; prints JSON)
"""
import json
import os
import subprocess
import sys

import tiny_lm

SEQ = 512
FRACTION = float(os.environ.get("FIT_FRACTION", "0.05"))  # of the card: ~7 GiB of an H200


def model_and_step(torch):
    """The shared model's step (bench/gpu/tiny_lm.py) at batch `batch`, length SEQ."""
    step = tiny_lm.model_and_step(torch)
    return lambda batch: step(batch, SEQ)


def child(batch, fraction):
    import torch
    torch.cuda.set_per_process_memory_fraction(fraction)
    step = model_and_step(torch)
    out = {"batch": batch, "oom": False}
    try:
        step(batch)  # warm-up, as recorded
        torch.cuda.reset_peak_memory_stats()
        step(batch)
        torch.cuda.synchronize()
    except torch.OutOfMemoryError as e:
        out["oom"] = True
        out["message"] = str(e).splitlines()[0][:300]
    out["max_allocated"] = torch.cuda.max_memory_allocated()
    out["max_reserved"] = torch.cuda.max_memory_reserved()
    out["card"] = int(torch.cuda.get_device_properties(0).total_memory * fraction)
    print(json.dumps(out))


def main():
    out, binary = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    import torch
    import allocdoc
    torch.cuda.set_per_process_memory_fraction(FRACTION)
    card = int(torch.cuda.get_device_properties(0).total_memory * FRACTION)
    step = model_and_step(torch)
    paths = allocdoc.capture.record_sizes(step, sizes=[2, 4], directory=os.path.join(out, "recorded"), knob="batch")
    del step
    torch.cuda.empty_cache()
    es = "expandable_segments:True"
    r = subprocess.run([binary, "fit", *paths, "--sizes", "2,4", "--knob", "batch", "--at", "8,16,24",
                        "--capacity", str(card), "--conf", es, "--format", "json"], capture_output=True, text=True)
    pred = json.loads(r.stdout)
    json.dump(pred, open(os.path.join(out, "fit.json"), "w"), indent=1)
    largest = {l["conf"]: l["size"] for l in pred["largest"]}
    sizes = sorted({8, 16, 24} | {s for s in largest.values() if s} | {s + 1 for s in largest.values() if s})
    rows = []
    for conf in ("", es):
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf)
        for b in sizes:
            c = subprocess.run([sys.executable, __file__, "--child", str(b), str(FRACTION)], env=env,
                               capture_output=True, text=True, timeout=300)
            measured = json.loads(c.stdout.strip().splitlines()[-1]) if c.returncode == 0 else {"error": c.stderr[-500:]}
            p = next((p for p in pred["predictions"] if p["size"] == b), None)
            pc = next((x for x in (p or {}).get("configs", []) if x["conf"] == conf), None)
            rows.append({"conf": conf, "batch": b, "measured": measured,
                         "predicted_allocated": (p or {}).get("peak_allocated_bytes"),
                         "predicted_reserved": (pc or {}).get("peak_reserved_bytes"),
                         "predicted_oom": None if pc is None else pc.get("oom") is not None,
                         "predicted_largest": largest.get(conf)})
    json.dump({"card": card, "fraction": FRACTION, "rows": rows}, open(os.path.join(out, "compare.json"), "w"), indent=1)
    with open(os.path.join(out, "compare.txt"), "w") as f:
        f.write(f"card {card} bytes ({FRACTION} of the GPU); largest predicted: {largest}\n")
        for x in rows:
            m = x["measured"]
            f.write(f"{x['conf'] or '(defaults)':28} batch {x['batch']:4}  allocated {m.get('max_allocated')} "
                    f"(pred {x['predicted_allocated']})  reserved {m.get('max_reserved')} (pred {x['predicted_reserved']})  "
                    f"oom {m.get('oom')} (pred {x['predicted_oom']})\n")
    print(open(os.path.join(out, "compare.txt")).read())


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(int(sys.argv[2]), float(sys.argv[3]))
    else:
        main()
