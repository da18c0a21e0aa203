#!/usr/bin/env bash
# Every benchmark on one device, one JSON each, plus environment.json (the device, the versions and the exact
# commands with their seconds):
#
#   bash eval/gpu_suite.sh                                   # --device cuda, into eval/results/gpu/
#   bash eval/gpu_suite.sh --short                           # the CUDA tests and the GPU benchmarks of the families
#   bash eval/gpu_suite.sh --short --only bench_text,quality # two benchmarks at their own --quick settings
#   bash eval/gpu_suite.sh --device cpu --quick --out DIR    # the smoke test run by tests/eval/test_gpu_suite.py
#
# Options: --device DEVICE (default cuda), --quick (the smallest settings of each benchmark: a smoke test, about six
# minutes on 2 CPU cores), --short (cuda_tests, bench_graphs, real_size and cost_model, sized to take under 9 minutes
# on one H100; with --only, any benchmark at its short settings), --only NAME[,NAME] (these benchmarks;
# environment.json keeps the other benchmarks' runs from earlier calls), --out DIR (default eval/results/gpu),
# --python PYTHON (default python3). cuda_tests runs the tests that need CUDA (`pytest -k cuda`, its counts in
# cuda_tests.json); the full and short runs on a CUDA device start with it. The full run is sized for under 25
# minutes on one H100-class GPU; it and --short also draw docs/images/cost_model_<device>.png. Nothing is written
# when a benchmark or a test fails: the results go to a scratch folder and move only after every one has finished.
set -euo pipefail
cd "$(dirname "$0")/.."

benchmarks=(cuda_tests bench_text bench_image bench_continuous bench_video bench_graphs quality cost_model real_size)
device=cuda tier=full out=eval/results/gpu python=python3 only=""
while [ $# -gt 0 ]; do
    case "$1" in
        --device) device="${2:?--device needs a value}"; shift 2 ;;
        --quick) tier=smoke; shift ;;
        --short) tier=short; shift ;;
        --only) only="${2:?--only needs a value}"; shift 2 ;;
        --out) out="${2:?--out needs a value}"; shift 2 ;;
        --python) python="${2:?--python needs a value}"; shift 2 ;;
        -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_suite.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [ -z "$only" ]; then  # the tier's own set; the CUDA tests only where there is CUDA
    case "$tier" in
        short) only=bench_graphs,real_size,cost_model ;;
        *) only=$(IFS=,; echo "${benchmarks[*]:1}") ;;
    esac
    [[ "$device" == cuda* && "$tier" != smoke ]] && only="cuda_tests,$only"
fi
IFS=, read -r -a chosen <<< "$only"
for name in "${chosen[@]}"; do
    [[ " ${benchmarks[*]} " == *" $name "* ]] || {
        echo "gpu_suite.sh: --only: unknown benchmark '$name'; choose from ${benchmarks[*]}" >&2; exit 2; }
done

"$python" - "$device" <<'PY' || exit 2  # a device this machine lacks: one line, before any test or model
import sys
from mmspec.core.runtime.devices import parse_device

try:
    parse_device(sys.argv[1])
except ValueError as error:
    sys.exit(f"gpu_suite.sh: {error}")
PY

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
plot="$scratch/cost_model_${device%%:*}.png"  # to docs/images/ after a full run; a smoke test's is dropped
declare -A settings=(  # the full run; --short and --quick below
    [cuda_tests]=""
    [bench_text]=""
    [bench_image]=""
    [bench_continuous]=""
    [bench_video]=""
    [bench_graphs]=""
    [quality]="--quick --methods ar sjd tree lantern gsd draft pjd"
    [cost_model]="--dtype bfloat16"
    [real_size]="--dtype bfloat16"
)
if [ "$tier" = short ]; then  # bench_graphs, bench_text and bench_continuous: about 7.5 minutes on one H100
    for name in bench_image bench_video; do settings[$name]="--quick"; done
    settings[bench_graphs]="--prompts 8 --batch-sizes 1 8 --num-iter 16 --new-tokens 64"
    settings[bench_text]="--quick --methods hf_prompt_lookup ours_model ours_model_len8 ours_model_len16 ours_ngram \
ours_tree ours_tree_n30 ours_tree_full30"
    settings[bench_continuous]="--quick --no-fd --methods ar exact draft"
    settings[cost_model]="--dtype bfloat16 --models llamagen-b llamagen-l --batch-sizes 1 4 --prompts 4 --repeats 5"
    settings[real_size]="--dtype bfloat16 --models janus-pro-7b lumina-mgpt-7b --iterations 32 --prompts 4"
