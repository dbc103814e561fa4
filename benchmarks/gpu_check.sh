#!/usr/bin/env bash
# Verify every CUDA path of crackseg and take the GPU figures in one sitting: under 9 minutes on one H100.
#
#   benchmarks/gpu_check.sh
#
# Without a CUDA device it prints one line on stderr and exits 2, before anything slow. Otherwise,
# each step limited by `timeout`, all within one budget of 8.5 minutes (a step left without time
# fails), and a failed step does not stop the next:
#   install     pip install -e '.[dev]' from the wheels in .whl/ (WHEELS=DIR), only when crackseg or one
#               of its requirements does not import; falls back to the carried wheels and crackseg without
#               dependencies when the dev extras' wheels are not all there (docs/benchmarks.md)
#   versions    GPU, driver, CUDA, cuDNN, NCCL, torch, segmentation-models-pytorch, crackseg, Python
#   data        synthetic only: 64 images of 256 px, and 72 of 600 px for the memory runs
#   then at once (each its own process): pytest -m cuda; a 2-epoch launch.sh training (UNet-ResNet18,
#               256 px) with each of --amp bf16, --amp fp16, --channels-last, --compile,
#               --activation-checkpointing, --grad-accum 2, --strategy dp, --cache; and a training step
#               of UNet-ResNet34 at 448 px, bf16, channels_last, batch 32, with and without
#               --activation-checkpointing, for its peak memory
#   then one at a time, alone on the GPU: bench.py train, predict and strategies at the GPU goals'
#               sizes (UNet-ResNet34, 448 px, bf16, channels_last)
# Writes gpu_check.md (a PASS/FAIL row per step, the figures against the targets, bench.py's tables,
# ready for docs/benchmarks.md), gpu_check.log (the end of every failed step's output) and bench.py's
# JSON files: into $OUT when it is set (a result folder named by the caller), else benchmarks/results/.
# Exit status: 0 when every step passed, 1 when one failed, 2 without a CUDA device.
# PYTHON selects the interpreter (default: .venv/bin/python of the repository, else python3).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-}
if [[ -z $python ]]; then
  if [[ -x $repo/.venv/bin/python ]]; then python=$repo/.venv/bin/python; else python=python3; fi
fi

# The CUDA check comes first and alone: a machine without a GPU is told so in seconds.
if ! gpu=$(timeout 120 "$python" - 2>/dev/null <<'PY'
import os
import sys

try:
    import torch
except Exception as error:
    sys.exit(print(f"torch does not import in {sys.executable} ({type(error).__name__}: {error})") or 1)
if not torch.cuda.is_available():
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
    sys.exit(print(f"torch {torch.__version__} in {sys.executable} sees no GPU (CUDA_VISIBLE_DEVICES={visible}); "
                   "run this on a machine with one") or 1)
print(torch.cuda.get_device_name(0))
PY
); then
  gpu=${gpu:-$python did not run or did not answer within 120 s}
  echo "gpu_check: no CUDA device: ${gpu//$'\n'/ }" >&2
  exit 2
fi

cd "$repo"
export PYTHON=$python PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 repo
out=${OUT:-$repo/benchmarks/results}
mkdir -p "$out"
report=$out/gpu_check.md
failures=$out/gpu_check.log
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
trap 'rm -rf "$work"' EXIT
: >"$failures"
deadline=510  # seconds since this script started (bash's SECONDS): 8.5 minutes in all
started_at=$(date -u +"%Y-%m-%d %H:%M UTC")
rows=() failed=0

record() { # record STEP RESULT SECONDS DETAIL: one row of the report, one line on stdout
  rows+=("| $1 | $2 | $3 | ${4:-} |")
  [[ $2 == PASS ]] || failed=1
  echo "gpu_check: $2 $1 (${3} s)${4:+: $4}"
}

budget() { # budget SECONDS: a step's own limit, cut to what is left of the whole
  local left=$((deadline - SECONDS))
  echo $((left < $1 ? left : $1))
}

