#!/usr/bin/python3
"""Gradient parity of moetrain against the PyTorch reference (model.py).

  check_parity.py --checkpoint RUN/checkpoints/step_00000002 --dump grads.safetensors [--tol 1e-4]

Reads the model config from the checkpoint's manifest.json ("config_toml"), the parameters from
rank_00000.safetensors ("param/<name>"; the MoE layers' selection biases from "balancer/<layer>.moe.router.bias"),
and from the dump (written by `moetrain grad-dump`) the batch ("inputs", "targets" [B, T] I32), moetrain's loss
("loss" [1]) and gradients ("grad/<name>"). It recomputes the loss and every gradient with model.py in float32 and
compares:
  * loss: |L_mt - L_ref| / |L_ref|
  * each parameter: rho = ||g_ref - g_mt||_2 / ||g_ref||_2, and the element with the largest |difference|
Fails (exit 1) when any of these exceeds --tol, when a value is not finite, or when the parameter names of
the model, the checkpoint and the dump are not exactly the same set. It also recomputes everything in float64
and prints how far the float32 reference itself is from it (informational: it shows the noise floor that
--tol sits above).

For a dump made on the GPU in bf16 or fp16 (`moetrain grad-dump --set run.device="cuda"`), pass --half bf16|fp16
(and --device cuda to run the references on the GPU): the check then also runs PyTorch itself in that precision, as
autocast (f32 weights, half matmuls) and as a pure half model (weights and activations in half), and prints their
errors against the same f32 reference beside moetrain's, and fails when moetrain's worst gradient rho exceeds
--half-factor (default 2) times autocast PyTorch's worst: moetrain's mixed precision may lose somewhat more than
autocast (it also stores activations in half), but not a different order of accuracy.
"""

import argparse
import json
import math
import os
import sys
import tomllib

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import ModelConfig, Transformer  # noqa: E402
from safetensors_io import read_safetensors  # noqa: E402


class ParityError(Exception):
    pass


def load_checkpoint(ckpt_dir):
    manifest_path = os.path.join(ckpt_dir, "manifest.json")
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ParityError(f"cannot read {manifest_path}: {e}") from e
    if "config_toml" not in manifest:
        raise ParityError(f"{manifest_path} has no \"config_toml\"")
    try:
        job = tomllib.loads(manifest["config_toml"])
    except tomllib.TOMLDecodeError as e:
        raise ParityError(f"{manifest_path}: config_toml does not parse: {e}") from e
    world = manifest.get("mesh", {}).get("world", 1)
    if world != 1:
        raise ParityError(f"{manifest_path}: mesh world is {world}; this check reads a single-rank checkpoint")
    shard = os.path.join(ckpt_dir, "rank_00000.safetensors")
    tensors, _ = read_safetensors(shard)
    params = {k[len("param/"):]: v for k, v in tensors.items() if k.startswith("param/")}
    if not params:
        raise ParityError(f"{shard} holds no \"param/\" tensors")
    # MoE balancer state: the selection biases the routing used at this step.
    biases = {k[len("balancer/"):]: v for k, v in tensors.items()
              if k.startswith("balancer/") and k.endswith(".router.bias")}
    return manifest, job, params, biases


def name_diff(expected, got, what):
    """Problems (as strings) when the name sets differ, in both directions."""
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    out = [f"{what}: missing {n}" for n in missing]
    out += [f"{what}: unexpected {n} (not a parameter of the reference model)" for n in extra]
    return out


