#!/usr/bin/env python3
"""PyTorch FSDP2 peer for GPU issue 9: our GPT trained with `fully_shard` + `CPUOffloadPolicy`.

The model is the same GPT as models/gpt.hpp (GPT-2 layout, Hugging Face GPT-2 parameter names
and shapes, tied LM head), the optimizer the same AdamW with clipping, and the batch and
precision are set by flags, so that a run of this script and a run of our runtime in the same
session can be compared as ratios (ours over theirs). This script reports only its own
measurements: one JSON document on stdout in the schema of docs/benchmarks.md, progress on
stderr.

It needs nothing but torch (no `transformers`): on the GPU machine it runs on that machine's own
PyTorch. Single process with world size 1 by default; the process group is initialised here
with env defaults, so a `torchrun --nproc-per-node N` launch also works (rank 0 reports).

Exit status: 0 on success, 3 on out-of-memory (a JSON document with "error" is still printed,
so that a sweep can find the largest model that fits), 2 on bad flags, 1 on any other failure.
"""

import argparse
import datetime
import json
import math
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

try:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
except ImportError:  # PyTorch before 2.6 exposes FSDP2 only here
    from torch.distributed._composable.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from torch.distributed.device_mesh import init_device_mesh

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_OOM = 0, 1, 2, 3

# The presets of models/gpt_shape.hpp: (n_layer, n_embd, n_head, vocab_size, seq_len).
PRESETS = {
    "tiny": (2, 128, 4, 64, 64),
    "gpt2-124m": (12, 768, 12, 50257, 1024),
    "gpt2-350m": (24, 1024, 16, 50257, 1024),
    "gpt2-774m": (36, 1280, 20, 50257, 1024),
    "gpt2-1.5b": (48, 1600, 25, 50257, 1024),
    "zero-offload-10b": (50, 4096, 32, 50257, 1024),
}
GPT2_124M_PARAMETERS = 124_439_808


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---- the model ----------------------------------------------------------------------------------


class Conv1D(nn.Module):
    """GPT-2's Conv1D: a linear layer with the weight stored [in, out], y = x @ W + b."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.empty(n_out))

    def forward(self, x):
        shape = x.shape[:-1] + (self.weight.shape[1],)
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(shape)


class Attention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = Conv1D(n_embd, 3 * n_embd)
        self.c_proj = Conv1D(n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # [B, T, C] -> [B, heads, T, C / heads]
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = Conv1D(n_embd, 4 * n_embd)
        self.c_proj = Conv1D(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-norm transformer block. With `checkpointing`, the body runs under non-reentrant
    activation checkpointing; the FSDP hooks sit on this module, outside the checkpointed region
    (as with checkpoint_wrapper applied before fully_shard), so recomputation in backward reuses
    the parameters FSDP has already gathered for the block's backward."""

    def __init__(self, n_embd, n_head, checkpointing):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = Attention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = MLP(n_embd)
        self.checkpointing = checkpointing

    def body(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))

    def forward(self, x):
        if self.checkpointing and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(self.body, x, use_reentrant=False)
        return self.body(x)


class GPT(nn.Module):
    """Parameter names as Hugging Face GPT-2 (and models/gpt.hpp): wte, wpe, h.{l}.*, ln_f."""

    def __init__(self, n_layer, n_embd, n_head, vocab_size, seq_len, checkpointing=False):
        super().__init__()
        self.n_layer = n_layer
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(seq_len, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head, checkpointing) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, eps=1e-5)

    def forward(self, idx, targets):
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        # LM head tied to the token embedding: logits = x wte^T. The loss is taken in fp32 (the
        # usual FSDP2 recipe, e.g. torchtitan); with bf16 this makes an fp32 copy of the logits.
        logits = F.linear(x, self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))

    @torch.no_grad()
    def init_weights(self):
        """GPT-2 initialisation, as models/gpt.cpp: weights N(0, 0.02), the residual projections
        (c_proj) N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm weights 1. Works on the
        sharded DTensor parameters after fully_shard + to_empty."""
        proj_std = 0.02 / math.sqrt(2 * self.n_layer)
        for name, module in self.named_modules():
            if isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
            elif isinstance(module, Conv1D):
                nn.init.normal_(module.weight, std=proj_std if name.endswith("c_proj") else 0.02)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)


def count_parameters(shape):
    """Parameters of a shape, counted on a meta-device model (no memory): 12 C^2 + 13 C per block,
    V C + T C + 2 C else (the embedding counted once, the head being tied to it)."""
    with torch.device("meta"):
        model = GPT(*shape)
    return sum(p.numel() for p in model.parameters())


