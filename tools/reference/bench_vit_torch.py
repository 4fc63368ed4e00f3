#!/usr/bin/env python3
"""PyTorch baseline for moetrain's bench_vit: the same vision tower (ViT + projector, multimodal.md sections 1-2)
trained the way a PyTorch user would, forward and backward on one packed batch of images of mixed sizes.

  bench_vit_torch.py [--dim 1152] [--layers 27] [--heads 16] [--mlp 4304] [--patch 14] [--d-model 2048]
                     [--images 448x448,336x448,224x336,448x224] [--num-images 16] [--iters 10] [--warmup 3]
                     [--attn auto|varlen|flash_attn|loop|mask] [--compile] [--device cuda|cpu]

The model is tools/reference/vision.py's (its 2-D RoPE math is moetrain's): patch embedding, pre-norm blocks
(LayerNorm, q/k/v/o with biases, 2-D RoPE on q and k, bidirectional attention inside each image, GELU MLP), final
LayerNorm, 2x2 pixel shuffle, projector LayerNorm -> Linear -> GELU -> Linear. f32 parameters under bf16 autocast on
the GPU (f32 on the CPU). The packed images attend block-diagonally; --attn auto takes the first that runs a forward
and backward here: torch.nn.attention.varlen.varlen_attn (PyTorch's FlashAttention varlen), flash_attn's
flash_attn_varlen_func, SDPA per image in a loop, SDPA with a block-diagonal boolean mask (and plain softmax math
where SDPA is missing, as in Debian's torch 1.13). "impl" says which ran. --compile wraps each block and the
projector in torch.compile (compile time is spent in the warm-up). The forward includes the copy of the patches from
pinned host memory, as moetrain's forward copies them from the host.

Prints one JSON line with the fields of bench_vit (fwd_ms, bwd_ms, step_ms: medians of CUDA-event timings after the
warm-up; tflops from the same FLOPs formula, docs/PERFORMANCE.md "Vision"; peak_bytes: max_memory_allocated over one
step). Runs on the device's PyTorch 2.x; on the CPU only for tiny shapes (a check that it runs).
"""

import argparse
import contextlib
import json
import math
import time

import torch
import torch.nn.functional as F
from torch import nn