elif [ "$tier" = smoke ]; then
    settings=(
        [cuda_tests]=""
        [bench_text]="--quick --prompts 1 --new-tokens 16 --stop-prompts 2 --stream-prompts 12"
        [bench_image]="--quick --prompts 1 --methods sjd_published sjd_maximal draft heads heads_lantern"
        [bench_continuous]="--quick --images-bs1 1 --images-bs8 2 --num-iter 8 --diffusion-steps 10 --no-fd"
        [bench_video]="--quick --episodes 1 --frames 8 --change-probs 0.1"
        [bench_graphs]="--quick --prompts 1 --num-iter 8 --diffusion-steps 10 --new-tokens 32"
        [quality]="--quick --num-prompts 2 --ar-seed-sets 2 --methods ar sjd"
        [cost_model]="--quick --models llamagen-b --batch-sizes 1 --windows 1 2 4 --prompts 1 --repeats 1"
        [real_size]="--quick --batch-sizes 1 --iterations 4 --prompts 1"
    )
fi

commands=()
for name in "${benchmarks[@]}"; do
    [[ ",$only," == *",$name,"* ]] || continue
    extra=""
    case "$name" in
        quality) extra="--out-dir $scratch/quality_images" ;;
        cost_model) extra="--plot $plot" ;;
    esac
    command="$python -m mmspec.eval.$name --device $device ${settings[$name]} --json $scratch/$name.json $extra"
    run=($command)
    if [ "$name" = cuda_tests ]; then  # the default tier's tests named for CUDA; their counts as JSON
        run=("$python" -m pytest -q -p no:cacheprovider -m "not slow" -k cuda tests --junitxml "$scratch/cuda_tests.xml")
        command="${run[*]}"
    fi
    echo "== $command"
    began=$(date +%s)
    "${run[@]}"
    if [ "$name" = cuda_tests ]; then
        "$python" - "$scratch/cuda_tests.xml" "$scratch/cuda_tests.json" "$device" <<'PY'
import json, sys
import xml.etree.ElementTree as ElementTree
import torch
from mmspec.eval.devices import machine

suite = ElementTree.parse(sys.argv[1]).getroot()
suite = suite if suite.tag == "testsuite" else suite[0]
counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
json.dump({**machine(torch.device(sys.argv[3])), **counts, "passed": counts["tests"] - counts["failures"]
           - counts["errors"] - counts["skipped"]}, open(sys.argv[2], "w"), indent=1)
PY
        rm "$scratch/cuda_tests.xml"
    fi
    commands+=("$name	$(( $(date +%s) - began ))	${command//$scratch/$out}")
done

printf '%s\n' "${commands[@]}" | "$python" -c '
import json, os, sys
import torch
from mmspec.eval.devices import machine

device, tier, earlier_path, path = torch.device(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
runs = [dict(zip(("benchmark", "seconds", "command"), line.rstrip("\n").split("\t"))) for line in sys.stdin]
for run in runs:
    run["seconds"] = int(run["seconds"])
report = {**machine(device), "tier": tier, "runs": runs}
if os.path.exists(earlier_path):  # an earlier --only call on this device and tier: keep its other benchmarks
    earlier = json.load(open(earlier_path))
    if earlier.get("tier") == tier and earlier["device"]["name"] == report["device"]["name"]:
        ran = {run["benchmark"] for run in runs}
        report["runs"] = [run for run in earlier["runs"] if run["benchmark"] not in ran] + runs
report["total_seconds"] = sum(run["seconds"] for run in report["runs"])
json.dump(report, open(path, "w"), indent=1)
seconds, name = sum(run["seconds"] for run in runs), report["device"]["name"]
print(f"suite: {len(runs)} benchmarks in {seconds} s on {name}")
' "$device" "$tier" "$out/environment.json" "$scratch/environment.json"

mkdir -p "$out"
mv "$scratch"/*.json "$out"/
if [ "$tier" != smoke ] && [ -f "$plot" ]; then mv "$plot" docs/images/; fi
echo "wrote $out"
