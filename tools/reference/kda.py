#!/usr/bin/python3
"""The KDA layer (Kimi Delta Attention, spec kda.md section 1) in plain PyTorch, as an independent reference.

Written from the spec, not from moetrain's C++: the token mixer is the naive token-by-token recurrence
(kda.md section 2), the short conv a sum of shifted slices, and autograd gives every gradient. Per token x:

    q, k, v = silu(conv4(x Wq^T)), silu(conv4(x Wk^T)), silu(conv4(x Wv^T))     conv: causal, depthwise, no bias
    q = K^-1/2 q / sqrt(|q|^2 + 1e-6), k = k / sqrt(|k|^2 + 1e-6)               per head of K channels
    beta = sigmoid(x Wb^T)                                                       [HV]
    u = (x Wfa^T) Wfb^T                                                          [HV, K]
    g = l sigmoid(a (u + dt_bias))   (lower_bound)  or  -a softplus(u + dt_bias)  (softplus),  a = exp(A_log)
    S_t = (I - beta k k^T) Diag(exp(g)) S_{t-1} + beta k v^T,  o_t = S_t^T q      value head hv reads q/k head
                                                                                  hv // (HV / H)
    out = (rmsnorm_head(o) * sigmoid((x Wga^T) Wgb^T)) Wo^T

Usage (what tests/scripts/kda_parity.sh runs after the C++ test KdaLayerParity.Dump wrote its files):

    kda.py --dump-dir DIR [--tol-f64 1e-10] [--tol-f32 1e-5]

Each DIR/kda_<gate>_<dtype>.safetensors holds moetrain's parameters ("param/<name>"), the input x [B*T, C], the
initial state s0, the loss weights r_out, r_st, and moetrain's out, st (final state), dx, ds0 and "grad/<name>".
The reference recomputes everything in float64 at those parameters on the loss sum(out * r_out) +
sum(st * r_st) and prints rho = |ref - mt|_2 / |ref|_2 per tensor; exit 1 when a rho exceeds the tolerance of the
file's dtype, a value is not finite, or the tensor sets differ.
"""

import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dump_check import dump_check_main  # noqa: E402
from safetensors_io import read_safetensors  # noqa: E402

L2_EPS = 1e-6


def causal_conv_silu(x, w):
    """x [B, T, C], w [C, W]: y[t] = silu(sum_tau w[:, tau] x[t - W + 1 + tau]), zeros before t = 0."""
    b, t, c = x.shape
    width = w.shape[1]
    padded = torch.cat([x.new_zeros(b, width - 1, c), x], dim=1)
    z = sum(w[:, tau] * padded[:, tau : tau + t, :] for tau in range(width))
    return z * torch.sigmoid(z)


def l2norm(x, scale):
    return scale * x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def kda_recurrence(q, k, v, g, beta, s0):
    """q, k [B, T, H, K]; v [B, T, HV, V]; g [B, T, HV, K]; beta [B, T, HV]; s0 [B, HV, K, V].
    Returns o [B, T, HV, V] and the final state."""
    group = v.shape[2] // q.shape[2]
    q = q.repeat_interleave(group, dim=2)
    k = k.repeat_interleave(group, dim=2)
    s = s0
    outs = []
    for t in range(q.shape[1]):
        s = s * torch.exp(g[:, t]).unsqueeze(-1)                      # Diag(alpha) S
        kt, vt, bt = k[:, t], v[:, t], beta[:, t]
        pred = torch.einsum("bhkv,bhk->bhv", s, kt)                   # S~^T k
        s = s + bt[..., None, None] * kt.unsqueeze(-1) * (vt - pred).unsqueeze(-2)
        outs.append(torch.einsum("bhkv,bhk->bhv", s, q[:, t]))        # S_t^T q
    return torch.stack(outs, dim=1), s


