#!/usr/bin/env python3
"""Checks the controls of multimodal.md §6 on a shapes run's metrics.jsonl (docs/multimodal.md).

  check_controls.py METRICS MODE [--require CONTROL ...]

MODE image: the last eval line must show image use (eval/bound_ratio < 0.1, eval/exact_match >= 0.95), the zeroed and
shuffled views at >= 0.99 x their bound, and an exact match >= 0.95 for each of flipped, res112 and res336 that the run
logged; --require names controls that must have been logged. With --experts, the last train line carrying per-modality
expert loads (moe/modality/{image,text}/load/lNN) must give every expert of every MoE layer a token of each modality.
MODE twin: the text-only twin's eval/bound_ratio must lie in [0.99, 1.05].
Prints the figures it checked as one JSON line; exit 1 naming every control that failed.
"""

import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("metrics")
    ap.add_argument("mode", choices=["image", "twin"])
    ap.add_argument("--require", nargs="*", default=[])
    ap.add_argument("--experts", action="store_true")
    ap.add_argument("--name", default="")
    a = ap.parse_args()
    lines = [json.loads(l) for l in open(a.metrics)]
    evals = [l for l in lines if l.get("kind") == "eval"]
    if not evals:
        print(f"{a.metrics}: no eval line", file=sys.stderr)
        return 1
    e = evals[-1]
    shown = {k: round(v, 4) for k, v in e.items() if k.startswith("eval/") and isinstance(v, float)}
    bad = []
    if a.mode == "twin":
        r = e["eval/bound_ratio"]
        if not 0.99 <= r <= 1.05:
            bad.append(f"text-only twin: bound_ratio {r:.4f} outside [0.99, 1.05]")
    else:
        if not e["eval/bound_ratio"] < 0.1:
            bad.append(f"image use: bound_ratio {e['eval/bound_ratio']:.4f} >= 0.1")
        if not e["eval/exact_match"] >= 0.95:
            bad.append(f"image use: exact_match {e['eval/exact_match']:.4f} < 0.95")
        for c in a.require:
            if f"eval/{c}/loss" not in e:
                bad.append(f"{c}: not logged")
        for c in ("zeroed", "shuffled"):
            k = f"eval/{c}/bound_ratio"
            if k in e and not e[k] >= 0.99:
                bad.append(f"{c}: bound_ratio {e[k]:.4f} < 0.99")
        for c in ("flipped", "res112", "res336"):
            k = f"eval/{c}/exact_match"
            if k in e and not e[k] >= 0.95:
                bad.append(f"{c}: exact_match {e[k]:.4f} < 0.95")
    if a.experts:
        def modality_loads(line):
            return {k: v for k, v in line.items() if k.startswith("moe/modality/") and "/load/" in k}
        logged = [l for l in lines if l.get("kind") == "train" and modality_loads(l)]
        if not logged:
            bad.append("experts: no per-modality expert loads logged")
        else:
            loads = modality_loads(logged[-1])
            dead = {k: [i for i, n in enumerate(v) if n == 0] for k, v in loads.items()}
            dead = {k: v for k, v in dead.items() if v}
            shown["experts/step"] = logged[-1]["step"]
            shown["experts/min_load"] = min(min(v) for v in loads.values())
            if dead:
                bad.append(f"experts: dead experts {dead}")
    print(a.name or a.metrics, json.dumps(shown, sort_keys=True))
    if bad:
        print("FAIL: " + "; ".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
