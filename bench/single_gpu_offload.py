#!/usr/bin/env python3
"""single_gpu_offload: our zero-train against the PyTorch FSDP2 + CPUOffloadPolicy peer on one GPU,
and the "largest model that fits" sweep (GPU issue 9, the ZeRO-Offload paper's claims).

Two modes, both printing ONE JSON document on stdout in the schema of docs/benchmarks.md
(progress on stderr), and exiting 0 whenever the document was produced, failures included (each
side's failure is reported as "error" in the document):

  compare (default)  one model shape, ZeRO stage 2 (offload_optimizer cpu) or 3 (offload_optimizer
                     and offload_param cpu, pinned), bf16, AdamW as the peer: our step time,
                     tokens/s, model TFLOPS, MFU, device and host peaks and the fraction of host
                     AdamW hidden, each against the peer run with the same shape, batch, steps and
                     precision (bench/peers/fsdp2_offload.py, same interpreter, subprocess).
  --sweep            shapes of increasing size (default: the ZeRO-Offload paper's Table 3 shapes)
                     under a device memory limit (default 32GiB: a 32 GB V100), a few steps each,
                     until the first that does not fit: the largest model that fits, against the
                     paper's 13B.

zero-train trains on a token shard (llm.c format, docs/data-formats.md) of random tokens written
to a temporary folder, so every sequence has the model's full seq_len (the embedded addition task
has 9-token sequences, useless for throughput). Its stdout/stderr logs, config and metrics are kept
under --out-dir. Python 3.11 standard library only; the peer needs torch.

Examples (repository root):
  python3 bench/single_gpu_offload.py --quick --zero-train build/zero-train
  python3 bench/single_gpu_offload.py --model gpt2-1.5b --stage 2 --micro-batch 8 --steps 10 \
      --zero-train .device/bin/zero-train --out-dir $OUT/1.5b-s2
  python3 bench/single_gpu_offload.py --sweep --host-memory-limit 118GiB \
      --zero-train .device/bin/zero-train --out-dir $OUT/sweep
"""

import argparse
import array
import datetime
import json
import math
import os
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = os.path.join(REPO, "bench", "peers", "fsdp2_offload.py")

# models/gpt_shape.hpp: (n_layer, n_embd, n_head, vocab_size, seq_len).
PRESETS = {
    "tiny": (2, 128, 4, 64, 64),
    "gpt2-124m": (12, 768, 12, 50257, 1024),
    "gpt2-350m": (24, 1024, 16, 50257, 1024),
    "gpt2-774m": (36, 1280, 20, 50257, 1024),
    "gpt2-1.5b": (48, 1600, 25, 50257, 1024),
    "zero-offload-10b": (50, 4096, 32, 50257, 1024),
}

# The sweep's default shapes, about 12 L h^2 parameters each, vocabulary 50257, sequence 1024.
# From the paper's Table 3 as we recall it; check against the paper (Ren et al. 2021,
# "ZeRO-Offload: Democratizing Billion-Scale Model Training", Table 3).
TABLE3_SHAPES = [
    # (name, n_layer, hidden, heads)
    ("1B", 20, 2048, 16),
    ("2B", 40, 2048, 16),
    ("4B", 64, 2304, 24),
    ("6B", 53, 3072, 32),
    ("8B", 72, 3072, 32),
    ("10B", 50, 4096, 32),
    ("11B", 55, 4096, 32),
    ("12B", 60, 4096, 32),
    ("13B", 65, 4096, 32),
]
TABLE3_VOCAB, TABLE3_SEQ = 50257, 1024

# --quick --sweep: small shapes on the cpu backend under a 64 MiB device limit, so that the sweep
# stops at one that does not fit (the third: ~25M bf16 parameters plus activations).
QUICK_SWEEP_SHAPES = [
    ("2x128", 2, 128, 4),
    ("4x256", 4, 256, 4),
    ("8x512", 8, 512, 8),
]
QUICK_SWEEP_VOCAB, QUICK_SWEEP_SEQ = 512, 64

# Goals. MFU: DeepSpeed ZeRO-Offload's ~40 TFLOPS on a 125 TFLOPS V100 (paper; shared/ANCHORS.md).
# Largest model: the paper's 13B on one 32 GB V100. Host AdamW hidden: issue 9's 70%.
MFU_GOAL = 0.32
PARAMETERS_GOAL = 13e9
HIDDEN_GOAL = 0.7
STEP_TIME_RATIO_GOAL = 1.0

EXIT_OK = 0


def log(msg):
    print(f"single_gpu_offload: {msg}", file=sys.stderr, flush=True)


# ---- model arithmetic (the same as models/gpt.cpp and the peer) -----------------------------------


def flops_per_token(shape):
    """models::gpt_flops_per_token: 6 M + 12 L C T, M = 12 L C^2 + V C (matmul parameters)."""
    L, C, _, V, T = shape
    return 6.0 * (12.0 * L * C * C + V * C) + 12.0 * L * C * T


def count_parameters(shape):
    """12 C^2 + 13 C per block, V C (tied head) + T C (positions) + 2 C (ln_f)."""
    L, C, _, V, T = shape
    return L * (12 * C * C + 13 * C) + V * C + T * C + 2 * C


# ---- small helpers ------------------------------------------------------------------------------


def stats(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "reps": len(values)}


def rate(scale, step_time):
    """Items per second from step times, as the peer computes it: the slowest step gives the min."""
    return {"median": scale / step_time["median"], "min": scale / step_time["max"],
            "max": scale / step_time["min"], "reps": step_time["reps"]}


def single(value):
    return {"median": value, "min": value, "max": value, "reps": 1}


def finite(x):
    """JSON-safe: non-finite floats become null, recursively."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [finite(v) for v in x]
    return x


def parse_bytes(text):
    """"32GiB", "512MiB", "1.5GB", "123" -> bytes (as docs/config.md accepts them); None for None."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*([0-9.]+(?:[eE][0-9]+)?)\s*([KMGT]i?B|B)?\s*", str(text))
    if not m:
        raise ValueError(f"cannot read {text!r} as a byte count (e.g. 32GiB, 512MiB, 1.5GB)")
    units = {None: 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KiB": 2**10,
             "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
    return int(float(m.group(1)) * units[m.group(2)])


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def gpu_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def git_revision():
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, cwd=REPO, timeout=10)
        if out.returncode != 0:
            return None
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def the_command():
    """The command as typed, from the repository root: python3 + the script's path relative to it."""
    argv = list(sys.argv)
    script = os.path.abspath(argv[0])
    if script.startswith(REPO + os.sep):
        argv[0] = os.path.relpath(script, REPO)
    return shlex.join(["python3"] + argv)


