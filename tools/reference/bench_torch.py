#!/usr/bin/python3
"""PyTorch CPU baseline for moetrain's bench_train: times full training steps of the same model.

One step = zero grads, forward + backward for each micro-batch (loss / grad_accum), clip_grad_norm_ to
train.grad_clip, torch.optim.AdamW (betas/eps from [adamw], weight decay on matrices only, as moetrain).
Random tokens, shape [train.batch_size, train.seq_len]. Prints one JSON line:
  {"bench":"train_step","impl":"pytorch","torch":..,"batch":..,"seq":..,"steps":..,"ms_per_step":..,
   "tokens_per_s":..,"threads":..}

The timed model is a faster eager formulation of model.py (F.linear, batched GQA attention through
baddbmm with an additive causal mask and no K/V head copies, F.silu, fused F.cross_entropy); before timing it
checks that it gives the same loss and gradients as model.py (--no-check skips this).
--fused additionally fuses wq|wk|wv and w_gate|w_up into single matrices (the same math and the same AdamW
update elementwise, but not moetrain's parameter layout), off by default.

Threads. Debian's torch runs its own ops on OpenMP (libgomp) and its matmuls in the system OpenBLAS, whose
pthreads build keeps a second thread pool. With both pools at T threads and libgomp's default spin-waiting,
the idle OpenMP workers steal the cores the BLAS workers need, and steps get 2-10x slower. So by default
--threads T sets OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = T and OMP_WAIT_POLICY=PASSIVE (before torch loads;
an OMP_WAIT_POLICY already in the environment is kept). --tune instead times three layouts in subprocesses,
(omp T, blas T, passive), (omp T, blas 1), (omp 1, blas T), and reports the fastest (the baseline's best case).
"""

import argparse
import json
import math
import os
import sys
import time


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="moetrain job config (TOML)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: os.cpu_count())")
    ap.add_argument("--omp-threads", type=int, default=0, help="torch/OpenMP threads (0: --threads)")
    ap.add_argument("--blas-threads", type=int, default=0, help="OpenBLAS threads (0: --threads)")
    ap.add_argument("--omp-wait", choices=["passive", "active", "unset"], default=None,
                    help="OMP_WAIT_POLICY (default: the environment's, else passive; unset: libgomp's default)")
    ap.add_argument("--tune", action="store_true", help="try three thread layouts, report the fastest")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config key, e.g. --set train.batch_size=8 (value parsed as TOML)")
    ap.add_argument("--fused", action="store_true", help="fuse qkv and gate|up projections (same math)")
    ap.add_argument("--no-check", action="store_true", help="skip the equivalence check against model.py")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def thread_layout(args):
    """(threads, omp threads, blas threads) from the arguments."""
    threads = args.threads if args.threads > 0 else (os.cpu_count() or 1)
    return threads, args.omp_threads or threads, args.blas_threads or threads


if __name__ == "__main__":
    ARGS = parse_args()
    _, _omp, _blas = thread_layout(ARGS)
    # Thread pools are sized when the libraries load, so this must precede `import torch`.
    os.environ["OMP_NUM_THREADS"] = str(_omp)
    os.environ["OPENBLAS_NUM_THREADS"] = str(_blas)
    os.environ["MKL_NUM_THREADS"] = str(_blas)
    if ARGS.omp_wait == "unset":
        os.environ.pop("OMP_WAIT_POLICY", None)
    elif ARGS.omp_wait:
        os.environ["OMP_WAIT_POLICY"] = ARGS.omp_wait.upper()
    else:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import ModelConfig, Transformer, rope_cos_sin  # noqa: E402


