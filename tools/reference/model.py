"""The moetrain decoder-only LM (dense, or hybrid with KDA layers) written in plain PyTorch, as a readable
specification.

This is the independent reference that moetrain's C++ model is checked against (check_parity.py). It uses
only elementary torch ops (matmul, softmax, rsqrt, ...), so every step of the math is visible here:

    x = embed.weight[ids]                                            [B, T, C]
    for each layer l, with mixer layer_pattern[l % len(layer_pattern)]:
      'A' (attention):
        a = rmsnorm(x, attn_norm.weight)
        q = rope(a @ wq^T), k = rope(a @ wk^T), v = a @ wv^T         heads: [B, T, H, D]; rope only when
        h = x + (causal_gqa_attention(q, k, v) @ wo^T)               attn_rope (default: all-attention models)
      'K' (Kimi Delta Attention, kda.py's kda_layer: the naive token-by-token recurrence):
        h = x + kda_layer(rmsnorm(x, kda_norm.weight))
      then
        m = rmsnorm(h, mlp_norm.weight)
        x = h + (silu(m @ w_gate^T) * (m @ w_up^T)) @ w_down^T         (a dense layer)
        x = h + moe_layer(m)                                           ([moe] enabled, l >= first_k_dense: moe.py's
                                                                        router, top-k, experts and shared experts)
    logits = rmsnorm(x, final_norm.weight) @ W^T,  W = embed.weight if tied else lm_head.weight
    With [attnres] mode = block|full (Block Attention Residuals, spec attnres.md §2-§3) the residual adds are
    replaced: the 2 * n_layers sub-layers (mixer, MLP of each layer) read h_l = attnres_mix(sources) of the
    embedding, the completed blocks of S sub-layers and the running partial sum, and a final mix of all blocks
    feeds final_norm (attnres_forward below).
    loss = mean over positions with target != -1 of (logsumexp(logits) - logits[target])
           (+ the MoE layers' aux losses with [moe] balance = "aux_loss"; Transformer.last_aux keeps their sum)

Parameter names (state_dict keys) are exactly moetrain's canonical names, e.g. layers.0.attn.wq.weight,
layers.0.kda.q_proj.weight. No biases anywhere. Works in float32 and float64 (model.to(torch.float64)).
"""

import math
import os
import sys
from dataclasses import dataclass, field

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kda import kda_layer  # noqa: E402
from moe import moe_layer  # noqa: E402

IGNORE_INDEX = -1


