#!/usr/bin/env python3
"""Muon in PyTorch, written from ../shared/spec/muon.md §1 (not from moetrain's C++): the golden reference of
tests/optim/muon_golden_test.cpp.

    python3 tools/reference/muon.py IN.json OUT.json

IN holds the hyperparameters and, per case, a stack of matrices W [E, A, B] (f32 values) and the gradients of
several steps; OUT gets W after those steps (and the momentum), computed in float32 (float64 with "dtype": "f64")."""
import json
import math
import sys

import torch


def newton_schulz(g, steps, hybrid):
    """muon.md §1: X0 = G / (||G||_F + 1e-7), transposed when A > B; X <- a X + (b X X^T + c (X X^T)^2) X."""
    tall = g.size(0) > g.size(1)
    x = g / (g.norm() + 1e-7)
    if tall:
        x = x.T
    for k in range(10 if hybrid else steps):
        a, b, c = (2.0, -1.5, 0.5) if hybrid and k >= 8 else (3.4445, -4.7750, 2.0315)
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def muon_step(w, g, m, h):
    """One step on one matrix: Moonlight's momentum form, Nesterov, decoupled decay, the 0.2 sqrt(max(A, B)) scale."""
    m.mul_(h["momentum"]).add_(g)
    n = g + h["momentum"] * m if h["nesterov"] else m
    o = newton_schulz(n, h["ns_steps"], h["hybrid"])
    w.mul_(1.0 - h["lr"] * h["weight_decay"])
    w.add_(o, alpha=-h["lr"] * h["scale_factor"] * math.sqrt(max(w.size(0), w.size(1))))


def main():
    with open(sys.argv[1]) as f:
        job = json.load(f)
    h = job["hyper"]
    dtype = torch.float64 if job.get("dtype") == "f64" else torch.float32
    out = []
    for case in job["cases"]:
        shape = case["shape"]
        w = torch.tensor(case["w"], dtype=dtype).reshape(shape)
        m = torch.zeros_like(w)
        for grad in case["grads"]:
            g = torch.tensor(grad, dtype=dtype).reshape(shape)
            for e in range(shape[0]):
                muon_step(w[e], g[e], m[e], h)
        out.append({"w": w.flatten().tolist(), "m": m.flatten().tolist()})
    with open(sys.argv[2], "w") as f:
        json.dump({"cases": out}, f)


if __name__ == "__main__":
    main()