def parse_images(spec, patch, count):
    sizes = []
    for item in spec.split(","):
        h, w = (int(v) for v in item.split("x"))
        if h <= 0 or w <= 0 or h % (2 * patch) or w % (2 * patch):
            raise SystemExit(f"--images: {item} is not a multiple of two patches ({2 * patch} pixels) on both sides")
        sizes.append((h // patch, w // patch))
    n = count if count > 0 else len(sizes)
    return [sizes[i % len(sizes)] for i in range(n)]


def rope_tables(grids, head_dim, base, device):
    """cos and sin [P, 1, D/4] of the row angles and of the column angles (vision.py's rope2d)."""
    rows, cols = [], []
    for h, w in grids:
        rows += [r for r in range(h) for _ in range(w)]
        cols += [c for _ in range(h) for c in range(w)]
    q = head_dim // 4
    inv = base ** (-4.0 * torch.arange(q, dtype=torch.float64) / head_dim)
    out = []
    for idx in (rows, cols):
        ang = (torch.tensor(idx, dtype=torch.float64)[:, None] * inv[None, :]).float()[:, None, :]
        out += [torch.cos(ang).to(device), torch.sin(ang).to(device)]
    return out  # cos_r, sin_r, cos_c, sin_c


def rope2d(x, cos_r, sin_r, cos_c, sin_c):
    """x [P, H, D]: the first half of D rotates by the patch row, the second by its column (pairs (i, i + D/4))."""
    q = x.shape[-1] // 4
    x0, x1, x2, x3 = x[..., :q], x[..., q : 2 * q], x[..., 2 * q : 3 * q], x[..., 3 * q :]
    cr, sr, cc, sc = (t.to(x.dtype) for t in (cos_r, sin_r, cos_c, sin_c))
    return torch.cat([x0 * cr - x1 * sr, x1 * cr + x0 * sr, x2 * cc - x3 * sc, x3 * cc + x2 * sc], dim=-1)


class Packing:
    """How the attention sees the packed images: cu_seqlens, the spans, and (for --attn mask) the boolean mask."""

    def __init__(self, grids, device):
        lens = [h * w for h, w in grids]
        self.spans, at = [], 0
        for n in lens:
            self.spans.append((at, at + n))
            at += n
        self.cu = torch.tensor([0] + [b for _, b in self.spans], dtype=torch.int32, device=device)
        self.max_len = max(lens)
        self.total = at
        self.mask = None

    def block_mask(self, device):
        if self.mask is None:
            img = torch.cat([torch.full((b - a,), i) for i, (a, b) in enumerate(self.spans)]).to(device)
            self.mask = img[:, None] == img[None, :]
        return self.mask


def attn_math(q, k, v):
    """softmax(q k^T / sqrt(D)) v of [H, T, D] without SDPA (torch < 2.0)."""
    s = torch.einsum("hqd,hkd->hqk", q, k) / math.sqrt(q.shape[-1])
    return torch.einsum("hqk,hkd->hqd", torch.softmax(s.float(), dim=-1).to(v.dtype), v)


def sdpa(q, k, v, mask=None):
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if mask is not None:
        s = torch.einsum("hqd,hkd->hqk", q, k) / math.sqrt(q.shape[-1])
        s = s.float().masked_fill(~mask, float("-inf"))
        return torch.einsum("hqk,hkd->hqd", torch.softmax(s, dim=-1).to(v.dtype), v)
    return attn_math(q, k, v)


def make_attention(kind, pack):
    """q, k, v [P, H, D] -> [P, H, D], each image attending only to itself."""
    if kind == "varlen":
        from torch.nn.attention.varlen import varlen_attn

        return lambda q, k, v: varlen_attn(q, k, v, pack.cu, pack.cu, pack.max_len, pack.max_len)
    if kind == "flash_attn":
        from flash_attn import flash_attn_varlen_func

        return lambda q, k, v: flash_attn_varlen_func(q, k, v, pack.cu, pack.cu, pack.max_len, pack.max_len)
    if kind == "loop":

        def loop(q, k, v):
            outs = []
            for a, b in pack.spans:
                qi, ki, vi = (t[a:b].transpose(0, 1) for t in (q, k, v))  # [H, n, D]
                outs.append(sdpa(qi, ki, vi).transpose(0, 1))
            return torch.cat(outs)

        return loop
    if kind == "mask":
        return lambda q, k, v: sdpa(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), pack.block_mask(q.device)
        ).transpose(0, 1)
    raise SystemExit(f"--attn {kind}: not one of varlen, flash_attn, loop, mask")


class Block(nn.Module):
    def __init__(self, d, heads, mlp, eps):
        super().__init__()
        self.heads, self.eps = heads, eps
        self.norm1, self.norm2 = nn.LayerNorm(d, eps=eps), nn.LayerNorm(d, eps=eps)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(d, mlp), nn.Linear(mlp, d)

    def forward(self, x, rope, attention):
        P, d = x.shape
        h = self.norm1(x)
        q = rope2d(self.q(h).view(P, self.heads, d // self.heads), *rope)
        k = rope2d(self.k(h).view(P, self.heads, d // self.heads), *rope)
        v = self.v(h).view(P, self.heads, d // self.heads)
        x = x + self.o(attention(q, k, v).reshape(P, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class Projector(nn.Module):
    def __init__(self, d, dp, d_model, eps, grids):
        super().__init__()
        self.grids = grids
        self.norm = nn.LayerNorm(4 * d, eps=eps)
        self.fc1, self.fc2 = nn.Linear(4 * d, dp), nn.Linear(dp, d_model)

    def forward(self, feats):
        cells, at = [], 0
        d = feats.shape[1]
        for h, w in self.grids:  # 2x2 pixel shuffle: (2y,2x), (2y,2x+1), (2y+1,2x), (2y+1,2x+1)
            f = feats[at : at + h * w].reshape(h // 2, 2, w // 2, 2, d).permute(0, 2, 1, 3, 4)
            cells.append(f.reshape(h * w // 4, 4 * d))
            at += h * w
        return self.fc2(F.gelu(self.fc1(self.norm(torch.cat(cells)))))


class Tower(nn.Module):
    def __init__(self, a, grids):
        super().__init__()
        eps = 1e-6
        self.patch_embed = nn.Linear(3 * a.patch * a.patch, a.dim)
        self.blocks = nn.ModuleList(Block(a.dim, a.heads, a.mlp, eps) for _ in range(a.layers))
        self.final_norm = nn.LayerNorm(a.dim, eps=eps)
        self.projector = Projector(a.dim, 4 * a.dim, a.d_model, eps, grids)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward(self, patches, rope, attention):
        x = self.patch_embed(patches)
        for blk in self.blocks:
            x = blk(x, rope, attention)
        return self.projector(self.final_norm(x))


def model_flops(a, grids):
    """Forward FLOPs of the ViT and the projector: nn::vision_forward_flops (nn/vision/vision_flops.h)."""
    d, dp = a.dim, 4 * a.dim
    vit = proj = 0.0
    for h, w in grids:
        n = h * w
        vit += n * (2.0 * 3 * a.patch * a.patch * d + a.layers * (2.0 * (4 * d * d + 2 * d * a.mlp) + 4.0 * n * d))
        proj += n / 4 * 2.0 * (4 * d * dp + dp * a.d_model)
    return vit, proj


class Timer:
    """Median milliseconds: CUDA events on the GPU, wall clock on the CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def start(self):
        if self.cuda:
            self.ev = [torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)]
            self.ev[0].record()
        else:
            self.t0 = time.perf_counter()

    def stop(self):
        if self.cuda:
            self.ev[1].record()
            return self.ev
        return (time.perf_counter() - self.t0) * 1e3

    @staticmethod
    def median(marks):
        if marks and isinstance(marks[0], list):
            torch.cuda.synchronize()
            marks = [a.elapsed_time(b) for a, b in marks]
        marks = sorted(marks)
        return marks[len(marks) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dim", type=int, default=1152)
    ap.add_argument("--layers", type=int, default=27)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--mlp", type=int, default=4304)
    ap.add_argument("--patch", type=int, default=14)
    ap.add_argument("--d-model", type=int, default=2048)
    ap.add_argument("--images", default="448x448,336x448,224x336,448x224")
    ap.add_argument("--num-images", type=int, default=16)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--attn", default="auto")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    device = torch.device(a.device)
    if a.dim % a.heads or (a.dim // a.heads) % 4:
        raise SystemExit(f"--dim {a.dim} with --heads {a.heads}: the head dim must be a multiple of 4 (2-D RoPE)")
    if a.compile and not hasattr(torch, "compile"):
        raise SystemExit(f"--compile needs PyTorch 2.x (this is {torch.__version__})")
    torch.manual_seed(0)
    grids = parse_images(a.images, a.patch, a.num_images)
    pack = Packing(grids, device)
    P = pack.total
    rope = rope_tables(grids, a.dim // a.heads, 10000.0, device)
    model = Tower(a, grids).to(device)
    gpu = device.type == "cuda"
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if gpu else contextlib.nullcontext
    host = torch.rand(P, 3 * a.patch * a.patch) * 2 - 1  # normalised pixels in [-1, 1]
    if gpu:
        host = host.pin_memory()
    dout = torch.randn(P // 4, a.d_model, device=device, dtype=torch.bfloat16 if gpu else torch.float32)

    # The attention: the one asked for, or the first candidate that runs a forward and backward here.
    candidates = ["varlen", "flash_attn", "loop", "mask"] if a.attn == "auto" else [a.attn]
    tried = []
    for kind in candidates:
        try:
            attention = make_attention(kind, pack)
            hd = a.dim // a.heads
            q = torch.randn(P, a.heads, hd, device=device, requires_grad=True)
            with autocast():  # the blocks give the attention bf16 q, k, v under autocast
                qa = q.to(torch.bfloat16) if gpu else q
                attention(qa, qa, qa).float().sum().backward()
            break
        except Exception as e:  # noqa: BLE001 - any failure means "not usable here": try the next
            tried.append(f"{kind}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200])
    else:
        raise SystemExit("no attention path runs here: " + "; ".join(tried))
    sdpa_note = "" if kind in ("varlen", "flash_attn") or hasattr(F, "scaled_dot_product_attention") else " (math)"
    impl = f"torch {torch.__version__} {'bf16 autocast' if gpu else 'f32'} attn={kind}{sdpa_note}"

    if a.compile:
        for i, blk in enumerate(model.blocks):
            model.blocks[i] = torch.compile(blk)
        model.projector = torch.compile(model.projector)
        impl += " compile"

    def forward():
        with autocast():
            return model(host.to(device, non_blocking=True), rope, attention)

    def zero():
        for p in model.parameters():
            p.grad = None

    if gpu:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    out = forward()
    out.backward(dout)
    finite = bool(torch.isfinite(out).all()) and all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())
    peak = torch.cuda.max_memory_allocated() if gpu else 0
    del out
    zero()

    timer = Timer(device)
    fwd, bwd, step = [], [], []
    for i in range(a.warmup + a.iters):
        zero()
        timer.start()
        out = forward()
        m = timer.stop()
        timer.start()
        out.backward(dout)
        mb = timer.stop()
        del out
        if i >= a.warmup:
            fwd.append(m)
            bwd.append(mb)
    for i in range(a.warmup + a.iters):
        zero()
        timer.start()
        forward().backward(dout)
        m = timer.stop()
        if i >= a.warmup:
            step.append(m)
    fwd_ms, bwd_ms, step_ms = Timer.median(fwd), Timer.median(bwd), Timer.median(step)
    vit, proj = model_flops(a, grids)
    line = {
        "bench": "vit",
        "impl": impl,
        "device": device.type,
        "dim": a.dim,
        "layers": a.layers,
        "heads": a.heads,
        "head_dim": a.dim // a.heads,
        "mlp": a.mlp,
        "patch": a.patch,
        "d_model": a.d_model,
        "images": len(grids),
        "image_sizes": [f"{h * a.patch}x{w * a.patch}" for h, w in grids],
        "patches": P,
        "tokens": P // 4,
        "params": sum(p.numel() for p in model.parameters()),
        "fwd_ms": fwd_ms,
        "bwd_ms": bwd_ms,
        "step_ms": step_ms,
        "fwd_gflop": (vit + proj) / 1e9,
        "tflops": 3.0 * (vit + proj) / step_ms / 1e9,
        "peak_bytes": peak,
        "activation_bytes": max(peak - before, 0) if gpu else 0,
        "outputs_finite": finite,
        "iters": a.iters,
    }
    if tried:
        line["attn_not_usable"] = tried
    print(json.dumps(line), flush=True)
    return 0 if finite else 1


if __name__ == "__main__":
    raise SystemExit(main())
