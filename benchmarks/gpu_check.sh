#!/usr/bin/env bash
# Device check of specdec_np on a machine with a CUDA GPU, in under 8 minutes:
#   1. build the package in place, offline (--no-build-isolation --no-deps);
#   2. run the gpu-marked tests with SPECDEC_REQUIRE_GPU=1, so a missing device fails (they
#      include verify_ragged on CuPy against the NumPy path: logits, filters, mixed methods);
#   3. time every verifier on CuPy arrays (benchmarks/studies/run.py --backends cupy) over
#      B in {1, 8, 64}, k = 4, V in {32000, 128256}, and print time_us and achieved GB/s;
#   4. time verify_ragged on CuPy float32 logits (B in {8, 64}, V in {32000, 128256}, filters
#      off, top-k with top-p, top-p alone) and print time_us.
# Outputs (logs, JSON lines, the markdown tables) go under $OUT if set, else /tmp.
# Exits non-zero if the device is unusable, the build fails, a test fails, or the benchmark
# fails or times nothing on CuPy.
#
# Written for a machine with Python 3.12, cupy-cuda13x, numpy, Cython, setuptools and pytest
# and no network. The tests also need hypothesis and array-api-strict: where they are missing
# they are installed from benchmarks/wheelhouse, which a machine with network fills with
#   bash benchmarks/gpu_check.sh --prepare-wheels
# (and the device run then carries: benchmarks/wheelhouse is ignored by git).
set -euo pipefail
cd "$(dirname "$0")/.."

wheelhouse=benchmarks/wheelhouse
# The benchmark grid (tests/project/test_gpu_check_script.py parses it with the parser of
# benchmarks/studies/run.py).
bench_args=(--backends cupy --batch 1 8 64 --k 4 --vocab 32000 128256 --skip-reference
    --skip-torch --no-profile)
test_requirements=(hypothesis sortedcontainers array-api-strict)

if [[ "${1:-}" == "--prepare-wheels" ]]; then
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux2014_x86_64 -d "$wheelhouse" "${test_requirements[@]}"
    exit 0
