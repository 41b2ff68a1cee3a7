#!/usr/bin/env python3
"""DeepSpeed on CPU, the peer of zero-train's stages 1-3 for issue 21 (CPU speed): our GPT trained
by a DeepSpeed engine at ZeRO stage 2 (or 1 or 3), bf16 (fp32 when the config's bf16.enabled is
false), with and without optimizer offload, on DeepSpeed's CPU accelerator (run with DS_ACCELERATOR=cpu), on the token shard zero-train reads in
zero-train's order (cpu_common.py).

The DeepSpeed config is zero-train's own ds_config.json with the stage, the offload, the
gradient accumulation for this process count and the schedule's total_num_steps filled in, the
zero_train section dropped: DeepSpeed's own AdamW (DeepSpeedCPUAdam with offload, else its choice
for the CPU accelerator), its own WarmupCosineLR, gradient clipping and bf16 optimizer (in fp32
its plain ZeRO optimizer). Weight decay goes to the matrices only (two parameter groups), as zero-train's "matrices".

Communication: DeepSpeed's CPU accelerator names oneCCL ("ccl") as its backend, which needs
oneccl_bindings_for_pytorch (not on PyPI for current torch); this script initialises
torch.distributed with gloo through deepspeed.init_distributed(dist_backend="gloo"), which works
without oneCCL. One process (world size 1, env defaults) or `torchrun --standalone
--nproc-per-node P` (rank 0 reports).

Prints one JSON document on stdout (docs/benchmarks.md, "benchmark": "peer_deepspeed_cpu"), like
torch_cpu.py. Exit 0, 2 on bad flags, 1 on failure.

  DS_ACCELERATOR=cpu python3 bench/peers/deepspeed_cpu.py --config CFG --data SHARD --stage 2 --offload
"""

import argparse
import copy
import os
import sys
import time
import traceback

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import cpu_common as cc  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="zero-train's ds_config.json of the run")
    p.add_argument("--data", required=True, help="the llm.c token shard zero-train reads")
    p.add_argument("--stage", type=int, choices=[0, 1, 2, 3], default=2)
    p.add_argument("--offload", action="store_true", help="offload_optimizer: cpu")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps, warm-up included")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads per process (default: cores / processes)")
    p.add_argument("--quick", action="store_true", help="recorded in the document only")
    p.add_argument("--json-out", help="also write the document here")
    a = p.parse_args(argv)
    if a.steps <= a.warmup or a.warmup < 0:
        p.error("--steps must exceed --warmup >= 0 (at least one timed step)")
    if a.offload and a.stage == 0:
        p.error("--offload needs --stage 1, 2 or 3 (DeepSpeed offloads ZeRO's partitions)")
    return a


def deepspeed_config(cfg, a, world):
    ds = copy.deepcopy(cfg.raw)
    ds.pop("zero_train", None)
    ds.pop("seed", None)
    ds["gradient_accumulation_steps"] = cfg.grad_accum(world)
    ds["steps_per_print"] = 10 ** 9  # our own log line per step
    zo = ds.setdefault("zero_optimization", {})
    zo["stage"] = a.stage
    zo.pop("offload_optimizer", None)
    if a.offload:
        # pin_memory has no meaning without a GPU; DeepSpeed's CPU accelerator ignores it.
        zo["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    sched = ds.get("scheduler")
    if sched is not None:
        sp = sched.setdefault("params", {})
        if sp.get("total_num_steps") == "auto":
            sp["total_num_steps"] = a.steps
        if sp.get("warmup_num_steps") == "auto":
            sp["warmup_num_steps"] = 0
    return ds


def run(a):
    import deepspeed  # after DS_ACCELERATOR is set

    rank, world = cc.env_world()
    threads = a.threads or max(1, (os.cpu_count() or 1) // world)
    torch.set_num_threads(threads)
    cfg = cc.RunConfig(a.config)
    ga = cfg.grad_accum(world)
    if cfg.raw.get("fp16", {}).get("enabled", False):
        raise SystemExit(f"{a.config}: fp16.enabled is true; this peer measures bf16 or fp32 only")
    dtype = "bf16" if cfg.bf16 else "fp32"
    data = cc.TokenData(a.data, cfg.shape[3], cfg.shape[4], cfg.seed)
    deepspeed.init_distributed(dist_backend="gloo")

    model = cc.build_model(cfg)
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=cc.param_groups(model, cfg.weight_decay),
        config=deepspeed_config(cfg, a, world))
    if rank == 0:
        cc.log(f"deepspeed_cpu: deepspeed {deepspeed.__version__}, torch {torch.__version__}, "
               f"{world} process(es) x {threads} threads, ZeRO-{a.stage}"
               f"{' + offload' if a.offload else ''}, {dtype}, shape {cfg.shape}, "
               f"B={cfg.micro_batch} GA={ga}, optimizer {type(engine.optimizer).__name__} / "
               f"{type(getattr(engine.optimizer, 'optimizer', engine.optimizer)).__name__}")

    losses, lrs, times = [], [], []
    for step in range(1, a.steps + 1):
        batches = data.micro_batches(step, rank, world, ga, cfg.micro_batch)
        t0 = time.perf_counter()
        lr = engine.get_lr()[0]  # the lr this step applies (the scheduler steps after it)
        total = torch.zeros(())
        for x, y in batches:
            loss = engine(x, y)
            engine.backward(loss)  # scaled by 1 / GA inside
            engine.step()  # the optimizer step at the accumulation boundary only
            total += loss.detach().float()
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
        name = (f"DeepSpeed ZeRO-{a.stage}{' + CPU offload' if a.offload else ''} {dtype}, "
                f"{world} process{'es' if world > 1 else ''} (CPU accelerator, gloo)")
        doc = cc.document("peer_deepspeed_cpu",
                          {"name": name, "deepspeed": deepspeed.__version__,
                           "torch": torch.__version__, "comm_backend": "gloo",
                           "optimizer": type(getattr(engine.optimizer, "optimizer",
                                                     engine.optimizer)).__name__},
                          cfg, {"dtype": dtype, "stage": a.stage, "offload": a.offload,
                                "steps": a.steps, "warmup": a.warmup},
                          world, threads, times, rss, losses, lrs, a.quick)
        cc.emit(doc, a.json_out)
    dist.barrier()
    return 0


def main(argv):
    a = parse_args(argv)
    cc.claim_stdout()
    try:
        return run(a)
    except SystemExit:
        raise
    except Exception:
        traceback.print_exc()
        cc.log("deepspeed_cpu: failed")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
