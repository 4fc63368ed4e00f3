#!/usr/bin/env python3
"""PyTorch GPU baseline for moetrain's hybrid MoE training step (issue 25): the same model, written the way a PyTorch
user would, with the fastest public kernels for its parts.

  bench_hybrid_torch.py --config configs/kimi_linear_mini.toml --fla .fla [--steps 4] [--warmup 2]
                        [--set train.batch_size=2] [--flops-per-token F]

The model of the config's [model], [kda], [moe] and [attnres] tables (tools/reference/model.py's ModelConfig):
  - KDA layers: fla's KimiDeltaAttention (flash-linear-attention, carried as source with --fla; its Triton short
    convolution, chunk_kda with the safe lower-bounded gate, fused gated RMSNorm), as Kimi Linear's own code uses it;
  - global attention: SDPA (flash backend), GQA, no position encoding when the config has none, RoPE otherwise;
  - MoE layers: sigmoid router (f32 scores), top-k, gates normalised and scaled, a stable argsort permutation and
    the three expert GEMMs with torch._grouped_mm (device-side offsets), shared expert(s) as a dense SwiGLU;
  - Block Attention Residuals over blocks of attnres.block_size sub-layers (softmax over the block sources of
    query . RMSNorm(source), tools/reference/model.py's AttnResMix);
  - f32 parameters under bf16 autocast, fused AdamW (decay on matrices), clip_grad_norm_, F.cross_entropy on
    random tokens [batch_size, seq_len].
The selection bias of Quantile Balancing is a zero buffer here (moetrain's balancer update is a few small kernels
per MoE layer); routing is otherwise the same computation. Prints one JSON line: tokens/s, peak device memory
(torch.cuda.max_memory_allocated over the timed steps) and, with --flops-per-token (moetrain's count for the same
model, printed by bench_train), MFU against 989 TFLOP/s.
"""

import argparse
import json
import math
import os
import sys
import time
import tomllib

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import einops_shim  # noqa: E402
from bench_torch_gpu import Rms, rope  # noqa: E402
from model import ModelConfig  # noqa: E402
from train_harness import PEAK_FLOPS, adamw_from_train, random_batches, rope_tables, timed_training  # noqa: E402



class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, D = cfg.d_model, cfg.head_dim
        self.hq, self.hkv, self.d = cfg.n_heads, cfg.n_kv_heads, D
        self.wq = nn.Linear(C, self.hq * D, bias=False)
        self.wk = nn.Linear(C, self.hkv * D, bias=False)
        self.wv = nn.Linear(C, self.hkv * D, bias=False)
        self.wo = nn.Linear(self.hq * D, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.hq, self.d).transpose(1, 2)
        k = self.wk(x).view(B, T, self.hkv, self.d).transpose(1, 2)
        v = self.wv(x).view(B, T, self.hkv, self.d).transpose(1, 2)
        if cos is not None:
            q, k = rope(q, cos, sin), rope(k, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.hq != self.hkv)
        return self.wo(o.transpose(1, 2).reshape(B, T, self.hq * self.d))