@dataclass
class ModelConfig:
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    head_dim: int = 0  # 0: d_model // n_heads
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    init_std: float = 0.02
    layer_pattern: str = "A"  # layer l: 'A' attention or 'K' KDA, layer_pattern[l % len]
    attn_pos: str = "auto"  # rope | nope | auto (rope when every layer is attention)
    kda: dict = field(default_factory=dict)  # the [kda] table; missing keys take moetrain's defaults
    attnres: dict = field(default_factory=dict)  # the [attnres] table (mode off|block|full, block_size)
    moe: dict = field(default_factory=dict)  # the [moe] table (nested [moe.aux_loss] etc. as dicts)

    def __post_init__(self):
        if self.head_dim == 0:
            if self.d_model % self.n_heads:
                raise ValueError(f"model.d_model {self.d_model} is not a multiple of model.n_heads {self.n_heads}")
            self.head_dim = self.d_model // self.n_heads
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"model.n_heads {self.n_heads} is not a multiple of model.n_kv_heads {self.n_kv_heads}")
        if not self.layer_pattern or set(self.layer_pattern) - {"A", "K"} or self.n_layers % len(self.layer_pattern):
            raise ValueError(f"model.layer_pattern {self.layer_pattern!r}: letters A and K, length dividing "
                             f"model.n_layers {self.n_layers}")
        if self.attn_pos not in ("auto", "rope", "nope"):
            raise ValueError(f"model.attn_pos {self.attn_pos!r} is not auto, rope or nope")
        if self.attn_rope and self.head_dim % 2:
            raise ValueError(f"model.head_dim {self.head_dim} must be even for rotary embeddings")
        k = self.kda
        h = int(k.get("num_heads", 0)) or self.n_heads
        kd = int(k.get("head_dim", 0)) or self.head_dim
        self.kda_cfg = {  # what kda.kda_layer reads, defaults applied
            "num_heads": h,
            "num_v_heads": int(k.get("num_v_heads", 0)) or h,
            "head_dim": kd,
            "head_v_dim": int(k.get("head_v_dim", 0)) or kd,
            "conv_size": int(k.get("conv_size", 4)),
            "gate": k.get("gate", "lower_bound"),
            "gate_lower_bound": float(k.get("gate_lower_bound", -5.0)),
            "gate_use_a_log": bool(k.get("gate_use_A_log", True)),
            "norm_eps": self.norm_eps,
        }

    @property
    def moe_cfg(self):
        """What moe.moe_layer reads, moetrain's defaults applied (moe.md section 5)."""
        m = self.moe
        return {
            "num_experts": int(m.get("num_experts", 64)),
            "top_k": int(m.get("top_k", 4)),
            "num_shared_experts": int(m.get("num_shared_experts", 1)),
            "expert_ffn_dim": int(m.get("expert_ffn_dim", 1024)),
            "score": m.get("score", "sigmoid"),
            "normalize_gates": bool(m.get("normalize_gates", True)),
            "routed_scale": float(m.get("routed_scale", 2.5)),
            "capacity_factor": float(m.get("capacity_factor", 0.0)),
            "drop_policy": m.get("drop_policy", "probs"),
            "balance": m.get("balance", "quantile"),
            "aux_coeff": float(m.get("aux_loss", {}).get("coeff", 1e-2)),
        }

    def layer_is_moe(self, layer):
        return bool(self.moe.get("enabled", False)) and layer >= int(self.moe.get("first_k_dense", 1))

    @property
    def dense_ffn_dim(self):
        width = int(self.moe.get("dense_ffn_dim", 0)) if self.moe.get("enabled", False) else 0
        return width or self.d_ff

    def layer_is_kda(self, layer):
        return self.layer_pattern[layer % len(self.layer_pattern)] == "K"

    @property
    def attn_rope(self):
        return self.attn_pos == "rope" or (self.attn_pos == "auto" and "K" not in self.layer_pattern)

    @classmethod
    def from_toml(cls, doc):
        """Builds the config from a parsed job config (the whole document, or just its [model] table)."""
        m = doc.get("model", doc)
        return cls(
            vocab_size=int(m["vocab_size"]),
            d_model=int(m["d_model"]),
            n_layers=int(m["n_layers"]),
            n_heads=int(m["n_heads"]),
            n_kv_heads=int(m.get("n_kv_heads", m["n_heads"])),
            d_ff=int(m["d_ff"]),
            head_dim=int(m.get("head_dim", 0)),
            rope_theta=float(m.get("rope_theta", 10000.0)),
            norm_eps=float(m.get("norm_eps", 1e-5)),
            tie_embeddings=bool(m.get("tie_embeddings", True)),
            init_std=float(m.get("init_std", 0.02)),
            layer_pattern=str(m.get("layer_pattern", "A")),
            attn_pos=str(m.get("attn_pos", "auto")),
            kda=dict(doc.get("kda", {})) if "model" in doc else {},
            attnres=dict(doc.get("attnres", {})) if "model" in doc else {},
            moe=dict(doc.get("moe", {})) if "model" in doc else {},
        )

    @property
    def attnres_block(self):
        """S, the sub-layers per AttnRes block, or 0 when AttnRes is off."""
        mode = self.attnres.get("mode", "off")
        return 0 if mode == "off" else (1 if mode == "full" else int(self.attnres.get("block_size", 6)))


# ----------------------------------------------------------------------------------------------------------
# The elementary functions


def rmsnorm(x, weight, eps):
    """y = x / sqrt(mean(x^2) + eps) * weight, over the last dimension."""
    rstd = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return x * rstd * weight


def rope_cos_sin(seq_len, head_dim, theta, dtype):
    """cos and sin of angle[t, i] = t * theta^(-2i/D) for t in 0..T-1, i in 0..D/2-1, computed in float64
    and then rounded to dtype. Shapes [T, D/2]."""
    i = torch.arange(head_dim // 2, dtype=torch.float64)
    inv_freq = theta ** (-2.0 * i / head_dim)
    t = torch.arange(seq_len, dtype=torch.float64)
    angle = t[:, None] * inv_freq[None, :]
    return torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)


