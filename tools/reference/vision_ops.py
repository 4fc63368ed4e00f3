#!/usr/bin/env python3
"""The vision encoder's and projector's ops in PyTorch, written from ../shared/spec/multimodal.md §1-§2 (not from
moetrain's C++): the golden reference of tests/ops/vision_ops_golden_test.cpp.

    python3 tools/reference/vision_ops.py IN.json OUT.json

IN holds "dtype" ("f32" or "f64") and lists of cases per op, each with flat input values; OUT gets, per case, the
forward output "y" and the input gradient(s) of the loss sum(y * dy) from autograd, flat:
  layernorm:     torch.nn.functional.layer_norm over the last dim          -> y, dx, dweight, dbias
  gelu:          torch.nn.functional.gelu (exact erf form)                 -> y, dx
  rope2d:        2-D RoPE from its definition (rope2d below)               -> y, dx
  pixel_shuffle: the 2x2 pixel shuffle as a reshape/permute per image       -> y, dx
  bilinear_resize: the position table to each grid by F.interpolate         -> y, dtable"""
import json
import sys

import torch


def rope2d(x, rows, cols, theta):
    """x [T, H, D]: the first half of each head, [0, D/2), rotates by the patch's row index and the second half by its
    column index; within a half of dim D/2, "rotate half" (Llama): for i < D/4, pair (i, i + D/4) turns by
    index * theta^(-2i/(D/2)). Angles in float64, cos and sin rounded to the data dtype."""
    d = x.size(-1)
    half, quarter = d // 2, d // 4
    freq = theta ** (-2.0 * torch.arange(quarter, dtype=torch.float64) / half)

    def rotate(xh, index):
        angle = index.to(torch.float64)[:, None] * freq[None, :]  # [T, D/4]
        c = angle.cos().to(x.dtype)[:, None, :]
        s = angle.sin().to(x.dtype)[:, None, :]
        a, b = xh[..., :quarter], xh[..., quarter:]
        return torch.cat([a * c - b * s, b * c + a * s], dim=-1)

    return torch.cat([rotate(x[..., :half], rows), rotate(x[..., half:], cols)], dim=-1)


def pixel_shuffle(x, grids):
    """x [P, C], the patches of the images in order, each in raster order of its (h, w) grid: per image, output cell
    (r, c) of the (h/2, w/2) grid concatenates patches (2r, 2c), (2r, 2c+1), (2r+1, 2c), (2r+1, 2c+1)."""
    out, first = [], 0
    for h, w in grids:
        img = x[first:first + h * w].reshape(h // 2, 2, w // 2, 2, x.size(1))  # [r, dr, c, dc, C]
        out.append(img.permute(0, 2, 1, 3, 4).reshape(h // 2 * (w // 2), 4 * x.size(1)))  # [(r, c), (dr, dc, C)]
        first += h * w
    return torch.cat(out, dim=0)


def bilinear_resize(table, grids):
    """table [Hm, Wm, C] (vision.pos = "learned") resized to each image's (h, w) grid by F.interpolate (bilinear,
    align_corners=False, antialias=False), each image's h w rows in raster order, images in order: [sum h w, C]."""
    t = table.permute(2, 0, 1)[None]  # [1, C, Hm, Wm]
    out = []
    for h, w in grids:
        r = torch.nn.functional.interpolate(t, size=(h, w), mode="bilinear", align_corners=False, antialias=False)
        out.append(r[0].permute(1, 2, 0).reshape(h * w, table.size(2)))
    return torch.cat(out, dim=0)


def leaf(values, shape, dtype):
    return torch.tensor(values, dtype=dtype).reshape(shape).requires_grad_(True)


def flat(t):
    return t.detach().flatten().tolist()


def main():
    with open(sys.argv[1]) as f:
        job = json.load(f)
    dtype = torch.float64 if job["dtype"] == "f64" else torch.float32
    out = {"layernorm": [], "gelu": [], "rope2d": [], "pixel_shuffle": [], "bilinear_resize": []}
    for case in job.get("layernorm", []):
        n, c = case["n"], case["c"]
        x, w, b = leaf(case["x"], (n, c), dtype), leaf(case["weight"], (c,), dtype), leaf(case["bias"], (c,), dtype)
        y = torch.nn.functional.layer_norm(x, (c,), w, b, case["eps"])
        y.backward(torch.tensor(case["dy"], dtype=dtype).reshape(n, c))
        out["layernorm"].append({"y": flat(y), "dx": flat(x.grad), "dweight": flat(w.grad), "dbias": flat(b.grad)})
    for case in job.get("gelu", []):
        x = leaf(case["x"], (len(case["x"]),), dtype)
        y = torch.nn.functional.gelu(x)
        y.backward(torch.tensor(case["dy"], dtype=dtype))
        out["gelu"].append({"y": flat(y), "dx": flat(x.grad)})
    for case in job.get("rope2d", []):
        shape = (case["t"], case["h"], case["d"])
        x = leaf(case["x"], shape, dtype)
        rows, cols = torch.tensor(case["rows"], dtype=torch.int64), torch.tensor(case["cols"], dtype=torch.int64)
        y = rope2d(x, rows, cols, case["theta"])
        y.backward(torch.tensor(case["dy"], dtype=dtype).reshape(shape))
        out["rope2d"].append({"y": flat(y), "dx": flat(x.grad)})
    for case in job.get("pixel_shuffle", []):
        grids, c = case["grids"], case["c"]
        x = leaf(case["x"], (len(case["x"]) // c, c), dtype)
        y = pixel_shuffle(x, grids)
        y.backward(torch.tensor(case["dy"], dtype=dtype).reshape(y.shape))
        out["pixel_shuffle"].append({"y": flat(y), "dx": flat(x.grad)})
    for case in job.get("bilinear_resize", []):
        table = leaf(case["table"], (case["hm"], case["wm"], case["c"]), dtype)
        y = bilinear_resize(table, case["grids"])
        y.backward(torch.tensor(case["dy"], dtype=dtype).reshape(y.shape))
        out["bilinear_resize"].append({"y": flat(y), "dtable": flat(table.grad)})
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