class FastTransformer(nn.Module):
    """model.py's math, formulated for eager speed. Parameters are model.py's (or, with fused=True, the
    concatenations attn.wqkv = [wq; wk; wv] and mlp.w_gate_up = [w_gate; w_up])."""

    def __init__(self, cfg, fused=False):
        super().__init__()
        self.cfg, self.fused = cfg, fused
        C, D, Hq, Hkv, Fd = cfg.d_model, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff
        self.params = nn.ParameterDict()  # keyed by name with "." spelled "__" (module attribute rules)
        self._add("embed.weight", (cfg.vocab_size, C))
        for i in range(cfg.n_layers):
            p = f"layers.{i}."
            shapes = {"attn_norm.weight": (C,), "attn.wo.weight": (C, Hq * D), "mlp_norm.weight": (C,),
                      "mlp.w_down.weight": (C, Fd)}
            if fused:
                shapes["attn.wqkv.weight"] = ((Hq + 2 * Hkv) * D, C)
                shapes["mlp.w_gate_up.weight"] = (2 * Fd, C)
            else:
                shapes.update({"attn.wq.weight": (Hq * D, C), "attn.wk.weight": (Hkv * D, C),
                               "attn.wv.weight": (Hkv * D, C), "mlp.w_gate.weight": (Fd, C),
                               "mlp.w_up.weight": (Fd, C)})
            for n, s in shapes.items():
                self._add(p + n, s)
        self._add("final_norm.weight", (C,))
        if not cfg.tie_embeddings:
            self._add("lm_head.weight", (cfg.vocab_size, C))
        self._cache = {}

    def _add(self, name, shape):
        self.params[name.replace(".", "__")] = nn.Parameter(torch.empty(shape))

    def p(self, name):
        return self.params[name.replace(".", "__")]

    def named_weights(self):
        return [(k.replace("__", "."), v) for k, v in self.params.items()]

    def load_reference(self, ref_state):
        """Copies model.py parameters (canonical names) into this model."""
        with torch.no_grad():
            for i in range(self.cfg.n_layers):
                p = f"layers.{i}."
                if self.fused:
                    self.p(p + "attn.wqkv.weight").copy_(torch.cat(
                        [ref_state[p + "attn.wq.weight"], ref_state[p + "attn.wk.weight"],
                         ref_state[p + "attn.wv.weight"]]))
                    self.p(p + "mlp.w_gate_up.weight").copy_(torch.cat(
                        [ref_state[p + "mlp.w_gate.weight"], ref_state[p + "mlp.w_up.weight"]]))
            for name, t in ref_state.items():
                if name.replace(".", "__") in self.params:
                    self.p(name).copy_(t)

    def reference_grads(self):
        """Gradients under the canonical names (fused ones split back)."""
        g = {}
        C, D, Hq, Hkv, Fd = (self.cfg.d_model, self.cfg.head_dim, self.cfg.n_heads, self.cfg.n_kv_heads,
                             self.cfg.d_ff)
        for name, prm in self.named_weights():
            if name.endswith("attn.wqkv.weight"):
                base = name[: -len("wqkv.weight")]
                gq, gk, gv = prm.grad.split([Hq * D, Hkv * D, Hkv * D])
                g[base + "wq.weight"], g[base + "wk.weight"], g[base + "wv.weight"] = gq, gk, gv
            elif name.endswith("mlp.w_gate_up.weight"):
                base = name[: -len("w_gate_up.weight")]
                g[base + "w_gate.weight"], g[base + "w_up.weight"] = prm.grad.split([Fd, Fd])
            else:
                g[name] = prm.grad
        return g

    def _tables(self, T, dtype):
        """Per (T, dtype): RoPE as y = x * cos2 + swap_halves(x) * sin2 with cos2 = [cos, cos] and
        sin2 = [-sin, sin] (equal to model.rope term by term), and the additive causal mask for G*T rows."""
        key = (T, dtype)
        if key not in self._cache:
            cos, sin = rope_cos_sin(T, self.cfg.head_dim, self.cfg.rope_theta, dtype)
            cos2 = torch.cat([cos, cos], -1)[None, :, None, :]
            sin2 = torch.cat([-sin, sin], -1)[None, :, None, :]
            G = self.cfg.n_heads // self.cfg.n_kv_heads
            mask = torch.full((T, T), float("-inf"), dtype=dtype).triu(1).repeat(G, 1)  # [G*T, T]
            self._cache[key] = (cos2, sin2, mask)
        return self._cache[key]

    def _rmsnorm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps) * w

    def _rope(self, x, cos2, sin2):
        half = x.shape[-1] // 2
        return x * cos2 + torch.cat([x[..., half:], x[..., :half]], -1) * sin2

    def forward(self, ids, targets):
        cfg = self.cfg
        B, T = ids.shape
        D, Hq, Hkv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
        G = Hq // Hkv
        x = F.embedding(ids, self.p("embed.weight"))
        cos2, sin2, mask = self._tables(T, x.dtype)
        scale = 1.0 / math.sqrt(D)
        for i in range(cfg.n_layers):
            p = f"layers.{i}."
            a = self._rmsnorm(x, self.p(p + "attn_norm.weight"))
            if self.fused:
                qkv = F.linear(a, self.p(p + "attn.wqkv.weight")).view(B, T, Hq + 2 * Hkv, D)
                qk = self._rope(qkv[:, :, : Hq + Hkv], cos2, sin2)
                q, k, v = qk[:, :, :Hq], qk[:, :, Hq:], qkv[:, :, Hq + Hkv:]
            else:
                q = self._rope(F.linear(a, self.p(p + "attn.wq.weight")).view(B, T, Hq, D), cos2, sin2)
                k = self._rope(F.linear(a, self.p(p + "attn.wk.weight")).view(B, T, Hkv, D), cos2, sin2)
                v = F.linear(a, self.p(p + "attn.wv.weight")).view(B, T, Hkv, D)
            # Query head h = g_kv * G + j reads kv head g_kv: batch over (B, Hkv), rows (j, t).
            qb = q.view(B, T, Hkv, G, D).permute(0, 2, 3, 1, 4).reshape(B * Hkv, G * T, D)
            kb = k.permute(0, 2, 3, 1).reshape(B * Hkv, D, T)
            vb = v.permute(0, 2, 1, 3).reshape(B * Hkv, T, D)
            probs = torch.softmax(torch.baddbmm(mask, qb, kb, alpha=scale), dim=-1)
            o = torch.bmm(probs, vb).view(B, Hkv, G, T, D).permute(0, 3, 1, 2, 4).reshape(B, T, Hq * D)
            h = x + F.linear(o, self.p(p + "attn.wo.weight"))
            m = self._rmsnorm(h, self.p(p + "mlp_norm.weight"))
            if self.fused:
                gate, up = F.linear(m, self.p(p + "mlp.w_gate_up.weight")).chunk(2, dim=-1)
            else:
                gate = F.linear(m, self.p(p + "mlp.w_gate.weight"))
                up = F.linear(m, self.p(p + "mlp.w_up.weight"))
            x = h + F.linear(F.silu(gate) * up, self.p(p + "mlp.w_down.weight"))
        x = self._rmsnorm(x, self.p("final_norm.weight"))
        w_out = self.p("embed.weight") if cfg.tie_embeddings else self.p("lm_head.weight")
        logits = F.linear(x, w_out)
        return F.cross_entropy(logits.view(B * T, -1), targets.reshape(-1), ignore_index=-1)