def flops_per_token(shape):
    """Training FLOPs per token, the same as models::gpt_flops_per_token (models/gpt.cpp), so that
    TFLOPS compare one to one with our runtime's:
        6 * M + 12 * n_layer * C * T,   M = 12 * n_layer * C^2 + V * C
    M is the matmul parameters (the blocks' four matrices and the tied head): 2 FLOPs per
    parameter forward, 4 backward. 12 L C T: attention scores q k^T and probs @ v, 2 T C each
    per layer forward, over the full T x T (as is customary), times 3 for forward + backward.
    Activation-checkpointing recomputation is not counted. M leaves out the position embedding,
    the LayerNorms and the biases (0.7% of N for gpt2-124m), which do no matmul FLOPs."""
    L, C, _, V, T = shape
    return 6.0 * (12.0 * L * C * C + V * C) + 12.0 * L * C * T


# ---- the run ------------------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="PyTorch FSDP2 (fully_shard + CPUOffloadPolicy) peer for GPU issue 9: trains "
        "our GPT and prints one JSON document on stdout.")
    p.add_argument("--model", choices=sorted(PRESETS), default=None,
                   help="model preset (default gpt2-124m; tiny with --quick)")
    p.add_argument("--n-layer", type=int, help="override the preset's number of blocks")
    p.add_argument("--n-embd", type=int, help="override the preset's hidden size C")
    p.add_argument("--n-head", type=int, help="override the preset's attention heads")
    p.add_argument("--vocab", type=int, help="override the preset's vocabulary size V")
    p.add_argument("--seq-len", type=int, help="override the preset's sequence length T")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None,
                   help="default cuda when available, else cpu")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16",
                   help="bf16: MixedPrecisionPolicy(param bf16, reduce fp32) over fp32 sharded "
                   "parameters; fp32: no mixed precision")
    p.add_argument("--offload", action=argparse.BooleanOptionalAction, default=True,
                   help="CPUOffloadPolicy: parameters, gradients and the AdamW step on the CPU")
    p.add_argument("--activation-checkpointing", action="store_true",
                   help="checkpoint each block (torch.utils.checkpoint, use_reentrant=False)")
    p.add_argument("--adamw-impl", choices=["default", "foreach", "fused"], default="default",
                   help="torch.optim.AdamW implementation: default (foreach/fused unset, torch "
                   "chooses), foreach=True or fused=True")
    p.add_argument("--micro-batch", type=int, default=8, help="sequences per micro-batch per rank")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 20; 5 with --quick)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed steps before them (default 3; 1 with --quick)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--quick", action="store_true",
                   help="few steps, and the tiny model unless --model is given")
    p.add_argument("--count-only", action="store_true",
                   help="print the parameter count on stdout and exit (no process group, no memory)")
    p.add_argument("--json-out", metavar="FILE", help="also write the JSON document to FILE")
    a = p.parse_args(argv)

    if a.model is None:
        a.model = "tiny" if a.quick else "gpt2-124m"
    if a.steps is None:
        a.steps = 5 if a.quick else 20
    if a.warmup is None:
        a.warmup = 1 if a.quick else 3
    if a.device is None:
        a.device = "cuda" if torch.cuda.is_available() else "cpu"

    preset = PRESETS[a.model]
    overrides = (a.n_layer, a.n_embd, a.n_head, a.vocab, a.seq_len)
    a.shape = tuple(o if o is not None else v for o, v in zip(overrides, preset))
    # The preset's name only when the shape is exactly the preset's.
    a.preset = a.model if a.shape == preset else None

    L, C, H, V, T = a.shape
    if min(a.shape) < 1 or C % H:
        p.error(f"bad shape n_layer={L} n_embd={C} n_head={H} vocab={V} seq_len={T}: sizes must be "
                "positive and n_head must divide n_embd")
    if a.micro_batch < 1 or a.grad_accum < 1 or a.steps < 1 or a.warmup < 0:
        p.error("--micro-batch, --grad-accum and --steps must be >= 1, --warmup >= 0")
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but torch.cuda.is_available() is false")
    return a


def init_process_group(device):
    """World size 1 unless a launcher (torchrun) set the usual variables."""
    for k, v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29533"), ("RANK", "0"),
                 ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(k, v)
    if device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend="cpu:gloo,cuda:nccl" if device == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size()


