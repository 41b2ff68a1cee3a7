"""What the CPU peers (torch_cpu.py, deepspeed_cpu.py) share, so that both train exactly what
zero-train trains in bench/cpu_speed.py: the run's settings read from the same ds_config.json
zero-train reads, the same token shard read in zero-train's order, zero-train's learning-rate
schedule, the GPT of fsdp2_offload.py, and the JSON document of docs/benchmarks.md.

Contract of the data order (docs/data-formats.md, "Token shards"; docs/training.md, "One run"):
the micro-batch of (step s >= 1, rank r, micro-batch m) with W ranks and GA accumulation steps is
sequences (((s-1) W + r) GA + m) B onwards, sequence i being window perm_e(i mod Wn) of epoch
e = i div Wn (Wn windows of seq_len + 1 tokens), perm_e a 6-round Feistel bijection keyed by
hash_counters(seed, 1, e). Ported from core/random.hpp and models/data/dataset.hpp; a peer that
reads the shard this way sees, step by step, the tokens zero-train sees.
"""

import datetime
import json
import math
import os
import resource
import statistics
import subprocess
import sys

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fsdp2_offload import GPT, PRESETS, count_parameters, flops_per_token  # noqa: E402

MASK64 = (1 << 64) - 1


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---- zero-train's counter-based randomness (core/random.hpp) -----------------------------------


def mix64(x):
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK64
    x ^= x >> 31
    return x


def hash_counters(key, a, b=0, c=0):
    h = mix64((key ^ 0x6A09E667F3BCC908) & MASK64)
    h = mix64(h ^ a)
    h = mix64(((h + 0x9E3779B97F4A7C15) & MASK64) ^ b)
    h = mix64(((h + 0x9E3779B97F4A7C15) & MASK64) ^ c)
    return h


class IndexPermutation:
    """models/data/dataset.hpp's seeded bijection of [0, n): Feistel network + cycle walking."""

    ROUNDS = 6

    def __init__(self, n, key):
        self.n, self.key = n, key
        bits = 2
        while bits < 64 and (1 << bits) < n:
            bits += 2
        self.half = bits // 2
        self.mask = (1 << self.half) - 1

    def __call__(self, i):
        if self.n <= 1:
            return i
        while True:
            left, right = i >> self.half, i & self.mask
            for k in range(self.ROUNDS):
                left, right = right, left ^ (hash_counters(self.key, k, right) & self.mask)
            i = (left << self.half) | right
            if i < self.n:
                return i


# ---- the run's settings, from zero-train's ds_config.json ---------------------------------------


