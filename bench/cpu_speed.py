#!/usr/bin/env python3
"""cpu_speed: zero-train's training throughput on the cpu backend next to PyTorch and DeepSpeed on
the same cores, same model, same data, same optimizer and schedule (issue 21, "Must show").

Cases (each a real training run of a few steps): zero-train at ZeRO stage 0, 2 and 3, with and
without optimizer offload (stages 2 and 3), on 1 and 2 ranks; the peers at the matching stage
when a virtualenv with torch and deepspeed is given (--peers-venv, made by
bench/peers/install.sh): PyTorch eager (bf16 autocast, or fp32) on 1 process, all cores, and DDP
over gloo (2 processes) for stage 0, DeepSpeed ZeRO-2 and ZeRO-3 with and without optimizer
offload (1 and 2 processes) for stages 2 and 3. Every system trains in bf16 where the CPU has
bf16 products (AVX-512 and up), in fp32 where it has not (--dtype, bf16_products()). Runs are
interleaved: run 1 of every case, then run 2 of every case, ..., so a slow minute of the machine
spreads over all systems alike.

Everyone reads one llm.c token shard written here (a fixed synthetic language, see
write_language_shard) in zero-train's sequence order; the config is bench/configs/cpu_speed.json
(8 layers, n_embd 512, 8 heads, vocab 8192, seq 256: 29.5M parameters) and, in the full run,
bench/configs/cpu_speed_gpt2_124m.json (GPT-2 124M at seq 256). Per case the stage and offload are
written into a copy of that config.

Threads: zero-train runs with OPENBLAS_NUM_THREADS=1 (the kernels' contract, models/cpu/
kernels.hpp: parallelism comes from oneTBB, which sees every core); the peers get cores/processes
torch threads per process. Peak RSS is each process's own (getrusage of that process: zero-train
ranks are started through this script's --rank-wrapper, which runs the rank as its child).

Prints one JSON document on stdout (docs/benchmarks.md): per zero-train case its tokens/s
(median/min/max over every timed step of every run), the best peer at the same stage and
offload as reference, ratio, goal ratio_at_least 1.0; peak RSS per process against the peer with
the same stage, offload and process count; every run's loss curve; model FLOP/s against a GEMM
rate (bf16, or fp32 on a CPU without bf16 products) when build/bench/cpu_gemm exists (`cpu_gemm --quick --reference-only`, about a second,
sampled right before every zero-train run; the median of all samples is the reference, as the
tokens/s are medians over runs spread over the same minutes). A loss table goes to stderr.

  python3 bench/cpu_speed.py --quick --peers-venv /work/peers-venv
  python3 bench/cpu_speed.py --peers-venv ~/.cache/zero-peers-venv --out-dir /tmp/cpu_speed

--quick trains 5 steps per case, one run each, on a subset of cases (about 3-4 minutes on the
2-core machine: it trains real 29.5M-parameter models, so the 60 s of docs/benchmarks.md is not
reachable). Exit 0 when the document was printed (failed cases are reported in it), 2 on bad
flags.
"""

import argparse
import array
import copy
import datetime
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS = os.path.join(REPO, "bench", "peers")
CONFIGS = {"cpu-speed-29m": "bench/configs/cpu_speed.json",
           "gpt2-124m-seq256": "bench/configs/cpu_speed_gpt2_124m.json"}
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-x", "OPENBLAS_NUM_THREADS=1"]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---- the data -----------------------------------------------------------------------------------


