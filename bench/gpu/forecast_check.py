#!/usr/bin/env python3
"""`allocdoc forecast` against a real GPU (run by bench/gpu/run.sh; NOT YET RUN on a GPU).

A small Transformer in plain torch (a training step: forward, backward, AdamW) trained on a run of
variable sequence lengths, on a card made small with torch.cuda.set_per_process_memory_fraction:
  1. records one step at length 128 and 256 (allocdoc.capture.record_sizes: a warm-up each);
  2. writes a run of STEPS steps of lengths drawn from 64..512 in steps of 64 (seeded, the longest
     rare, as a padded DataLoader over a long-tailed dataset makes them) and runs
     `allocdoc forecast` on a card without limit, then picks the card: between the largest step
     alone and the run's peak when the run ratchets above it, else 3 % below the largest step;
  3. runs `allocdoc forecast --capacity CARD` (defaults and expandable_segments:True);
  4. trains the run in a fresh process per config (PYTORCH_CUDA_ALLOC_CONF is read once per
     process) on the capped card, measuring memory_reserved() and max_memory_reserved() after
     each step and the step that runs out of memory;
  5. writes predicted against measured to OUT/compare.json and a summary to compare.txt.

usage: python3 bench/gpu/forecast_check.py OUT_DIR BIN
       python3 bench/gpu/forecast_check.py --child RUN_FILE FRACTION   (one measured run; JSON)
"""
import json
import os
import random
import subprocess
import sys

import tiny_lm

BATCH = 8
STEPS = int(os.environ.get("FORECAST_STEPS", "300"))
LENGTHS = list(range(64, 513, 64))
ES = "expandable_segments:True"


def model_and_step(torch):
    """The shared model's step (bench/gpu/tiny_lm.py) at length `length`, batch BATCH."""
    step = tiny_lm.model_and_step(torch)
    return lambda length: step(BATCH, length)


def child(run_file, fraction):
    import torch
    torch.cuda.set_per_process_memory_fraction(fraction)
    step = model_and_step(torch)
    run = [int(l) for l in open(run_file) if l.strip() and not l.startswith("#")]
    out = {"oom_step": None, "reserved_after_step": [], "max_reserved_after_step": []}
    for i, length in enumerate(run, 1):
        try:
            step(length)
            torch.cuda.synchronize()
        except torch.OutOfMemoryError as e:
            out["oom_step"] = i
            out["message"] = str(e).splitlines()[0][:300]
            break
        out["reserved_after_step"].append(torch.cuda.memory_reserved())
        out["max_reserved_after_step"].append(torch.cuda.max_memory_reserved())
    out["card"] = int(torch.cuda.get_device_properties(0).total_memory * fraction)
    print(json.dumps(out))


def forecast(binary, paths, run_file, capacity=None):
    args = [binary, "forecast", *paths, "--sizes", "128,256", "--run", run_file, "--knob", "length",
            "--conf", ES, "--format", "json"]
    if capacity:
        args += ["--capacity", str(capacity)]
    r = subprocess.run(args, capture_output=True, text=True)
    return json.loads(r.stdout)


def main():
    out, binary = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    import torch
    import allocdoc
    total = torch.cuda.get_device_properties(0).total_memory
    step = model_and_step(torch)
    paths = allocdoc.capture.record_sizes(step, sizes=[128, 256], directory=os.path.join(out, "recorded"),
                                          knob="length")
    del step
    torch.cuda.empty_cache()
    rng = random.Random(7)
    run = rng.choices(LENGTHS, weights=[1 / l for l in LENGTHS], k=STEPS)
    run_file = os.path.join(out, "run.txt")
    with open(run_file, "w") as f:
        f.write(f"# {STEPS} steps of lengths {LENGTHS}, weights 1/length, seed 7\n")
        f.writelines(f"{l}\n" for l in run)
    free = forecast(binary, paths, run_file)
    d = free["configs"][0]
    alone, peak = d["step_peak_reserved_bytes"], d["peak_reserved_bytes"]
    card = (alone + peak) // 2 if peak > alone * 1.01 else int(alone * 0.97)
    pred = forecast(binary, paths, run_file, card)
    json.dump({"free": free, "card": pred}, open(os.path.join(out, "forecast.json"), "w"), indent=1)
    rows = []
    for c in pred["configs"]:
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=c["conf"])
        m = subprocess.run([sys.executable, __file__, "--child", run_file, str(card / total)], env=env,
                           capture_output=True, text=True, timeout=420)
        measured = json.loads(m.stdout.strip().splitlines()[-1]) if m.returncode == 0 else {"error": m.stderr[-500:]}
        rows.append({"conf": c["conf"], "predicted_oom_step": (c["oom"] or {}).get("step"),
                     "predicted_peak_reserved_unlimited": next(x["peak_reserved_bytes"] for x in free["configs"]
                                                               if x["conf"] == c["conf"]),
                     "predicted_peak_reserved_on_card": c["card_peak_reserved_bytes"],
                     "predicted_reserved_after_step": c["reserved_after_step"], "measured": measured})
    json.dump({"card": card, "total": total, "rows": rows}, open(os.path.join(out, "compare.json"), "w"), indent=1)
    with open(os.path.join(out, "compare.txt"), "w") as f:
        f.write(f"card {card} bytes ({card / total:.4f} of the GPU); largest step alone {alone}, run peak {peak}\n")
        for x in rows:
            m = x["measured"]
            top = max(m.get("max_reserved_after_step") or [0])
            f.write(f"{x['conf'] or '(defaults)':28} OOM step {m.get('oom_step')} (pred {x['predicted_oom_step']})  "
                    f"max reserved {top} (pred on card {x['predicted_peak_reserved_on_card']})\n")
    print(open(os.path.join(out, "compare.txt")).read())


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], float(sys.argv[3]))
    else:
        main()