launch() { # launch NAME SECONDS COMMAND...: start COMMAND in the background under timeout; NAME.out, NAME.status
  local name=$1 limit
  limit=$(budget "$2")
  shift 2
  if ((limit < 10)); then echo "999 0" >"$work/$name.status"; return; fi
  (
    begun=$SECONDS status=0
    timeout -k 10 "$limit" "$@" >"$work/$name.out" 2>&1 || status=$?
    echo "$status $((SECONDS - begun)) $limit" >"$work/$name.status"
  ) &
}

finish() { # finish NAME STEP DETAIL: the row of a launched command (wait for it first)
  local status seconds limit why detail=${3:-}
  read -r status seconds limit <"$work/$1.status"
  if [[ $status == 0 ]]; then record "$2" PASS "$seconds" "$detail"; return; fi
  if [[ $status == 999 ]]; then record "$2" FAIL 0 "not started: the 9-minute budget was spent"; return; fi
  if [[ $status == 124 || $status == 137 ]]; then why="timed out after $limit s"; else why="exit status $status"; fi
  detail="$why${detail:+; $detail}"
  record "$2" FAIL "$seconds" "$detail"
  { echo "=== $2: $detail"; tail -n 80 "$work/$1.out"; echo; } >>"$failures"
}

run() { # run NAME SECONDS COMMAND...: launch and wait
  launch "$@"
  wait
}

last_line() { grep -v '^\s*$' "$work/$1.out" 2>/dev/null | tail -n 1 || true; }