def write_language_shard(path, n_tokens, vocab, seed):
    """An llm.c token shard (docs/data-formats.md) of a fixed synthetic language a model can learn,
    so that loss curves have a shape (uniform random tokens would stay at ln V): a first-order
    Markov chain where each token has 16 successors (fixed pseudo-random ids) drawn with weights
    1/(k+1), and one token in 20 uniform. Its entropy is about 2.7 nats; the loss starts at
    ln V (9.0 for V = 8192) and falls."""
    rng = random.Random(seed)
    succ = [[rng.randrange(vocab) for _ in range(16)] for _ in range(vocab)]
    weights = [1.0 / (k + 1) for k in range(16)]
    cum = list(__import__("itertools").accumulate(weights))
    picks = rng.choices(range(16), cum_weights=cum, k=n_tokens)
    noise = rng.choices((False, True), weights=(19, 1), k=n_tokens)
    tokens = array.array("H", [0] * n_tokens)
    t = rng.randrange(vocab)
    for i in range(n_tokens):
        t = rng.randrange(vocab) if noise[i] else succ[t][picks[i]]
        tokens[i] = t
    header = array.array("i", [0] * 256)
    header[0], header[1], header[2] = 20240520, 1, n_tokens
    if sys.byteorder != "little":
        header.byteswap()
        tokens.byteswap()
    with open(path + ".tmp", "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())
    os.replace(path + ".tmp", path)


# ---- cases --------------------------------------------------------------------------------------


class Case:
    def __init__(self, model, system, stage, offload, procs, label):
        self.model, self.system, self.stage, self.offload = model, system, stage, offload
        self.procs, self.label = procs, label
        self.runs = []  # one dict per run: step_times, losses, lrs, rss, error

    @property
    def key(self):
        return f"{self.model} | {self.label}"


def zero_cases(model, quick, dtype):
    combos = [(0, False), (2, False), (2, True), (3, False), (3, True)]
    ranks = (1, 2)
    out = []
    for stage, offload in combos:
        for r in ranks:
            if quick and r == 1 and stage != 0:
                continue  # quick: stage 0 on 1 rank, every stage on 2
            if quick and r == 2 and stage == 3 and offload:
                continue
            out.append(Case(model, "zero-train", stage, offload, r,
                            f"zero-train stage {stage}{' + offload' if offload else ''}, {dtype}, "
                            f"{r} rank{'s' if r > 1 else ''}"))
    return out


def peer_cases(model, quick, dtype):
    how = "bf16 autocast" if dtype == "bf16" else "fp32"
    out = [Case(model, "torch", 0, False, 1, f"PyTorch eager {how}, 1 process"),
           Case(model, "torch", 0, False, 2, f"PyTorch DDP {how}, 2 processes")]
    for stage in (2, 3):
        for offload in (False, True):
            for procs in (1, 2):
                if quick and (procs == 1 or (stage == 3 and offload)):
                    continue
                out.append(Case(model, "deepspeed", stage, offload, procs,
                                f"DeepSpeed ZeRO-{stage}{' + offload' if offload else ''} {dtype}, "
                                f"{procs} process{'es' if procs > 1 else ''}"))
    return out


def case_config(base_path, case, out_dir, dtype):
    """The model's config with the case's stage, offload and dtype, written to out_dir."""
    with open(os.path.join(REPO, base_path)) as f:
        cfg = json.load(f)
    cfg["bf16"] = {"enabled": dtype == "bf16"}
    zo = copy.deepcopy(cfg.get("zero_optimization", {}))
    zo["stage"] = case.stage
    zo.pop("offload_optimizer", None)
    if case.offload:
        zo["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    cfg["zero_optimization"] = zo
    name = f"{case.model}-s{case.stage}{'-off' if case.offload else ''}-{dtype}.json"
    path = os.path.join(out_dir, name)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
    return path


# ---- running ------------------------------------------------------------------------------------


def run_logged(cmd, env, log_path, timeout):
    """Runs cmd (its own session, so a timeout ends all of it); stdout returned, stderr to a file."""
    with open(log_path, "wb") as err:
        try:
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                 env=env, cwd=REPO, start_new_session=True)
        except OSError as e:
            return None, f"cannot run {cmd[0]}: {e}"
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.communicate()
            return None, f"timed out after {timeout} s"
    if p.returncode != 0:
        return out.decode(errors="replace"), f"exit status {p.returncode} (log: {log_path})"
    return out.decode(errors="replace"), None


def binding(case):
    return ["--bind-to", "none"] if case.procs == 1 else []


def launch_of(case):
    return shlex.join(["mpirun"] + binding(case) + ["-np", str(case.procs)]) + (
        "" if binding(case) else " (Open MPI's default: each rank bound to one core)")


def run_zero(a, case, cfg_path, shard, run_dir, steps):
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    rss_dir = os.path.join(run_dir, "rss")
    os.makedirs(rss_dir, exist_ok=True)
    for f in os.listdir(rss_dir):
        os.remove(os.path.join(rss_dir, f))
    train = [a.zero_train, "--config", cfg_path, "--steps", str(steps), "--data", shard,
             "--metrics", metrics]
    wrapper = [sys.executable, os.path.abspath(__file__), "--rank-wrapper", rss_dir, "--"]
    # One rank gets every core: Open MPI binds each rank to one core when it starts 2 ranks or
    # fewer, which would leave the other cores idle (zero-train warns about it at start-up and
    # says to launch this way); 2 ranks keep the default one core each.
    cmd = MPIRUN + binding(case) + ["-np", str(case.procs)] + wrapper + train
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    _, err = run_logged(cmd, env, os.path.join(run_dir, "stderr.log"), a.timeout)
    lines = []
    try:
        with open(metrics) as f:
            lines = [json.loads(x) for x in f if x.strip()]
    except OSError:
        pass
    steps_seen = [x for x in lines if "step_time_s" in x]
    if err is None and len(steps_seen) != steps:
        err = f"{len(steps_seen)} metric lines for {steps} steps"
    rss = []
    for r in range(case.procs):
        try:
            with open(os.path.join(rss_dir, str(r))) as f:
                rss.append(int(f.read()))
        except (OSError, ValueError):
            rss.append(None)
    return {"step_times": [x["step_time_s"] for x in steps_seen[a.warmup:]],
            "losses": [x["loss"] for x in steps_seen], "lrs": [x["lr"] for x in steps_seen],
            "rss": rss, "error": err}


def run_peer(a, case, cfg_path, shard, run_dir, steps):
    py = os.path.join(a.peers_venv, "bin", "python")
    script = os.path.join(PEERS, "torch_cpu.py" if case.system == "torch" else "deepspeed_cpu.py")
    args = ["--config", cfg_path, "--data", shard, "--steps", str(steps), "--warmup", str(a.warmup)]
    if case.system == "deepspeed":
        args += ["--stage", str(case.stage)] + (["--offload"] if case.offload else [])
    else:
        args += ["--dtype", a.dtype]
    if case.procs == 1:
        cmd = [py, script] + args
    else:
        cmd = [py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
               str(case.procs), script] + args
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS=str(max(1, a.cores // case.procs)))
    env.pop("OPENBLAS_NUM_THREADS", None)
    out, err = run_logged(cmd, env, os.path.join(run_dir, "stderr.log"), a.timeout)
    doc = None
    if out:
        try:
            doc = json.loads(out[out.index("{"):])
        except ValueError:
            err = err or "no JSON document on stdout"
    if doc is None:
        return {"step_times": [], "losses": [], "lrs": [], "rss": [], "error": err or "no document"}
    st = [r for r in doc["results"] if r["name"] == "step time"][0]
    rss = [r for r in doc["results"] if r["name"].startswith("peak RSS")][0]["per_rank"]
    return {"step_times": doc.get("step_times", [st["median"]]), "losses": doc["losses"],
            "lrs": doc["lrs"], "rss": rss, "error": err, "peer": doc.get("peer")}


# ---- the document -------------------------------------------------------------------------------


def tokens_per_step(model):
    with open(os.path.join(REPO, CONFIGS[model])) as f:
        c = json.load(f)
    return c["train_batch_size"] * c["zero_train"]["model"]["seq_len"], c


def shape_of(c):
    presets = {"gpt2-124m": (12, 768, 12, 50257, 1024)}
    m = dict(c["zero_train"]["model"])
    L, C, H, V, T = presets.get(m.get("preset"), (None,) * 5)
    return (m.get("n_layer", L), m.get("n_embd", C), m.get("n_head", H),
            m.get("vocab_size", V), m.get("seq_len", T))


def flops_per_token(shape):
    """models::gpt_flops_per_token: 6 M + 12 L C T, M = 12 L C^2 + V C (matmul parameters)."""
    L, C, _, V, T = shape
    return 6.0 * (12.0 * L * C * C + V * C) + 12.0 * L * C * T


def throughput(case, tokens):
    rates = [tokens / t for r in case.runs for t in r["step_times"] if t and t > 0]
    if not rates:
        return None
    return {"median": statistics.median(rates), "min": min(rates), "max": max(rates),
            "reps": len(rates)}


def peak_rss(case):
    vals = [v for r in case.runs for v in r["rss"] if v]
    return max(vals) if vals else None


def errors(case):
    return [r["error"] for r in case.runs if r["error"]]


def gemm_rate(a):
    """The bf16 GEMM rate from build/bench/cpu_gemm (another piece of issue 21), when built: its
    --reference-only mode, oneDNN's bf16 products alone on every thread (about a second)."""
    exe = os.path.join(REPO, "build", "bench", "cpu_gemm")
    if not os.access(exe, os.X_OK):
        return None, "build/bench/cpu_gemm is not built: model FLOP/s over the bf16 GEMM rate left out"
    try:
        out = subprocess.run([exe, "--quick", "--reference-only"], capture_output=True, text=True,
                             timeout=300, cwd=REPO).stdout
        doc = json.loads(out)
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        return None, f"build/bench/cpu_gemm failed: {e}"
    return gemm_rate_of(doc)


def gemm_rate_of(doc):
    """(FLOP/s, result name) of cpu_gemm's document, or (None, why not)."""
    # The rows cpu_gemm marks params.mfu_reference: oneDNN's bf16 product, or on a CPU without
    # bf16 products the OpenBLAS fp32 product that bf16 training multiplies with there; older
    # documents have no mark, and their reference is params.library "oneDNN bf16". On every
    # thread of the node (model FLOP/s counts all ranks), best over the shapes measured.
    res = [r for r in doc.get("results", []) if "flop" in r.get("unit", "").lower()]
    rows = [r for r in res if r.get("params", {}).get("mfu_reference")] or \
        [r for r in res if r.get("params", {}).get("library") == "oneDNN bf16"]
    most = max((r["params"].get("threads", 0) for r in rows), default=0)
    best = None
    for r in rows:
        unit = r["unit"].lower()
        if r["params"].get("threads", 0) == most:
            scale = 1e9 if unit.startswith("gflop") else 1e12 if unit.startswith("tflop") else 1.0
            v = r["median"] * scale
            if best is None or v > best[0]:
                best = (v, r.get("name"))
    if best is None:
        return None, "build/bench/cpu_gemm printed no bf16 reference FLOP/s result"
    return best, None


def build_document(a, cases, gemm_note):
    results, curves = [], {}
    # The MFU reference: every GEMM sample of the benchmark (one before each zero-train run).
    # This VM's bf16 rate flips between about 600 and 1200 GFLOP/s within seconds, so one sample,
    # or a case's own few, is a coin toss; the median over all of them is the machine's typical
    # rate over the minutes the runs were spread across, as the tokens/s medians are.
    samples = [r["gemm"][0] for c in cases for r in c.runs if r.get("gemm")]
    # What was measured: oneDNN bf16, or OpenBLAS fp32 on a CPU without bf16 products (the
    # library named at the head of cpu_gemm's result names, "<library>[ (...)], <shape>, ...").
    libs = sorted({r["gemm"][1].split(",")[0].split(" (")[0]
                   for c in cases for r in c.runs if r.get("gemm")})
    gemm = None
    if samples:
        gemm = {"name": "build/bench/cpu_gemm --quick --reference-only: " + " / ".join(libs) +
                        " on every thread, best of its GPT shapes; median of the samples taken "
                        "right before "
                        "every zero-train run", "median": statistics.median(samples),
                "min": min(samples), "max": max(samples), "samples": samples}
    for model in a.models:
        tokens, c = tokens_per_step(model)
        fpt = flops_per_token(shape_of(c))
        ours = [x for x in cases if x.model == model and x.system == "zero-train"]
        peers = [x for x in cases if x.model == model and x.system != "zero-train"]
        for case in [x for x in cases if x.model == model]:
            curves[case.key] = [r["losses"] for r in case.runs]
        for case in ours:
            tp = throughput(case, tokens)
            params = {"model": model, "stage": case.stage, "offload": case.offload,
                      "ranks": case.procs, "dtype": a.dtype, "tokens_per_step": tokens,
                      "openblas_threads": 1, "steps": a.steps, "warmup": a.warmup,
                      "runs": len(case.runs), "launch": launch_of(case)}
            same = [p for p in peers if p.stage == case.stage and p.offload == case.offload
                    and throughput(p, tokens)]
            row = {"name": f"{case.label}, {model}", "params": params, "metric": "throughput",
                   "unit": "tokens/s"}
            if tp:
                row.update(tp)
            else:
                row.update({"median": None, "min": None, "max": None, "reps": 0})
            if errors(case):
                row["error"] = errors(case)[0]
            if same and tp:
                best = max(same, key=lambda p: throughput(p, tokens)["median"])
                ref = throughput(best, tokens)
                row["reference"] = {"name": best.label + " (best peer at this stage, same run)",
                                    **ref}
                row["ratio"] = tp["median"] / ref["median"]
                row["goal"] = {"ratio_at_least": 1.0}
                row["meets_goal"] = row["ratio"] >= 1.0
            else:
                row["note"] = ("no peer measured at this stage" if a.peers_venv else
                               "peers not installed (--peers-venv): no reference")
            results.append(row)

            # Memory: our largest rank against the same kind of peer run (stage, offload, count).
            mine = peak_rss(case)
            mem = {"name": f"peak RSS per process, {case.label}, {model}", "params": params,
                   "metric": "bytes", "unit": "B", "median": mine, "min": mine, "max": mine,
                   "reps": 1, "per_rank_by_run": [r["rss"] for r in case.runs]}
            twin = [p for p in same if p.procs == case.procs and peak_rss(p)]
            if mine and twin:
                ref_rss = min(peak_rss(p) for p in twin)
                who = [p for p in twin if peak_rss(p) == ref_rss][0]
                mem["reference"] = {"name": who.label + " (largest process)", "median": ref_rss}
                mem["ratio"] = ref_rss / mine
                mem["goal"] = {"ratio_at_least": 1.0}
                mem["meets_goal"] = mem["ratio"] >= 1.0
            results.append(mem)

            if tp and gemm:
                mfu = tp["median"] * fpt
                results.append({
                    "name": f"model FLOP/s over the GEMM reference rate, {case.label}, {model}",
                    "params": params, "metric": "fraction", "unit": "1",
                    "median": mfu / gemm["median"], "min": tp["min"] * fpt / gemm["median"],
                    "max": tp["max"] * fpt / gemm["median"], "reps": tp["reps"],
                    "reference": gemm,
                    "ratio": mfu / gemm["median"], "goal": {"fraction_at_least": 0.5},
                    "meets_goal": mfu / gemm["median"] >= 0.5})
        ref_lrs = next((r["lrs"] for x in ours for r in x.runs if r["lrs"]), None)
        for case in peers:
            tp = throughput(case, tokens)
            lrs = next((r["lrs"] for r in case.runs if r["lrs"]), None)
            row = {"name": f"peer: {case.label}, {model}",
                   "params": {"model": model, "stage": case.stage, "offload": case.offload,
                              "processes": case.procs, "runs": len(case.runs)},
                   "metric": "throughput", "unit": "tokens/s",
                   **(tp or {"median": None, "min": None, "max": None, "reps": 0}),
                   "peak_rss_per_process": peak_rss(case)}
            if errors(case):
                row["error"] = errors(case)[0]
            if lrs and ref_lrs:
                # The same schedule, step by step: zero-train's metrics (float) against the
                # peer's lrs; 1e-6 relative covers zero-train printing the lr as a float.
                row["lr_schedule_matches_zero_train"] = len(lrs) == len(ref_lrs) and all(
                    abs(x - y) <= 1e-6 * max(abs(x), abs(y), 1e-12) for x, y in zip(lrs, ref_lrs))
            results.append(row)

    notes = []
    if gemm_note:
        notes.append(gemm_note)
    if not a.peers_venv:
        notes.append("peers skipped: no --peers-venv (bench/peers/install.sh makes one)")
    return {
        "benchmark": "cpu_speed", "version": 1,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git": git_revision(), "command": the_command(a),
        "machine": {"cpu": cpu_model(), "cores": a.cores, "gpu": None, "ranks": "1 and 2",
                    "threads": "zero-train: OPENBLAS_NUM_THREADS=1, oneTBB held to the host "
                               "thread budget (cores / ranks on the cores each rank may use); "
                               "peers: cores / processes torch threads"},
        "quick": a.quick,
        "settings": {"steps": a.steps, "warmup": a.warmup, "runs": a.runs,
                     "dtype": a.dtype, "dtype_why": a.dtype_why,
                     "configs": {m: CONFIGS[m] for m in a.models},
                     "data": "synthetic Markov language shard (write_language_shard), one per "
                             "vocabulary, read by every system in zero-train's order",
                     "peers_venv": bool(a.peers_venv),
                     "throughput": "tokens per step / step time, every timed step of every run"},
        "notes": notes,
        "results": results,
        "loss_curves": curves,
    }


def print_losses(cases, models):
    for model in models:
        cs = [c for c in cases if c.model == model and c.runs and c.runs[0]["losses"]]
        if not cs:
            continue
        log(f"\nloss by step, {model} (first run of each case):")
        for i, c in enumerate(cs):
            log(f"  [{i}] {c.label}")
        n = max(len(c.runs[0]["losses"]) for c in cs)
        log("  step " + "".join(f"{f'[{i}]':>9}" for i in range(len(cs))))
        for s in range(n):
            cells = []
            for c in cs:
                ls = c.runs[0]["losses"]
                cells.append(f"{ls[s]:9.4f}" if s < len(ls) and ls[s] is not None else " " * 9)
            log(f"  {s + 1:4d} " + "".join(cells))


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
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, cwd=REPO, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def the_command(a):
    return "python3 " + shlex.join(["bench/cpu_speed.py"] + a.argv)


# ---- main ---------------------------------------------------------------------------------------


def rank_wrapper(argv):
    """--rank-wrapper DIR -- CMD...: run CMD as a child and write its peak RSS in bytes to
    DIR/<rank> (the rank from Open MPI's or PMI's environment); exit with its status."""
    out_dir, cmd = argv[0], argv[2:]
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0"))
    p = subprocess.Popen(cmd)
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = 0
    with open(os.path.join(out_dir, rank), "w") as f:
        f.write(str(usage.ru_maxrss * 1024))
    return os.waitstatus_to_exitcode(status) & 0xFF


def bf16_products():
    """(bool, why): whether this CPU has bf16 matrix products in the libraries every system here
    uses. oneDNN 2.6 (zero-train's) has bf16 matmul from AVX-512 (avx512_core: F, BW, VL, DQ) up,
    AVX512-BF16 and AMX natively; so does the oneDNN inside torch for its bf16 linear layers.
    Without them zero-train widens bf16 weights to fp32 and torch's bf16 matmul falls to a
    reference loop (measured 0.3 GFLOP/s per core against 29 for fp32 on an AVX2 EPYC,
    2026-11-29): a bf16 run would time the peers' fallback, not the systems, and no user of this
    CPU would train in bf16, so --dtype auto trains every system in fp32 there."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    except OSError as e:
        return True, f"/proc/cpuinfo unreadable ({e}); bf16 assumed"
    need = {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
    have = sorted(x for x in flags if x.startswith("avx512") or x.startswith("amx"))
    if need <= set(flags):
        return True, "bf16 products on this CPU (" + " ".join(have) + ")"
    return False, ("no bf16 products on this CPU (oneDNN needs avx512_core: "
                   + " ".join(sorted(need - set(flags))) + " missing), so fp32 for every system")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="5 steps, 1 run, fewer cases")
    p.add_argument("--zero-train", default="build/zero-train")
    p.add_argument("--peers-venv", default=os.environ.get("ZERO_PEERS_VENV"),
                   help="virtualenv with torch and deepspeed (bench/peers/install.sh); "
                   "default $ZERO_PEERS_VENV; without it the peers are skipped with a note")
    p.add_argument("--runs", type=int, help="interleaved runs of each case (default 3; 1 quick)")
    p.add_argument("--steps", type=int, help="steps per run, warm-up included (default 12; 5)")
    p.add_argument("--warmup", type=int, help="untimed first steps (default 2; 1 quick)")
    p.add_argument("--models", help="comma-separated, of " + ", ".join(CONFIGS) +
                   " (default: both; the first only with --quick)")
    p.add_argument("--out-dir", help="keep configs, data and logs here (default: a temp dir)")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per run")
    p.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default="auto",
                   help="training precision of every system (default auto: bf16 where the CPU "
                   "has bf16 products, else fp32; see bf16_products())")
    p.add_argument("--json-out", help="also write the document here")
    a = p.parse_args(argv)
    a.argv = argv
    a.runs = a.runs or (1 if a.quick else 3)
    a.steps = a.steps or (5 if a.quick else 12)
    a.warmup = a.warmup if a.warmup is not None else (1 if a.quick else 2)
    if a.steps <= a.warmup:
        p.error("--steps must exceed --warmup")
    a.models = (a.models.split(",") if a.models else
                (["cpu-speed-29m"] if a.quick else list(CONFIGS)))
    for m in a.models:
        if m not in CONFIGS:
            p.error(f"--models: unknown model {m!r}; choose from {', '.join(CONFIGS)}")
    if a.peers_venv and not os.access(os.path.join(a.peers_venv, "bin", "python"), os.X_OK):
        p.error(f"--peers-venv {a.peers_venv}: no bin/python there; make it with "
                "bench/peers/install.sh")
    if not os.access(os.path.join(REPO, a.zero_train) if not os.path.isabs(a.zero_train)
                     else a.zero_train, os.X_OK):
        p.error(f"--zero-train {a.zero_train}: not an executable; build first (scripts/build.sh)")
    a.zero_train = os.path.join(REPO, a.zero_train) if not os.path.isabs(a.zero_train) else a.zero_train
    a.cores = os.cpu_count() or 1
    a.bf16_products, a.dtype_why = bf16_products()
    if a.dtype == "auto":
        a.dtype = "bf16" if a.bf16_products else "fp32"
        a.dtype_why = "--dtype auto: " + a.dtype_why
    else:
        a.dtype_why = f"--dtype {a.dtype} given ({a.dtype_why})"
    return a


def main(argv):
    if argv[:1] == ["--rank-wrapper"]:
        return rank_wrapper(argv[1:])
    a = parse_args(argv)
    out_dir = a.out_dir or tempfile.mkdtemp(prefix="cpu_speed.")
    os.makedirs(out_dir, exist_ok=True)
    log(f"cpu_speed: working in {out_dir}")

    cases, shards = [], {}
    for model in a.models:
        _, c = tokens_per_step(model)
        vocab, T = shape_of(c)[3], shape_of(c)[4]
        shards[model] = os.path.join(out_dir, f"language-v{vocab}.bin")
        if not os.path.exists(shards[model]):
            # Enough windows that no sequence repeats in a run.
            n = (a.steps * c["train_batch_size"] + 64) * T + 1
            write_language_shard(shards[model], max(n, 1 << 20), vocab, seed=21)
        cases += zero_cases(model, a.quick, a.dtype)
        if a.peers_venv:
            cases += peer_cases(model, a.quick, a.dtype)

    # The GEMM rate is sampled right before every zero-train run; build_document sets every
    # case's MFU against the median of all samples (its comment says why).
    note = None
    for run in range(a.runs):
        for i, case in enumerate(cases):
            cfg = case_config(CONFIGS[case.model], case, out_dir, a.dtype)
            run_dir = os.path.join(out_dir, f"{case.model}-{i:02d}-run{run}")
            os.makedirs(run_dir, exist_ok=True)
            g = None
            if case.system == "zero-train":
                g, note = gemm_rate(a)
            t0 = time.monotonic()
            fn = run_zero if case.system == "zero-train" else run_peer
            r = fn(a, case, cfg, shards[case.model], run_dir, a.steps)
            r["gemm"] = g
            case.runs.append(r)
            tokens, _ = tokens_per_step(case.model)
            tp = statistics.median([tokens / t for t in r["step_times"]]) if r["step_times"] else 0
            log(f"run {run + 1}/{a.runs} | {case.key}: {tp:8.1f} tokens/s | peak RSS "
                f"{max([v for v in r['rss'] if v] or [0]) / 2**20:7.0f} MiB | "
                f"{time.monotonic() - t0:5.1f} s"
                f"{f' | GEMM ref {g[0] / 1e9:.0f} GFLOP/s' if g else ''}"
                f"{' | ERROR ' + r['error'] if r['error'] else ''}")

    if any(r.get("gemm") for c in cases for r in c.runs):
        note = None
    doc = build_document(a, cases, note)
    print_losses(cases, a.models)
    text = json.dumps(doc, indent=2)
    print(text, flush=True)
    if a.json_out:
        with open(a.json_out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