def now_utc():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- the token shard ----------------------------------------------------------------------------


def write_token_shard(path, n_tokens, vocab, seed):
    """An llm.c token shard (docs/data-formats.md): 256 int32 LE header (magic 20240520, version 1,
    token count, the rest 0), then uint16 LE tokens, uniformly random below `vocab`."""
    if vocab > 65536:
        raise ValueError(f"vocabulary {vocab} does not fit llm.c's uint16 tokens (at most 65536)")
    if n_tokens >= 2**31:
        raise ValueError(f"{n_tokens} tokens: more than an llm.c shard's int32 count holds")
    header = array.array("i", [0] * 256)
    header[0], header[1], header[2] = 20240520, 1, n_tokens
    rng = random.Random(seed)
    tokens = array.array("H")
    tokens.frombytes(rng.randbytes(2 * n_tokens))
    if vocab < 65536:
        tokens = array.array("H", (t % vocab for t in tokens))
    if sys.byteorder != "little":
        header.byteswap()
        tokens.byteswap()
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())


def tokens_needed(total_steps, micro_batch, grad_accum, seq_len):
    """Windows of seq_len + 1 tokens overlapping by one (window k is tokens [kT, kT + T]): a shard of
    n tokens holds floor((n - 1) / T). One window per sequence of the run, plus a margin, so no
    sequence repeats."""
    windows = total_steps * micro_batch * grad_accum + max(16, total_steps)
    return windows * seq_len + 1


# ---- running a child ----------------------------------------------------------------------------


def run_child(cmd, stdout_path, stderr_path, env, timeout, echo=None, echo_stderr=False):
    """Runs cmd with stdout/stderr into files, in its own session (so a timeout kills all of it).
    Returns {exit_status, signal, timed_out, wall_s, rss_peak_bytes, spawn_error}. `echo(line)`
    picks lines of its stdout (its stderr with echo_stderr) to forward to ours as progress."""
    echo_path = stderr_path if echo_stderr else stdout_path
    t0 = time.monotonic()
    res = {"exit_status": None, "signal": None, "timed_out": False, "wall_s": None,
           "rss_peak_bytes": None, "spawn_error": None}
    try:
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            p = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                                 start_new_session=True)
    except OSError as e:
        res["spawn_error"] = f"cannot run {cmd[0]}: {e.strerror or e}"
        return res
    offset = 0
    deadline = t0 + timeout if timeout else None
    status = rusage = None
    reaped = False
    try:
        while True:
            pid, status, rusage = os.wait4(p.pid, os.WNOHANG)
            if echo is not None:
                offset = _forward(echo_path, offset, echo)
            if pid != 0:
                reaped = True
                break
            if deadline is not None and time.monotonic() > deadline:
                res["timed_out"] = True
                _kill_group(p.pid)
                _, status, rusage = os.wait4(p.pid, 0)
                reaped = True
                break
            time.sleep(0.1)
    finally:
        if not reaped:  # interrupted (Ctrl-C): take the child and its children down with us
            _kill_group(p.pid)
    p.returncode = 0  # reaped here; keeps Popen from waiting again
    res["wall_s"] = time.monotonic() - t0
    if os.WIFSIGNALED(status):
        res["signal"] = os.WTERMSIG(status)
        res["exit_status"] = -res["signal"]
    else:
        res["exit_status"] = os.WEXITSTATUS(status)
    res["rss_peak_bytes"] = rusage.ru_maxrss * 1024  # KiB on Linux
    if echo is not None:
        _forward(echo_path, offset, echo)
    return res


def _kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _forward(path, offset, echo):
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return offset
    end = data.rfind(b"\n")
    if end < 0:
        return offset
    for line in data[:end].decode("utf-8", "replace").splitlines():
        if echo(line):
            log("  | " + line)
    return offset + end + 1


