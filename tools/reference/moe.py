#!/usr/bin/python3
"""The MoE layer (spec moe.md sections 1-2) in plain PyTorch, as an independent reference.

Written from the spec, not from moetrain's C++: the routed experts are a loop over experts with boolean masks and
index_add (no permutation buffer), and autograd gives every gradient. Per token x (rows of x [N, C]):

    z = x Wr^T;  s = sigmoid(z)  (or softmax(z) over the experts)
    I = the K experts with the largest s + b, ties to the lower index (b: the balancing bias, selection only)
    g_j = rho s_j / (sum_{j' in I} s_j' + 1e-20)   (normalize_gates)   or   rho s_j
    capacity (capacity_factor CF > 0): an expert keeps at most ceil(N K / E * CF) of its (token, slot) pairs, the
        largest gates (ties by token, then slot) with drop_policy "probs", the first in token order with "position"
    out = FFN_shared(x) + sum_{j in I, kept} g_j FFN_j(x),   FFN(x) = (silu(x Wg^T) * (x Wu^T)) Wd^T
    aux_loss (balance "aux_loss") = alpha sum_j f_j P_j, f_j = E count_j / (K N), P_j = mean_t p_tj, p = s / sum s
        (sigmoid) or s (softmax); gradient through P only

and the balancer's update after the step (bias_after): Quantile Balancing's histogram step (section 2.1: cutoff c
the (K+1)-th largest s + b, r = c - s binned over (L, U) = (min b - 1, max b + 1), per-expert quantile at
rank ceil(N K / E), EMA, centring) or the sign rule (section 2.2).

Usage (what tests/scripts/moe_parity.sh runs after the C++ test MoeLayerParity.Dump wrote its files):

    moe.py --dump-dir DIR [--tol-f64 1e-10] [--tol-f32 1e-5]

Each DIR/moe_<variant>_<dtype>.safetensors holds moetrain's parameters ("param/<name>"), the input x, the loss
weights r_out, the selection bias used, and moetrain's out, aux_loss, indices, gates, dx, "grad/<name>" and the
balancer's bias after the step. The reference recomputes everything in float64 on the loss sum(out * r_out) +
aux_loss, requires the same routing (indices) exactly, and prints rho = |ref - mt|_2 / |ref|_2 per tensor; exit 1
when a rho exceeds the tolerance of the file's dtype, a value is not finite, or the tensor sets differ. The QB
update is compared exactly (to f32 rounding) for f64 files; for f32 files, where a score within f32 rounding of a
bin edge may land in the next bin, with rho <= 1e-2.
"""

import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dump_check import dump_check_main  # noqa: E402
from safetensors_io import read_safetensors  # noqa: E402

GATE_EPS = 1e-20


def swiglu_ffn(x, wg, wu, wd):
    a = x @ wg.T
    return (a * torch.sigmoid(a) * (x @ wu.T)) @ wd.T


def top_k(key, k):
    """Indices of the k largest entries per row, descending, ties to the lower index."""
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices
    return order[:, :k]


def keep_mask(idx, gates, num_experts, cfg):
    """[N, K] bool: which (token, slot) pairs survive the capacity limit."""
    n, k = idx.shape
    keep = torch.ones(n, k, dtype=torch.bool)
    if cfg["capacity_factor"] <= 0:
        return keep
    cap = math.ceil(n * k / num_experts * cfg["capacity_factor"])
    g = gates.detach().tolist()
    for e in range(num_experts):
        pairs = [(i, q) for i in range(n) for q in range(k) if int(idx[i, q]) == e]
        if len(pairs) <= cap:
            continue
        if cfg["drop_policy"] == "probs":
            pairs.sort(key=lambda p: (-g[p[0]][p[1]], p[0], p[1]))
        for i, q in pairs[cap:]:
            keep[i, q] = False
    return keep


def moe_layer(w, cfg, x, bias):
    """w(name) -> tensor (names without the layer prefix, e.g. "router.weight"); x [N, C]; bias [E] (the selection
    bias). Returns out [N, C], aux loss (scalar), indices [N, K], gates [N, K], scores [N, E]."""
    e, k, rho = cfg["num_experts"], cfg["top_k"], cfg["routed_scale"]
    z = x @ w("router.weight").T
    s = torch.sigmoid(z) if cfg["score"] == "sigmoid" else torch.softmax(z, dim=-1)
    uses_bias = cfg["balance"] in ("quantile", "sign_bias")
    key = s.detach() + (bias if uses_bias else 0.0)
    idx = top_k(key, k)
    sel = s.gather(1, idx)
    gates = rho * sel / (sel.sum(-1, keepdim=True) + GATE_EPS) if cfg["normalize_gates"] else rho * sel
    keep = keep_mask(idx, gates, e, cfg)
    out = torch.zeros_like(x)
    for j in range(e):
        mask = (idx == j) & keep                       # [N, K], at most one slot per token
        tok, slot = mask.nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        y = swiglu_ffn(x[tok], w("experts.w_gate")[j], w("experts.w_up")[j], w("experts.w_down")[j])
        out = out.index_add(0, tok, gates[tok, slot].unsqueeze(-1) * y)
    if cfg["num_shared_experts"] > 0:
        out = out + swiglu_ffn(x, w("shared.w_gate.weight"), w("shared.w_up.weight"), w("shared.w_down.weight"))
    aux = x.new_zeros(())
    if cfg["balance"] == "aux_loss":
        n = x.shape[0]
        count = torch.bincount(idx.flatten(), minlength=e).to(x.dtype)
        f = e * count / (k * n)
        p = s / s.sum(-1, keepdim=True) if cfg["score"] == "sigmoid" else s
        aux = cfg["aux_coeff"] * (f * p.mean(0)).sum()
    return out, aux, idx, gates, s, keep


