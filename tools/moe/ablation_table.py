#!/usr/bin/python3
"""Summarises MoE ablation runs: ablation_table.py OUT NAME... reads OUT/NAME/metrics.jsonl of each run and prints a
markdown table and one JSON line per run.

Columns: the final validation loss; MaxVio (max over MoE layers of max_j load_j / mean - 1) at the last step and its
mean over the last 100 steps; load variance (mean over experts of (f - 1)^2, max over layers) likewise; the drop rate
(dropped rows / (T k), mean over layers) over the last 100 steps; the aux loss's mean over the last 100 steps."""

import json
import sys


def summarise(path):
    train, val = [], None
    with open(path) as f:
        for line in f:
            j = json.loads(line)
            if j["kind"] == "train":
                train.append(j)
            elif j["kind"] == "eval":
                val = j["val_loss"]
    tail = train[-100:]

    def mean(key):
        vals = [t[key] for t in tail if t.get(key) is not None]
        return sum(vals) / len(vals) if vals else float("nan")

    return {
        "steps": train[-1]["step"],
        "val_loss": val,
        "max_vio_last": train[-1]["moe/max_vio"],
        "max_vio_mean100": mean("moe/max_vio"),
        "load_var_last": train[-1]["moe/load_var"],
        "load_var_mean100": mean("moe/load_var"),
        "drop_rate_mean100": mean("moe/drop_rate"),
        "aux_loss_mean100": mean("aux_loss"),
        "tokens_per_s": train[-1]["tokens_per_s"],
    }


def main():
    out, names = sys.argv[1], sys.argv[2:]
    rows = {n: summarise(f"{out}/{n}/metrics.jsonl") for n in names}
    print("| balance | steps | val loss | MaxVio (last) | MaxVio (mean, last 100) | load var (last) "
          "| load var (mean, last 100) | drop rate (mean, last 100) | tok/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n, r in rows.items():
        print(f"| {n} | {r['steps']} | {r['val_loss']:.4f} | {r['max_vio_last']:.3f} | {r['max_vio_mean100']:.3f} "
              f"| {r['load_var_last']:.4f} | {r['load_var_mean100']:.4f} | {r['drop_rate_mean100']:.4f} "
              f"| {r['tokens_per_s']:.0f} |")
    for n, r in rows.items():
        print(json.dumps({"case": n, **r}))


if __name__ == "__main__":
    main()
