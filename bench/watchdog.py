#!/usr/bin/env python3
"""watchdog: how fast a job notices a rank or host that stopped answering, and what the
watchdog costs a normal step (issue 16). Prints ONE JSON document (docs/benchmarks.md) on
stdout; progress on stderr. Python 3 standard library; run from the repository root after the
README's build, as root (SIGSTOP of a rank, network namespaces for the lost host):

  python3 bench/watchdog.py [--quick] [--timeout S]

Results:
  * detection time, from the fault to the first watchdog report on the job's output, for a
    rank stopped with SIGSTOP and for a host whose link goes down (two hosts made of network
    namespaces, tests/cli/netns_hosts.sh), on 2 and 4 ranks. Reference: the configured timeout,
    the earliest a heartbeat watchdog may declare a peer lost; ratio = timeout / detection.
    Also kept: the time until the whole job has ended (mpirun's own teardown included).
  * overhead: the median step time of the same training with the watchdog off and on
    (default settings), interleaved; ratio = off / on (goal: within noise).
"""
import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZT = os.path.join(ROOT, "build", "zero-train")
CFG = os.path.join(ROOT, "tests", "data", "configs", "watchdog_train.json")
NETNS = os.path.join(ROOT, "tests", "cli", "netns_hosts.sh")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def mpirun_base():
    cmd = ["mpirun", "--oversubscribe", "-x", "OPENBLAS_NUM_THREADS=1"]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    return cmd


def wait_training(proc, ckdir, logpath, limit=180):
    """Until the job saved a checkpoint and trained 20 steps past it."""
    t_end = time.time() + limit
    metrics = os.path.join(ckdir, "metrics.jsonl")
    while time.time() < t_end:
        if proc.poll() is not None:
            raise RuntimeError("the job ended before the fault:\n" + open(logpath).read()[-3000:])
        if os.path.exists(os.path.join(ckdir, "latest")) and os.path.exists(metrics):
            with open(metrics) as f:
                if sum('"loss"' in line for line in f) >= 40:
                    return
        time.sleep(0.05)
    raise RuntimeError("no checkpoint within %d s" % limit)


def wait_report(proc, logpath, t0, limit):
    """Seconds from t0 to the first watchdog report in the log, and to the job's end."""
    seen = None
    t_end = t0 + limit
    while time.time() < t_end:
        if seen is None:
            with open(logpath, errors="replace") as f:
                if "watchdog: rank" in f.read():
                    seen = time.time() - t0
        if proc.poll() is not None:
            if seen is None:
                with open(logpath, errors="replace") as f:
                    seen = time.time() - t0 if "watchdog: rank" in f.read() else None
            return seen, time.time() - t0, proc.returncode
        time.sleep(0.02)
    proc.kill()
    return seen, None, None


def one_fault(mode, np_, timeout, work):
    ck = os.path.join(work, "ck")
    logpath = os.path.join(work, "run.log")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    args = [ZT, "--config", CFG, "--steps", "100000", "--watchdog-timeout", str(timeout),
            "--checkpoint-dir", ck, "--save-interval", "20"]
    prefix = None
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    if mode == "stopped":
        cmd = mpirun_base() + ["-np", str(np_)] + args
    else:
        prefix = "zb%d" % os.getpid()
        env["ZERO_NETNS_PREFIX"] = prefix
        subprocess.run(["bash", NETNS, "up", prefix], check=True)
        per = np_ // 2
        cmd = ["ip", "netns", "exec", prefix + "-head"] + mpirun_base() + [
            "--host", "h1:%d,h2:%d" % (per, per), "-np", str(np_),
            "--mca", "plm_rsh_agent", NETNS + " rsh", "--mca", "plm_rsh_no_tree_spawn", "1",
            "--mca", "btl", "self,vader,tcp", "--mca", "btl_tcp_if_include", "10.231.0.0/24",
            "--mca", "oob_tcp_if_include", "10.231.0.0/24", "-x", "ZERO_NETNS_PREFIX"] + args
    try:
        with open(logpath, "w") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=work, env=env)
        wait_training(proc, ck, logpath)
        if mode == "stopped":
            ranks = subprocess.run(["pgrep", "-P", str(proc.pid), "-f", "zero-train"],
                                   capture_output=True, text=True).stdout.split()
            victim = max(int(p) for p in ranks)
            t0 = time.time()
            os.kill(victim, signal.SIGSTOP)
        else:
            t0 = time.time()
            subprocess.run(["bash", NETNS, "cut", prefix, "h2"], check=True)
        seen, ended, rc = wait_report(proc, logpath, t0, timeout + 120)
        if mode == "stopped":
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return seen, ended, rc
    finally:
        if prefix:
            subprocess.run(["bash", NETNS, "down", prefix])