def read_text(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


# ---- our run ------------------------------------------------------------------------------------


def ds_config(a, shape, total_steps, device_limit, host_limit):
    """The DeepSpeed config zero-train reads (docs/config.md). Constant LR: no scheduler block."""
    L, C, H, V, T = shape
    zero = {"stage": a.stage, "overlap_comm": True}
    # Bucket sizes as configs/gpu/gpt2-1.5b_stage{2,3}_offload.json.
    if a.stage == 2:
        zero.update({"reduce_bucket_size": 50000000, "allgather_bucket_size": 50000000,
                     "offload_optimizer": {"device": "cpu", "pin_memory": True}})
    else:
        zero.update({"reduce_bucket_size": 50000000, "allgather_bucket_size": 500000,
                     "stage3_prefetch_bucket_size": 50000000,
                     "stage3_param_persistence_threshold": 100000,
                     "stage3_max_live_parameters": 1000000000,
                     "offload_optimizer": {"device": "cpu", "pin_memory": True},
                     "offload_param": {"device": "cpu", "pin_memory": True}})
    ours = {"device": a.device, "steps": total_steps,
            "model": {"n_layer": L, "n_embd": C, "n_head": H, "vocab_size": V, "seq_len": T}}
    if device_limit is not None:
        ours["device_memory_limit"] = device_limit
    if host_limit is not None:
        ours["host_memory_limit"] = host_limit
    if a.speculative_host_step is not None:
        ours["speculative_host_step"] = a.speculative_host_step
    cfg = {
        "train_micro_batch_size_per_gpu": a.micro_batch,
        "gradient_accumulation_steps": a.grad_accum,
        "steps_per_print": 1,
        "wall_clock_breakdown": a.breakdown,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW",
                      "params": {"lr": 6e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
        "zero_optimization": zero,
    }
    if a.activation_checkpointing:
        # number_checkpoints >= n_layer: every block recomputes its activations (as the peer's
        # per-block torch.utils.checkpoint).
        cfg["activation_checkpointing"] = {"number_checkpoints": L}
    cfg["zero_train"] = ours
    if a.config_override:
        deep_merge(cfg, a.config_override)
    return cfg


def deep_merge(dst, src):
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            deep_merge(dst[k], v)
        else:
            dst[k] = v


def ledger_blocks(stdout):
    """Every 'memory ledger of ...' table in zero-train's stdout, each as its lines."""
    blocks, cur = [], None
    for line in stdout.splitlines():
        if line.startswith("memory ledger of"):
            cur = [line]
            blocks.append(cur)
        elif cur is not None:
            if line.startswith("  "):
                cur.append(line)
                if line.strip().startswith("capacity"):
                    cur = None
            else:
                cur = None
    return blocks


def startup_block(stdout):
    """The start-up lines before the first step line (the run, threads, model state, ledger)."""
    lines = []
    for line in stdout.splitlines():
        if line.startswith("step "):
            break
        lines.append(line)
    return lines


def first_error_line(stderr, stdout):
    """The first line of zero-train's error paragraph (on stderr; 'error:' in it)."""
    for text in (stderr, stdout):
        for line in text.splitlines():
            if "error" in line.lower() and line.strip():
                return line.strip()
    tail = [l.strip() for l in stderr.splitlines() if l.strip()]
    return tail[-1] if tail else None


def is_oom_text(text):
    t = text.lower()
    return ("out of memory" in t or "out of device memory" in t or "out of host memory" in t
            or "does not fit" in t or "cannot allocate" in t or "over capacity" in t)


def run_ours(a, shape, run_dir, data_dir, device_limit, host_limit, timeout, label):
    """One zero-train run; returns everything we know of it, never raises for a failed run."""
    os.makedirs(run_dir, exist_ok=True)
    total_steps = a.warmup + a.steps
    L, C, H, V, T = shape
    r = {"config": os.path.join(run_dir, "ds_config.json"),
         "stdout_log": os.path.join(run_dir, "zero-train.stdout.log"),
         "stderr_log": os.path.join(run_dir, "zero-train.stderr.log"),
         "metrics": os.path.join(run_dir, "metrics.jsonl"),
         "error": None, "error_kind": None}
    try:
        cfg = ds_config(a, shape, total_steps, device_limit, host_limit)
        with open(r["config"], "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")
        shard = os.path.join(data_dir, f"tokens_v{V}_{label}.bin")
        n = tokens_needed(total_steps, a.micro_batch, a.grad_accum, T)
        write_token_shard(shard, n, V, a.seed)
        r["data"] = {"file": shard, "tokens": n, "vocab": V, "kind": "uniform random tokens"}
    except (OSError, ValueError) as e:
        r["error"], r["error_kind"] = f"driver could not prepare the run: {e}", "driver"
        return r
    if os.path.exists(r["metrics"]):
        os.remove(r["metrics"])  # zero-train appends
    cmd = [a.zero_train, "--config", r["config"], "--data", shard, "--metrics", r["metrics"],
           "--progress", "off", "--seed", str(a.seed)]
    env = dict(os.environ)
    env["OPENBLAS_NUM_THREADS"] = "1"
    root = package_root(a)
    if root is not None and not any(os.path.abspath(d).startswith(root + os.sep) for d in
                                    env.get("LD_LIBRARY_PATH", "").split(":") if d):
        log(f"warning: {a.zero_train} is a packed binary but {root}/env.sh is not sourced "
            f"(run: source {os.path.relpath(root)}/env.sh && python3 ...)")
    # A singleton MPI start as root (the GPU machine) must be allowed explicitly by Open MPI, and
    # one rank needs no mpirun (as .device/env.sh sets them).
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("OMPI_MCA_ess_singleton_isolated", "1")
    r["command"] = shlex.join(cmd)
    log(f"ours [{label}]: L={L} C={C} H={H} V={V} T={T}, stage {a.stage}, B={a.micro_batch} "
        f"GA={a.grad_accum}, {total_steps} steps on {a.device}: {r['command']}")
    echo = (lambda line: line.startswith("step ") or line.startswith("zero-train: done")) \
        if not a.silent_children else None
    res = run_child(cmd, r["stdout_log"], r["stderr_log"], env, timeout, echo)
    r.update({k: res[k] for k in ("exit_status", "signal", "timed_out", "wall_s", "rss_peak_bytes")})
    stdout, stderr = read_text(r["stdout_log"]), read_text(r["stderr_log"])

    # What the start-up block says.
    m = re.search(r"\), (\d+) parameters$", stdout, re.M)
    r["parameters"] = int(m.group(1)) if m else count_parameters(shape)
    m = re.search(r"^zero-train: \d+ rank\(s\) on (\S+)", stdout, re.M)
    r["device_name"] = m.group(1).rstrip(",") if m else None
    m = re.search(r"^host threads per rank: (\d+)", stdout, re.M)
    r["threads"] = int(m.group(1)) if m else None
    blocks = ledger_blocks(stdout)
    r["startup"] = startup_block(stdout)
    r["ledger"] = blocks[0] if blocks else []
    r["ledger_at_end"] = blocks[-1] if len(blocks) > 1 else []
    # Warnings (the speculative bank turning itself off, ignored keys...).
    r["warnings"] = [l.strip() for l in (stdout + "\n" + stderr).splitlines() if "warning" in l.lower()]

    # Metrics: one JSON object per step (eval lines have no "loss").
    steps = []
    for line in read_text(r["metrics"]).splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            j = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "loss" in j and "step_time_s" in j:
            steps.append(j)
    r["steps"] = steps
    r["timed"] = [s for s in steps if s["step"] > a.warmup]

    if res["spawn_error"]:
        r["error"], r["error_kind"] = res["spawn_error"], "not_run"
    elif res["timed_out"]:
        r["error"], r["error_kind"] = (f"timed out after {timeout:.0f} s (--timeout) at step "
                                       f"{len(steps)} of {total_steps}"), "timeout"
    elif res["signal"] is not None:
        r["error"] = (f"killed by signal {res['signal']}" +
                      (" (SIGKILL: likely the kernel's OOM killer)" if res["signal"] == 9 else ""))
        r["error_kind"] = "out_of_memory" if res["signal"] == 9 else "crashed"
    elif res["exit_status"] != 0:
        first = first_error_line(stderr, stdout) or f"exit status {res['exit_status']}"
        r["error"] = first
        if res["exit_status"] == 2:
            r["error_kind"] = "bad_config"
        elif is_oom_text(stderr):
            r["error_kind"] = "out_of_memory"
        else:
            r["error_kind"] = "failed"
    elif not r["timed"]:
        r["error"], r["error_kind"] = "exit status 0 but no timed step in the metrics", "failed"
    if r["error"]:
        log(f"ours [{label}]: {r['error_kind']}: {r['error']}")
    else:
        log(f"ours [{label}]: done in {res['wall_s']:.1f} s")
    return r


def summarise_ours(a, r, shape):
    """Medians over the timed steps; None where there is nothing."""
    timed = r.get("timed") or []
    if not timed:
        return None
    T = shape[4]
    tokens = a.micro_batch * a.grad_accum * T
    st = stats([s["step_time_s"] for s in timed])
    fpt = flops_per_token(shape)
    s = {"step_time": st, "tokens_per_step": tokens,
         "tokens_per_s": rate(tokens, st), "tflops": rate(tokens * fpt / 1e12, st),
         "reported_tokens_per_s_median": statistics.median(x["tokens_per_s"] for x in timed),
         "reported_tflops_median": statistics.median(x["model_flops_per_s"] for x in timed) / 1e12}
    mfus = [x.get("mfu") for x in timed]
    s["mfu"] = stats(mfus) if all(isinstance(v, (int, float)) for v in mfus) else None
    steps = r.get("steps") or timed
    s["device_peak_bytes"] = max(x["device_peak_bytes"] for x in steps)
    s["host_peak_bytes"] = max(x["host_peak_bytes"] for x in steps)
    s["losses"] = [x["loss"] for x in steps]
    s["grad_norms"] = [x["grad_norm"] for x in steps]
    times = [x["time"] for x in timed if isinstance(x.get("time"), dict)]
    if times:
        keys = sorted(set().union(*times))
        s["phases"] = {f"{k}_s": statistics.median(t.get(k, 0.0) for t in times) for k in keys}
        hidden = [1.0 - t["host_adam_waited"] / t["host_adam"] for t in times
                  if t.get("host_adam", 0) > 0]
        s["host_adam_hidden"] = stats(hidden) if hidden else None
    else:
        s["phases"] = None
        s["host_adam_hidden"] = None
    return s


# ---- the peer -----------------------------------------------------------------------------------


def run_peer(a, shape, run_dir, timeout, label):
    os.makedirs(run_dir, exist_ok=True)
    L, C, H, V, T = shape
    r = {"json": os.path.join(run_dir, "fsdp2_offload.json"),
         "stdout_log": os.path.join(run_dir, "fsdp2_offload.stdout.log"),
         "stderr_log": os.path.join(run_dir, "fsdp2_offload.stderr.log"),
         "error": None, "error_kind": None, "document": None}
    if os.path.exists(r["json"]):
        os.remove(r["json"])
    preset = next((n for n, v in PRESETS.items() if v == shape), "tiny")
    cmd = [sys.executable, PEER, "--model", preset, "--n-layer", str(L), "--n-embd", str(C),
           "--n-head", str(H), "--vocab", str(V), "--seq-len", str(T), "--device", a.device,
           "--dtype", "bf16", "--micro-batch", str(a.micro_batch), "--grad-accum", str(a.grad_accum),
           "--steps", str(a.steps), "--warmup", str(a.warmup), "--seed", str(a.seed),
           "--adamw-impl", a.peer_adamw_impl, "--json-out", r["json"]]
    if a.activation_checkpointing:
        cmd.append("--activation-checkpointing")
    r["command"] = shlex.join(cmd)
    log(f"peer [{label}]: {r['command']}")
    echo = (lambda line: line.startswith("step ")) if not a.silent_children else None
    res = run_child(cmd, r["stdout_log"], r["stderr_log"], peer_env(a), timeout, echo,
                    echo_stderr=True)
    r.update({k: res[k] for k in ("exit_status", "signal", "timed_out", "wall_s", "rss_peak_bytes")})
    doc = None
    for path in (r["json"], r["stdout_log"]):
        try:
            with open(path) as f:
                doc = json.load(f)
            break
        except (OSError, json.JSONDecodeError):
            continue
    r["document"] = doc
    stderr = read_text(r["stderr_log"])
    if res["spawn_error"]:
        r["error"], r["error_kind"] = res["spawn_error"], "not_run"
    elif res["timed_out"]:
        r["error"], r["error_kind"] = f"timed out after {timeout:.0f} s (--timeout)", "timeout"
    elif res["signal"] is not None:
        r["error"] = (f"killed by signal {res['signal']}" +
                      (" (SIGKILL: likely the kernel's OOM killer)" if res["signal"] == 9 else ""))
        r["error_kind"] = "out_of_memory" if res["signal"] == 9 else "crashed"
    elif res["exit_status"] != 0:
        if doc and doc.get("error"):
            r["error"] = doc["error"]
        else:
            lines = [l.strip() for l in stderr.splitlines() if l.strip()]
            r["error"] = (lines[-2] if len(lines) >= 2 and lines[-1].endswith("failed") else
                          (lines[-1] if lines else f"exit status {res['exit_status']}"))
        r["error_kind"] = {3: "out_of_memory", 2: "bad_flags"}.get(res["exit_status"], "failed")
    elif doc is None:
        r["error"], r["error_kind"] = "exit status 0 but no JSON document", "failed"
    if r["error"]:
        log(f"peer [{label}]: {r['error_kind']}: {r['error']}")
    else:
        log(f"peer [{label}]: done in {res['wall_s']:.1f} s")
    return r


def package_root(a):
    """The packed folder zero-train runs from (.device/ of shared/device/pack.sh: bin/zero-train
    beside env.sh), or None."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(a.zero_train)))
    return root if os.path.isfile(os.path.join(root, "env.sh")) else None


def peer_env(a):
    """Our environment for the peer, less what `source .device/env.sh` added for zero-train's
    packed libraries and Open MPI, so that they cannot shadow torch's own."""
    env = dict(os.environ)
    root = package_root(a)
    if root is None:
        return env
    keep = [d for d in env.get("LD_LIBRARY_PATH", "").split(":")
            if d and not os.path.abspath(d).startswith(root + os.sep)]
    env["LD_LIBRARY_PATH"] = ":".join(keep)
    env.pop("OPAL_PREFIX", None)
    return env


def peer_result(peer, name):
    doc = (peer or {}).get("document") or {}
    if (peer or {}).get("error"):
        return None
    for x in doc.get("results", []):
        if x.get("name") == name:
            return x
    return None


PEER_NAME = ("PyTorch FSDP2 fully_shard + CPUOffloadPolicy (parameters, gradients and AdamW on the "
             "CPU at any stage: FSDP2 has no optimizer-only offload), same shape, batch, steps, bf16")


# ---- results ------------------------------------------------------------------------------------


def result(name, metric, unit, values, params, reference=None, ratio_of=None, goal=None, note=None):
    """One result of docs/benchmarks.md. ratio_of: 'ours/ref' or 'ref/ours' (None: no ratio).
    goal: {"ratio_at_least": x} | {"fraction_at_least": x} | {"parameters_at_least": x}."""
    x = {"name": name, "params": params, "metric": metric, "unit": unit}
    if values is None:
        x.update({"median": None, "min": None, "max": None, "reps": 0})
    else:
        x.update(values)
    if reference is not None:
        x["reference"] = reference
    ratio = None
    ours, ref = x["median"], (reference or {}).get("median")
    if ratio_of and isinstance(ours, (int, float)) and isinstance(ref, (int, float)):
        if ratio_of == "ours/ref" and ref != 0:
            ratio = ours / ref
        elif ratio_of == "ref/ours" and ours != 0:
            ratio = ref / ours
    if reference is not None or ratio_of:
        x["ratio"] = ratio
    if goal:
        x["goal"] = goal
        (kind, bound), = goal.items()
        value = ratio if kind.startswith("ratio") else x["median"]
        if not isinstance(value, (int, float)):
            x["meets_goal"] = None  # nothing measured to judge
        elif kind.endswith("_at_least"):
            x["meets_goal"] = value >= bound
        else:
            x["meets_goal"] = value <= bound
    if note:
        x["note"] = note
    return x


def compare_results(a, shape, ours, s, peer):
    """The compare mode's results, from our summary `s` and the peer's document. When our run
    failed (`s` None) every result is still listed, with our figures null and the peer's kept."""
    L, C, H, V, T = shape
    base = {"n_layer": L, "n_embd": C, "n_head": H, "vocab": V, "seq_len": T,
            "parameters": ours.get("parameters") or count_parameters(shape),
            "flops_per_token": flops_per_token(shape), "stage": a.stage,
            "micro_batch": a.micro_batch, "grad_accum": a.grad_accum,
            "tokens_per_step": a.micro_batch * a.grad_accum * T, "dtype": "bf16", "device": a.device,
            "activation_checkpointing": a.activation_checkpointing, "timed_steps": a.steps,
            "warmup_steps": a.warmup}
    if s is None:
        base["error"] = f"ours: {ours.get('error')}"
    with_peer = peer is not None and not a.no_peer
    got = (lambda key: s[key]) if s is not None else (lambda key: None)
    phases = got("phases") or {}

    def ref(name):
        x = peer_result(peer, name) if with_peer else None
        if x is None:
            return None
        return {"name": PEER_NAME, "median": x["median"], "min": x.get("min"), "max": x.get("max")}

    out = []
    out.append(result(
        f"step time, stage {a.stage} with offload, {shape_label(shape)}, B={a.micro_batch} "
        f"GA={a.grad_accum} (ratio = peer / ours: above 1 = we are faster)",
        "time", "s", got("step_time"),
        dict(base, phases=got("phases"), zero_train_wall_s=ours.get("wall_s")),
        reference=ref("step time"), ratio_of="ref/ours",
        goal={"ratio_at_least": STEP_TIME_RATIO_GOAL},
        note="goal: faster than the PyTorch peer on the same shape"))
    out.append(result(
        f"tokens/s, {shape_label(shape)} (ratio = ours / peer)", "throughput", "tokens/s",
        got("tokens_per_s"),
        dict(base, reported_by_zero_train_median=got("reported_tokens_per_s_median")),
        reference=ref("throughput"), ratio_of="ours/ref"))
    out.append(result(
        f"model TFLOPS, {shape_label(shape)} (ratio = ours / peer)", "throughput", "TFLOPS",
        got("tflops"), dict(base, reported_by_zero_train_median=got("reported_tflops_median")),
        reference=ref("model TFLOPS"), ratio_of="ours/ref",
        note="6 M + 12 L C T FLOPs per token (models::gpt_flops_per_token, the peer's too); "
             "activation-checkpointing recomputation not counted"))
    if got("mfu") is not None:
        out.append(result(
            f"MFU (model FLOPs / the GPU's dense 16-bit peak), {shape_label(shape)}", "fraction", "",
            s["mfu"], base, reference={"name": "all of the peak", "median": 1.0}, ratio_of="ours/ref",
            goal={"fraction_at_least": MFU_GOAL},
            note="goal 0.32: DeepSpeed ZeRO-Offload's ~40 TFLOPS on a 125 TFLOPS V100 (ZeRO-Offload "
                 "paper)"))
    else:
        out.append(result(
            f"MFU, {shape_label(shape)}", "fraction", "", None, base,
            note="no MFU: the device's peak is unknown (cpu backend, or a GPU not in "
                 "core/peak_flops.hpp), or our run failed; no goal"))
    peak_alloc = peer_result(peer, "device peak allocated") if with_peer else None
    peak_res = peer_result(peer, "device peak reserved") if with_peer else None
    dev_ref = None
    if peak_alloc is not None:
        dev_ref = {"name": "peer: torch.cuda.max_memory_allocated (warm-up included)",
                   "median": peak_alloc["median"],
                   "max_memory_reserved": peak_res["median"] if peak_res else None}
    out.append(result(
        f"device peak bytes, {shape_label(shape)} (ratio = peer / ours: above 1 = we use less)",
        "bytes", "B", single(s["device_peak_bytes"]) if s else None, base, reference=dev_ref,
        ratio_of="ref/ours",
        note="ours: the ledger's device peak over the run (every byte zero-train allocates, "
             "warm-up included); the peer's: PyTorch's caching allocator, allocated bytes "
             "(reserved in reference.max_memory_reserved). On cpu the peer has no device figure."))
    rss = peer_result(peer, "host peak RSS") if with_peer else None
    rss_ref = {"name": "peer: host peak RSS of its process", "median": rss["median"]} if rss else None
    out.append(result(
        f"host peak bytes, {shape_label(shape)} (ratio = peer / ours: above 1 = we use less)",
        "bytes", "B", single(s["host_peak_bytes"]) if s else None,
        dict(base, zero_train_peak_rss_bytes=ours.get("rss_peak_bytes")),
        reference=rss_ref, ratio_of="ref/ours",
        note="not like for like: ours is the ledger's host peak (host memory allocated on the "
             "device's behalf: offloaded state, pinned buffers), the peer's is its process's peak "
             "RSS (Python, torch's libraries and everything else included). Our process's RSS is "
             "in the next result."))
    out.append(result(
        f"host peak RSS, {shape_label(shape)} (ratio = peer / ours: above 1 = we use less)",
        "bytes", "B", single(ours["rss_peak_bytes"]) if s and ours.get("rss_peak_bytes") else None,
        base, reference=rss_ref, ratio_of="ref/ours",
        note="both: the process's peak resident set (getrusage ru_maxrss of the child process)"))
    if a.breakdown:
        out.append(result(
            f"host AdamW time hidden behind other work, {shape_label(shape)}", "fraction", "",
            got("host_adam_hidden"),
            dict(base, host_adam_s=phases.get("host_adam_s"),
                 host_adam_waited_s=phases.get("host_adam_waited_s")),
            reference={"name": "all of it hidden", "median": 1.0}, ratio_of="ours/ref",
            goal={"fraction_at_least": HIDDEN_GOAL},
            note="1 - host_adam_waited / host_adam per timed step (wall_clock_breakdown), median; "
                 "negative when the driving thread waited longer than AdamW ran"))
    return out


def shape_label(shape):
    L, C, H, V, T = shape
    params = count_parameters(shape)
    size = f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.1f}M"
    return f"{L} layers x {C} hidden ({size} parameters, V={V}, T={T})"


def side_report(r, keep):
    """The JSON view of one side's run: status, error, files."""
    if r is None:
        return None
    return {k: r.get(k) for k in keep if k in r}


OURS_KEYS = ("exit_status", "signal", "timed_out", "error", "error_kind", "command", "config",
             "stdout_log", "stderr_log", "metrics", "wall_s", "rss_peak_bytes", "device_name",
             "threads", "warnings")
PEER_KEYS = ("exit_status", "signal", "timed_out", "error", "error_kind", "command", "json",
             "stdout_log", "stderr_log", "wall_s", "rss_peak_bytes")


# ---- the modes ----------------------------------------------------------------------------------


def header(a, mode):
    return {
        "benchmark": "single_gpu_offload",
        "version": 1,
        "date": now_utc(),
        "git": git_revision(),
        "command": the_command(),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(),
                    "gpu": gpu_name() if a.device == "cuda" else None, "ranks": 1, "threads": None},
        "quick": a.quick,
        "mode": mode,
    }


