#!/usr/bin/env bash
# Installs robo_rl and its simulator stack into $VENV (default .venv). Idempotent: `make` only
# calls this when pyproject.toml, constraints.txt, this script or robo_rl/envs/setup_sim.py changed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

# 1. Headless rendering: EGL (Mesa works without a GPU), OSMesa as the fallback.
if ! ldconfig -p | grep -q 'libEGL.so.1' || ! ldconfig -p | grep -q 'libOSMesa.so'; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "[setup] installing Debian packages for headless rendering (EGL, OSMesa)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      libegl1 libgl1 libgles2 libosmesa6 >/dev/null
  else
    echo "[setup] WARNING: libEGL/libOSMesa missing and cannot apt-get install; rendering may fail" >&2
  fi
fi

# 2. Virtual environment and torch first (a newer torch would pull a multi-GB CUDA build).
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check -q"
$PIP install --upgrade pip >/dev/null
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  $VENV/bin/python -c "import torch" 2>/dev/null || $PIP install torch
else
  $PIP install "torch==2.13.0"
fi
TORCH=$($VENV/bin/python -c "import torch; print(torch.__version__.split('+')[0])")
{ cat constraints.txt; echo "torch==$TORCH"; } > "$VENV/constraints.txt"

# 3. robo_rl and everything else, with torch pinned to what is installed.
$PIP install -c "$VENV/constraints.txt" -e ".[dev,language,ray]"

# 4. Simulator housekeeping: LIBERO config (its first import would prompt) and a .pth file that points
#    every Python of the venv at it, scene assets link,
#    robosuite's private macro file (silences its start-up warnings).
$VENV/bin/python -m robo_rl.envs.setup_sim
echo "[setup] done: $($VENV/bin/python -c 'import torch, mujoco, robosuite; print("torch", torch.__version__, "| mujoco", mujoco.__version__, "| robosuite", robosuite.__version__)')"