def rope(x, cos, sin):
    """Rotate-half rotary embedding (Llama / Hugging Face layout) of x [B, T, H, D]: for i < D/2,
    y[i] = x[i] cos - x[i + D/2] sin,  y[i + D/2] = x[i + D/2] cos + x[i] sin."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c = cos[None, :, None, :]  # [1, T, 1, D/2]
    s = sin[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def causal_gqa_attention(q, k, v):
    """q [B, T, Hq, D], k and v [B, T, Hkv, D] -> [B, T, Hq, D].
    Query head h reads key/value head h // (Hq / Hkv); scores = q k^T / sqrt(D), keys at positions <= the
    query position only, softmax over keys."""
    B, T, Hq, D = q.shape
    group = Hq // k.shape[2]
    q = q.transpose(1, 2)  # [B, Hq, T, D]
    k = k.transpose(1, 2).repeat_interleave(group, dim=1)  # [B, Hq, T, D]; head h is kv head h // group
    v = v.transpose(1, 2).repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(D)  # [B, Hq, T, T]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, v)  # [B, Hq, T, D]
    return out.transpose(1, 2)


def silu(x):
    return x * torch.sigmoid(x)


def cross_entropy_loss(logits, targets, ignore_index=IGNORE_INDEX):
    """Mean over the positions whose target != ignore_index of (logsumexp(logits) - logits[target]).
    logits [..., V], targets [...] integer. With no counted position the loss is 0 (and so are the grads)."""
    V = logits.shape[-1]
    logits = logits.reshape(-1, V)
    targets = targets.reshape(-1).long()
    keep = targets != ignore_index
    bad = keep & ((targets < 0) | (targets >= V))
    if bool(bad.any()):
        raise ValueError(f"target {int(targets[bad][0])} outside [0, {V}) and not the ignore index {ignore_index}")
    safe = torch.where(keep, targets, torch.zeros_like(targets))
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(1, safe[:, None])[:, 0]
    losses = torch.where(keep, lse - picked, torch.zeros_like(lse))
    count = int(keep.sum())
    return losses.sum() / max(count, 1)


# ----------------------------------------------------------------------------------------------------------
# Modules (they only own parameters with moetrain's names; the math is in the functions above)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return rmsnorm(x, self.weight, self.eps)


def _linear(n_in, n_out):
    return nn.Linear(n_in, n_out, bias=False)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = _linear(cfg.d_model, cfg.n_heads * cfg.head_dim)
        self.wk = _linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim)
        self.wv = _linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim)
        self.wo = _linear(cfg.n_heads * cfg.head_dim, cfg.d_model)

    def forward(self, x, cos, sin):
        """cos, sin: RoPE tables, or None for no position encoding (NoPE)."""
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim)
        if cos is not None:
            q, k = rope(q, cos, sin), rope(k, cos, sin)
        out = causal_gqa_attention(q, k, v).reshape(B, T, self.n_heads * self.head_dim)
        return self.wo(out)


class MLP(nn.Module):
    def __init__(self, cfg, width=None):
        super().__init__()
        width = width or cfg.d_ff
        self.w_gate = _linear(cfg.d_model, width)
        self.w_up = _linear(cfg.d_model, width)
        self.w_down = _linear(width, cfg.d_model)

    def forward(self, x):
        return self.w_down(silu(self.w_gate(x)) * self.w_up(x))


class MoE(nn.Module):
    """The MoE FFN with moetrain's parameter names; the math is moe.py's moe_layer (router, top-k on score + bias,
    gates, experts as a masked loop, shared experts, aux loss). `bias` is the balancer's selection bias: not a
    parameter, loaded from a checkpoint's "balancer/<layer>.moe.router.bias" when there is one."""

    def __init__(self, cfg):
        super().__init__()
        m = self.moe_cfg = cfg.moe_cfg
        e, f, c = m["num_experts"], m["expert_ffn_dim"], cfg.d_model
        self.router = _linear(c, e)
        self.experts = nn.Module()
        self.experts.w_gate = nn.Parameter(torch.empty(e, f, c))
        self.experts.w_up = nn.Parameter(torch.empty(e, f, c))
        self.experts.w_down = nn.Parameter(torch.empty(e, c, f))
        if m["num_shared_experts"] > 0:
            self.shared = MLP(cfg, f * m["num_shared_experts"])
        self.register_buffer("bias", torch.zeros(e), persistent=False)
        self.last_aux = None

    def forward(self, x):
        B, T, C = x.shape
        params = dict(self.named_parameters())
        out, aux, *_ = moe_layer(params.__getitem__, self.moe_cfg, x.reshape(B * T, C), self.bias.to(x.dtype))
        self.last_aux = aux
        return out.view(B, T, C)


