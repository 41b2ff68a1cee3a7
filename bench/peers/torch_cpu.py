#!/usr/bin/env python3
"""PyTorch on CPU, the peer of zero-train's stage 0 for issue 21 (CPU speed): our GPT trained in
eager mode, bf16 autocast (or fp32), with torch's AdamW (fused), clipping and zero-train's
schedule, on the token shard zero-train reads, in zero-train's order (cpu_common.py). One
process with N threads, or DistributedDataParallel over gloo with P processes when launched by
`torchrun --standalone --nproc-per-node P` (rank 0 reports).

Prints one JSON document on stdout (docs/benchmarks.md, "benchmark": "peer_torch_cpu"): tokens/s
over the timed steps after warm-up, model FLOP/s, each process's peak RSS, every step's loss and
lr. Exit 0, 2 on bad flags, 1 on failure.

  python3 bench/peers/torch_cpu.py --config CFG --data SHARD --steps 10 [--dtype fp32]
  torchrun --standalone --nproc-per-node 2 bench/peers/torch_cpu.py --config CFG --data SHARD
"""

import argparse
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import cpu_common as cc


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="zero-train's ds_config.json of the run")
    p.add_argument("--data", required=True, help="the llm.c token shard zero-train reads")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps, warm-up included")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16",
                   help="bf16: torch.autocast(cpu, bfloat16) over fp32 parameters")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads per process (default: cores / processes)")
    p.add_argument("--adamw-impl", choices=["fused", "foreach", "default"], default="fused",
                   help="torch.optim.AdamW implementation (fused: torch's fastest CPU AdamW)")
    p.add_argument("--quick", action="store_true", help="recorded in the document only")
    p.add_argument("--json-out", help="also write the document here")
    a = p.parse_args(argv)
    if a.steps <= a.warmup or a.warmup < 0:
        p.error("--steps must exceed --warmup >= 0 (at least one timed step)")
    return a


def run(a):
    rank, world = cc.env_world()
    threads = a.threads or max(1, (os.cpu_count() or 1) // world)
    torch.set_num_threads(threads)
    cfg = cc.RunConfig(a.config)
    ga = cfg.grad_accum(world)
    data = cc.TokenData(a.data, cfg.shape[3], cfg.shape[4], cfg.seed)
    if world > 1:
        dist.init_process_group("gloo")

    model = cc.build_model(cfg)
    if world > 1:
        # Gradients averaged over the processes by gloo all-reduce in buckets during backward.
        model = DistributedDataParallel(model)
    impl = {"fused": {"fused": True}, "foreach": {"foreach": True}, "default": {}}[a.adamw_impl]
    opt = torch.optim.AdamW(cc.param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas,
                            eps=cfg.eps, **impl)
    if rank == 0:
        cc.log(f"torch_cpu: torch {torch.__version__}, {world} process(es) x {threads} threads, "
               f"{a.dtype}, shape {cfg.shape}, B={cfg.micro_batch} GA={ga}, adamw {a.adamw_impl}")

    losses, lrs, times = [], [], []
    for step in range(1, a.steps + 1):
        batches = data.micro_batches(step, rank, world, ga, cfg.micro_batch)
        t0 = time.perf_counter()
        lr = cfg.lr_at(step, a.steps)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        total = torch.zeros(())
        for m, (x, y) in enumerate(batches):
            # DDP all-reduces only on the last micro-batch of the step.
            sync = world == 1 or m == ga - 1
            with model.no_sync() if not sync else _null():
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
                    loss = model(x, y)
                (loss / ga).backward()
            total += loss.detach().float()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=cfg.clipping)
        opt.step()
        total /= ga
        if world > 1:
            dist.all_reduce(total)
            total /= world
        value = total.item()
        dt = time.perf_counter() - t0
        losses.append(value)
        lrs.append(lr)
        if step > a.warmup:
            times.append(dt)
        if rank == 0:
            cc.log(f"step {step}/{a.steps}{'' if step > a.warmup else ' (warm-up)'} | loss "
                   f"{value:.4f} | lr {lr:.3e} | {dt:.3f} s")

    rss = cc.gather_rss(world)
    if rank == 0:
        name = ("PyTorch eager" if world == 1 else f"PyTorch DDP (gloo, {world} processes)")
        name += " bf16 autocast" if a.dtype == "bf16" else " fp32"
        doc = cc.document("peer_torch_cpu", {"name": name, "torch": torch.__version__}, cfg,
                          {"dtype": a.dtype, "adamw_impl": a.adamw_impl, "stage": 0,
                           "offload": False, "steps": a.steps, "warmup": a.warmup, "ddp": world > 1},
                          world, threads, times, rss, losses, lrs, a.quick)
        cc.emit(doc, a.json_out)
    if world > 1:
        dist.destroy_process_group()
    return 0


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main(argv):
    a = parse_args(argv)
    cc.claim_stdout()
    try:
        return run(a)
    except SystemExit:
        raise
    except Exception:
        traceback.print_exc()
        cc.log("torch_cpu: failed")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