elif [[ $# -gt 0 ]]; then
    echo "usage: $0 [--prepare-wheels]" >&2
    exit 2
fi

out="${OUT:-/tmp}/specdec_gpu_check"
mkdir -p "$out"
python=${PYTHON:-python3}
budget_s=480
deadline=$((SECONDS + budget_s))

# Seconds left before the deadline, minus a margin for the steps that follow (never below 10).
left() {
    local remaining=$((deadline - SECONDS - ${1:-0}))
    echo $((remaining > 10 ? remaining : 10))
}

echo "== device =="
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 \
    | tee "$out/device.txt" || true
"$python" - <<'EOF' 2>&1 | tee -a "$out/device.txt"
import sys
import cupy
print("python", sys.version.split()[0], "| cupy", cupy.__version__)
if not cupy.is_available():
    sys.exit("cupy.is_available() is False: no usable CUDA device")
device = cupy.cuda.Device()
print("device", device.id, "compute capability", device.compute_capability,
      "| CUDA runtime", cupy.cuda.runtime.runtimeGetVersion(),
      "| driver", cupy.cuda.runtime.driverGetVersion())
EOF

echo "== test requirements =="
if ! "$python" -c "import hypothesis, array_api_strict" 2>/dev/null; then
    if [[ -d "$wheelhouse" ]]; then
        "$python" -m pip install --no-index --no-deps --find-links "$wheelhouse" \
            "${test_requirements[@]}"
    else
        echo "hypothesis or array-api-strict is missing and there is no $wheelhouse:" \
            "run 'bash benchmarks/gpu_check.sh --prepare-wheels' with network first" >&2
        exit 1
    fi
fi

echo "== build (pip install -e . --no-build-isolation --no-deps) =="
timeout "$(left 360)" "$python" -m pip install --no-build-isolation --no-deps -e . \
    > "$out/build.log" 2>&1 || { tail -n 40 "$out/build.log"; echo "build failed" >&2; exit 1; }
tail -n 2 "$out/build.log"
"$python" -c "import specdec_np, specdec_np._core; print('specdec_np', specdec_np.__version__)"

echo "== gpu tests (SPECDEC_REQUIRE_GPU=1 pytest -m gpu) =="
tests_rc=0
SPECDEC_REQUIRE_GPU=1 timeout "$(left 150)" "$python" -m pytest -m gpu -q -p no:cacheprovider \
    --junitxml="$out/gpu_tests.xml" 2>&1 | tee "$out/gpu_tests.log" || tests_rc=$?
if [[ $tests_rc -ne 0 ]]; then
    echo "gpu tests failed (exit $tests_rc; 124 is the time limit)" >&2
fi

echo "== GPU benchmark (CuPy, k = 4) =="
bench_rc=0
timeout "$(left 5)" "$python" benchmarks/studies/run.py "${bench_args[@]}" \
    --json "$out/gpu_bench.jsonl" --markdown 2>&1 | tee "$out/gpu_bench.log" || bench_rc=$?
if [[ $bench_rc -eq 0 ]]; then
    "$python" - "$out/gpu_bench.jsonl" <<'EOF' 2>&1 | tee "$out/gpu_bench.md" || bench_rc=$?
import json
import sys

records = [json.loads(line) for line in open(sys.argv[1])]
meta = next(r for r in records if r["kind"] == "meta")
rows = [r for r in records if r["kind"] == "cell" and r["backend"] == "cupy"]
if not rows:
    sys.exit("the benchmark timed nothing on CuPy")
print(f"device read bandwidth (cupy.max): {meta.get('cuda_bandwidth_gb_per_s', 0):.0f} GB/s\n")
print("| verifier | regime | B | k | V | time_us | MB read | GB/s |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for r in rows:
    gb_per_s = r["bytes"] / (r["time_us"] * 1e3)
    print(f"| {r['verifier']} | {r['regime']} | {r['B']} | {r['k']} | {r['V']} "
          f"| {r['time_us']:.1f} | {r['bytes'] / 1e6:.2f} | {gb_per_s:.0f} |")
EOF
fi
if [[ $bench_rc -ne 0 ]]; then
    echo "GPU benchmark failed (exit $bench_rc; 124 is the time limit)" >&2
fi

echo "== GPU engine layout (verify_ragged on CuPy logits, k = 4) =="
engine_rc=0
timeout "$(left 0)" "$python" - <<'EOF' 2>&1 | tee "$out/gpu_engine.md" || engine_rc=$?
import cupy
import numpy as np

import specdec_np

filters = {"off": {}, "top-k 50, top-p 0.9": {"top_k": 50, "top_p": 0.9}, "top-p 0.9": {"top_p": 0.9}}
print("| B | V | filters | time_us |")
print("|---:|---:|---|---:|")
for batch in (8, 64):
    for vocab in (32000, 128256):
        rng = np.random.default_rng(0)
        counts = np.full(batch, 4)
        target = cupy.asarray(rng.standard_normal((5 * batch, vocab), dtype=np.float32) * 3)
        draft = cupy.asarray(rng.standard_normal((4 * batch, vocab), dtype=np.float32) * 3)
        ids = cupy.asarray(rng.integers(0, vocab, 4 * batch))
        for name, chosen in filters.items():
            def call():
                return specdec_np.verify_ragged(
                    num_draft_tokens=counts, draft_token_ids=ids, target_logits=target,
                    draft_logits=draft, temperature=0.8, **chosen)
            call()  # the first call compiles the module
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            for _ in range(5):
                call()
            stop.record()
            stop.synchronize()
            time_us = cupy.cuda.get_elapsed_time(start, stop) * 1e3 / 5
            print(f"| {batch} | {vocab} | {name} | {time_us:.1f} |")
EOF
if [[ $engine_rc -ne 0 ]]; then
    echo "GPU engine timing failed (exit $engine_rc; 124 is the time limit)" >&2
fi

echo "== done in ${SECONDS} s; outputs in $out =="
if [[ $tests_rc -ne 0 || $bench_rc -ne 0 || $engine_rc -ne 0 ]]; then
    exit 1
fi
