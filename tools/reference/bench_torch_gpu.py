#!/usr/bin/env python3
"""PyTorch GPU baseline for moetrain's bench_train: the same dense model, trained the way a PyTorch user would.

  bench_torch_gpu.py --config configs/dense_1b3.toml [--mode eager|compile|both] [--steps 10] [--warmup 3]

A llama-style model of the config's shape (RMSNorm, rotary embeddings, causal SDPA with GQA, SwiGLU, untied or
tied LM head; no biases), f32 parameters under bf16 autocast, fused AdamW (weight decay on matrices only, betas
and eps from [train]), clip_grad_norm_ to train.grad_clip, F.cross_entropy. Random tokens, [batch_size, seq_len].
--mode compile compiles each block and the head (final norm, LM head, loss) with torch.compile (the default
inductor backend; per block as torchtitan does, so one graph serves every layer); compile time is spent in the
warm-up steps. Prints one JSON line per mode with tokens/s and MFU, using moetrain's FLOPs formula
(docs/PERFORMANCE.md): 6 * N_matmul + 6 * L * T * Hq * D per token, against 989 TFLOP/s.

This runs on the device's own PyTorch (2.x, CUDA); it is not part of the CPU test suite.
"""

import argparse
import json
import math
import os
import sys
import tomllib

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import ModelConfig  # noqa: E402
from train_harness import PEAK_FLOPS, adamw_from_train, random_batches, rope_tables, timed_training  # noqa: E402



class Rms(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, D, Hq, Hkv, Fd = cfg.d_model, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff
        self.cfg = cfg
        self.attn_norm, self.mlp_norm = Rms(C, cfg.norm_eps), Rms(C, cfg.norm_eps)
        self.wq = nn.Linear(C, Hq * D, bias=False)
        self.wk = nn.Linear(C, Hkv * D, bias=False)
        self.wv = nn.Linear(C, Hkv * D, bias=False)
        self.wo = nn.Linear(Hq * D, C, bias=False)
        self.w_gate = nn.Linear(C, Fd, bias=False)
        self.w_up = nn.Linear(C, Fd, bias=False)
        self.w_down = nn.Linear(Fd, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        D, Hq, Hkv = self.cfg.head_dim, self.cfg.n_heads, self.cfg.n_kv_heads
        a = self.attn_norm(x)
        q = self.wq(a).view(B, T, Hq, D).transpose(1, 2)
        k = self.wk(a).view(B, T, Hkv, D).transpose(1, 2)
        v = self.wv(a).view(B, T, Hkv, D).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=Hq != Hkv)
        h = x + self.wo(o.transpose(1, 2).reshape(B, T, Hq * D))
        m = self.mlp_norm(h)
        return h + self.w_down(F.silu(self.w_gate(m)) * self.w_up(m))


def rope(x, cos, sin):
    """Rotate-half rotary embedding of x [B, H, T, D] with cos/sin [T, D/2] (moetrain's layout)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


class Llama(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.final_norm = Rms(cfg.d_model, cfg.norm_eps)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        for name, p in self.named_parameters():
            if p.ndim >= 2:
                nn.init.normal_(p, 0.0, cfg.init_std)

    def forward(self, ids, targets, cos, sin):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.head_loss(x, targets)

    def head_loss(self, x, targets):
        x = self.final_norm(x)
        logits = F.linear(x, self.embed.weight if self.lm_head is None else self.lm_head.weight)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def flops_per_token(model, cfg, seq):
    matmul = sum(p.numel() for n, p in model.named_parameters() if p.ndim == 2 and not n.startswith("embed."))
    if cfg.tie_embeddings:
        matmul += cfg.vocab_size * cfg.d_model
    return 6.0 * matmul + 6.0 * cfg.n_layers * seq * cfg.n_heads * cfg.head_dim


def run_mode(mode, cfg, train, args):
    torch.manual_seed(args.seed)
    dev = torch.device("cuda")
    B, T = int(train.get("batch_size", 4)), int(train.get("seq_len", 4096))
    model = Llama(cfg).to(dev)
    opt = adamw_from_train(model, train)
    cos, sin = rope_tables(cfg.head_dim, cfg.rope_theta, T, dev)
    batches = random_batches(cfg.vocab_size, B, T, dev, args.seed + 7, 4)
    if mode == "compile":
        # Per block (as torchtitan does): one graph reused by all layers compiles in seconds, not minutes; the
        # head (final norm, LM head, loss) is compiled as one more graph.
        for layer in model.layers:
            layer.compile()
        model.head_loss = torch.compile(model.head_loss)
    r = timed_training(lambda x, y: model(x, y, cos, sin), model, opt, train, batches, args.warmup, args.steps)
    ms, last = r["ms"], r["loss"]
    tok_s = B * T / (ms / 1000.0)
    fpt = flops_per_token(model, cfg, T)
    line = {"bench": "train_step", "impl": "pytorch", "mode": mode, "torch": torch.__version__,
            "device": torch.cuda.get_device_name(), "batch": B, "seq": T, "steps": args.steps,
            "ms_per_step": round(ms, 3), "tokens_per_s": round(tok_s, 1), "flops_per_token": fpt,
            "mfu": round(tok_s * fpt / PEAK_FLOPS, 4), "peak_device_bytes": r["peak"],
            "params": sum(p.numel() for p in model.parameters()), "warmup_s": round(r["warm_s"], 1),
            "final_loss": round(last, 4)}
    if not math.isfinite(last):
        line["error"] = "non-finite loss"
    print(json.dumps(line), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--mode", choices=["eager", "compile", "both"], default="both")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with open(args.config, "rb") as f:
        doc = tomllib.load(f)
    cfg = ModelConfig.from_toml(doc)
    torch.backends.cuda.matmul.allow_tf32 = False
    for mode in (["eager", "compile"] if args.mode == "both" else [args.mode]):
        run_mode(mode, cfg, doc.get("train", {}), args)
        torch.cuda.empty_cache()  # the mode's model and optimizer are gone with run_mode's frame
    return 0


if __name__ == "__main__":
    sys.exit(main())