def compare_with_reference(cfg, batch, seq, dtype=torch.float32, fused=False, seed=0):
    """Loss relative error and the worst gradient rho of FastTransformer vs model.Transformer."""
    torch.manual_seed(seed)
    ref = Transformer(cfg).to(dtype)
    fast = FastTransformer(cfg, fused).to(dtype)
    fast.load_reference(ref.state_dict())
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)
    targets = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)
    targets[0, 0] = -1
    lr = ref.loss(ids, targets)
    lr.backward()
    lf = fast(ids, targets)
    lf.backward()
    fg = fast.reference_grads()
    worst = 0.0
    for name, prm in ref.named_parameters():
        worst = max(worst, float((prm.grad - fg[name]).norm() / prm.grad.norm()))
    return abs(float(lf) - float(lr)) / abs(float(lr)), worst


def load_config(path, overrides):
    import tomllib
    with open(path, "rb") as f:
        doc = tomllib.load(f)
    for item in overrides:
        key, _, value = item.partition("=")
        try:
            val = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            val = value
        *parents, leaf = key.strip().split(".")
        node = doc
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = val
    return doc


def blas_library():
    """The BLAS shared object actually mapped into this process (resolved path), for the record."""
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "blas" in line.rsplit("/", 1)[-1].lower()}
        return ",".join(sorted(os.path.realpath(p) for p in libs)) or "unknown"
    except OSError:
        return "unknown"