def build(a, world):
    """The model built on the meta device (no memory for the unsharded model, which matters for
    10B), sharded block by block and then at the root, then materialised: on the CPU with offload
    (FSDP2 requires the sharded parameters there), on the device without; then initialised."""
    with torch.device("meta"):
        model = GPT(*a.shape, checkpointing=a.activation_checkpointing)
    mesh = init_device_mesh(a.device, (world,))
    kwargs = {"mesh": mesh}
    if a.dtype == "bf16":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if a.offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=a.device == "cuda")
    for block in model.h:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    model.to_empty(device="cpu" if a.offload else a.device)
    model.init_weights()

    # Weight decay as our runtime (models/gpt.hpp): on the matrices, embeddings included, not on
    # biases and LayerNorm parameters. The implementation is torch's default unless asked: with
    # offload the parameters are CPU tensors, for which torch picks the per-tensor loop.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    impl = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}[a.adamw_impl]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=6e-4, betas=(0.9, 0.95), eps=1e-8, **impl)
    return model, optimizer


def make_batches(a, rank):
    """GA micro-batches of random token ids, the same every step: inputs and next-token targets."""
    _, _, _, V, T = a.shape
    gen = torch.Generator(device=a.device)
    gen.manual_seed(a.seed * 1000 + 1 + rank)
    batches = []
    for _ in range(a.grad_accum):
        tokens = torch.randint(0, V, (a.micro_batch, T + 1), generator=gen, device=a.device)
        batches.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    return batches


def sync(a):
    if a.device == "cuda":
        torch.cuda.synchronize()


def train_step(a, model, optimizer, batches, world):
    """One optimizer step: GA forward/backward passes (FSDP2 reduce-scatters, and with offload
    copies the gradients to the CPU, after each), clipping, AdamW. Returns the mean loss."""
    optimizer.zero_grad(set_to_none=True)
    total = None
    for inputs, targets in batches:
        loss = model(inputs, targets)
        (loss / a.grad_accum).backward()
        total = loss.detach() if total is None else total + loss.detach()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    optimizer.step()
    total = total / a.grad_accum
    if world > 1:  # the mean over ranks (SUM: gloo has no AVG)
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        total = total / world
    return total.item()  # also waits for the step's work on the device


def stats(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "reps": len(values)}


def finite_or_none(x):
    return x if math.isfinite(x) else None


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
        if out.returncode != 0:
            return None
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def document(a, world, parameters, results, losses):
    """The benchmark document of docs/benchmarks.md, without ratios (a peer measures only itself)."""
    L, C, H, V, T = a.shape
    command = shlex.join([os.path.basename(sys.executable)] + sys.argv)
    if world > 1:
        command = f"torchrun --nproc-per-node {world} " + shlex.join(sys.argv)
    return {
        "benchmark": "peer_fsdp2_offload",
        "version": 1,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git": git_revision(),
        "command": command,
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(),
                    "gpu": torch.cuda.get_device_name() if a.device == "cuda" else None,
                    "ranks": world, "threads": torch.get_num_threads()},
        "quick": a.quick,
        "peer": {"name": "PyTorch FSDP2 fully_shard + CPUOffloadPolicy", "torch": torch.__version__,
                 "cuda": torch.version.cuda},
        "model": {"preset": a.preset, "n_layer": L, "n_embd": C, "n_head": H, "vocab_size": V,
                  "seq_len": T, "parameters": parameters,
                  "flops_per_token": flops_per_token(a.shape)},
        "settings": {"device": a.device, "dtype": a.dtype, "offload": a.offload,
                     "micro_batch": a.micro_batch, "grad_accum": a.grad_accum,
                     "activation_checkpointing": a.activation_checkpointing,
                     "adamw_impl": a.adamw_impl,
                     "steps": a.steps, "warmup": a.warmup, "seed": a.seed},
        "results": results,
        # Every step's mean loss, the warm-up steps first.
        "losses": [finite_or_none(x) for x in losses],
    }


def emit(a, doc):
    text = json.dumps(doc, indent=2, allow_nan=False)
    print(text, flush=True)
    if a.json_out:
        with open(a.json_out, "w") as f:
            f.write(text + "\n")