def kda_layer(w, cfg, x, s0, batch):
    """The layer at parameters w(name) -> tensor (names as moetrain's, without the layer prefix, e.g.
    "q_proj.weight", "A_log"); x [B*T, C]; s0 [B, HV, K, V] or None for the zero state. Returns out [B*T, C] and
    the final state."""
    h, hv, kd, vd = cfg["num_heads"], cfg["num_v_heads"], cfg["head_dim"], cfg["head_v_dim"]
    n, d = x.shape
    t = n // batch
    xs = x.view(batch, t, d)
    q = causal_conv_silu(xs @ w("q_proj.weight").T, w("q_conv1d.weight"))
    k = causal_conv_silu(xs @ w("k_proj.weight").T, w("k_conv1d.weight"))
    v = causal_conv_silu(xs @ w("v_proj.weight").T, w("v_conv1d.weight"))
    q = l2norm(q.view(batch, t, h, kd), kd ** -0.5)
    k = l2norm(k.view(batch, t, h, kd), 1.0)
    v = v.view(batch, t, hv, vd)
    beta = torch.sigmoid(xs @ w("b_proj.weight").T)
    u = ((xs @ w("f_a_proj.weight").T) @ w("f_b_proj.weight").T).view(batch, t, hv, kd)
    a = torch.exp(w("A_log")).view(hv, 1) if cfg["gate_use_a_log"] else torch.ones(hv, 1, dtype=x.dtype)
    z = u + w("dt_bias").view(hv, kd)
    if cfg["gate"] == "lower_bound":
        g = cfg["gate_lower_bound"] * torch.sigmoid(a * z)
    else:
        g = -a * (torch.clamp(z, min=0) + torch.log1p(torch.exp(-z.abs())))
    if s0 is None:
        s0 = x.new_zeros(batch, hv, kd, vd)
    o, st = kda_recurrence(q, k, v, g, beta, s0)
    on = o * torch.rsqrt((o * o).mean(-1, keepdim=True) + cfg["norm_eps"]) * w("o_norm.weight")
    gate = torch.sigmoid((xs @ w("g_a_proj.weight").T) @ w("g_b_proj.weight").T)
    y = (on.reshape(batch, t, hv * vd) * gate) @ w("o_proj.weight").T
    return y.reshape(n, d), st


def rho(ref, got):
    ref, got = ref.double(), got.double()
    norm = ref.norm().item()
    diff = (ref - got).norm().item()
    return diff / norm if norm > 0 else diff


def check_file(path, tol_f64, tol_f32):
    tensors, meta = read_safetensors(path)
    if meta.get("format") != "moetrain-kda-parity":
        raise ValueError(f"{path}: metadata format is {meta.get('format')!r}, expected 'moetrain-kda-parity'")
    cfg = {
        "num_heads": int(meta["num_heads"]),
        "num_v_heads": int(meta["num_v_heads"]),
        "head_dim": int(meta["head_dim"]),
        "head_v_dim": int(meta["head_v_dim"]),
        "gate": meta["gate"],
        "gate_lower_bound": float(meta["gate_lower_bound"]),
        "gate_use_a_log": meta.get("gate_use_a_log", "true") == "true",
        "norm_eps": float(meta["norm_eps"]),
    }
    prefix = meta["prefix"]
    is_f32 = tensors["x"].dtype == torch.float32
    tol = tol_f32 if is_f32 else tol_f64
    params = {name[len("param/"):]: t.double().clone().requires_grad_(True)
              for name, t in tensors.items() if name.startswith("param/")}
    x = tensors["x"].double().clone().requires_grad_(True)
    s0 = tensors["s0"].double().clone().requires_grad_(True)
    batch = s0.shape[0]
    out, st = kda_layer(lambda name: params[f"{prefix}.{name}"], cfg, x, s0, batch)
    loss = (out * tensors["r_out"].double()).sum() + (st * tensors["r_st"].double()).sum()
    loss.backward()

    pairs = [("out", out.detach(), tensors["out"]), ("st", st.detach(), tensors["st"]),
             ("dx", x.grad, tensors["dx"]), ("ds0", s0.grad, tensors["ds0"])]
    grad_names = {name[len("grad/"):] for name in tensors if name.startswith("grad/")}
    if grad_names != set(params):
        raise ValueError(f"{path}: parameters {sorted(set(params))} but gradients {sorted(grad_names)}")
    for name in sorted(params):
        pairs.append((f"grad/{name}", params[name].grad, tensors[f"grad/{name}"]))
    failures = 0
    results = []
    for name, ref, got in pairs:
        if tuple(ref.shape) != tuple(got.shape):
            raise ValueError(f"{path}: {name} has shape {list(got.shape)}, reference {list(ref.shape)}")
        r = rho(ref, got) if torch.isfinite(got).all() else math.inf
        results.append((r, name))
        if not r <= tol:
            failures += 1
    label = os.path.basename(path)
    print(f"== {label} ({cfg['gate']}, {'f32' if is_f32 else 'f64'}; tolerance {tol:.0e})")
    for r, name in sorted(results, reverse=True):
        print(f"  {'FAIL' if not r <= tol else 'ok  '} rho {r:.3e}  {name}")
    return failures, max(r for r, _ in results)


def main():
    return dump_check_main("kda.py", "kda_", check_file, __doc__.split("\n")[0], "worst rho")


if __name__ == "__main__":
    sys.exit(main())
