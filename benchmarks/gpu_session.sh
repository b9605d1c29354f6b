#!/usr/bin/env bash
# Issue 21's GPU checks in one run on a lent GPU (the device tool; docs/benchmarks.md, "GPU (H100, lent device)").
#
# The device image has CUDA torch, safetensors and attrs but no Ray, rankcore's other dependencies or
# Ray's jsonschema: they travel as cp312 wheels in .whl/ (Ray's trimmed to fit the 64 MiB the tool carries:
# no Java jars, RLlib, Tune, Train, Data, LLM or dashboard web build, which nothing here imports).
# Each step has its own time limit and its output goes to $OUT/gpu.log; a step that fails does not stop
# the others. Run from the repository root:
#
#     bash benchmarks/gpu_session.sh --wheels        # here, once: fill .whl/ (git-ignored via .git/info/exclude)
#     bash benchmarks/gpu_session.sh                 # there (device tool, carry [".whl"]): all steps
#     bash benchmarks/gpu_session.sh tiers1 share    # only these (names below)
#     bash benchmarks/gpu_session.sh env http proxies httpraw floor proxiesgen  # issue 38's ingress figures, quiet host
#     bash benchmarks/gpu_session.sh env floor floorref floorvalue byvalue     # issue 38's floor: by value and by reference
#     bash benchmarks/gpu_session.sh --before REV    # here: .before/ holds REV's code (git-ignored), for
#     bash benchmarks/gpu_session.sh env before floor httpraw  # there: REV's one-client floor beside this tree's
# (the steps named run in this file's order, not the command line's)
set -u
if [ "${1:-}" = "--before" ]; then  # an earlier revision's code beside this one, to compare on the same machine
    set -e
    grep -qx '/.before/' .git/info/exclude 2>/dev/null || echo /.before/ >>.git/info/exclude
    rm -rf .before && mkdir .before
    git archive "${2:?--before needs a revision}" executors rankcore benchmarks tests/__init__.py \
        tests/integration/__init__.py tests/integration/protos | tar -x -C .before
    git rev-parse --short "$2" >.before/REVISION
    du -sh .before
    exit 0