def is_out_of_memory(e):
    oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                                  getattr(torch.cuda, "OutOfMemoryError", None)) if t is not None)
    # A failed pinned host allocation surfaces as a RuntimeError naming CUDA's out-of-memory
    # error, a failed pageable one as "DefaultCPUAllocator: can't allocate memory" (or "not
    # enough memory"). The kernel's OOM killer, when host memory is overcommitted, ends the
    # process with nothing to catch.
    text = str(e).lower()
    phrases = ("out of memory", "not enough memory", "can't allocate memory", "cannot allocate memory")
    return isinstance(e, oom_types) or (isinstance(e, RuntimeError) and any(p in text for p in phrases))


def run(a):
    parameters = count_parameters(a.shape)
    if a.count_only:
        log(f"parameters: {parameters:,}")
        if a.shape == PRESETS["gpt2-124m"]:
            assert parameters == GPT2_124M_PARAMETERS, parameters
        print(parameters, flush=True)
        return EXIT_OK

    rank, world = init_process_group(a.device)
    losses = []
    try:
        L, C, H, V, T = a.shape
        if rank == 0:
            log(f"fsdp2 peer: torch {torch.__version__}, device {a.device}, world {world}, shape "
                f"L={L} C={C} H={H} V={V} T={T}, parameters {parameters:,}, {a.dtype}, offload "
                f"{a.offload}, B={a.micro_batch} GA={a.grad_accum}, checkpointing "
                f"{a.activation_checkpointing}")
        if a.shape == PRESETS["gpt2-124m"]:
            assert parameters == GPT2_124M_PARAMETERS, parameters

        torch.manual_seed(a.seed)
        model, optimizer = build(a, world)
        batches = make_batches(a, rank)
        if a.device == "cuda":
            torch.cuda.reset_peak_memory_stats()

        times = []
        for step in range(a.warmup + a.steps):
            sync(a)
            t0 = time.perf_counter()
            loss = train_step(a, model, optimizer, batches, world)
            sync(a)
            dt = time.perf_counter() - t0
            losses.append(loss)
            timed = step >= a.warmup
            if timed:
                times.append(dt)
            if rank == 0:
                log(f"step {step + 1}/{a.warmup + a.steps}{'' if timed else ' (warm-up)'} | loss "
                    f"{loss:.4f} | {dt:.3f} s")
    except Exception as e:
        if not is_out_of_memory(e):
            raise
        if rank == 0:
            first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
            log(f"fsdp2 peer: out of memory: {first_line}")
            doc = document(a, world, parameters, [], losses)
            doc["error"] = f"out of memory: {first_line}"
            emit(a, doc)
        return EXIT_OOM

    # Tokens per step over all ranks; TFLOPS = flops_per_token * tokens / step time (see
    # flops_per_token: 6 M + 12 L C T per token, M the matmul parameters).
    tokens = a.micro_batch * a.grad_accum * T * world
    step_time = stats(times)

    def rate(scale):  # items per second from the step times: the slowest step gives the min
        return {"median": scale / step_time["median"], "min": scale / step_time["max"],
                "max": scale / step_time["min"], "reps": step_time["reps"]}

    def single(value):  # one measurement (a peak over the whole run)
        return {"median": value, "min": value, "max": value, "reps": 1}

    results = [
        {"name": "step time", "metric": "time", "unit": "s", **step_time},
        {"name": "throughput", "metric": "throughput", "unit": "tokens/s", **rate(tokens)},
        {"name": "model TFLOPS", "metric": "throughput", "unit": "TFLOPS",
         **rate(tokens * flops_per_token(a.shape) / 1e12)},
    ]
    # Peaks over the whole run, warm-up included (the first step allocates what later steps
    # reuse), of this rank.
    if a.device == "cuda":
        results.append({"name": "device peak allocated", "metric": "bytes", "unit": "B",
                        **single(torch.cuda.max_memory_allocated())})
        results.append({"name": "device peak reserved", "metric": "bytes", "unit": "B",
                        **single(torch.cuda.max_memory_reserved())})
    # ru_maxrss is in KiB on Linux.
    results.append({"name": "host peak RSS", "metric": "bytes", "unit": "B",
                    **single(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)})

    if rank == 0:
        emit(a, document(a, world, parameters, results, losses))
    dist.destroy_process_group()
    return EXIT_OK


def main(argv):
    a = parse_args(argv)
    try:
        code = run(a)
    except Exception:
        traceback.print_exc()
        log("fsdp2 peer: failed")
        code = EXIT_FAILURE
    sys.stdout.flush()
    sys.stderr.flush()
    if code != EXIT_OK:
        # After an error (a CUDA OOM in particular) tearing down NCCL and the offload threads can
        # hang; nothing is left to write, so leave at once.
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
