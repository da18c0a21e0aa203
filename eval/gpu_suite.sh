#!/usr/bin/env bash
# Every benchmark on one device, one JSON each, plus environment.json (the device, the versions and the exact
# commands with their seconds):
#
#   bash eval/gpu_suite.sh                                   # --device cuda, into eval/results/gpu/
#   bash eval/gpu_suite.sh --device cpu --quick --out DIR    # the smoke test run by tests/eval/test_gpu_suite.py
#
# Options: --device DEVICE (default cuda), --quick (the smallest settings of each benchmark: a smoke test, about two
# minutes on 2 CPU cores), --out DIR (default eval/results/gpu), --python PYTHON (default python3). The full run is
# sized for under 25 minutes on one H100-class GPU and also draws docs/images/cost_model_<device>.png. Nothing is
# written when a benchmark fails: the results go to a scratch folder and move only after every benchmark has finished.
set -euo pipefail
cd "$(dirname "$0")/.."

device=cuda quick=0 out=eval/results/gpu python=python3
while [ $# -gt 0 ]; do
    case "$1" in
        --device) device="${2:?--device needs a value}"; shift 2 ;;
        --quick) quick=1; shift ;;
        --out) out="${2:?--out needs a value}"; shift 2 ;;
        --python) python="${2:?--python needs a value}"; shift 2 ;;
        -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_suite.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
plot="$scratch/cost_model_${device%%:*}.png"  # to docs/images/ after a full run; a smoke test's is dropped
if [ "$quick" = 1 ]; then
    declare -A settings=(
        [bench_text]="--quick --prompts 1 --new-tokens 16"
        [bench_image]="--quick --prompts 1"
        [bench_continuous]="--quick --images-bs1 1 --images-bs8 2 --num-iter 8 --diffusion-steps 10 --no-fd"
        [bench_video]="--quick --episodes 1 --frames 8 --change-probs 0.1"
        [quality]="--quick --num-prompts 2 --ar-seed-sets 2 --methods ar sjd"
        [cost_model]="--quick --models llamagen-b --batch-sizes 1 --windows 1 2 4 --prompts 1 --repeats 1"
    )
else
    declare -A settings=(
        [bench_text]=""
        [bench_image]=""
        [bench_continuous]=""
        [bench_video]=""
        [quality]="--quick --methods ar sjd tree lantern gsd draft pjd"
        [cost_model]="--dtype bfloat16"
    )
fi

commands=()
for name in bench_text bench_image bench_continuous bench_video quality cost_model; do
    extra=""
    case "$name" in
        quality) extra="--out-dir $scratch/quality_images" ;;
        cost_model) extra="--plot $plot" ;;
    esac
    command="$python -m mmspec.eval.$name --device $device ${settings[$name]} --json $scratch/$name.json $extra"
    echo "== $command"
    began=$(date +%s)
    $command
    commands+=("$name	$(( $(date +%s) - began ))	${command//$scratch/$out}")
done

printf '%s\n' "${commands[@]}" | "$python" -c '
import json, sys
import torch
from mmspec.eval.devices import machine

device = torch.device(sys.argv[1])
runs = [dict(zip(("benchmark", "seconds", "command"), line.rstrip("\n").split("\t"))) for line in sys.stdin]
for run in runs:
    run["seconds"] = int(run["seconds"])
report = {**machine(device), "quick": sys.argv[2] == "1", "runs": runs,
          "total_seconds": sum(run["seconds"] for run in runs)}
json.dump(report, open(sys.argv[3], "w"), indent=1)
total, name = report["total_seconds"], report["device"]["name"]
print(f"suite: {len(runs)} benchmarks in {total} s on {name}")
' "$device" "$quick" "$scratch/environment.json"

mkdir -p "$out"
mv "$scratch"/*.json "$out"/
[ "$quick" = 1 ] || mv "$plot" docs/images/
echo "wrote $out"