class RunConfig:
    """The parts of a zero-train ds_config.json (docs/config.md) a peer needs. Anything the peers
    cannot reproduce is an error naming the file and the key, never silently different."""

    def __init__(self, path):
        self.path = path
        try:
            with open(path) as f:
                c = json.load(f)
        except (OSError, ValueError) as e:
            raise SystemExit(f"{path}: cannot read the config: {e}")
        self.raw = c

        def need(cond, where, what):
            if not cond:
                raise SystemExit(f"{path}: {where}: {what} (the CPU peers reproduce only this)")

        zt = c.get("zero_train", {})
        model = dict(zt.get("model", {}))
        preset = PRESETS.get(model.pop("preset", None), None) if "preset" in model else None
        keys = ("n_layer", "n_embd", "n_head", "vocab_size", "seq_len")
        shape = list(preset) if preset else [None] * 5
        for i, k in enumerate(keys):
            if k in model:
                shape[i] = int(model[k])
        need(all(v is not None for v in shape), "zero_train.model",
             "needs a preset or all of " + ", ".join(keys))
        self.shape = tuple(shape)
        self.seed = int(c.get("seed", 1234))
        self.micro_batch = int(c["train_micro_batch_size_per_gpu"])
        self.train_batch = int(c["train_batch_size"])
        self.clipping = float(c.get("gradient_clipping", 1.0))
        self.bf16 = bool(c.get("bf16", {}).get("enabled", False))
        opt = c.get("optimizer", {})
        need(opt.get("type", "AdamW") in ("AdamW", "Adam"), "optimizer.type", "AdamW expected")
        p = opt.get("params", {})
        self.lr = float(p.get("lr", 1e-3))
        self.betas = tuple(float(b) for b in p.get("betas", (0.9, 0.999)))
        self.eps = float(p.get("eps", 1e-8))
        self.weight_decay = float(p.get("weight_decay", 0.0))
        need(zt.get("weight_decay_applies_to", "matrices") == "matrices",
             "zero_train.weight_decay_applies_to", "\"matrices\" expected")
        sched = c.get("scheduler")
        self.scheduler = None
        if sched is not None:
            need(sched.get("type") == "WarmupCosineLR", "scheduler.type", "WarmupCosineLR expected")
            sp = sched.get("params", {})
            wn = sp.get("warmup_num_steps", 0)
            self.scheduler = {
                "warmup_num_steps": 0 if wn == "auto" else int(wn),
                "warmup_type": sp.get("warmup_type", "log"),
                "warmup_min_ratio": float(sp.get("warmup_min_ratio", 0.0)),
                "cos_min_ratio": float(sp.get("cos_min_ratio", 1e-4)),
            }

    def grad_accum(self, world):
        ga, rem = divmod(self.train_batch, self.micro_batch * world)
        if rem or ga < 1:
            raise SystemExit(f"{self.path}: train_batch_size {self.train_batch} is not "
                             f"train_micro_batch_size_per_gpu {self.micro_batch} x {world} "
                             "processes x a whole gradient accumulation")
        return ga

    def lr_at(self, step, total_steps):
        """zero-train's lr for optimizer step `step` (1-based): optim/lr_schedule.cpp's
        WarmupCosineLR at iteration step - 2. As in DeepSpeed, the scheduler starts at
        last_batch_iteration -1, where the lr is 0, and steps after each optimizer step, so step
        1 runs at 0 and step s at iteration s - 2 (zero-train's metrics show the same lrs)."""
        if self.scheduler is None:
            return self.lr
        s = self.scheduler
        it = step - 2
        if it < 0:
            return 0.0
        n = max(2, s["warmup_num_steps"])
        if it < n:
            frac = (math.log(it + 1) / math.log(n)) if s["warmup_type"] == "log" else it / n
            return self.lr * (s["warmup_min_ratio"] + frac * (1.0 - s["warmup_min_ratio"]))
        progress = min(1.0, (it - n + 1) / max(1, total_steps - n))
        cosine = (1.0 + math.cos(math.pi * progress)) / 2.0
        return self.lr * max(0.0, s["cos_min_ratio"] + (1.0 - s["cos_min_ratio"]) * cosine)


# ---- the token shard ----------------------------------------------------------------------------


class TokenData:
    """One llm.c token shard read in zero-train's sequence order (see the module's contract)."""

    def __init__(self, path, vocab, seq_len, seed):
        try:
            raw = np.fromfile(path, dtype="<i4", count=256)
        except OSError as e:
            raise SystemExit(f"{path}: cannot open the token shard: {e}")
        if raw.size < 256 or raw[0] != 20240520 or raw[1] != 1:
            raise SystemExit(f"{path}: not an llm.c token shard (magic 20240520, version 1)")
        self.tokens = np.memmap(path, dtype="<u2", mode="r", offset=1024, shape=(int(raw[2]),))
        if int(self.tokens.max()) >= vocab:
            raise SystemExit(f"{path}: holds a token id >= the model's vocabulary of {vocab}")
        self.T, self.seed = seq_len, seed
        self.windows = (self.tokens.size - 1) // seq_len
        if self.windows < 1:
            raise SystemExit(f"{path}: fewer than seq_len + 1 = {seq_len + 1} tokens")

    def batch(self, first, count):
        rows = []
        for i in range(first, first + count):
            epoch = i // self.windows
            w = IndexPermutation(self.windows, hash_counters(self.seed, 1, epoch))(i % self.windows)
            rows.append(np.asarray(self.tokens[w * self.T: w * self.T + self.T + 1], dtype=np.int64))
        t = torch.from_numpy(np.stack(rows))
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()

    def micro_batches(self, step, rank, world, ga, micro_batch):
        return [self.batch((((step - 1) * world + rank) * ga + m) * micro_batch, micro_batch)
                for m in range(ga)]