def balancer_update(cfg, s, idx, bias):
    """The bias after the step (float64, before rounding to f32)."""
    e, k = cfg["num_experts"], cfg["top_k"]
    n = s.shape[0]
    b = bias.clone()
    if cfg["balance"] == "quantile":
        key = s + b
        cutoff = torch.sort(key, dim=-1, descending=True, stable=True).values[:, k]
        r = cutoff.unsqueeze(-1) - s                  # [N, E]
        lo, hi, bins = b.min().item() - 1.0, b.max().item() + 1.0, cfg["bins"]
        t = torch.floor((r - lo) * (bins / (hi - lo))).clamp(0, bins - 1).long()
        width = (hi - lo) / bins
        new = torch.empty(e, dtype=torch.float64)
        for j in range(e):
            h = torch.bincount(t[:, j], minlength=bins).tolist()
            tau = n * k / e
            rank = math.ceil(tau)
            cum, c = 0, 0
            while c < bins - 1 and cum + h[c] < rank:
                cum += h[c]
                c += 1
            frac = min(max((tau - cum) / h[c], 0.0), 1.0) if h[c] > 0 else 1.0
            new[j] = lo + (c + frac) * width
        b = cfg["ema"] * b + (1 - cfg["ema"]) * new
        return b - b.mean()
    if cfg["balance"] == "sign_bias":
        load = torch.bincount(idx.flatten(), minlength=e).double()
        sign = torch.sign(n * k / e - load)
        return b + cfg["sign_rate"] * (sign - sign.mean())
    return b


def rho(ref, got):
    ref, got = ref.double(), got.double()
    norm = ref.norm().item()
    diff = (ref - got).norm().item()
    return diff / norm if norm > 0 else diff


def check_file(path, tol_f64, tol_f32):
    tensors, meta = read_safetensors(path)
    if meta.get("format") != "moetrain-moe-parity":
        raise ValueError(f"{path}: metadata format is {meta.get('format')!r}, expected 'moetrain-moe-parity'")
    cfg = {key: int(meta[key]) for key in ("num_experts", "top_k", "num_shared_experts", "bins")}
    cfg.update({key: float(meta[key]) for key in ("routed_scale", "capacity_factor", "ema", "sign_rate", "aux_coeff")})
    cfg.update({key: meta[key] for key in ("score", "drop_policy", "balance")})
    cfg["normalize_gates"] = meta["normalize_gates"] == "true"
    prefix = meta["prefix"]
    is_f32 = tensors["x"].dtype == torch.float32
    tol = tol_f32 if is_f32 else tol_f64
    params = {name[len("param/"):]: t.double().clone().requires_grad_(True)
              for name, t in tensors.items() if name.startswith("param/")}
    x = tensors["x"].double().clone().requires_grad_(True)
    bias = tensors["bias"].double()
    out, aux, idx, gates, s, keep = moe_layer(lambda name: params[f"{prefix}.{name}"], cfg, x, bias)
    loss = (out * tensors["r_out"].double()).sum() + aux
    loss.backward()

    label = os.path.basename(path)
    mismatched = int((idx != tensors["indices"].long()).sum())
    if mismatched:
        print(f"== {label}: FAIL: {mismatched} routing indices differ from moetrain's")
        return 1, math.inf
    pairs = [("out", out.detach(), tensors["out"]), ("gates", gates.detach(), tensors["gates"]),
             ("aux_loss", aux.detach().reshape(1), tensors["aux_loss"]), ("dx", x.grad, tensors["dx"])]
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
        results.append((r, name, tol))
    # the balancer's update, from the reference's own scores and routing
    bias_ref = balancer_update(cfg, s.detach(), idx, bias).float()
    qb_tol = 1e-2 if is_f32 and cfg["balance"] == "quantile" else 1e-7
    results.append((rho(bias_ref, tensors["bias_after"]) if bias_ref.norm() > 0 else
                    (bias_ref - tensors["bias_after"]).norm().item(), "bias_after", qb_tol))
    for r, _, t in results:
        if not r <= t:
            failures += 1
    dropped = int((~keep).sum())
    print(f"== {label} ({cfg['balance']}, {'f32' if is_f32 else 'f64'}; tolerance {tol:.0e}; "
          f"{dropped} of {keep.numel()} rows dropped; bias range {bias.max() - bias.min():.3f})")
    for r, name, t in sorted(results, reverse=True):
        print(f"  {'FAIL' if not r <= t else 'ok  '} rho {r:.3e}  {name}")
    return failures, max(r for r, name, _ in results if name != "bias_after")


def main():
    return dump_check_main("moe.py", "moe_", check_file, __doc__.split("\n")[0], "worst rho (outputs and gradients)")


if __name__ == "__main__":
    sys.exit(main())