def reference_grads(cfg, params, biases, inputs, targets, dtype, device="cpu", autocast=None):
    """Loss and {name: grad} (f64, on the CPU) of model.py at the given parameters, in dtype on device; with
    autocast set (a half dtype), under torch.autocast."""
    model = Transformer(cfg).to(device=device, dtype=dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(params[name].to(dtype))
        model.load_moe_biases(biases)
    model.zero_grad(set_to_none=True)
    inputs, targets = inputs.to(device), targets.to(device)
    if autocast is not None:
        with torch.autocast(device_type=device, dtype=autocast):
            loss = model.loss(inputs, targets)
    else:
        loss = model.loss(inputs, targets)
    loss.backward()
    # moetrain reports the LM loss alone (the aux loss is logged apart); its gradients include the aux loss's.
    return float(loss - model.last_aux), {n: p.grad.detach().double().cpu() for n, p in model.named_parameters()}


def rho(ref, other):
    ref64, other64 = ref.double(), other.double()
    num = float((ref64 - other64).norm())
    den = float(ref64.norm())
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def worst_element(ref, other):
    diff = (ref.double() - other.double()).abs()
    flat = int(diff.reshape(-1).argmax()) if diff.numel() else 0
    idx = []
    for s in reversed(ref.shape):
        idx.append(flat % s)
        flat //= s
    idx = tuple(reversed(idx))
    return idx, float(ref[idx]) if ref.numel() else 0.0, float(other[idx]) if other.numel() else 0.0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="checkpoint directory (…/checkpoints/step_NNNNNNNN)")
    ap.add_argument("--dump", required=True, help="safetensors file written by `moetrain grad-dump`")
    ap.add_argument("--tol", type=float, default=1e-4, help="max loss rel err and per-tensor gradient rho")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave torch's default)")
    ap.add_argument("--device", default="cpu", help="where the references run (cpu, cuda)")
    ap.add_argument("--half", choices=["bf16", "fp16"], default=None,
                    help="the dump is from a half-precision run: also report PyTorch's own errors in that precision")
    ap.add_argument("--half-factor", type=float, default=2.0,
                    help="with --half: max ratio of moetrain's worst gradient rho to autocast PyTorch's (0: off)")
    args = ap.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    try:
        manifest, job, params, biases = load_checkpoint(args.checkpoint)
        cfg = ModelConfig.from_toml(job)
        if job.get("data", {}).get("document_mask", False):
            # The reference has no document masking (moetrain's is checked by DocumentMaskModel.*): a run with it
            # would differ by design, not by a fault.
            raise ParityError("the checkpoint's run has data.document_mask = true, which the reference does not "
                              "model: train with --set data.document_mask=false")
        dump, _ = read_safetensors(args.dump)
    except (ParityError, ValueError, KeyError, OSError) as e:
        print(f"check_parity: error: {e}", file=sys.stderr)
        return 1

    problems = []
    model_shapes = {n: tuple(p.shape) for n, p in Transformer(cfg).named_parameters()}
    names = list(model_shapes)
    problems += name_diff(names, params, f"checkpoint {args.checkpoint}")
    grads_mt = {k[len("grad/"):]: v for k, v in dump.items() if k.startswith("grad/")}
    problems += name_diff(names, grads_mt, f"dump {args.dump}")
    for key in ("inputs", "targets", "loss"):
        if key not in dump:
            problems.append(f"dump {args.dump}: missing \"{key}\"")
    for where, table in (("checkpoint param", params), ("dump grad", grads_mt)):
        for n, t in table.items():
            if n in model_shapes and tuple(t.shape) != model_shapes[n]:
                problems.append(f"{where} {n}: shape {list(t.shape)}, the model config says {list(model_shapes[n])}")
            elif n in model_shapes and t.dtype != torch.float32:
                problems.append(f"{where} {n}: dtype {t.dtype}, expected float32")
    if problems:
        for p in problems:
            print(f"check_parity: error: {p}", file=sys.stderr)
        return 1

    inputs, targets = dump["inputs"].long(), dump["targets"].long()
    loss_mt = float(dump["loss"].reshape(-1)[0])
    if inputs.shape != targets.shape or inputs.dim() != 2:
        print(f"check_parity: error: inputs {list(inputs.shape)} and targets {list(targets.shape)} must both be "
              f"[B, T]", file=sys.stderr)
        return 1
    if int(inputs.min()) < 0 or int(inputs.max()) >= cfg.vocab_size:
        print(f"check_parity: error: input ids span [{int(inputs.min())}, {int(inputs.max())}], vocab is "
              f"{cfg.vocab_size}", file=sys.stderr)
        return 1
    counted = int((targets != -1).sum())
    print(f"checkpoint {args.checkpoint} (step {manifest.get('step')}), dump {args.dump}")
    print(f"model: V={cfg.vocab_size} C={cfg.d_model} L={cfg.n_layers} Hq={cfg.n_heads} Hkv={cfg.n_kv_heads} "
          f"D={cfg.head_dim} F={cfg.d_ff} tied={cfg.tie_embeddings}; batch {list(inputs.shape)}, "
          f"{counted} counted targets; torch {torch.__version__}, {torch.get_num_threads()} threads")

    try:
        loss32, g32 = reference_grads(cfg, params, biases, inputs, targets, torch.float32, args.device)
        loss64, g64 = reference_grads(cfg, params, biases, inputs, targets, torch.float64, args.device)
        half = {}
        if args.half:
            hdt = torch.bfloat16 if args.half == "bf16" else torch.float16
            half["autocast"] = reference_grads(cfg, params, biases, inputs, targets, torch.float32, args.device, hdt)
            half["pure"] = reference_grads(cfg, params, biases, inputs, targets, hdt, args.device)
    except ValueError as e:
        print(f"check_parity: error: {e}", file=sys.stderr)
        return 1

    failed = []
    loss_rel = abs(loss_mt - loss32) / abs(loss32) if loss32 != 0 else abs(loss_mt)
    loss_rel64 = abs(loss32 - loss64) / abs(loss64) if loss64 != 0 else abs(loss32)
    print(f"loss: moetrain {loss_mt:.9g}  ref f32 {loss32:.9g}  ref f64 {loss64:.12g}  rel err {loss_rel:.3e}  "
          f"(ref f32 vs f64 {loss_rel64:.3e})")
    if not math.isfinite(loss_mt) or not (loss_rel <= args.tol):
        failed.append("loss")

    rows = []
    for n in names:
        gm = grads_mt[n]
        finite = bool(torch.isfinite(gm).all())
        r = rho(g32[n], gm) if finite else math.inf
        rows.append((r, n, worst_element(g32[n], gm), rho(g64[n], g32[n]), rho(g64[n], gm.double())))
        if not (r <= args.tol):
            failed.append(n)
    rows.sort(key=lambda row: -row[0])
    checks = len(names) + 1  # loss and every gradient, and the moetrain / autocast limit when it is checked
    relation = ""
    if half:
        hname = args.half
        print(f"PyTorch {hname} against the same f32 reference: loss rel err autocast "
              f"{abs(half['autocast'][0] - loss32) / abs(loss32):.3e}, pure {abs(half['pure'][0] - loss32) / abs(loss32):.3e}")
        print(f"{'tensor':<{max(len(n) for n in names)}}  {'moetrain':>9}  {'torch-autocast':>14}  {'torch-pure':>10}")
        worst_t = {"autocast": 0.0, "pure": 0.0}
        for r, n, *_ in rows:
            ra, rp = rho(g32[n], half["autocast"][1][n]), rho(g32[n], half["pure"][1][n])
            worst_t["autocast"], worst_t["pure"] = max(worst_t["autocast"], ra), max(worst_t["pure"], rp)
            print(f"{n:<{max(len(n) for n in names)}}  {r:9.3e}  {ra:14.3e}  {rp:10.3e}")
        ratio = rows[0][0] / worst_t["autocast"] if worst_t["autocast"] > 0 else math.inf
        print(f"worst gradient rho: moetrain {rows[0][0]:.3e}, torch {hname} autocast {worst_t['autocast']:.3e}, "
              f"torch pure {hname} {worst_t['pure']:.3e}; moetrain / autocast {ratio:.3g}"
              + (f" (limit {args.half_factor:g})" if args.half_factor > 0 else ""))
        if args.half_factor > 0 and worst_t["autocast"] <= 1e-5:
            # Far below half precision's rounding (2^-9 bf16, 2^-11 fp16): autocast did not run in half here (CPU
            # PyTorch without fp16 autocast falls back to f32 with a warning), so there is nothing to compare with.
            # That is a reference that did not run, not a pass: fail rather than skip the relation silently.
            failed.append(f"torch {hname} autocast's worst rho {worst_t['autocast']:.3e} is no half-precision error "
                          f"(autocast in {hname} unsupported on {args.device}?): the moetrain / autocast limit "
                          f"cannot be checked; pass --half-factor 0 to leave it out on purpose")
        elif args.half_factor > 0:
            checks += 1
            relation = f", worst within {args.half_factor:g}x torch {hname} autocast's"
            if not (ratio <= args.half_factor):
                failed.append(f"worst rho {rows[0][0]:.3e} > {args.half_factor:g} x torch {hname} autocast's "
                              f"{worst_t['autocast']:.3e}")
    width = max(len(n) for n in names)
    print(f"{'tensor':<{width}}  {'rho':>9}  {'f32ref~f64':>10}  {'mt~f64':>9}  worst element: index, ref, moetrain")
    for r, n, (idx, vref, vmt), r32_64, rmt_64 in rows:
        flag = "  FAIL" if n in failed else ""
        print(f"{n:<{width}}  {r:9.3e}  {r32_64:10.3e}  {rmt_64:9.3e}  {list(idx)}, {vref:.9g}, {vmt:.9g}{flag}")
    worst = rows[0]
    floor = max(max(row[3] for row in rows), loss_rel64)
    print(f"worst: {worst[1]} rho {worst[0]:.3e} at {list(worst[2][0])} (ref {worst[2][1]:.9g}, moetrain "
          f"{worst[2][2]:.9g}); tol {args.tol:g}; f32 reference's own worst error vs f64: {floor:.3e}")
    if floor > args.tol / 10:
        print(f"note: the f32 reference is within 10x of the tolerance (its own error {floor:.3e}); the tolerance "
              f"is not meaningfully above the f32 noise floor", file=sys.stderr)
    if failed:
        print(f"FAIL: {len(failed)} of {checks} checks over their limits (tol {args.tol:g}): "
              f"{', '.join(failed[:8])}{' ...' if len(failed) > 8 else ''}")
        return 1
    print(f"PASS: loss and {len(names)} gradients within {args.tol:g}{relation}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