class Mlp(nn.Module):
    def __init__(self, cfg, width):
        super().__init__()
        self.w_gate = nn.Linear(cfg.d_model, width, bias=False)
        self.w_up = nn.Linear(cfg.d_model, width, bias=False)
        self.w_down = nn.Linear(width, cfg.d_model, bias=False)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Moe(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        m = cfg.moe_cfg
        self.e, self.k, self.scale, self.norm = m["num_experts"], m["top_k"], m["routed_scale"], m["normalize_gates"]
        f, c = m["expert_ffn_dim"], cfg.d_model
        self.router = nn.Linear(c, self.e, bias=False)
        self.w_gate = nn.Parameter(torch.empty(self.e, f, c))
        self.w_up = nn.Parameter(torch.empty(self.e, f, c))
        self.w_down = nn.Parameter(torch.empty(self.e, c, f))
        self.shared = Mlp(cfg, f * m["num_shared_experts"]) if m["num_shared_experts"] > 0 else None
        self.register_buffer("bias", torch.zeros(self.e), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        xt = x.reshape(B * T, C)
        scores = torch.sigmoid(self.router(xt).float())
        idx = torch.topk(scores + self.bias, self.k, dim=-1).indices
        sel = scores.gather(1, idx)
        gates = self.scale * (sel / (sel.sum(-1, keepdim=True) + 1e-20) if self.norm else sel)
        flat = idx.flatten()
        order = torch.argsort(flat, stable=True)
        offs = torch.cumsum(torch.bincount(flat, minlength=self.e), 0).to(torch.int32)
        dt = torch.bfloat16
        xp = xt.to(dt)[order // self.k]
        wg, wu, wd = (w.to(dt).transpose(-2, -1) for w in (self.w_gate, self.w_up, self.w_down))
        h = F.silu(torch._grouped_mm(xp, wg, offs=offs)) * torch._grouped_mm(xp, wu, offs=offs)
        yp = torch._grouped_mm(h, wd, offs=offs)
        y = torch.bmm(gates.to(dt).unsqueeze(1), yp[torch.argsort(order)].view(B * T, self.k, C)).squeeze(1)
        out = y.view(B, T, C)
        return out + self.shared(x) if self.shared is not None else out


class Layer(nn.Module):
    def __init__(self, cfg, idx, kda_cls):
        super().__init__()
        self.norm0, self.norm1 = Rms(cfg.d_model, cfg.norm_eps), Rms(cfg.d_model, cfg.norm_eps)
        if cfg.layer_is_kda(idx):
            k = cfg.kda_cfg
            if k["gate"] != "lower_bound":
                raise SystemExit("bench_hybrid_torch: kda.gate must be lower_bound (fla's safe gate)")
            self.mixer = kda_cls(hidden_size=cfg.d_model, head_dim=k["head_dim"], num_heads=k["num_heads"],
                                 num_v_heads=k["num_v_heads"], expand_v=k["head_v_dim"] / k["head_dim"],
                                 conv_size=k["conv_size"], safe_gate=True, lower_bound=k["gate_lower_bound"],
                                 norm_eps=cfg.norm_eps, layer_idx=idx)
            self.kda = True
        else:
            self.mixer, self.kda = Attention(cfg), False
        self.ffn = Moe(cfg) if cfg.layer_is_moe(idx) else Mlp(cfg, cfg.dense_ffn_dim)

    def branch(self, sub, h, cos, sin):
        if sub == 1:
            return self.ffn(self.norm1(h))
        a = self.norm0(h)
        return self.mixer(a)[0] if self.kda else self.mixer(a, cos, sin)


class AttnResMix(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.query = nn.Parameter(torch.zeros(dim))
        self.key_norm = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, sources):
        if len(sources) == 1:
            return sources[0]
        v = torch.stack(sources)
        keys = F.rms_norm(v, (v.shape[-1],), self.key_norm, self.eps)
        alpha = torch.softmax((keys * self.query).sum(-1).float(), dim=0).to(v.dtype)
        return (alpha.unsqueeze(-1) * v).sum(0)


class Hybrid(nn.Module):
    def __init__(self, cfg, kda_cls):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Layer(cfg, l, kda_cls) for l in range(cfg.n_layers))
        self.final_norm = Rms(cfg.d_model, cfg.norm_eps)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.S = cfg.attnres_block
        if self.S:
            self.mix = nn.ModuleList(AttnResMix(cfg.d_model, cfg.norm_eps) for _ in range(2 * cfg.n_layers + 1))
        with torch.no_grad():
            for p in self.parameters():
                if p.ndim >= 2:
                    p.normal_(0.0, cfg.init_std)

    def forward(self, ids, targets, cos, sin):
        x = self.embed(ids)
        L = 2 * len(self.layers)
        if self.S:
            blocks, partial = [x], None
            for l in range(L):
                i = l % self.S
                h = self.mix[l](blocks + ([partial] if i > 0 else []))
                v = self.layers[l // 2].branch(l % 2, h, cos, sin)
                partial = v if i == 0 else partial + v
                if i == self.S - 1 or l == L - 1:
                    blocks.append(partial)
            x = self.mix[L](blocks)
        else:
            for l in range(L):
                x = x + self.layers[l // 2].branch(l % 2, x, cos, sin)
        x = self.final_norm(x)
        logits = F.linear(x, self.embed.weight if self.lm_head is None else self.lm_head.weight)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def apply_sets(doc, sets):
    for s in sets:
        key, _, value = s.partition("=")
        *path, leaf = key.split(".")
        table = doc
        for p in path:
            table = table.setdefault(p, {})
        table[leaf] = tomllib.loads(f"v = {value}")["v"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--fla", required=True, help="directory holding fla/ (flash-linear-attention's package)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], help="section.key=value, as moetrain's --set")
    ap.add_argument("--flops-per-token", type=float, default=0.0, help="moetrain's FLOPs count for this model")
    args = ap.parse_args()
    with open(args.config, "rb") as f:
        doc = tomllib.load(f)
    apply_sets(doc, args.set)
    cfg = ModelConfig.from_toml(doc)
    train = doc.get("train", {})
    sys.path.insert(0, os.path.abspath(args.fla))
    shim = einops_shim.install()
    from fla.layers.kda import KimiDeltaAttention

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(args.seed)
    dev = torch.device("cuda")
    B, T = int(train.get("batch_size", 4)), int(train.get("seq_len", 4096))
    t0 = time.perf_counter()
    with dev:  # parameters are created and initialised on the GPU (seconds; on the host, minutes for billions)
        model = Hybrid(cfg, KimiDeltaAttention)
    torch.cuda.synchronize()
    print(f"bench_hybrid_torch: model built in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    opt = adamw_from_train(model, train)
    cos = sin = None
    if cfg.attn_rope:
        cos, sin = rope_tables(cfg.head_dim, cfg.rope_theta, T, dev)
    batches = random_batches(cfg.vocab_size, B, T, dev, args.seed + 7, 2)

    def warm(k, seconds):
        print(f"bench_hybrid_torch: warm-up step {k} done at {seconds:.1f} s (Triton compiles and autotunes fla's "
              "kernels in the first)", file=sys.stderr, flush=True)

    r = timed_training(lambda x, y: model(x, y, cos, sin), model, opt, train, batches, args.warmup, args.steps, warm)
    ms, last = r["ms"], r["loss"]
    tok_s = B * T / (ms / 1000.0)
    line = {"bench": "train_step", "impl": "pytorch eager + fla chunk_kda + torch._grouped_mm",
            "config": os.path.basename(args.config), "torch": torch.__version__, "einops_shim": shim,
            "device": torch.cuda.get_device_name(), "batch": B, "seq": T, "steps": args.steps,
            "ms_per_step": round(ms, 3), "tokens_per_s": round(tok_s, 1),
            "peak_device_bytes": r["peak"],
            "params": sum(p.numel() for p in model.parameters()), "warmup_s": round(r["warm_s"], 1),
            "final_loss": round(last, 4)}
    if args.flops_per_token > 0:
        line["flops_per_token"] = args.flops_per_token
        line["mfu"] = round(tok_s * args.flops_per_token / PEAK_FLOPS, 4)
    if not math.isfinite(last):
        line["error"] = "non-finite loss"
    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
