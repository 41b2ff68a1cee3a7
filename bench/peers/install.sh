#!/usr/bin/env bash
# Installs the CPU peers (PyTorch and DeepSpeed) into a virtualenv OUTSIDE the repository, so that
# bench/cpu_speed.py can run them next to zero-train (issue 21). Nothing in the build or the test
# suite needs these packages.
#
# Usage: bench/peers/install.sh [VENV]
#   VENV defaults to $ZERO_PEERS_VENV, else $HOME/.cache/zero-peers-venv.
# Packages come by name from pip's configured default index. torch from the default index is the
# CUDA build (a few GB of wheels); it runs on CPU all the same.
# deepspeed's setup imports torch, so it is installed second, without build isolation, with its
# C++/CUDA ops left to be built just in time (DS_BUILD_OPS=0, the default): the CPU accelerator
# builds its CPU Adam op on first use, which needs a C++ compiler and Python headers.
set -euo pipefail

venv="${1:-${ZERO_PEERS_VENV:-$HOME/.cache/zero-peers-venv}}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
case "$(cd "$(dirname "$venv")" 2>/dev/null && pwd)/$(basename "$venv")/" in
    "$repo"/*)
        echo "install.sh: $venv is inside the repository ($repo); give a path outside it" >&2
        exit 2 ;;
esac

python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
    echo "install.sh: creating virtualenv $venv with $($python --version 2>&1)" >&2
    "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip)
"${pip[@]}" install --upgrade pip wheel setuptools >&2
echo "install.sh: installing torch" >&2
"${pip[@]}" install torch numpy >&2
echo "install.sh: installing deepspeed" >&2
DS_BUILD_OPS=0 "${pip[@]}" install --no-build-isolation deepspeed py-cpuinfo psutil >&2

# DeepSpeed compiles its CPU ops (cpu_adam; the shared-memory collectives) just in time, into
# torch's extension cache ($TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions), which takes
# minutes on 2 cores: build them once here so that no benchmark run waits for a compiler.
# The shared-memory collectives op is built by every engine's start otherwise: the first
# DeepSpeed case of a benchmark took 190 s instead of 66 (2026-11-29).
echo "install.sh: building DeepSpeed's CPU Adam and shared-memory collectives ops" >&2
DS_ACCELERATOR=cpu "$venv/bin/python" - <<'PY'
import torch, deepspeed
from deepspeed.ops.op_builder import CPUAdamBuilder
from deepspeed.ops.op_builder.cpu.comm import ShareMemCommBuilder
CPUAdamBuilder().load()
ShareMemCommBuilder().load()
print(f"torch {torch.__version__}, deepspeed {deepspeed.__version__}, cpu_adam and shm_comm built")
PY
echo "install.sh: peers installed in $venv; pass --peers-venv $venv to bench/cpu_speed.py" >&2