def tune(args):
    """Runs this script once per thread layout and prints the fastest run's line, with all tried."""
    import subprocess
    threads, _, _ = thread_layout(args)
    layouts = [(threads, threads, "passive"), (threads, 1, "unset"), (1, threads, "unset")]
    if threads == 1:
        layouts = layouts[:1]
    base = [a for a in sys.argv[1:] if a != "--tune"]
    results = []
    for omp, blas, wait in layouts:
        cmd = [sys.executable, os.path.abspath(__file__), *base, "--threads", str(threads),
               "--omp-threads", str(omp), "--blas-threads", str(blas), "--omp-wait", wait]
        out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    best = min(results, key=lambda r: r["ms_per_step"])
    best["tuned"] = [{"omp": r["omp_threads"], "blas": r["blas_threads"], "omp_wait": r["omp_wait_policy"],
                      "ms_per_step": r["ms_per_step"]} for r in results]
    print(json.dumps(best))
    return 0


def main(args):
    if args.tune:
        return tune(args)
    threads, omp_threads, blas_threads = thread_layout(args)
    torch.set_num_threads(omp_threads)
    doc = load_config(args.config, args.set)
    cfg = ModelConfig.from_toml(doc)
    train = doc.get("train", {})
    adamw = doc.get("adamw", {})
    B, T = int(train.get("batch_size", 16)), int(train.get("seq_len", 128))
    accum = int(train.get("grad_accum", 1))
    lr = float(train.get("lr", 3e-4))
    wd = float(adamw.get("weight_decay", train.get("weight_decay", 0.1)))
    clip = float(train.get("grad_clip", doc.get("optim", {}).get("clip_grad_norm", 1.0)))
    betas = (float(adamw.get("beta1", 0.9)), float(adamw.get("beta2", 0.95)))
    eps = float(adamw.get("eps", 1e-8))

    if not args.no_check:
        rel, worst = compare_with_reference(cfg, batch=2, seq=min(T, 32), fused=args.fused, seed=args.seed)
        if rel > 1e-5 or worst > 1e-4:
            print(f"bench_torch: fast formulation differs from model.py: loss rel err {rel:.2e}, "
                  f"worst grad rho {worst:.2e}", file=sys.stderr)
            return 1

    torch.manual_seed(args.seed)
    ref = Transformer(cfg)
    model = FastTransformer(cfg, args.fused)
    model.load_reference(ref.state_dict())
    del ref
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=betas, eps=eps, foreach=True)

    g = torch.Generator().manual_seed(args.seed + 7)
    pool = [torch.randint(0, cfg.vocab_size, (B, T + 1), generator=g) for _ in range(4)]
    batches = [(b[:, :-1].contiguous(), b[:, 1:].contiguous()) for b in pool]

    def step(k):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for j in range(accum):
            ids, tg = batches[(k * accum + j) % len(batches)]
            loss = model(ids, tg) / accum
            loss.backward()
            total += loss.item()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        return total

    for k in range(args.warmup):
        step(k)
    t0 = time.perf_counter()
    last = 0.0
    for k in range(args.steps):
        last = step(args.warmup + k)
    dt = time.perf_counter() - t0
    if not math.isfinite(last):
        print(f"bench_torch: non-finite loss {last}", file=sys.stderr)
        return 1
    ms = 1000.0 * dt / max(args.steps, 1)
    print(json.dumps({
        "bench": "train_step", "impl": "pytorch", "torch": torch.__version__, "batch": B, "seq": T,
        "steps": args.steps, "ms_per_step": round(ms, 3), "tokens_per_s": round(B * T * accum / (ms / 1000.0), 1),
        "threads": threads, "omp_threads": omp_threads, "blas_threads": blas_threads,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""), "grad_accum": accum, "warmup": args.warmup, "fused": args.fused,
        "params": sum(p.numel() for p in model.parameters()), "final_loss": round(last, 4),
        "blas": blas_library()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
