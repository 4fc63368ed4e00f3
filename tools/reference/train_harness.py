"""What the PyTorch GPU benchmarks share: the training loop of the step benchmarks (bench_torch_gpu.py,
bench_hybrid_torch.py): AdamW and clipping from the config's [train] table as moetrain reads it, rotary tables,
random token batches and the timed steps; and the kernel benchmarks' timer (median_cuda_ms).

Each step: zero the gradients, the loss under bf16 autocast, backward, global-norm clipping (foreach) where
train.grad_clip > 0, fused AdamW (weight decay on matrices only). Warm-up steps first (torch.compile and Triton
compile there), then the peak-memory counter is reset and the timed steps run between two CUDA events.
"""
import time

import torch

PEAK_FLOPS = 989e12  # dense bf16 tensor-core peak of an H100/H200 SXM, as moetrain's MFU


def median_cuda_ms(fn, warmup, iters):
    """fn() timed with CUDA events after warmup calls: the median over iters calls, in ms."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def adamw_from_train(model, train):
    """Fused AdamW with moetrain's [train] lr, weight_decay (2-D weights only), beta1, beta2 and eps."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": float(train.get("weight_decay", 0.1))},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=float(train.get("lr", 3e-4)),
                             betas=(float(train.get("beta1", 0.9)), float(train.get("beta2", 0.95))),
                             eps=float(train.get("eps", 1e-8)), fused=True)


def rope_tables(head_dim, theta, seq, dev):
    """cos, sin [seq, head_dim / 2] f32 of the rotary angles, formed in f64."""
    inv = theta ** (-2.0 * torch.arange(head_dim // 2, dtype=torch.float64) / head_dim)
    ang = torch.arange(seq, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).float().to(dev), torch.sin(ang).float().to(dev)


def random_batches(vocab, batch, seq, dev, seed, count):
    """count batches of [batch, seq + 1] uniform token ids (inputs and shifted targets)."""
    g = torch.Generator(device=dev).manual_seed(seed)
    return [torch.randint(0, vocab, (batch, seq + 1), device=dev, generator=g) for _ in range(count)]


def timed_training(loss_fn, model, opt, train, batches, warmup, steps, on_warmup_step=None):
    """Runs warmup then steps training steps; loss_fn(inputs, targets) gives the loss. Returns ms per timed step,
    the last loss, the warm-up seconds and the peak device bytes of the timed steps."""
    clip = float(train.get("grad_clip", 1.0))

    def step(k):
        opt.zero_grad(set_to_none=True)
        b = batches[k % len(batches)]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(b[:, :-1], b[:, 1:])
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=True)
        opt.step()
        return loss

    t0 = time.perf_counter()
    for k in range(warmup):
        step(k)
        if on_warmup_step is not None:
            torch.cuda.synchronize()
            on_warmup_step(k, time.perf_counter() - t0)
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    torch.cuda.reset_peak_memory_stats()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    loss = None
    for k in range(steps):
        loss = step(warmup + k)
    end.record()
    torch.cuda.synchronize()
    return {"ms": start.elapsed_time(end) / steps, "loss": float(loss.detach()), "warm_s": warm_s,
            "peak": torch.cuda.max_memory_allocated()}