def settings(a):
    return {"device": a.device, "dtype": "bf16", "stage": a.stage, "offload_optimizer": "cpu",
            "offload_param": "cpu" if a.stage == 3 else None, "pin_memory": True,
            "micro_batch": a.micro_batch, "grad_accum": a.grad_accum, "steps": a.steps,
            "warmup": a.warmup, "activation_checkpointing": a.activation_checkpointing,
            "device_memory_limit": a.device_memory_limit, "host_memory_limit": a.host_memory_limit,
            "speculative_host_step": a.speculative_host_step, "wall_clock_breakdown": a.breakdown,
            "optimizer": "AdamW lr 6e-4 betas [0.9, 0.95] eps 1e-8 weight_decay 0.1, constant LR",
            "gradient_clipping": 1.0, "seed": a.seed, "zero_train": a.zero_train,
            "config_override": a.config_override, "timeout_s": a.timeout}


def compare(a, out_dir, data_dir):
    shape = a.shape
    doc = header(a, "compare")
    doc["model"] = {"preset": a.preset, "n_layer": shape[0], "n_embd": shape[1], "n_head": shape[2],
                    "vocab_size": shape[3], "seq_len": shape[4],
                    "parameters": count_parameters(shape), "flops_per_token": flops_per_token(shape)}
    doc["settings"] = settings(a)
    doc["out_dir"] = out_dir
    ours = run_ours(a, shape, os.path.join(out_dir, "ours"), data_dir, a.device_memory_limit,
                    a.host_memory_limit, a.timeout, "compare")
    s = summarise_ours(a, ours, shape)
    peer = None
    if not a.no_peer:
        peer = run_peer(a, shape, os.path.join(out_dir, "peer"), a.timeout, "compare")
    doc["machine"]["threads"] = ours.get("threads")
    if doc["machine"]["gpu"] is None and a.device == "cuda" and peer and peer.get("document"):
        doc["machine"]["gpu"] = (peer["document"].get("machine") or {}).get("gpu")
    doc["results"] = compare_results(a, shape, ours, s, peer)
    doc["ours"] = side_report(ours, OURS_KEYS)
    if s is not None:
        doc["ours"]["losses"] = s["losses"]
        doc["ours"]["grad_norms"] = s["grad_norms"]
    doc["ledger"] = ours.get("ledger", [])
    doc["ledger_at_end"] = ours.get("ledger_at_end", [])
    doc["startup"] = ours.get("startup", [])
    if a.no_peer:
        doc["peer"] = {"skipped": "--no-peer"}
    else:
        doc["peer"] = side_report(peer, PEER_KEYS)
        doc["peer"]["document"] = peer.get("document")
    return doc


