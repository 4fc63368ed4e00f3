#!/usr/bin/env python3
"""Which operands of KDA's chunked algorithm can be bf16 (issue 25 item 3: "bf16 tensor-core tiles where the
bounded gate allows, the chunk states kept in bf16 where precision allows"): a CPU study in float64.

The chunked forward of spec kda.md §4.1 (chunks of 64, the anchors of §4.2: row factor e^(Γ_i - Γ_n) and column
factor e^(Γ_n - Γ_j) with n the first row of i's 16-row sub-chunk) runs in float64 with each group of tensor-core
operands rounded as a kernel would round it: to TF32 (10 explicit mantissa bits, ties away: what moetrain's kernels
use today) or to bf16 (7 bits, fla's choice). Products accumulate exactly (fp32 accumulation is far finer than
either operand rounding). The reference is the same algorithm unrounded on the same bf16-rounded inputs (it equals
the token recurrence to ~1e-15, printed). Three modes:

    /usr/bin/python3 tools/reference/kda_precision_study.py [--t 1024] [--heads 2]   # forward: rho(o), rho(S_T)
    ... --backward         # gradients when the backward reads the per-chunk states h_n and Vn from a rounded copy
    ... --backward-tiles   # gradients when the backward's products read the forward's rounded operands

rho(a, b) = ||a - b|| / ||b|| (spec §8); spec §8.6's budgets for bf16 inputs: 5e-3 for o and S_T, 1e-2 for dq, dk,
dv, 2e-2 for dg and dbeta. Debian's python3-torch (1.13, CPU) suffices. Results: docs/perf_log/kda.md.
"""
import argparse

import torch

C, SUB = 64, 16


def tf32(x):
    """Round to nearest (ties away, as cvt.rna) with 10 explicit mantissa bits, float64 in and out."""
    m, e = torch.frexp(x)  # x = m 2^e, 0.5 <= |m| < 1: 11 significant bits keep m * 2^11 integral
    return torch.ldexp(torch.sign(m) * torch.floor(m.abs() * 2048 + 0.5) / 2048, e)


def bf16(x):
    return x.to(torch.bfloat16).to(torch.float64)


def exact(x):
    return x


ROUND = {"f64": exact, "tf32": tf32, "bf16": bf16}


def straight_through(fn):
    """fn's rounding in the forward, the identity in the backward: autograd's products then read the rounded value
    wherever the forward's did (a backward whose products take the forward's rounded operands)."""
    return lambda x: x + (fn(x.detach()) - x.detach())


def plan_of(anc="f64", tx="f64", tiles="f64", kg="f64", vn="f64", state="f64", gop="f64"):
    """A rounding plan: anc (the anchored row and column factors of A and L), tx (T, Xw, Xu as the operands of W and
    U), tiles (W, U, A as scan operands), kg (Qg, Kg), vn (Vn as an operand), state (S as an operand), gop (the
    gradients flowing into the scans' products, as the backward's operands; --backward-tiles only)."""
    return dict(anc=anc, tx=tx, tiles=tiles, kg=kg, vn=vn, state=state, gop=gop)


class _GradRound(torch.autograd.Function):
    """The identity in the forward; the backward rounds the gradient that flows in (a gradient as an MMA operand)."""

    @staticmethod
    def forward(ctx, x, key):
        ctx.key = key
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return ROUND[ctx.key](grad), None