# Installing. Everything below runs from this checkout (PYTHONPATH); what may be missing is a requirement.
requirements="crackseg.training.train, crackseg.prediction.predict, segmentation_models_pytorch, scipy, skimage, safetensors, tensorboard, tqdm, PIL, pytest"
export requirements
install() {
  local wheels=${WHEELS:-$repo/.whl}
  if compgen -G "$wheels/*.whl" >/dev/null; then
    "$PYTHON" -m pip install -q --no-index --find-links "$wheels" --no-build-isolation -e "$repo[dev]" || {
      echo "not every dev extra has a wheel in $wheels: installing its wheels, then crackseg without dependencies"
      "$PYTHON" -m pip install -q --no-index --no-deps "$wheels"/*.whl
      "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation -e "$repo"
    }
  else
    "$PYTHON" -m pip install -q --no-build-isolation -e "$repo[dev]"
  fi
  "$PYTHON" -c "import $requirements"
}
export -f install
if "$python" -c "import $requirements" 2>/dev/null; then
  record install PASS 0 "nothing to install"
else
  run install 150 bash -c install
  finish install install "$(last_line install)"
fi

versions() {
  local smi status=0
  if smi=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1); then
    sed 's/^/- nvidia-smi: /' <<<"$smi"
  else
    echo "- nvidia-smi: failed: ${smi//$'\n'/ }"
    status=1
  fi
  "$PYTHON" - <<'PY' || status=1
import platform

import torch

import crackseg

try:
    import segmentation_models_pytorch as smp
    smp_version = smp.__version__
except Exception as error:  # reported here; the install step says why
    smp_version = f"does not import ({type(error).__name__})"
nccl = torch.cuda.nccl.version()
nccl = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
props = torch.cuda.get_device_properties(0)
print(f"- torch sees: {torch.cuda.get_device_name(0)}, compute capability {props.major}.{props.minor}, "
      f"{props.total_memory / 2**30:.1f} GiB, {torch.cuda.device_count()} GPU(s) visible")
print(f"- CUDA {torch.version.cuda} (torch's build), cuDNN {torch.backends.cudnn.version()}, NCCL {nccl}")
print(f"- torch {torch.__version__}, segmentation-models-pytorch {smp_version}, crackseg {crackseg.__version__}, "
      f"Python {platform.python_version()}")
PY
  commit=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null) && echo "- commit $commit"
  return "$status"
}
export -f versions
run versions 30 bash -c versions
finish versions versions
cat "$work/versions.out"

run data 60 bash -c '"$PYTHON" -m crackseg synth "$1/data" --count 64 --size 256 --seed 0 --workers 8 \
  && "$PYTHON" -m crackseg synth "$1/data448" --count 72 --size 600 --seed 1 --workers 8' _ "$work"
finish data "synthetic data" "64 images of 256 px, 72 of 600 px (no ../shared datasets are used)"

# At once: the tests and the short trainings (each measures only itself: peak memory is per process).
launch pytest 240 "$python" -m pytest -m cuda -q
flags=("--amp bf16" "--amp fp16" "--channels-last" "--compile" "--activation-checkpointing" "--grad-accum 2"
       "--strategy dp" "--cache")
small=(--data "$work/data" --epochs 2 --encoder resnet18 --encoder-weights none --crop-size 256 --batch-size 8
       --workers 2 --val-fraction 0.125 --log-every 1)
for index in "${!flags[@]}"; do
  read -ra extra <<<"${flags[$index]}"
  [[ ${flags[$index]} == --compile ]] || extra+=(--no-compile)  # compile is on by default on CUDA: one flag at a time
  launch "train$index" 240 bash launch.sh --nproc 1 --max-restarts 0 train --run "$work/runs/$index" "${small[@]}" "${extra[@]}"
done
large=(--data "$work/data448" --epochs 1 --encoder resnet34 --encoder-weights none --crop-size 448 --batch-size 32
       --workers 4 --val-fraction 0.1 --amp bf16 --channels-last --no-compile --log-every 1)
launch memory_plain 180 bash launch.sh --nproc 1 --max-restarts 0 train --run "$work/runs/memory_plain" "${large[@]}"
launch memory_checkpointed 180 bash launch.sh --nproc 1 --max-restarts 0 train --run "$work/runs/memory_checkpointed" \
  "${large[@]}" --activation-checkpointing
wait

finish pytest "pytest -m cuda" "$(last_line pytest)"
epoch_line() { # the last epoch of a run's log: "last epoch N img/s, peak X GB"
  local line rate peak
  line=$(grep -h "epoch [0-9]*/[0-9]*  train loss" "$work/runs/$1/train.log" 2>/dev/null | tail -n 1) || true
  rate=$(sed -n 's/.*  \([0-9.]*\) img\/s.*/\1/p' <<<"$line")
  peak=$(sed -n 's/.*peak GPU memory \([0-9.]*\) GB.*/\1/p' <<<"$line")
  echo "${rate:+last epoch $rate img/s}${peak:+, peak $peak GB}"
}
for index in "${!flags[@]}"; do
  finish "train$index" "launch.sh train ${flags[$index]}" "$(epoch_line "$index")"
done
finish memory_plain "step memory, plain" "$(epoch_line memory_plain)"
finish memory_checkpointed "step memory, --activation-checkpointing" "$(epoch_line memory_checkpointed)"

# One at a time: the figures.
bench=("$python" benchmarks/bench.py)
goal=(--device cuda --encoder resnet34 --size 448 --amp bf16 --channels-last)
run bench_train 80 "${bench[@]}" train "${goal[@]}" --batch-size 64 --workers 14 --out "$out/gpu_check_train.json"
finish bench_train "bench.py train" "batch 64, 14 workers"
run bench_predict 200 "${bench[@]}" predict "${goal[@]}" --batch-size 64 --workers 14 --count 512 --windows 1 --out "$out/gpu_check_predict.json"
finish bench_predict "bench.py predict" "batch 64, 14 workers, 512 images per run, one timed window"
run bench_strategies 70 "${bench[@]}" strategies --device cuda --encoder resnet34 --size 448 --batch-size 32 --workers 6 \
  --out "$out/gpu_check_strategies.json"
finish bench_strategies "bench.py strategies" "batch 32 per process, 6 workers"

peak() { sed -n 's/.*peak GPU memory \([0-9.]*\) GB.*/\1/p' "$work/runs/$1/train.log" 2>/dev/null | tail -n 1 || true; }
{
  echo "## GPU check, $started_at"
  echo
  echo "\`benchmarks/gpu_check.sh\`, $SECONDS s in all; synthetic data only."
  echo
  grep '^- ' "$work/versions.out" || true
  echo
  echo "| step | result | seconds | detail |"
  echo "|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo
  "$python" - "$out" "$(peak memory_plain)" "$(peak memory_checkpointed)" <<'PY' || echo "(the figures could not be read: see gpu_check.log)"
import json
import sys
from pathlib import Path

out, plain, checkpointed = Path(sys.argv[1]), sys.argv[2], sys.argv[3]


def rows(mode: str) -> list[dict]:
    path = out / f"gpu_check_{mode}.json"
    return json.loads(path.read_text())["rows"] if path.exists() else []


def row(rows: list[dict], start: str) -> dict:
    return next((r for r in rows if r.get("path", "").startswith(start)), {})


def verdict(value, target: float | None) -> str:
    if value is None or value == "":
        return "not measured"
    return "-" if target is None else ("met" if value >= target else "missed")


train, predict = rows("train"), rows("predict")
model_train, end_train = row(train, "model only"), row(train, "end to end")
model_predict, naive = row(predict, "model only"), row(predict, "naive loop")
no_measure, measure = row(predict, "crackseg predict, JPEG files to PNG masks (--no-measure)"), row(predict, "crackseg predict, JPEG files to PNG masks +")
saving = round(1 - float(checkpointed) / float(plain), 3) if plain and checkpointed and float(plain) > 0 else None
figures = [
    ("training, end to end (files, augmentation, loader), img/s", end_train.get("images_per_s"), 1700),
    ("training, model only, img/s", model_train.get("images_per_s"), None),
    ("training, achieved TFLOP/s (model only)", model_train.get("achieved_tflops"), None),
    ("training, fraction of the bf16 peak (model only)", model_train.get("fraction_of_peak"), None),
    ("training, peak GPU memory, MB (batch 64)", model_train.get("peak_memory_mb"), None),
    ("inference, model only, img/s", model_predict.get("images_per_s"), 5000),
    ("inference, achieved TFLOP/s (model only)", model_predict.get("achieved_tflops"), None),
    ("crackseg predict, JPEG files to PNG masks (--no-measure), img/s", no_measure.get("images_per_s"), 2500),
    ("crackseg predict, files to PNG masks + measurements, img/s", measure.get("images_per_s"), 1000),
    ("crackseg predict (--no-measure) / naive loop", naive.get("crackseg_speedup"), 10),
    ("activation checkpointing: peak memory saved (batch 32, 448 px, bf16)", saving, 0.4),
]
print("| figure (UNet-ResNet34, 448 px, bf16, channels_last) | value | target | verdict |")
print("|---|---|---|---|")
for name, value, target in figures:
    shown = "" if value is None else value
    print(f"| {name} | {shown} | {'' if target is None else ('>= ' + format(target, 'g'))} | {verdict(value, target)} |")
if plain or checkpointed:
    print(f"\nPeak GPU memory of one training step: {plain or '?'} GB plain, {checkpointed or '?'} GB with --activation-checkpointing.")
for mode in ("train", "predict", "strategies"):
    path = out / f"gpu_check_{mode}.json"
    if path.exists():
        report = json.loads(path.read_text())
        print(f"\n`{report['environment']['command']}`\n")
        table = [r for r in report["rows"]]
        columns = list(dict.fromkeys(k for r in table for k, v in r.items() if not isinstance(v, list)))
        print("| " + " | ".join(columns) + " |")
        print("|" + "---|" * len(columns))
        for r in table:
            print("| " + " | ".join(str(r.get(c, "")) for c in columns) + " |")
PY
  echo
  if ((failed)); then echo "Result: FAIL (the end of each failed step's output is in gpu_check.log)"; else echo "Result: PASS"; fi
} >"$report"
echo "gpu_check: report written to $report$( ((failed)) && echo "; failures in $failures")"
exit "$failed"
