"""PyTorch reference of moetrain's vision tower (multimodal.md sections 1-2), from plain torch ops: patch embedding,
pre-norm ViT blocks (LayerNorm, multi-head attention with 2-D RoPE inside each image, GELU MLP), final LayerNorm,
2x2 pixel shuffle by reshape/permute, projector LayerNorm -> Linear -> GELU -> Linear. With pos = "learned" the blocks
rotate nothing and the patch embeddings get vision.pos_embed.weight [G, G, dim] resized to each grid by F.interpolate
(bilinear, align_corners=False) added.

Usage: vision.py IN.safetensors OUT.safetensors
IN holds every parameter under moetrain's names, input.patches [P, 3 p^2], input.grids [n, 2] i32 (patch rows and
columns per image) and input.dout [tokens, d_model]; its metadata holds dim, layers, heads, eps, rope_base and
optionally pos ("rope2d" by default, or "learned").
OUT gets out (the slot embeddings), features (the ViT output), and grad.<name> for every parameter: the gradient of
sum(out * dout)."""

import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import read_safetensors, write_safetensors  # noqa: E402


def rope2d(x, rows, cols, base):
    """x [P, H, D]: the first half of D rotates by the patch row, the second by its column ("rotate half" pairs
    (i, i + D/4) within each half, angle = index * base^(-4i/D))."""
    d = x.shape[-1]
    q = d // 4
    inv = base ** (-4.0 * torch.arange(q, dtype=torch.float64) / d)
    out = []
    for half, idx in ((x[..., : d // 2], rows), (x[..., d // 2 :], cols)):
        ang = (idx.to(torch.float64)[:, None] * inv[None, :]).to(x.dtype)[:, None, :]  # [P, 1, D/4]
        c, s = torch.cos(ang), torch.sin(ang)
        a, b = half[..., :q], half[..., q:]
        out += [a * c - b * s, b * c + a * s]
    return torch.cat(out, dim=-1)


def pos_table(table, grids):
    """The learned [G, G, dim] table resized to each (h, w) grid, rows in the packed patch order: [P, dim]."""
    t = table.permute(2, 0, 1)[None]
    out = []
    for h, w in grids:
        r = F.interpolate(t, size=(h, w), mode="bilinear", align_corners=False, antialias=False)
        out.append(r[0].permute(1, 2, 0).reshape(h * w, table.shape[2]))
    return torch.cat(out)


def block(x, p, name, heads, eps, rows, cols, spans, base, rope):
    P, d = x.shape
    lin = lambda t, n: F.linear(t, p[f"{name}.{n}.weight"], p[f"{name}.{n}.bias"])  # noqa: E731
    h = F.layer_norm(x, (d,), p[f"{name}.norm1.weight"], p[f"{name}.norm1.bias"], eps)
    q = lin(h, "attn.q").view(P, heads, d // heads)
    k = lin(h, "attn.k").view(P, heads, d // heads)
    if rope:
        q, k = rope2d(q, rows, cols, base), rope2d(k, rows, cols, base)
    v = lin(h, "attn.v").view(P, heads, d // heads)
    outs = []
    for a, b in spans:  # one image at a time: the block-diagonal mask
        s = torch.einsum("qhd,khd->hqk", q[a:b], k[a:b]) / math.sqrt(d // heads)
        outs.append(torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v[a:b]))
    x1 = x + lin(torch.cat(outs).reshape(P, d), "attn.o")
    h2 = F.layer_norm(x1, (d,), p[f"{name}.norm2.weight"], p[f"{name}.norm2.bias"], eps)
    return x1 + lin(F.gelu(lin(h2, "mlp.fc1")), "mlp.fc2")


def main():
    tensors, meta = read_safetensors(sys.argv[1])
    dim, layers, heads = int(meta["dim"]), int(meta["layers"]), int(meta["heads"])
    eps, base = float(meta["eps"]), float(meta["rope_base"])
    rope = meta.get("pos", "rope2d") == "rope2d"
    params = {n: t.clone().requires_grad_(True) for n, t in tensors.items() if not n.startswith("input.")}
    patches, grids, dout = tensors["input.patches"], tensors["input.grids"].tolist(), tensors["input.dout"]
    rows, cols, spans, at = [], [], [], 0
    for h, w in grids:
        rows += [r for r in range(h) for _ in range(w)]
        cols += [c for _ in range(h) for c in range(w)]
        spans.append((at, at + h * w))
        at += h * w
    rows, cols = torch.tensor(rows), torch.tensor(cols)
    p = params
    x = F.linear(patches, p["vision.patch_embed.weight"], p["vision.patch_embed.bias"])
    if not rope:
        x = x + pos_table(p["vision.pos_embed.weight"], grids)
    for l in range(layers):
        x = block(x, p, f"vision.blocks.{l}", heads, eps, rows, cols, spans, base, rope)
    feats = F.layer_norm(x, (dim,), p["vision.final_norm.weight"], p["vision.final_norm.bias"], eps)
    cells = []
    for (h, w), (a, b) in zip(grids, spans):  # 2x2 pixel shuffle: (2y,2x), (2y,2x+1), (2y+1,2x), (2y+1,2x+1)
        f = feats[a:b].reshape(h // 2, 2, w // 2, 2, dim).permute(0, 2, 1, 3, 4)
        cells.append(f.reshape(h * w // 4, 4 * dim))
    c = torch.cat(cells)
    c = F.layer_norm(c, (4 * dim,), p["projector.norm.weight"], p["projector.norm.bias"], eps)
    out = F.linear(F.gelu(F.linear(c, p["projector.fc1.weight"], p["projector.fc1.bias"])),
                   p["projector.fc2.weight"], p["projector.fc2.bias"])
    (out * dout).sum().backward()
    result = {"out": out.detach(), "features": feats.detach()}
    for n, t in params.items():
        result[f"grad.{n}"] = t.grad.detach()
    write_safetensors(sys.argv[2], result)


if __name__ == "__main__":
    main()
