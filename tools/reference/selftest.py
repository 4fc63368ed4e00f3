#!/usr/bin/python3
"""Self-checks of the reference itself (no moetrain needed):

1. forward: model.py's loss equals an independent loop-by-loop numpy evaluation of the same spec, in float64;
2. backward: autograd gradients of every parameter match central finite differences in float64 (along random
   directions and at random coordinates), relative error <= 1e-6 as conventions.md section 1.4 asks;
3. safetensors: a file written by hand with struct reads back, the writer round-trips, and malformed files
   are refused;
4. the benchmark's fast formulation (bench_torch.py) gives the same loss and gradients as model.py.

Run: /usr/bin/python3 tools/reference/selftest.py   (exits 1 on any failure)
"""

import json
import math
import os
import struct
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import ModelConfig, Transformer, cross_entropy_loss  # noqa: E402
from safetensors_io import SafetensorsError, read_safetensors, write_safetensors  # noqa: E402

FAILURES = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        FAILURES.append(what)


# ----------------------------------------------------------------------------------------------------------
# 1. An independent numpy evaluation, written with explicit loops over positions, heads and rotary pairs.


def naive_loss(cfg, params, ids, targets):
    P = {k: v.detach().numpy().astype(np.float64) for k, v in params.items()}
    B, T = ids.shape
    C, D, Hq, Hkv = cfg.d_model, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads

    def norm(x, w):
        out = np.empty_like(x)
        for r in range(x.shape[0]):
            ms = sum(float(e) ** 2 for e in x[r]) / x.shape[1]
            out[r] = x[r] / math.sqrt(ms + cfg.norm_eps) * w
        return out

    def rot(vec, t):
        out = vec.copy()
        for i in range(D // 2):
            a = t * cfg.rope_theta ** (-2.0 * i / D)
            out[i] = vec[i] * math.cos(a) - vec[i + D // 2] * math.sin(a)
            out[i + D // 2] = vec[i + D // 2] * math.cos(a) + vec[i] * math.sin(a)
        return out

    total, count = 0.0, 0
    for b in range(B):
        x = np.stack([P["embed.weight"][ids[b, t]] for t in range(T)])  # [T, C]
        for layer in range(cfg.n_layers):
            p = lambda n: P[f"layers.{layer}.{n}"]  # noqa: E731
            a = norm(x, p("attn_norm.weight"))
            q = a @ p("attn.wq.weight").T
            k = a @ p("attn.wk.weight").T
            v = a @ p("attn.wv.weight").T
            att = np.zeros((T, Hq * D))
            for h in range(Hq):
                g = h // (Hq // Hkv)
                for t in range(T):
                    qt = rot(q[t, h * D:(h + 1) * D], t)
                    s = [float(qt @ rot(k[u, g * D:(g + 1) * D], u)) / math.sqrt(D) for u in range(t + 1)]
                    mx = max(s)
                    e = [math.exp(z - mx) for z in s]
                    for u in range(t + 1):
                        att[t, h * D:(h + 1) * D] += e[u] / sum(e) * v[u, g * D:(g + 1) * D]
            hres = x + att @ p("attn.wo.weight").T
            m = norm(hres, p("mlp_norm.weight"))
            gate = m @ p("mlp.w_gate.weight").T
            up = m @ p("mlp.w_up.weight").T
            act = gate / (1.0 + np.exp(-gate)) * up
            x = hres + act @ p("mlp.w_down.weight").T
        x = norm(x, P["final_norm.weight"])
        w_out = P["embed.weight"] if cfg.tie_embeddings else P["lm_head.weight"]
        logits = x @ w_out.T
        for t in range(T):
            if targets[b, t] == -1:
                continue
            row = logits[t]
            mx = row.max()
            lse = mx + math.log(sum(math.exp(z - mx) for z in row))
            total += lse - row[targets[b, t]]
            count += 1
    return total / count


def tiny_cfg(tied, head_dim=0):
    return ModelConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=20,
                       head_dim=head_dim, rope_theta=10000.0, norm_eps=1e-5, tie_embeddings=tied, init_std=0.3)


def make_model(cfg, seed):
    torch.manual_seed(seed)
    model = Transformer(cfg).to(torch.float64)
    with torch.no_grad():  # norm gains away from 1 so that their gradients are exercised
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model


def make_batch(cfg, B, T, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    targets = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    targets[0, 1] = -1
    targets[-1, -1] = -1
    return ids, targets


def test_forward():
    for tied, head_dim in ((True, 0), (False, 6)):
        cfg = tiny_cfg(tied, head_dim)
        model = make_model(cfg, 1)
        ids, targets = make_batch(cfg, 2, 7, 2)
        ref = float(model.loss(ids, targets))
        naive = naive_loss(cfg, dict(model.named_parameters()), ids.numpy(), targets.numpy())
        rel = abs(ref - naive) / abs(naive)
        check(rel < 1e-12, f"forward vs loop numpy (tied={tied}, head_dim={cfg.head_dim}): rel err {rel:.2e}")


def test_gradients():
    for tied in (True, False):
        cfg = tiny_cfg(tied, 0 if tied else 6)
        model = make_model(cfg, 3)
        ids, targets = make_batch(cfg, 2, 6, 4)
        model.zero_grad()
        model.loss(ids, targets).backward()
        g = torch.Generator().manual_seed(5)
        worst = 0.0
        for name, p in model.named_parameters():
            grad = p.grad.clone()
            probes = [torch.randn(p.shape, generator=g, dtype=torch.float64) for _ in range(3)]
            for _ in range(8):  # single coordinates
                e = torch.zeros_like(p)
                e.view(-1)[int(torch.randint(0, p.numel(), (1,), generator=g))] = 1.0
                probes.append(e)
            for d in probes:
                h = 1e-6 * max(1.0, float(p.detach().abs().max()))
                with torch.no_grad():
                    p.add_(d, alpha=h)
                    lp = float(model.loss(ids, targets))
                    p.add_(d, alpha=-2 * h)
                    lm = float(model.loss(ids, targets))
                    p.add_(d, alpha=h)
                fd = (lp - lm) / (2 * h)
                an = float((grad * d).sum())
                # relative error, with an absolute floor for the f64 rounding noise of the difference
                # quotient (about eps * |loss| / h = 1e-16 * 3 / 1e-6 = 3e-10)
                err = abs(fd - an) / (max(abs(fd), abs(an)) + 1e-3)
                worst = max(worst, err)
                if err > 1e-6:
                    check(False, f"grad {name} (tied={tied}): finite diff {fd:.10e} vs autograd {an:.10e}")
        check(worst <= 1e-6, f"gradients vs finite differences (tied={tied}): worst rel err {worst:.2e}")


def test_cross_entropy():
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(5, 4, 9, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 9, (5, 4), generator=g)
    targets[1, 2] = -1
    ours = float(cross_entropy_loss(logits, targets))
    theirs = float(torch.nn.functional.cross_entropy(logits.view(-1, 9), targets.view(-1), ignore_index=-1))
    check(abs(ours - theirs) < 1e-12, f"cross_entropy_loss matches F.cross_entropy(ignore_index=-1): {ours:.12f}")
    all_ignored = torch.full((5, 4), -1)
    check(float(cross_entropy_loss(logits, all_ignored)) == 0.0, "cross_entropy_loss with every target ignored is 0")


# ----------------------------------------------------------------------------------------------------------
# 3. safetensors


def test_safetensors():
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "hand.safetensors")
        f32 = struct.pack("<4f", 1.0, -2.5, 3.25, 1e-3)
        f64 = struct.pack("<2d", math.pi, -1e300)
        bf16 = struct.pack("<2H", 0x3F80, 0xC040)  # 1.0, -3.0
        i32 = struct.pack("<3i", -1, 7, 2**31 - 1)
        i64 = struct.pack("<q", -(2**40))
        u16 = struct.pack("<2H", 65535, 3)
        blobs = [("a_f64", "F64", [2], f64), ("b_f32", "F32", [2, 2], f32), ("c_i64", "I64", [1], i64),
                 ("d_i32", "I32", [1, 3], i32), ("e_bf16", "BF16", [2], bf16), ("f_u16", "U16", [2], u16),
                 ("g_empty", "F32", [0, 3], b"")]
        header, off = {"__metadata__": {"format": "test"}}, 0
        for name, dt, shape, raw in blobs:
            header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
            off += len(raw)
        hj = json.dumps(header).encode() + b"   "
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(hj)) + hj + b"".join(b[3] for b in blobs))
        t, meta = read_safetensors(path)
        ok = (meta == {"format": "test"}
              and t["b_f32"].tolist() == [[1.0, -2.5], [3.25, float(np.float32(1e-3))]]
              and t["a_f64"].tolist() == [math.pi, -1e300]
              and t["e_bf16"].dtype == torch.bfloat16 and t["e_bf16"].float().tolist() == [1.0, -3.0]
              and t["d_i32"].tolist() == [[-1, 7, 2**31 - 1]] and t["c_i64"].tolist() == [-(2**40)]
              and t["f_u16"].tolist() == [65535, 3] and tuple(t["g_empty"].shape) == (0, 3))
        check(ok, "safetensors: hand-written file (F64 F32 I64 I32 BF16 U16, empty) reads back")

        out = os.path.join(tmp, "rt.safetensors")
        src = {"x": torch.randn(3, 5), "y": torch.arange(6, dtype=torch.int32).view(2, 3),
               "z": torch.randn(4, dtype=torch.float64), "w": torch.randn(7).to(torch.bfloat16)}
        write_safetensors(out, src, {"k": "v"})
        back, meta = read_safetensors(out)
        (n,) = struct.unpack("<Q", open(out, "rb").read(8))
        same = all(torch.equal(src[k], back[k]) and src[k].dtype == back[k].dtype for k in src)
        check(same and meta == {"k": "v"} and (8 + n) % 8 == 0, "safetensors: writer round trip, header aligned")

        data = open(out, "rb").read()
        for what, bad in (("truncated", data[:-4]), ("short", data[:5]),
                          ("bad header length", struct.pack("<Q", 10**9) + data[8:])):
            p = os.path.join(tmp, "bad.safetensors")
            open(p, "wb").write(bad)
            try:
                read_safetensors(p)
                check(False, f"safetensors: {what} file is refused")
            except SafetensorsError as e:
                check(True, f"safetensors: {what} file is refused ({e})")


# ----------------------------------------------------------------------------------------------------------
# 4. the benchmark formulation


def test_bench_formulation():
    import bench_torch
    for tied, fused in ((True, False), (False, False), (True, True), (False, True)):
        cfg = tiny_cfg(tied, 0 if tied else 6)
        rho_loss, worst = bench_torch.compare_with_reference(cfg, batch=3, seq=9, dtype=torch.float64, fused=fused)
        check(rho_loss < 1e-12 and worst < 1e-12, f"bench formulation == model.py in f64 (tied={tied}, fused={fused}): "
              f"loss rel {rho_loss:.1e}, worst grad rho {worst:.1e}")


def main():
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    test_cross_entropy()
    test_forward()
    test_gradients()
    test_safetensors()
    test_bench_formulation()
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed")
        return 1
    print("all self-checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
