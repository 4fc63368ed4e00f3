"""The command line shared by the layer references (kda.py, moe.py): check every <prefix>*.safetensors dump that a
GoogleTest "<Layer>Parity.Dump" wrote, each with the reference's check_file(path, tol_f64, tol_f32) -> (failures,
worst rho), and end with PASS or FAIL and the exit code the parity scripts test."""

import argparse
import glob
import os
import sys

import torch


def dump_check_main(program, prefix, check_file, description, worst_label="worst rho"):
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--dump-dir", required=True)
    ap.add_argument("--tol-f64", type=float, default=1e-10)
    ap.add_argument("--tol-f32", type=float, default=1e-5)
    args = ap.parse_args()
    torch.set_default_dtype(torch.float64)
    files = sorted(glob.glob(os.path.join(args.dump_dir, f"{prefix}*.safetensors")))
    if not files:
        print(f"{program}: FAIL: no {prefix}*.safetensors in {args.dump_dir}", file=sys.stderr)
        return 1
    total = 0
    for path in files:
        failures, worst = check_file(path, args.tol_f64, args.tol_f32)
        total += failures
        print(f"  {worst_label} {worst:.3e}")
    if total:
        print(f"{program}: FAIL: {total} tensors above tolerance", file=sys.stderr)
        return 1
    print(f"{program}: PASS ({len(files)} files)")
    return 0