class ShortConv(nn.Module):
    """A depthwise causal conv filter, weight [C, W] (kda.causal_conv_silu applies it)."""

    def __init__(self, channels, width):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, width))


class KDA(nn.Module):
    """Kimi Delta Attention with moetrain's (Kimi Linear's) parameter names; the math is kda.kda_layer."""

    def __init__(self, cfg):
        super().__init__()
        k = self.kda_cfg = cfg.kda_cfg
        h, hv, kd, vd, w = k["num_heads"], k["num_v_heads"], k["head_dim"], k["head_v_dim"], k["conv_size"]
        d = cfg.d_model
        self.q_proj, self.k_proj, self.v_proj = _linear(d, h * kd), _linear(d, h * kd), _linear(d, hv * vd)
        self.q_conv1d, self.k_conv1d, self.v_conv1d = ShortConv(h * kd, w), ShortConv(h * kd, w), ShortConv(hv * vd, w)
        self.f_a_proj, self.f_b_proj = _linear(d, kd), _linear(kd, hv * kd)
        self.A_log = nn.Parameter(torch.zeros(hv))
        self.dt_bias = nn.Parameter(torch.zeros(hv * kd))
        self.b_proj = _linear(d, hv)
        self.g_a_proj, self.g_b_proj = _linear(d, vd), _linear(vd, hv * vd)
        self.o_norm = RMSNorm(vd, cfg.norm_eps)
        self.o_proj = _linear(hv * vd, d)

    def forward(self, x):
        B, T, C = x.shape
        params = dict(self.named_parameters())
        out, _ = kda_layer(params.__getitem__, self.kda_cfg, x.reshape(B * T, C), None, B)
        return out.view(B, T, C)


class Block(nn.Module):
    def __init__(self, cfg, kda=False, moe=False):
        super().__init__()
        if kda:
            self.kda_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
            self.kda = KDA(cfg)
        else:
            self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
            self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        if moe:
            self.moe = MoE(cfg)
        else:
            self.mlp = MLP(cfg, cfg.dense_ffn_dim)

    def forward(self, x, cos, sin):
        h = x + self.branch(0, x, cos, sin)
        return h + self.branch(1, h, cos, sin)

    def branch(self, sub, h, cos, sin):
        """Sub-layer 0 (the mixer) or 1 (the MLP) on its own, with its pre-norm and without the residual add."""
        if sub == 1:
            return (self.moe if hasattr(self, "moe") else self.mlp)(self.mlp_norm(h))
        if hasattr(self, "kda"):
            return self.kda(self.kda_norm(h))
        return self.attn(self.attn_norm(h), cos, sin)


class AttnResMix(nn.Module):
    """One Block AttnRes mix (spec attnres.md §2): softmax over sources of query . RMSNorm_keys(source), per token."""

    def __init__(self, dim, eps):
        super().__init__()
        self.query = nn.Parameter(torch.zeros(dim))
        self.key_norm = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, sources):
        v = torch.stack(sources)  # [m, B, T, C]
        keys = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + self.eps) * self.key_norm
        alpha = torch.softmax((keys * self.query).sum(-1), dim=0)  # [m, B, T]
        return (alpha.unsqueeze(-1) * v).sum(0)


