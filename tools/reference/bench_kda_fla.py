#!/usr/bin/env python3
"""fla's chunk_kda (flash-linear-attention, Triton) timed like bench/bench_kda.cpp: the KDA row of the performance
issue's table, run in the same device call as moetrain's.

  bench_kda_fla.py --fla .fla [--iters 5] [--warmup 2] [--h 16] [--k 128] [--v 128]

Cases (B, T) = (8, 4096), (1, 32768), (2, 65536), H heads of K = V = 128, bf16 q, k, v, beta and gate input, the safe
lower-bounded gate (safe_gate=True, lower_bound=-5, the gate computed in the kernel from the raw input with A_log and
dt_bias, as Kimi Linear calls it), q/k L2-normalised in the kernel, beta's sigmoid in the kernel, no initial state.
Forward and forward + backward are timed with CUDA events (median). kept_bytes_per_token_head is what the forward
keeps for the backward: torch.cuda.memory_allocated after the forward (autograd's saved tensors and the output)
minus before, less the output itself, per token and head. peak_extra_bytes_per_token_head is the peak of memory
allocated during one forward + backward above what was allocated before it, less the output and the input gradients
(bench_kda's figure of the same name excludes its preallocated outputs and gradients too). One JSON line per case.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import einops_shim  # noqa: E402
from train_harness import median_cuda_ms  # noqa: E402


def bench_case(chunk_kda, b, t, h, kd, vd, warmup, iters):
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(b, t, h, kd, device=dev, dtype=dt).requires_grad_()
    k = torch.randn(b, t, h, kd, device=dev, dtype=dt).requires_grad_()
    v = torch.empty(b, t, h, vd, device=dev, dtype=dt).uniform_(-2, 2).requires_grad_()
    g = torch.randn(b, t, h, kd, device=dev, dtype=dt).requires_grad_()
    beta = torch.randn(b, t, h, device=dev, dtype=dt).requires_grad_()
    a_log = torch.zeros(h, device=dev, dtype=torch.float32, requires_grad=True)
    dt_bias = torch.zeros(h * kd, device=dev, dtype=torch.float32, requires_grad=True)
    dout = torch.randn(b, t, h, vd, device=dev, dtype=dt)
    inputs = (q, k, v, g, beta, a_log, dt_bias)

    def fwd():
        o, _ = chunk_kda(q=q, k=k, v=v, g=g, beta=beta, A_log=a_log, dt_bias=dt_bias, use_qk_l2norm_in_kernel=True,
                         use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=-5.0)
        return o

    def fwd_bwd():
        for x in inputs:
            x.grad = None
        fwd().backward(dout)

    with torch.no_grad():
        fwd()
    fwd_bwd()  # compiles and autotunes the Triton kernels
    fwd_ms = median_cuda_ms(lambda: fwd().detach(), warmup, iters)
    fwd_bwd_ms = median_cuda_ms(fwd_bwd, warmup, iters)
    for x in inputs:
        x.grad = None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    o = fwd()
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - before - o.numel() * o.element_size()
    del o
    for x in inputs:
        x.grad = None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fwd_bwd()
    torch.cuda.synchronize()
    grads = sum(x.numel() * x.element_size() for x in inputs)
    out_bytes = b * t * h * vd * 2
    peak_extra = torch.cuda.max_memory_allocated() - before - grads - out_bytes
    for x in inputs:
        x.grad = None
    tokens = b * t
    print(json.dumps({
        "bench": "kda", "impl": "fla chunk_kda (Triton), safe_gate lower_bound -5", "dtype": "bf16", "B": b, "T": t,
        "H": h, "K": kd, "V": vd, "fwd_ms": fwd_ms, "fwd_bwd_ms": fwd_bwd_ms,
        "fwd_bwd_tokens_per_s": tokens / fwd_bwd_ms * 1e3, "kept_bytes_per_token_head": kept / (tokens * h),
        "peak_extra_bytes_per_token_head": peak_extra / (tokens * h), "peak_extra_gib": peak_extra / 2**30,
        "iters": iters, "device": torch.cuda.get_device_name(), "torch": torch.__version__}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fla", required=True, help="directory holding fla/ (flash-linear-attention's package)")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--h", type=int, default=16)
    ap.add_argument("--k", type=int, default=128)
    ap.add_argument("--v", type=int, default=128)
    a = ap.parse_args()
    sys.path.insert(0, os.path.abspath(a.fla))
    einops_shim.install()
    from fla.ops.kda import chunk_kda
    for b, t in ((8, 4096), (1, 32768), (2, 65536)):
        bench_case(chunk_kda, b, t, a.h, a.k, a.v, a.warmup, a.iters)
    return 0


if __name__ == "__main__":
    sys.exit(main())
