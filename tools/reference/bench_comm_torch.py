#!/usr/bin/env python3
"""torch.distributed (nccl backend) reference for bench/bench_comm.cpp: the comparison row of docs/PERFORMANCE.md.

The same four cases measured the same way: all-reduce (sum, in place) and all-to-all (all_to_all_single, equal
splits) of f32 GPU tensors of 64 and 512 MiB per rank. Time is host time from issuing the first of --iters
back-to-back operations to the completion of the last (torch.cuda.synchronize), divided by iters, after warm-up and
a barrier, the slowest rank's; algbw = size / time, busbw = algbw * 2(n-1)/n for all-reduce and algbw * (n-1)/n for
all-to-all (nccl-tests conventions), GB/s = 1e9 bytes/s. Rank 0 prints one JSON line per case, bench_comm's fields.

  torchrun --nproc_per_node 2 tools/reference/bench_comm_torch.py [--sizes-mb 64,512] [--iters 20] [--warmup 5]
  mpirun -np 2 python3 tools/reference/bench_comm_torch.py          # ranks from Open MPI's variables
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist


def env_from_mpirun():
    """Fills torch.distributed's variables from Open MPI's when launched by mpirun rather than torchrun."""
    if "RANK" in os.environ or "OMPI_COMM_WORLD_RANK" not in os.environ:
        return
    os.environ["RANK"] = os.environ["OMPI_COMM_WORLD_RANK"]
    os.environ["WORLD_SIZE"] = os.environ["OMPI_COMM_WORLD_SIZE"]
    os.environ["LOCAL_RANK"] = os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", os.environ["RANK"])
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")


def time_op(issue, warmup, iters):
    """Seconds per operation: the slowest rank's mean over iters operations issued back to back."""
    for _ in range(warmup):
        issue().wait()
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    works = [issue() for _ in range(iters)]
    for w in works:
        w.wait()
    torch.cuda.synchronize()
    sec = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device="cuda")
    dist.all_reduce(sec, op=dist.ReduceOp.MAX)
    return sec.item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes-mb", default="64,512")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    env_from_mpirun()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    n, rank = dist.get_world_size(), dist.get_rank()
    for mb in (int(s) for s in args.sizes_mb.split(",")):
        nbytes = mb << 20
        send = torch.zeros(nbytes // 4, dtype=torch.float32, device="cuda")
        recv = torch.empty_like(send)
        cases = [
            ("all_reduce", 2.0 * (n - 1) / n, lambda: dist.all_reduce(send, async_op=True)),
            ("all_to_all", (n - 1) / n, lambda: dist.all_to_all_single(recv, send, async_op=True)),
        ]
        for op, factor, issue in cases:
            sec = time_op(issue, args.warmup, args.iters)
            algbw = nbytes / 1e9 / sec
            if rank == 0:
                line = {"bench": "comm", "impl": "torch-nccl", "op": op, "dtype": "f32", "ranks": n,
                        "size_mb": mb, "bytes": nbytes, "time_ms": sec * 1e3, "algbw_gbs": algbw,
                        "busbw_gbs": algbw * factor, "iters": args.iters, "torch": torch.__version__,
                        "nccl": ".".join(str(v) for v in torch.cuda.nccl.version())}
                print(json.dumps(line), flush=True)
        del send, recv
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
