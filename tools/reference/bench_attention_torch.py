#!/usr/bin/env python3
"""Causal attention forward + backward with PyTorch's SDPA on the GPU: the comparison row of bench/bench_attention.cpp.

F.scaled_dot_product_attention(is_causal=True) on bf16 [B, H, T, D] tensors (the flash backend PyTorch picks for
this shape; the backend is pinned with sdpa_kernel so a fallback shows as an error, not as a slow figure), forward and
forward + backward timed with CUDA events, median of the timed iterations. FLOPs as bench_attention counts them (the
FlashAttention convention): forward 4 B Hq T^2 D / 2, backward 2.5x the forward. Cases: MHA B8 T4096 H16 D128, GQA
(Hkv = 4, enable_gqa), and the same FLOPs at D = 64 (H = 32). Peak device memory over each case beside it.

  python3 tools/reference/bench_attention_torch.py [--iters 20] [--warmup 3]
"""
import argparse
import json

import torch
import torch.nn.functional as F
from train_harness import median_cuda_ms  # noqa: E402


def bench_case(b, t, hq, hkv, d, warmup, iters):
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(b, hq, t, d, device=dev, dtype=dt, requires_grad=True)
    k = torch.randn(b, hkv, t, d, device=dev, dtype=dt, requires_grad=True)
    v = torch.randn(b, hkv, t, d, device=dev, dtype=dt, requires_grad=True)
    dout = torch.randn(b, hq, t, d, device=dev, dtype=dt)
    gqa = hkv != hq
    backends = [torch.nn.attention.SDPBackend.FLASH_ATTENTION, torch.nn.attention.SDPBackend.CUDNN_ATTENTION]

    def fwd():
        with torch.nn.attention.sdpa_kernel(backends):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

    def fwd_bwd():
        for x in (q, k, v):
            x.grad = None
        fwd().backward(dout)

    torch.cuda.reset_peak_memory_stats()
    fwd_ms = median_cuda_ms(fwd, warmup, iters)
    fwd_bwd_ms = median_cuda_ms(fwd_bwd, warmup, iters)
    fwd_flops = 4.0 * b * hq * t * t * d / 2
    line = {
        "bench": "attention", "impl": f"pytorch {torch.__version__} SDPA (flash/cudnn)", "dtype": "bf16",
        "causal": True, "b": b, "t": t, "hq": hq, "hkv": hkv, "d": d, "fwd_ms": fwd_ms, "fwd_bwd_ms": fwd_bwd_ms,
        "fwd_tflops": fwd_flops / fwd_ms * 1e-9, "fwd_bwd_tflops": 3.5 * fwd_flops / fwd_bwd_ms * 1e-9,
        "peak_device_bytes": torch.cuda.max_memory_allocated(), "iters": iters,
        "device": torch.cuda.get_device_name(),
    }
    print(json.dumps(line), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"bench": "attention", "impl": "pytorch", "skipped": "no CUDA device"}))
        return
    bench_case(8, 4096, 16, 16, 128, a.warmup, a.iters)
    bench_case(8, 4096, 16, 4, 128, a.warmup, a.iters)
    bench_case(8, 4096, 32, 32, 64, a.warmup, a.iters)


if __name__ == "__main__":
    main()
