#!/usr/bin/env bash
# The GPU checks, prepared for whenever a GPU machine is at hand: one command, at most ~8 minutes, one JSON.
#
#   bash benchmarks/gpu_check.sh OUT_DIR            # on the GPU machine, from the repository root
#   DEVICE=cpu QWM_ENVS=4 WARP_WORLDS= BATCHES=32 bash benchmarks/gpu_check.sh OUT_DIR   # its CPU path (tests)
#
# Steps (each under its own time limit; a step that fails or lacks a module is recorded as such and the others
# still run), all with device=$DEVICE:
#   smoke            scripts/train_qwm.py budget=smoke: a whole run (demos, offline, online, evaluation) and its video
#   qwm_search       benchmarks/qwm_search.py at each of $QWM_ENVS envs (16: with the per-node loop; more: without)
#   warp             benchmarks/env_throughput.py --backend warp at each of $WARP_WORLDS worlds
#   offline_updates  benchmarks/offline_updates.py at each batch of $BATCHES
# OUT_DIR/gpu_check.json holds every step's exit status, seconds and headline numbers, beside each step's own
# JSON and log. Targets (issue 46): search <= 10 ms per decision at 1024 envs, Warp >= 100k world steps/s.
#
# Packages: it runs with $PY (default python3, which holds torch on the lent GPU machines) and this checkout on
# PYTHONPATH. What that python lacks is installed first from the wheels in $WHEELS (default .whl/, carried with
# the run), e.g. fetched here for the GPU machine's Python 3.12:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl \
#     hydra-core==1.3.8 omegaconf==2.3.0 antlr4-python3-runtime==4.9.3 mujoco==3.8.0 mujoco-warp==3.8.0.3
# Not every step fits one carry: robosuite 1.4.0's wheel is 193 MB and warp-lang 1.12.1's 136 MB against the
# device tool's 64 MiB per call, so without them `smoke` and `warp` are recorded as missing their modules.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/gpu_check}
DEVICE=${DEVICE:-cuda}
PY=${PY:-python3}
WHEELS=${WHEELS:-.whl}
QWM_ENVS=${QWM_ENVS-16 1024}
WARP_WORLDS=${WARP_WORLDS-4096 16384}
BATCHES=${BATCHES-256 1024}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 WANDB_MODE=disabled MUJOCO_GL=${MUJOCO_GL:-egl}

if compgen -G "$WHEELS/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpu_check_site "$WHEELS"/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/gpu_check_site"
fi

STEPS="$OUT/steps.jsonl"
: >"$STEPS"
# step NAME SECONDS COMMAND...: run it with a time limit, log to OUT/NAME.log, append {name, status, seconds}
step() {
  local name=$1 limit=$2 start=$SECONDS status
  shift 2
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  status=$?
  echo "{\"name\": \"$name\", \"status\": $status, \"seconds\": $((SECONDS - start))}" >>"$STEPS"
  echo "[gpu_check] $name: exit $status after $((SECONDS - start)) s"
}

step smoke 240 $PY scripts/train_qwm.py budget=smoke device="$DEVICE" logger.mode=disabled \
  hydra.run.dir="$OUT/smoke" demo_cache="$OUT/demos"
for envs in $QWM_ENVS; do
  loop=$([ "$envs" -le 16 ] || echo --no-loop)
  step "qwm_search_$envs" 120 $PY benchmarks/qwm_search.py --device "$DEVICE" --envs "$envs" --rounds 3 $loop \
    --json "$OUT/qwm_search_$envs.json"
done
if [ -n "$WARP_WORLDS" ]; then
  # shellcheck disable=SC2086  # the worlds are separate arguments
  step warp 240 $PY benchmarks/env_throughput.py --backend warp --device "$DEVICE" --num-envs $WARP_WORLDS \
    --subprocess-envs "$(nproc)" --steps 200 --max-seconds 20 --json "$OUT/warp.json"
fi
for batch in $BATCHES; do
  step "offline_updates_$batch" 120 $PY benchmarks/offline_updates.py --device "$DEVICE" --batch "$batch" \
    --rounds 3 --steps 5 --json "$OUT/offline_updates_$batch.json"
done

$PY - "$OUT" <<'EOF'
"""Every step's status and headline numbers into OUT/gpu_check.json."""
import json
import re
import sys
from pathlib import Path

out = Path(sys.argv[1])
report = {"steps": {}}


def read(name):
    path = out / name
    return json.loads(path.read_text()) if path.exists() else None


for line in (out / "steps.jsonl").read_text().splitlines():
    s = json.loads(line)
    log = (out / f"{s['name']}.log").read_text(errors="replace")
    missing = re.findall(r"No module named '([\w.]+)'", log)
    s["missing_module"] = missing[-1] if missing else None
    s["log_tail"] = log.strip().splitlines()[-1][-300:] if log.strip() else ""
    report["steps"][s.pop("name")] = s
smoke = read("smoke/eval.json")
if smoke:
    report["smoke"] = {"success_rate": smoke["success_rate"], "threads": smoke.get("threads"),
                       "videos": sorted(str(p.relative_to(out)) for p in (out / "smoke").rglob("*.mp4"))}
searches = {p.stem.rsplit("_", 1)[1]: read(p.name) for p in out.glob("qwm_search_*.json")}
report["qwm_search_ms"] = {envs: r["search_ms"] for envs, r in searches.items()}
report["qwm_speedup_vs_loop"] = {envs: r["speedup_vs_loop"] for envs, r in searches.items() if "speedup_vs_loop" in r}
warp = read("warp.json")
if warp:
    report["warp_world_steps_per_s"] = warp["warp_world_steps_per_s"]
report["offline_updates_per_s"] = {p.stem.rsplit("_", 1)[1]: read(p.name)["updates_per_s"]
                                   for p in out.glob("offline_updates_*.json")}
(out / "gpu_check.json").write_text(json.dumps(report, indent=2))
print(json.dumps({k: v for k, v in report.items() if k != "steps"}, indent=2))
EOF