def sweep_shapes(a):
    if a.shapes:
        return a.shapes
    if a.quick:
        return [{"name": n, "shape": (L, C, H, QUICK_SWEEP_VOCAB, QUICK_SWEEP_SEQ)}
                for n, L, C, H in QUICK_SWEEP_SHAPES]
    return [{"name": n, "shape": (L, C, H, TABLE3_VOCAB, TABLE3_SEQ)} for n, L, C, H in TABLE3_SHAPES]


def sweep(a, out_dir, data_dir):
    doc = header(a, "sweep")
    doc["settings"] = settings(a)
    doc["out_dir"] = out_dir
    shapes = sweep_shapes(a)
    t_start = time.monotonic()
    rows, results, largest = [], [], None
    stopped = None
    summary_path = os.path.join(out_dir, "sweep.partial.json")

    def finish():
        head_params = largest["parameters"] if largest else None
        headline = result(
            f"largest model that fits, stage {a.stage} with offload, device limit "
            f"{a.device_memory_limit or 'the real capacity'}, host limit "
            f"{a.host_memory_limit or 'the default (90% of RAM)'}, B={a.micro_batch} "
            f"GA={a.grad_accum}{', activation checkpointing' if a.activation_checkpointing else ''}",
            "parameters", "parameters", single(head_params) if largest else None,
            {"largest_fitting": largest["name"] if largest else None,
             "shape": list(largest["shape"]) if largest else None,
             "first_not_fitting": next((r["name"] for r in rows if r["fits"] is False), None),
             "stopped": stopped, "shapes_tried": sum(r["fits"] is not None for r in rows),
             "shapes_listed": len(shapes)},
            reference={"name": "DeepSpeed ZeRO-Offload on one 32 GB V100 (ZeRO-Offload paper)",
                       "median": PARAMETERS_GOAL},
            ratio_of="ours/ref", goal={"parameters_at_least": PARAMETERS_GOAL},
            note="fits = zero-train ran every step under the limits (exit 0)")
        doc["results"] = [headline] + results
        doc["largest_fitting"] = ({"name": largest["name"], "parameters": largest["parameters"],
                                   "shape": list(largest["shape"])} if largest else None)
        doc["shapes"] = rows
        return doc

    for i, entry in enumerate(shapes):
        name, shape = entry["name"], tuple(entry["shape"])
        L, C, H, V, T = shape
        elapsed = time.monotonic() - t_start
        timeout = a.timeout
        if a.budget_s:
            left = a.budget_s - elapsed
            if left < 10:
                stopped = f"time budget (--budget-s {a.budget_s:g}) spent before {name}"
                rows.extend({"name": e["name"], "shape": list(e["shape"]),
                             "parameters": count_parameters(tuple(e["shape"])), "fits": None,
                             "error": "not tried: time budget spent"} for e in shapes[i:])
                break
            timeout = min(timeout, left) if timeout else left
        label = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        ours = run_ours(a, shape, os.path.join(out_dir, label), data_dir, a.device_memory_limit,
                        a.host_memory_limit, timeout, label)
        if doc["machine"]["threads"] is None:
            doc["machine"]["threads"] = ours.get("threads")
        s = summarise_ours(a, ours, shape)
        fits = ours["error"] is None and s is not None
        row = {"name": name, "shape": list(shape), "parameters": ours.get("parameters"),
               "fits": fits, "error": ours["error"], "error_kind": ours["error_kind"],
               "step_time_s": s["step_time"]["median"] if s else None,
               "tokens_per_s": s["tokens_per_s"]["median"] if s else None,
               "tflops": s["tflops"]["median"] if s else None,
               "mfu": s["mfu"]["median"] if s and s["mfu"] else None,
               "host_adam_hidden": (s["host_adam_hidden"]["median"]
                                    if s and s["host_adam_hidden"] else None),
               "device_peak_bytes": s["device_peak_bytes"] if s else None,
               "host_peak_bytes": s["host_peak_bytes"] if s else None,
               "rss_peak_bytes": ours.get("rss_peak_bytes"), "wall_s": ours.get("wall_s"),
               "ledger": ours.get("ledger", []),
               "ours": side_report(ours, OURS_KEYS)}
        peer = None
        if fits and a.with_peer:
            peer = run_peer(a, shape, os.path.join(out_dir, label), timeout, label)
            row["peer"] = side_report(peer, PEER_KEYS)
            row["peer"]["document"] = peer.get("document")
            row["peer_fits"] = peer["error"] is None
        rows.append(row)
        if fits:
            if largest is None or row["parameters"] > largest["parameters"]:
                largest = {"name": name, "parameters": row["parameters"], "shape": shape}
            ref = None
            if peer is not None:
                x = peer_result(peer, "step time")
                if x is not None:
                    ref = {"name": PEER_NAME, "median": x["median"]}
            results.append(result(
                f"step time, {name}: {shape_label(shape)}, stage {a.stage} with offload"
                + (" (ratio = peer / ours)" if a.with_peer else ""),
                "time", "s", s["step_time"],
                {"shape_name": name, "n_layer": L, "n_embd": C, "n_head": H, "vocab": V, "seq_len": T,
                 "parameters": row["parameters"], "micro_batch": a.micro_batch,
                 "grad_accum": a.grad_accum, "tflops": row["tflops"], "mfu": row["mfu"],
                 "tokens_per_s": row["tokens_per_s"], "host_adam_hidden": row["host_adam_hidden"],
                 "device_peak_bytes": row["device_peak_bytes"],
                 "host_peak_bytes": row["host_peak_bytes"], "phases": s["phases"]},
                reference=ref, ratio_of="ref/ours" if a.with_peer else None,
                goal={"ratio_at_least": STEP_TIME_RATIO_GOAL} if a.with_peer else None))
        # What we know so far, in case the whole command is cut off (the device tool's limit).
        try:
            with open(summary_path, "w") as f:
                json.dump(finite(finish()), f, indent=2, allow_nan=False)
        except (OSError, ValueError):
            pass
        if not fits and not a.all:
            stopped = f"{name} does not fit ({ours['error_kind']}); --all would go on"
            rows.extend({"name": e["name"], "shape": list(e["shape"]),
                         "parameters": count_parameters(tuple(e["shape"])), "fits": None,
                         "error": "not tried: a smaller shape did not fit"} for e in shapes[i + 1:])
            break
    return finish()