def attnres_forward(model, x, cos, sin):
    """The sub-layer loop of spec attnres.md §3: keep the completed blocks (starting with the embedding) and a
    running partial sum; before sub-layer l mix the blocks and (inside a block) the partial; add the output to the
    partial; close the block every S sub-layers and after the last; then the final mix."""
    S, L = model.cfg.attnres_block, 2 * model.cfg.n_layers
    blocks, partial = [x], None
    for l in range(L):
        i = l % S
        h = model.attnres.mix[str(l + 1)](blocks + ([partial] if i > 0 else []))
        v = model.layers[l // 2].branch(l % 2, h, cos, sin)
        partial = v if i == 0 else partial + v
        if i == S - 1 or l == L - 1:
            blocks.append(partial)
    return model.attnres.mix[str(L + 1)](blocks)


class Transformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg, cfg.layer_is_kda(l), cfg.layer_is_moe(l)) for l in range(cfg.n_layers))
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = None if cfg.tie_embeddings else _linear(cfg.d_model, cfg.vocab_size)
        if cfg.attnres_block:
            self.attnres = nn.Module()
            self.attnres.mix = nn.ModuleDict(
                {str(l): AttnResMix(cfg.d_model, cfg.norm_eps) for l in range(1, 2 * cfg.n_layers + 2)})
        self.init_weights()

    @torch.no_grad()
    def init_weights(self, generator=None):
        """Every matrix ~ N(0, init_std^2), every norm gain = 1; KDA: conv filters ~ N(0, 1/W), A_log = 0 (log U(1, 16)
        for the softplus gate), dt_bias = softplus^-1(delta), delta log-uniform in [1e-3, 1e-1]. (moetrain's own
        draws differ; parity checks load moetrain's parameters, so this only matters for standalone use and
        benchmarks.)"""
        for name, p in self.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".key_norm"):
                p.fill_(1.0)
            elif name.endswith(".query"):
                p.zero_()
            elif name.endswith("A_log"):
                if self.cfg.kda_cfg["gate"] == "softplus":
                    p.copy_(torch.log(1.0 + 15.0 * torch.rand(p.shape, generator=generator)))
                else:
                    p.zero_()
            elif name.endswith("dt_bias"):
                u = torch.rand(p.shape, generator=generator)
                delta = torch.exp(math.log(1e-3) + (math.log(1e-1) - math.log(1e-3)) * u)
                p.copy_(torch.log(torch.expm1(delta)))
            elif "_conv1d." in name:
                p.normal_(0.0, p.shape[1] ** -0.5, generator=generator)
            else:
                p.normal_(0.0, self.cfg.init_std, generator=generator)

    def forward(self, ids):
        """ids [B, T] integer -> logits [B, T, V]."""
        T = ids.shape[1]
        x = self.embed.weight[ids.long()]
        cos, sin = None, None
        if self.cfg.attn_rope:
            cos, sin = (t.to(x.device) for t in rope_cos_sin(T, self.cfg.head_dim, self.cfg.rope_theta, x.dtype))
        if self.cfg.attnres_block:
            x = attnres_forward(self, x, cos, sin)
        else:
            for layer in self.layers:
                x = layer(x, cos, sin)
        x = self.final_norm(x)
        w_out = self.embed.weight if self.lm_head is None else self.lm_head.weight
        return torch.matmul(x, w_out.t())

    def loss(self, ids, targets):
        """The training objective: cross-entropy plus the MoE aux losses (zero unless balance = "aux_loss"); their
        sum is kept in last_aux, so that loss - last_aux is the LM loss moetrain reports."""
        ce = cross_entropy_loss(self(ids), targets)
        self.last_aux = sum((b.moe.last_aux for b in self.layers if hasattr(b, "moe")), ce.new_zeros(()))
        return ce + self.last_aux

    def load_moe_biases(self, tensors):
        """Sets each MoE layer's selection bias from {"<layer>.moe.router.bias": tensor} (a checkpoint's "balancer/"
        entries); layers without an entry keep b = 0."""
        for i, block in enumerate(self.layers):
            key = f"layers.{i}.moe.router.bias"
            if hasattr(block, "moe") and key in tensors:
                block.moe.bias.copy_(tensors[key].to(block.moe.bias.dtype))


def parameter_names(cfg):
    """The canonical parameter names, in model order."""
    return list(Transformer(cfg).state_dict().keys())
