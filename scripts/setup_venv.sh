#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install the project into it.
#
#   CPU-only machine : torch's CPU build (TORCH_CPU_VERSION, default 2.13.0) and triton, so that no
#                      multi-GB CUDA wheels are downloaded; Triton kernels then run under TRITON_INTERPRET=1.
#   CUDA machine     : if the system python already has a CUDA torch (e.g. a lent GPU machine with no
#                      package registry), the venv sees it (--system-site-packages) and nothing is
#                      downloaded; otherwise pip installs the normal CUDA build of torch.
set -euo pipefail
VENV=${1:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_CPU_VERSION=${TORCH_CPU_VERSION:-2.13.0}
TRITON_VERSION=${TRITON_VERSION:-3.6.0}

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }
system_cuda_torch() { "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; }

if [ ! -x "$VENV/bin/python" ]; then
  if has_gpu && system_cuda_torch; then
    echo "setup: CUDA torch found in $PYTHON; creating $VENV on top of the system site-packages"
    "$PYTHON" -m venv --system-site-packages "$VENV"
  else
    "$PYTHON" -m venv "$VENV"
  fi
fi
# --no-cache-dir: a fresh clone keeps no second copy of each wheel (CI's disk is shared and has run
# out mid-install). A failed install is tried twice more after a pause, for the same reason: pip
# reinstalls what a broken attempt left half-written.
pip_install() {
  local attempt
  for attempt in 1 2 3; do
    "$VENV/bin/python" -m pip install --disable-pip-version-check --no-cache-dir "$@" && return 0
    [ "$attempt" -lt 3 ] && { echo "setup: pip install failed (attempt $attempt of 3); retrying in 30 s" >&2; sleep 30; }
  done
  return 1
}
PIP=(pip_install)

if "$VENV/bin/python" -c 'import torch' >/dev/null 2>&1; then
  echo "setup: torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)') already present"
elif has_gpu; then
  "${PIP[@]}" torch "triton==${TRITON_VERSION}"
else
  echo "setup: CPU-only machine: installing torch==${TORCH_CPU_VERSION} (CPU build) and triton==${TRITON_VERSION}"
  "${PIP[@]}" "torch==${TORCH_CPU_VERSION}" "triton==${TRITON_VERSION}"
fi

# Our own two packages first, without touching torch. Where the venv already has a recent
# setuptools (a venv over a system python), build without isolation: nothing is downloaded, which is
# what a machine with no package registry needs.
if "$VENV/bin/python" -c 'import setuptools, sys; sys.exit(int(setuptools.__version__.split(".")[0]) < 68)' 2>/dev/null; then
  "${PIP[@]}" --no-deps --no-build-isolation -e .
else
  "${PIP[@]}" --no-deps -e .
fi

# Then whatever runtime dependency or test tool is still missing (on a lent GPU machine: none).
missing=$("$VENV/bin/python" - <<'PY'
import importlib.util
wanted = {"einops": "einops", "numpy": "numpy", "pandas": "pandas", "matplotlib": "matplotlib",
          "tqdm": "tqdm", "tabulate": "tabulate", "tensorboard": "tensorboard", "pytest": "pytest",
          "pytest_timeout": "pytest-timeout",
          "xdist": "pytest-xdist"}
print(" ".join(pkg for mod, pkg in wanted.items() if importlib.util.find_spec(mod) is None))
PY
)
if [ -n "$missing" ]; then
  echo "setup: installing the project's dependencies (missing: $missing)"
  "${PIP[@]}" -e ".[dev]"
elif [ ! -x "$VENV/bin/ruff" ] && ! "$VENV/bin/python" -c 'import ruff' 2>/dev/null; then
  "$VENV/bin/python" -m pip install --disable-pip-version-check --no-cache-dir --retries 0 --timeout 10 ruff || echo "setup: ruff not installed (no registry?); only 'make lint' needs it"
fi