# ---- flags --------------------------------------------------------------------------------------


def parse_shapes(text):
    try:
        return read_shapes(text)
    except (ValueError, KeyError, TypeError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def read_shapes(text):
    """--shapes: a JSON list; each item a name of the default list ("8B"), [L, C, H] or
    [L, C, H, V, T], or {"name", "n_layer", "n_embd", "n_head"[, "vocab_size", "seq_len"]}."""
    items = json.loads(text)
    if not isinstance(items, list) or not items:
        raise ValueError("--shapes: expected a non-empty JSON list")
    table = {n: (L, C, H) for n, L, C, H in TABLE3_SHAPES + QUICK_SWEEP_SHAPES}
    out = []
    for it in items:
        if isinstance(it, str):
            if it not in table:
                raise ValueError(f"--shapes: unknown name {it!r}; known: {', '.join(table)}")
            quick = any(it == n for n, *_ in QUICK_SWEEP_SHAPES)
            vocab, seq = ((QUICK_SWEEP_VOCAB, QUICK_SWEEP_SEQ) if quick
                          else (TABLE3_VOCAB, TABLE3_SEQ))
            out.append({"name": it, "shape": table[it] + (vocab, seq)})
        elif isinstance(it, list) and len(it) in (3, 5):
            shape = tuple(int(v) for v in it) + (() if len(it) == 5 else (TABLE3_VOCAB, TABLE3_SEQ))
            out.append({"name": f"{shape[0]}x{shape[1]}", "shape": shape})
        elif isinstance(it, dict):
            shape = (int(it["n_layer"]), int(it["n_embd"]), int(it["n_head"]),
                     int(it.get("vocab_size", TABLE3_VOCAB)), int(it.get("seq_len", TABLE3_SEQ)))
            out.append({"name": str(it.get("name", f"{shape[0]}x{shape[1]}")), "shape": shape})
        else:
            raise ValueError(f"--shapes: cannot read {it!r}")
    for e in out:
        L, C, H, V, T = e["shape"]
        if min(e["shape"]) < 1 or C % H:
            raise ValueError(f"--shapes: {e['name']}: sizes must be positive and n_head divide n_embd")
    return out


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Our zero-train against the PyTorch FSDP2 + CPUOffloadPolicy peer on one GPU "
        "(compare), or the largest model that fits (--sweep). One JSON document on stdout.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--sweep", action="store_true", help="the largest-model-that-fits sweep")
    p.add_argument("--quick", action="store_true",
                   help="tiny shapes on --device cpu, 3 timed steps: under a minute on 2 cores")
    p.add_argument("--zero-train", default="build/zero-train", help="the zero-train program")
    p.add_argument("--out-dir", help="keep logs, configs, metrics and the document here "
                   "(default: a new temporary folder)")
    p.add_argument("--model", choices=sorted(PRESETS), default=None,
                   help="compare: a preset (default gpt2-124m; tiny with --quick)")
    p.add_argument("--n-layer", type=int)
    p.add_argument("--n-embd", type=int)
    p.add_argument("--n-head", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--shapes", type=parse_shapes, default=None,
                   help="sweep: JSON list of shapes: names of the defaults (\"8B\"), [L, C, H], "
                   "[L, C, H, V, T] or {name, n_layer, n_embd, n_head[, vocab_size, seq_len]}")
    p.add_argument("--all", action="store_true", help="sweep: go on after a shape that does not fit")
    p.add_argument("--with-peer", action="store_true", help="sweep: run the peer on fitting shapes")
    p.add_argument("--no-peer", action="store_true", help="compare: ours only")
    p.add_argument("--stage", type=int, choices=[2, 3], default=2,
                   help="2: offload_optimizer cpu; 3: offload_optimizer + offload_param cpu")
    p.add_argument("--micro-batch", type=int, default=None,
                   help="sequences per micro-batch (default 8; 4 in sweep; 4 with --quick)")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step")
    p.add_argument("--steps", type=int, default=None,
                   help="timed steps (default 10; 3 in sweep and with --quick)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed first steps (default 2; 1 in sweep and with --quick)")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None,
                   help="default cuda; cpu with --quick")
    p.add_argument("--device-memory-limit", default=None,
                   help="zero_train.device_memory_limit, e.g. 32GiB (default: the real capacity; "
                   "32GiB in sweep; 64MiB in sweep with --quick)")
    p.add_argument("--host-memory-limit", default=None,
                   help="zero_train.host_memory_limit, e.g. 118GiB (default: zero-train's, 90%% "
                   "of RAM)")
    p.add_argument("--activation-checkpointing", action=argparse.BooleanOptionalAction, default=None,
                   help="checkpoint every block (ours: activation_checkpointing.number_checkpoints "
                   "= n_layer; the peer's flag). Default: off in compare, on in sweep")
    p.add_argument("--speculative-host-step", action=argparse.BooleanOptionalAction, default=None,
                   help="zero_train.speculative_host_step (default: zero-train's, on)")
    p.add_argument("--breakdown", action=argparse.BooleanOptionalAction, default=True,
                   help="wall_clock_breakdown (per-phase timers; the host-AdamW-hidden result "
                   "needs them; they add host waits, so --no-breakdown for the purest step time)")
    p.add_argument("--config-override", type=json.loads, default=None,
                   help="JSON object deep-merged into our ds_config (e.g. bucket sizes)")
    p.add_argument("--peer-adamw-impl", choices=["default", "foreach", "fused"], default="default",
                   help="the peer's --adamw-impl")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds per child run before it is killed (default 1800; 600 in sweep)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="sweep: start no new shape after this many seconds in all (the device "
                   "tool's 10-minute command limit: e.g. 540)")
    p.add_argument("--silent-children", action="store_true",
                   help="do not forward zero-train's step lines to stderr")
    a = p.parse_args(argv)

    if a.device is None:
        a.device = "cpu" if a.quick else "cuda"
    if a.micro_batch is None:
        a.micro_batch = 4 if (a.sweep or a.quick) else 8
    if a.steps is None:
        a.steps = 3 if (a.sweep or a.quick) else 10
    if a.warmup is None:
        a.warmup = 1 if (a.sweep or a.quick) else 2
    if a.timeout is None:
        a.timeout = 600.0 if a.sweep else 1800.0
    if a.activation_checkpointing is None:
        a.activation_checkpointing = bool(a.sweep and not a.quick)
    if a.sweep and a.device_memory_limit is None:
        a.device_memory_limit = "64MiB" if a.quick else "32GiB"
    for flag in ("device_memory_limit", "host_memory_limit"):
        try:
            parse_bytes(getattr(a, flag))
        except ValueError as e:
            p.error(f"--{flag.replace('_', '-')}: {e}")
    if a.micro_batch < 1 or a.grad_accum < 1 or a.steps < 1 or a.warmup < 0:
        p.error("--micro-batch, --grad-accum and --steps must be >= 1, --warmup >= 0")
    if a.config_override is not None and not isinstance(a.config_override, dict):
        p.error("--config-override: expected a JSON object")

    if not a.sweep:
        if a.model is None:
            a.model = "tiny" if a.quick else "gpt2-124m"
        preset = PRESETS[a.model]
        overrides = (a.n_layer, a.n_embd, a.n_head, a.vocab, a.seq_len)
        a.shape = tuple(o if o is not None else v for o, v in zip(overrides, preset))
        a.preset = a.model if a.shape == preset else None
        L, C, H, V, T = a.shape
        if min(a.shape) < 1 or C % H:
            p.error(f"bad shape n_layer={L} n_embd={C} n_head={H} vocab={V} seq_len={T}: sizes "
                    "must be positive and n_head must divide n_embd")
        if V > 65536:
            p.error(f"--vocab {V}: the token shard holds uint16 ids (at most 65536)")
    elif any(x is not None for x in (a.model, a.n_layer, a.n_embd, a.n_head, a.vocab, a.seq_len)):
        p.error("--sweep takes its shapes from --shapes, not --model / --n-layer ...")
    return a


def main(argv):
    a = parse_args(argv)
    if a.out_dir:
        out_dir = os.path.abspath(a.out_dir)
        os.makedirs(out_dir, exist_ok=True)
    else:
        out_dir = tempfile.mkdtemp(prefix="single_gpu_offload-")
    log(f"logs, configs and metrics go to {out_dir}")
    with tempfile.TemporaryDirectory(prefix="single_gpu_offload-data-") as data_dir:
        doc = sweep(a, out_dir, data_dir) if a.sweep else compare(a, out_dir, data_dir)
    doc = finite(doc)
    text = json.dumps(doc, indent=2, allow_nan=False)
    path = os.path.join(out_dir, "single_gpu_offload.json")
    try:
        with open(path, "w") as f:
            f.write(text + "\n")
        log(f"the document is also in {path}")
    except OSError as e:
        log(f"cannot write {path}: {e}")
    print(text, flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
