#!/usr/bin/env python3
"""PyTorch reference for moetrain's bench_attn_window: sliding-window attention with g global tokens in
FlexAttention (torch.nn.attention.flex_attention, compiled to Triton), the way a PyTorch user writes it.

  bench_attn_window_torch.py [--t-list 8192,...] [--w 4096] [--g 4] [--h 16] [--d 128] [--tokens 131072]

The g global keys and values are prepended to the key sequence (positions 0..g-1) and every query sees them plus
the keys t - w < s <= t of its own sequence (mask_mod); the block mask skips the other tiles, as moetrain's kernel
does. No sink logit (FlexAttention has no denominator term). Each length runs B = tokens / T rows; the figure is
the median of CUDA-event timings after warm-up (the compile happens there). Prints one JSON line per length with
the forward, backward and ns per token, and the peak memory. Runs on the device's own PyTorch 2.x (CUDA); it is not
part of the CPU test suite.
"""

import argparse
import json

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from train_harness import median_cuda_ms  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--t-list", default="8192,16384,32768,65536,131072")
    ap.add_argument("--w", type=int, default=4096)
    ap.add_argument("--g", type=int, default=4)
    ap.add_argument("--h", type=int, default=16)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    w, g = args.w, args.g
    compiled = torch.compile(flex_attention)

    def mask_mod(b, h, q_idx, kv_idx):
        local = kv_idx - g
        return (kv_idx < g) | ((local <= q_idx) & (q_idx - local < w))

    for t in [int(x) for x in args.t_list.split(",")]:
        b = max(1, args.tokens // t)
        torch.cuda.reset_peak_memory_stats()
        opts = dict(device="cuda", dtype=torch.bfloat16)
        q = torch.randn(b, args.h, t, args.d, **opts, requires_grad=True)
        k = torch.randn(b, args.h, t + g, args.d, **opts, requires_grad=True)
        v = torch.randn(b, args.h, t + g, args.d, **opts, requires_grad=True)
        dout = torch.randn(b, args.h, t, args.d, **opts)
        block_mask = create_block_mask(mask_mod, B=None, H=None, Q_LEN=t, KV_LEN=t + g, device="cuda", _compile=True)
        fwd_ms = median_cuda_ms(lambda: compiled(q, k, v, block_mask=block_mask), args.warmup, args.iters)

        def fwd_bwd():
            out = compiled(q, k, v, block_mask=block_mask)
            out.backward(dout)

        both_ms = median_cuda_ms(fwd_bwd, args.warmup, args.iters)
        line = {
            "bench": "attn_window",
            "impl": "pytorch-flex_attention (torch.compile) " + torch.__version__,
            "B": b,
            "T": t,
            "w": w,
            "g": g,
            "Hq": args.h,
            "Hkv": args.h,
            "D": args.d,
            "window_fwd_ms": fwd_ms,
            "window_bwd_ms": both_ms - fwd_ms,
            "window_ns_per_token": both_ms * 1e6 / (b * t),
            "peak_bytes": torch.cuda.max_memory_allocated(),
        }
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