# ---- the model ----------------------------------------------------------------------------------


def build_model(cfg):
    """fsdp2_offload.py's GPT (GPT-2 layout, tied head, GPT-2 initialisation), in fp32."""
    torch.manual_seed(cfg.seed)
    model = GPT(*cfg.shape)
    model.init_weights()
    return model


def param_groups(model, weight_decay):
    """Weight decay on the matrices (embeddings included), as zero-train's "matrices"."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


# ---- process group and report -------------------------------------------------------------------


def env_world():
    for k, v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29541"), ("RANK", "0"),
                 ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(k, v)
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def gather_rss(world):
    mine = peak_rss_bytes()
    if world == 1:
        return [mine]
    out = [None] * world
    dist.all_gather_object(out, mine)
    return out


def stats(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "reps": len(values)}


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def git_revision():
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=os.path.dirname(os.path.abspath(__file__)), timeout=10)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def document(benchmark, peer, cfg, settings, world, threads, step_times, rss, losses, lrs, quick):
    """The peer's document (docs/benchmarks.md); no ratio: a peer measures only itself."""
    L, C, H, V, T = cfg.shape
    tokens = cfg.train_batch * T
    st = stats(step_times)
    rate = {"median": tokens / st["median"], "min": tokens / st["max"], "max": tokens / st["min"],
            "reps": st["reps"]}
    one = lambda v: {"median": v, "min": v, "max": v, "reps": 1}  # noqa: E731
    fpt = flops_per_token(cfg.shape)
    command = " ".join([os.path.basename(sys.executable)] + sys.argv)
    if world > 1:
        command = f"torchrun --standalone --nproc-per-node {world} " + " ".join(sys.argv)
    return {
        "benchmark": benchmark, "version": 1,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git": git_revision(), "command": command,
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "gpu": None, "ranks": world,
                    "threads": threads},
        "quick": quick, "peer": peer,
        "model": {"n_layer": L, "n_embd": C, "n_head": H, "vocab_size": V, "seq_len": T,
                  "parameters": count_parameters(cfg.shape), "flops_per_token": fpt},
        "settings": dict(settings, config=cfg.path, micro_batch=cfg.micro_batch,
                         train_batch=cfg.train_batch, grad_accum=cfg.grad_accum(world)),
        "results": [
            {"name": "step time", "metric": "time", "unit": "s", **st},
            {"name": "throughput", "metric": "throughput", "unit": "tokens/s", **rate},
            {"name": "model FLOP/s", "metric": "throughput", "unit": "FLOP/s",
             **{k: (v * fpt if k != "reps" else v) for k, v in rate.items()}},
            {"name": "peak RSS per process (largest)", "metric": "bytes", "unit": "B",
             **one(max(rss)), "per_rank": rss},
        ],
        "step_times": step_times,  # the timed steps', in order (s)
        "losses": [x if math.isfinite(x) else None for x in losses],
        "lrs": lrs,
    }


_DOC_OUT = None


def claim_stdout():
    """Keeps stdout for the one JSON document: DeepSpeed and torch's extension builder print to
    file descriptor 1, so from here on descriptor 1 is stderr and the document goes to a
    duplicate of the original stdout."""
    global _DOC_OUT
    if _DOC_OUT is None:
        sys.stdout.flush()
        _DOC_OUT = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)


def emit(doc, json_out):
    text = json.dumps(doc, indent=2, allow_nan=False)
    print(text, flush=True, file=_DOC_OUT or sys.stdout)
    if json_out:
        with open(json_out, "w") as f:
            f.write(text + "\n")