fi
if [ "${1:-}" = "--wheels" ]; then  # the versions constraints.txt pins, for the device's Python 3.12
    set -e
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >>.git/info/exclude
    mkdir -p .whl
    rm -f .whl/*.whl  # one version of each package: none left over from an earlier set
    pin() { grep -i "^$1==" constraints.txt || { echo "$1 is not pinned in constraints.txt" >&2; exit 1; }; }
    plat="--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64"
    # shellcheck disable=SC2046,SC2086
    python3 -m pip download -q --no-deps --only-binary=:all: $plat -d .whl $(pin attrs) $(pin immutables) \
        $(pin transitions) $(pin cattrs) jsonschema==4.26.0 referencing==0.37.0 \
        jsonschema-specifications==2025.9.1 rpds-py==2026.9.1
    # Ray Serve (HTTP and gRPC proxies) and rankcore's ingress (executors/ray_gpu/ingress/): grpcio and
    # protobuf at our pins (they shadow the device's own, of unknown versions), the health and reflection
    # services, starlette/uvicorn/httptools, and fastapi with what it imports at `from ray import serve`
    # (pydantic, annotated-doc, opentelemetry-api); typing-extensions for pydantic-core (needs >= 4.14),
    # six for transitions. Ray's dashboard/metrics extras (aiohttp_cors, opencensus, opentelemetry-sdk,
    # smart_open, virtualenv, py-spy, mmh3, watchfiles, colorful) are left out: Ray and Serve run without.
    # shellcheck disable=SC2046,SC2086
    python3 -m pip download -q --no-deps --only-binary=:all: $plat -d .whl $(pin grpcio) $(pin protobuf) \
        $(pin grpcio-health-checking) grpcio-reflection==1.84.0 $(pin starlette) $(pin uvicorn) $(pin httptools) \
        fastapi==0.165.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 annotated-doc==0.0.7 \
        typing-inspection==0.4.5 typing-extensions==4.16.0 opentelemetry-api==1.45.2 six==1.17.0
    tmp=$(mktemp -d)
    # shellcheck disable=SC2086
    python3 -m pip download -q --no-deps --only-binary=:all: $plat -d "$tmp" "$(pin ray)"
    python3 - "$tmp"/ray-*.whl .whl/ray_trim.zip <<'PY'
import sys, zipfile
drop = ("ray/jars/", "ray/rllib/", "ray/tune/", "ray/train/", "ray/llm/", "ray/data/", "ray/dashboard/client/build/")
with zipfile.ZipFile(sys.argv[1]) as src, zipfile.ZipFile(sys.argv[2], "w", zipfile.ZIP_DEFLATED, compresslevel=9) as out:
    for info in src.infolist():
        if not info.filename.startswith(drop):
            out.writestr(info, src.read(info.filename), compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
PY
    rm -rf "$tmp"
    du -sh .whl
    exit 0
fi
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
LOG=$OUT/gpu.log
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled
steps=${*:-"env unit tiers1 share sleep tiers4 sweep"}

if [ -d .whl ] && [ -z "${NO_WHEELS:-}" ]; then  # (NO_WHEELS=1: use the Python on PATH as it is)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl >>"$LOG" 2>&1 || echo "wheel install FAILED" | tee -a "$LOG"
    [ -f .whl/ray_trim.zip ] && python3 -m zipfile -e .whl/ray_trim.zip /tmp/site >>"$LOG" 2>&1
    chmod -R u+x /tmp/site/ray/core 2>/dev/null
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}

step() {  # name, seconds, command...
    local name=$1 limit=$2
    shift 2
    case " $steps " in *" $name "*) ;; *) return ;; esac
    echo "===== $name ($(date -u +%H:%M:%S), limit ${limit}s): $*" | tee -a "$LOG"
    local t0=$SECONDS
    timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$LOG"
    echo "===== $name: rc=${PIPESTATUS[0]} in $((SECONDS - t0)) s" | tee -a "$LOG"
}

step env 30 bash -c 'nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; uptime; nproc;
    python3 -c "import sys, torch, safetensors; print(sys.version.split()[0], torch.__version__, safetensors.__version__)";
    python3 -c "import ray; print(\"ray\", ray.__version__)"'
step unit 120 python3 -m pytest -q -p no:cacheprovider -W ignore -rs tests/unit/test_shared_weights.py
step tiers1 150 python3 benchmarks/bench_tiers.py --gib 1 --dir /tmp
step share 240 python3 benchmarks/bench_shared_weights.py --device cuda --mib 1024 --replicas 2 --repeats 3
step sleep 120 python3 benchmarks/gpu_sleep_frees_memory.py
step tiers4 180 python3 benchmarks/bench_tiers.py --gib 4 --dir /tmp
step sweep 240 python3 benchmarks/bench_tiers.py --gib 1 --sweep --dir /tmp
# not GPU work: the device machine is the only quiet many-core host lent here (issue 38's HTTP floor)
step http 300 python3 benchmarks/bench_http.py --paths http,grpc,handle --clients 1,16,64 --json "$OUT/http.json"
step proxies 200 python3 benchmarks/bench_proxies.py --workers 4 --proxies 1,2,4 --clients 64
step httpraw 200 python3 benchmarks/bench_http.py --paths http --clients 1,16,64 --http-client raw --json "$OUT/httpraw.json"
# (.before/: an earlier revision, --before above; run from there, so its replicas import its code)
[ -d .before ] && step before 120 bash -c "cd .before && echo \"revision \$(cat REVISION)\" && PYTHONPATH=/tmp/site \
    python3 benchmarks/bench_http.py --only ours --paths http,handle --clients 1 --seconds 10 --http-client raw \
    --json $OUT/before.json"
step floor 200 python3 benchmarks/bench_http.py --paths http,grpc,handle --clients 1 --seconds 10 --http-client raw \
    --json "$OUT/floor.json"
# the same floor with every proxy and handle sending Ray calls (ours as before its by-value default), and
# both systems over gRPC to their replicas (Serve's interdeployment transport); then the three ways interleaved
step floorref 150 python3 benchmarks/bench_http.py --only ours --paths http --clients 1 --seconds 10 --http-client raw \
    --transport reference --json "$OUT/floorref.json"
step floorvalue 200 python3 benchmarks/bench_http.py --paths http,handle --clients 1 --seconds 10 --http-client raw \
    --transport value --json "$OUT/floorvalue.json"
step byvalue 120 python3 benchmarks/bench_by_value.py --clients 1,16 --seconds 5 --rounds 3 --json "$OUT/byvalue.json"
step proxiesgen 200 python3 benchmarks/bench_proxies.py --workers 4 --proxies 1,2,4 --clients 64 --generators 8 \
    --http-client raw
rm -f /tmp/rankcore-* 2>/dev/null
echo "done $(date -u +%H:%M:%S)" | tee -a "$LOG"