def chunked_forward(q, k, v, g, beta, plan, grad=False):
    """q, k [N, T, K] (q scaled), v [N, T, V], g [N, T, K] (log decay per token), beta [N, T]; plan (plan_of) maps
    each operand group to a rounding. grad: straight-through rounding (the backward's products read the rounded
    operands) and the gradient operands rounded by plan["gop"]. Returns o [N, T, V], S_T [N, K, V]."""
    n, t, kd = q.shape
    vd = v.shape[2]
    r = {key: straight_through(ROUND[val]) if grad else ROUND[val] for key, val in plan.items() if key != "gop"}
    gop = plan["gop"] if grad else "f64"
    gr = (lambda x: _GradRound.apply(x, gop)) if gop != "f64" else (lambda x: x)
    s = torch.zeros(n, kd, vd, dtype=torch.float64)
    out = []
    idx = torch.arange(C)
    causal = (idx[:, None] >= idx[None, :]).double()
    strict = (idx[:, None] > idx[None, :]).double()
    anchor = (idx // SUB) * SUB  # the first row of each row's sub-chunk
    for c0 in range(0, t, C):
        c1 = min(c0 + C, t)
        m = c1 - c0
        qc, kc, vc, bc = q[:, c0:c1], k[:, c0:c1], v[:, c0:c1], beta[:, c0:c1]
        gam = torch.cumsum(g[:, c0:c1], dim=1)  # Γ, restarting every chunk
        gn = gam[:, anchor[:m]]  # Γ of each row's anchor [N, m, K]
        # A_ij = sum_d q_id e^(Γ_id - Γ_nd) k_jd e^(Γ_nd - Γ_jd) with n = anchor(i): each factor rounded (anc).
        rows_q = r["anc"](qc * torch.exp(gam - gn))
        rows_k = r["anc"](kc * torch.exp(gam - gn))
        a = torch.zeros(n, m, m, dtype=torch.float64)
        lmat = torch.zeros(n, m, m, dtype=torch.float64)
        for a0 in range(0, m, SUB):
            a1 = min(a0 + SUB, m)
            # e^(Γ_n - Γ_j), n = a0, for the columns j < a1 the tiles b <= a hold (later ones would overflow bf16)
            cols = r["anc"](kc[:, :a1] * torch.exp(gam[:, a0 : a0 + 1] - gam[:, :a1]))
            a[:, a0:a1, :a1] = torch.einsum("nik,njk->nij", rows_q[:, a0:a1], cols)
            lmat[:, a0:a1, :a1] = torch.einsum("nik,njk->nij", rows_k[:, a0:a1], cols)
        a = a * causal[:m, :m]
        lmat = bc[:, :, None] * lmat * strict[:m, :m]
        tinv = torch.linalg.inv(torch.eye(m, dtype=torch.float64) + lmat)  # fp32 blocks in the kernel: exact here
        xw = bc[:, :, None] * kc * torch.exp(gam)
        xu = bc[:, :, None] * vc
        w = r["tiles"](torch.einsum("nij,njk->nik", r["tx"](tinv), r["tx"](xw)))
        u = r["tiles"](torch.einsum("nij,njv->niv", r["tx"](tinv), r["tx"](xu)))
        qg = r["kg"](qc * torch.exp(gam))
        kg = r["kg"](kc * torch.exp(gam[:, m - 1 : m] - gam))
        a_op = r["tiles"](a)
        s_op = r["state"](s)
        vn = u - gr(torch.einsum("nik,nkv->niv", w, s_op))
        vn_op = r["vn"](vn)
        out.append(gr(torch.einsum("nik,nkv->niv", qg, s_op)) + gr(torch.einsum("nij,njv->niv", a_op, vn_op)))
        s = torch.exp(gam[:, m - 1])[:, :, None] * s + gr(torch.einsum("nik,niv->nkv", kg, vn_op))
    return torch.cat(out, dim=1), s


class _KeptMatmul(torch.autograd.Function):
    """x @ s in the forward; the backward reads s as it was kept (rounded by `keep`): a backward that recomputes
    nothing but reads the per-chunk states from a bf16 copy."""

    @staticmethod
    def forward(ctx, x, s, keep):
        ctx.save_for_backward(x, ROUND[keep](s))
        return x @ s

    @staticmethod
    def backward(ctx, grad):
        x, s_kept = ctx.saved_tensors
        return grad @ s_kept.transpose(-1, -2), x.transpose(-1, -2) @ grad, None


class _KeptDecay(torch.autograd.Function):
    """gamma[:, :, None] * s; the backward's gamma gradient reads s as it was kept (spec §4.6 step 4's last-row term
    gamma * sum_V(h_n * dh_n))."""

    @staticmethod
    def forward(ctx, gamma, s, keep):
        ctx.save_for_backward(gamma, ROUND[keep](s))
        return gamma[:, :, None] * s

    @staticmethod
    def backward(ctx, grad):
        gamma, s_kept = ctx.saved_tensors
        return (grad * s_kept).sum(-1), gamma[:, :, None] * grad, None


def chunked_kept_states(q, k, v, g, beta, keep, keep_vn="f64"):
    """The chunked forward in float64 without rounding, differentiable, its backward reading every per-chunk state
    h_n rounded by `keep` and Vn by `keep_vn` (f64: exact)."""
    n, t, kd = q.shape
    s = torch.zeros(n, kd, v.shape[2], dtype=torch.float64)
    out = []
    idx = torch.arange(C)
    causal = (idx[:, None] >= idx[None, :]).double()
    strict = (idx[:, None] > idx[None, :]).double()
    for c0 in range(0, t, C):
        c1 = min(c0 + C, t)
        m = c1 - c0
        qc, kc, vc, bc = q[:, c0:c1], k[:, c0:c1], v[:, c0:c1], beta[:, c0:c1]
        gam = torch.cumsum(g[:, c0:c1], dim=1)
        diff = gam[:, :, None, :] - gam[:, None, :, :]  # Γ_i - Γ_j, [N, m, m, K]; only i >= j is used
        fac = torch.exp(torch.minimum(diff, torch.zeros_like(diff)))
        a = torch.einsum("nik,njk,nijk->nij", qc, kc, fac) * causal[:m, :m]
        lmat = bc[:, :, None] * torch.einsum("nik,njk,nijk->nij", kc, kc, fac) * strict[:m, :m]
        tinv = torch.linalg.inv(torch.eye(m, dtype=torch.float64) + lmat)
        w = tinv @ (bc[:, :, None] * kc * torch.exp(gam))
        u = tinv @ (bc[:, :, None] * vc)
        qg = qc * torch.exp(gam)
        kg = kc * torch.exp(gam[:, m - 1 : m] - gam)
        vn = u - _KeptMatmul.apply(w, s, keep)
        out.append(_KeptMatmul.apply(qg, s, keep) + _KeptMatmul.apply(a, vn, keep_vn))
        s = _KeptDecay.apply(torch.exp(gam[:, m - 1]), s, keep) + _KeptMatmul.apply(kg.transpose(-1, -2), vn, keep_vn)
    return torch.cat(out, dim=1), s


def gradient_study(args, runs, round_d_out):
    """runs: name -> a function of the leaves (q, k, v, g, beta) returning (o, S_T); the first is the reference.
    Prints rho of each other run's gradients against it, loss sum(o * R1) + sum(S_T * R2), per gate."""
    names = ("dq", "dk", "dv", "dg", "dbeta")
    width = max(len(name) for name in runs)
    for gate in ("bounded", "floor", "slow"):
        q, k, v, g, beta = inputs(args.heads, args.t, args.k, args.v, gate, seed=7)
        gen = torch.Generator().manual_seed(11)
        d_out = torch.randn(args.heads, args.t, args.v, generator=gen, dtype=torch.float64)
        d_state = torch.randn(args.heads, args.k, args.v, generator=gen, dtype=torch.float64)
        if round_d_out:
            d_out = bf16(d_out)  # dO arrives in bf16 (the model's activations)
        grads = {}
        for name, run in runs.items():
            leaves = [x.clone().requires_grad_(True) for x in (q, k, v, g, beta)]
            o, s = run(*leaves)
            ((o * d_out).sum() + (s * d_state).sum()).backward()
            grads[name] = [x.grad for x in leaves]
        ref = grads[next(iter(runs))]
        for name in list(runs)[1:]:
            figures = "  ".join(f"{n} {rho(got, want):.1e}" for n, got, want in zip(names, grads[name], ref))
            print(f"{gate:8s} {name:{width}s} {figures}")


def backward_tiles_study(args):
    """Gradients when the backward's products read the operands the forward rounded (straight-through rounding of
    the plan's groups; the gradient operands rounded where the plan says) against the unrounded backward."""
    # The kernels' backward forms its intra-chunk and T products in 3xTF32 (about fp32): "prep exact" is that. The
    # scans' products take one dtype for both operands (a bf16 m16n8k16 needs bf16 on both sides).
    plans = {
        "exact": plan_of(),
        "scans TF32, prep exact": plan_of(tiles="tf32", kg="tf32", vn="tf32", state="tf32"),
        "scans bf16, prep exact": plan_of(tiles="bf16", kg="bf16", vn="bf16", state="bf16"),
        "scans bf16 + grad operands": plan_of(tiles="bf16", kg="bf16", vn="bf16", state="bf16", gop="bf16"),
        "T, Xw, Xu bf16, scans TF32": plan_of(tx="bf16", tiles="tf32", kg="tf32", vn="tf32", state="tf32"),
        "anchored factors TF32": plan_of(anc="tf32", tiles="tf32", kg="tf32", vn="tf32", state="tf32"),
        "everything bf16 (fla)": all_but("bf16", gop="bf16"),
    }
    runs = {name: (lambda p: lambda *x: chunked_forward(*x, p, grad=True))(plan) for name, plan in plans.items()}
    gradient_study(args, runs, round_d_out=True)


def backward_study(args):
    """Gradients with the per-chunk states h_n and Vn kept in bf16 (or TF32) against kept exactly, same inputs."""
    plans = {"exact": ("f64", "f64"), "h_n tf32": ("tf32", "f64"), "h_n bf16": ("bf16", "f64"),
             "Vn bf16": ("f64", "bf16"), "h_n and Vn bf16": ("bf16", "bf16")}
    runs = {name: (lambda h, vn: lambda *x: chunked_kept_states(*x, h, vn))(*keep) for name, keep in plans.items()}
    gradient_study(args, runs, round_d_out=False)


def recurrence(q, k, v, g, beta):
    n, t, kd = q.shape
    s = torch.zeros(n, kd, v.shape[2], dtype=torch.float64)
    out = []
    for i in range(t):
        s = s * torch.exp(g[:, i])[:, :, None]
        pred = torch.einsum("nkv,nk->nv", s, k[:, i])
        s = s + beta[:, i, None, None] * k[:, i, :, None] * (v[:, i] - pred)[:, None, :]
        out.append(torch.einsum("nkv,nk->nv", s, q[:, i]))
    return torch.stack(out, dim=1), s


def rho(got, ref):
    return ((got - ref).norm() / ref.norm()).item()


def inputs(n, t, kd, vd, gate, seed):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q = torch.nn.functional.normalize(randn(n, t, kd), dim=-1) * kd**-0.5  # the layer's L2 norm, scale 1/sqrt(K)
    k = torch.nn.functional.normalize(randn(n, t, kd), dim=-1)
    v = randn(n, t, vd)
    beta = torch.sigmoid(randn(n, t))
    if gate == "bounded":  # l sigma(u + b), l = -5, b at the init's long-memory end and u ~ N(0, 1)
        g = -5.0 * torch.sigmoid(randn(n, t, kd) - 3.0)
    elif gate == "floor":  # every channel at the bound: the largest anchored column factor, e^75
        g = torch.full((n, t, kd), -5.0, dtype=torch.float64) + 1e-3 * randn(n, t, kd).abs()
    else:  # "slow": decay about -0.005 a token, the state holds ~200 tokens and grows
        g = -0.005 * torch.sigmoid(randn(n, t, kd)) * 2
    rnd = lambda x: bf16(x)  # the kernels take bf16 q, k, v; g and beta stay f32 (exact enough here)
    return rnd(q), rnd(k), rnd(v), g, beta


def all_but(base, **over):
    """Every forward group (all but gop) rounded by `base`, except those named."""
    return plan_of(**{**{key: base for key in ("anc", "tx", "tiles", "kg", "vn", "state")}, **over})


PLANS = {
    "today's kernels (TF32 everywhere)": all_but("tf32"),
    "state bf16": all_but("tf32", state="bf16"),
    "prep: anchored A, L factors bf16": all_but("tf32", anc="bf16"),
    "prep: T, Xw, Xu bf16": all_but("tf32", tx="bf16"),
    "scans: W, U, A, Qg, Kg bf16 only": all_but("tf32", tiles="bf16", kg="bf16"),
    "scans all bf16 (and Vn, state)": all_but("bf16", anc="tf32", tx="tf32"),
    "everything bf16 (fla)": all_but("bf16"),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--t", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--k", type=int, default=128)
    ap.add_argument("--v", type=int, default=128)
    ap.add_argument("--backward", action="store_true", help="the gradients with the per-chunk states kept rounded")
    ap.add_argument("--backward-tiles", action="store_true", help="the gradients with the products' operands rounded")
    args = ap.parse_args()
    torch.set_num_threads(2)
    if args.backward:
        backward_study(args)
        return
    if args.backward_tiles:
        backward_tiles_study(args)
        return
    for gate in ("bounded", "floor", "slow"):
        q, k, v, g, beta = inputs(args.heads, args.t, args.k, args.v, gate, seed=7)
        ref_o, ref_s = chunked_forward(q, k, v, g, beta, plan_of())
        loop_o, loop_s = recurrence(q, k, v, g, beta)
        print(f"{gate:8s} check: chunked f64 against the token loop: rho(o) {rho(ref_o, loop_o):.1e}, "
              f"rho(S_T) {rho(ref_s, loop_s):.1e}")
        for name, plan in PLANS.items():
            o, s = chunked_forward(q, k, v, g, beta, plan)
            print(f"{gate:8s} {name:36s} rho(o) {rho(o, ref_o):.2e}  rho(S_T) {rho(s, ref_s):.2e}")


if __name__ == "__main__":
    main()