def step_times(timeout, steps, work):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    m = os.path.join(work, "m.jsonl")
    cmd = mpirun_base() + ["-np", "2", ZT, "--config", CFG, "--steps", str(steps),
                           "--watchdog-timeout", str(timeout), "--metrics", m]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=work)
    with open(m) as f:
        rows = [json.loads(line) for line in f if '"step_time_s"' in line]
    return statistics.median(r["step_time_s"] for r in rows[5:])  # past the warm-up


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 fault of each kind, 5 + 5 overhead runs")
    ap.add_argument("--timeout", type=float, default=6, help="watchdog timeout for the faults (s)")
    a = ap.parse_args()
    if not os.path.exists(ZT):
        sys.exit("build/zero-train is missing: run scripts/build.sh first")
    reps = 1 if a.quick else 3
    results = []
    netns_ok = subprocess.run(["bash", NETNS, "check"], capture_output=True).returncode == 0
    with tempfile.TemporaryDirectory(prefix="zero-watchdog-") as tmp:
        for mode in ("stopped", "lost-host"):
            if mode == "lost-host" and not netns_ok:
                log("skipping the lost host: network namespaces are not available here")
                continue
            for np_ in (2, 4):
                seen_all, ended_all = [], []
                for r in range(reps):
                    log("%s, %d ranks, run %d" % (mode, np_, r + 1))
                    seen, ended, rc = one_fault(mode, np_, a.timeout, os.path.join(tmp, "f"))
                    if seen is None or rc != 3:
                        raise SystemExit("%s on %d ranks: no report / exit %s" % (mode, np_, rc))
                    seen_all.append(seen)
                    ended_all.append(ended)
                med = statistics.median(seen_all)
                results.append({
                    "name": "detection, %s, %d ranks, timeout %g s" % (
                        "rank stopped (SIGSTOP)" if mode == "stopped" else "host link down", np_, a.timeout),
                    "params": {"fault": mode, "ranks": np_, "timeout_s": a.timeout, "runs": reps},
                    "metric": "time", "unit": "s",
                    "median": med, "min": min(seen_all), "max": max(seen_all),
                    "job_ended_s": {"median": statistics.median(ended_all), "max": max(ended_all)},
                    "reference": {"name": "the configured timeout",
                                  "median": a.timeout},
                    "ratio": a.timeout / med,
                    "goal": {"ratio_at_least": 0.75},
                    "meets_goal": a.timeout / med >= 0.75,
                })
        runs = 5
        steps = 150 if a.quick else 400
        off, on = [], []
        for r in range(runs):
            log("overhead run %d/%d" % (r + 1, runs))
            off.append(step_times(0, steps, os.path.join(tmp, "o")))
            on.append(step_times(20, steps, os.path.join(tmp, "o")))
        ratio = statistics.median(off) / statistics.median(on)
        results.append({
            "name": "step time with the watchdog on (timeout 20 s) vs off, 2 ranks",
            "params": {"ranks": 2, "steps": steps, "runs": runs, "config": os.path.relpath(CFG, ROOT)},
            "metric": "time", "unit": "s",
            "median": statistics.median(on), "min": min(on), "max": max(on),
            "reference": {"name": "the same run with --watchdog-timeout 0", "median": statistics.median(off),
                          "min": min(off), "max": max(off)},
            "ratio": ratio,
            "goal": {"ratio_at_least": 0.97},
            "meets_goal": ratio >= 0.97,
        })
    git = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    doc = {
        "benchmark": "watchdog", "version": 1,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git": git,
        "command": "python3 bench/watchdog.py" + (" --quick" if a.quick else ""),
        "machine": {"cpu": cpu, "cores": os.cpu_count(), "gpu": None, "ranks": "2 and 4", "threads": 1},
        "quick": a.quick,
        "results": results,
    }
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
