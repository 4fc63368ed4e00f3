#!/usr/bin/env python3
"""The MoE layer of bench/bench_moe.cpp in PyTorch, timed on the GPU: the comparison row of docs/PERFORMANCE.md.

sigmoid router (bf16 GEMM, f32 scores), top-k of the scores, gates normalised over the selected experts times 2.5,
permutation by a stable argsort of the expert ids, the three expert GEMMs with torch._grouped_mm (device-side
offsets, no host synchronisation), SwiGLU, and the gate-weighted combine (a batched [1, k] x [k, d] product per
token). Forward and forward + backward (autograd; bf16 parameters and gradients, and f32 master parameters cast to
bf16 in the forward with f32 gradients, which is what moetrain's layer keeps: its f32 weight gradients are read and
written by every dw product, about 4x the bytes of a written bf16 gradient) are timed with CUDA events, median over
the timed iterations; one JSON line per case, the fields of bench_moe. The cases of bench_moe: 64 and 256
experts of width --ffn, and 1024 experts of width --ffn-1024 (256). torch._grouped_mm takes at most 1024 groups
(PyTorch 2.11: "Can't process more than 1024 groups" at E = 1024), so above GROUP_LIMIT experts each product runs as
several calls of GROUP_LIMIT experts, their row ranges cut at the plan's offsets (one host read per call: what a
PyTorch user of that limit would write); the JSON line says how many calls.

  python3 tools/reference/bench_moe_torch.py [--iters 10] [--warmup 3] [--tokens 16384] [--d 2048] [--ffn 1024]
      [--ffn-1024 256]
"""
import argparse
import json

import torch
import torch.nn.functional as F
from train_harness import median_cuda_ms  # noqa: E402


GROUP_LIMIT = 512  # experts per torch._grouped_mm call when E exceeds the library's limit


def grouped_mm(xp, w, offs):
    """xp [R, K] rows grouped by expert, w [E, M, K]: y_e = x_e w_e^T, in calls of at most GROUP_LIMIT experts."""
    e = w.shape[0]
    if e <= GROUP_LIMIT:
        return torch._grouped_mm(xp, w.transpose(-2, -1), offs=offs)
    outs, start = [], 0
    for g0 in range(0, e, GROUP_LIMIT):
        g1 = min(e, g0 + GROUP_LIMIT)
        end = int(offs[g1 - 1])
        outs.append(torch._grouped_mm(xp[start:end], w[g0:g1].transpose(-2, -1), offs=offs[g0:g1] - start))
        start = end
    return torch.cat(outs)


def moe_forward(x, w_router, w_gate, w_up, w_down, top_k, scale):
    t, d = x.shape
    e = w_router.shape[0]
    scores = torch.sigmoid((x @ w_router.t()).float())
    sel_scores, idx = torch.topk(scores, top_k, dim=-1)
    gates = scale * sel_scores / (sel_scores.sum(-1, keepdim=True) + 1e-20)
    flat = idx.flatten()
    order = torch.argsort(flat, stable=True)  # rows grouped by expert, (token, slot) order within an expert
    offs = torch.cumsum(torch.bincount(flat, minlength=e), 0).to(torch.int32)
    xp = x[order // top_k]
    hg = grouped_mm(xp, w_gate, offs)
    hu = grouped_mm(xp, w_up, offs)
    yp = grouped_mm(F.silu(hg) * hu, w_down, offs)
    y_slots = yp[torch.argsort(order)].view(t, top_k, d)  # back to slot order
    return torch.bmm(gates.to(x.dtype).unsqueeze(1), y_slots).squeeze(1)



def bench_case(t, d, f, e, k, target_ms, warmup, iters, master):
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    pt = torch.float32 if master == "f32" else dt  # the parameters' (and so the weight gradients') dtype
    x = torch.randn(t, d, device=dev, dtype=dt, requires_grad=True)
    w_router = (0.02 * torch.randn(e, d, device=dev)).to(pt).requires_grad_()
    w_gate = (0.02 * torch.randn(e, f, d, device=dev)).to(pt).requires_grad_()
    w_up = (0.02 * torch.randn(e, f, d, device=dev)).to(pt).requires_grad_()
    w_down = (0.02 / 7.0 * torch.randn(e, d, f, device=dev)).to(pt).requires_grad_()
    dout = 1e-2 * torch.randn(t, d, device=dev, dtype=dt)
    params = (w_router, w_gate, w_up, w_down)

    def fwd():
        # f32 master weights: cast to bf16 in the forward, as autocast does; their gradients come back f32.
        return moe_forward(x, *[p.to(dt) for p in params], k, 2.5)

    def fwd_bwd():
        for p in (x,) + params:
            p.grad = None
        fwd().backward(dout)

    fwd_ms = median_cuda_ms(fwd, warmup, iters)
    fwd_bwd_ms = median_cuda_ms(fwd_bwd, warmup, iters)
    fwd_flops = 3 * 2 * t * k * d * f + 2 * t * d * e
    line = {
        "bench": "moe", "impl": f"pytorch {torch.__version__} torch._grouped_mm", "dtype": "bf16",
        "params": "f32 (cast to bf16 in the forward; f32 gradients)" if master == "f32" else "bf16 (bf16 gradients)",
        "T": t, "d": d, "F": f, "E": e, "k": k, "fwd_ms": fwd_ms, "fwd_bwd_ms": fwd_bwd_ms,
        "fwd_tflops": fwd_flops / fwd_ms * 1e-9, "fwd_bwd_tflops": 3 * fwd_flops / fwd_bwd_ms * 1e-9,
        "target_fwd_bwd_ms": target_ms, "iters": iters, "device": torch.cuda.get_device_name(),
        "grouped_mm_calls_per_product": (e + GROUP_LIMIT - 1) // GROUP_LIMIT if e > GROUP_LIMIT else 1,
    }
    print(json.dumps(line), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--d", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--ffn-1024", type=int, default=256, help="expert width of the 1024-expert case")
    ap.add_argument("--master", default="bf16,f32",
                    help="parameter dtypes to run, comma-separated: bf16 (bf16 gradients, written) and/or f32 (f32 "
                         "master weights cast in the forward, f32 gradients, as moetrain's mixed precision keeps)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"bench": "moe", "impl": "pytorch", "skipped": "no CUDA device"}))
        return
    for master in a.master.split(","):
        bench_case(a.tokens, a.d, a.ffn, 64, a.top_k, 12.0, a.warmup, a.iters, master)
        bench_case(a.tokens, a.d, a.ffn, 256, a.top_k, 0.0, a.warmup, a.iters, master)
        bench_case(a.tokens, a.d, a.ffn_1024, 1024, a.top_k, 0.0, a.warmup, a.iters, master)


if __name__ == "__main__":
    main()
