#!/bin/bash
# The device checks of one lent-GPU session, in one call (GUIDE section 7), run on the device from
# the repository root with msgspec's and ruptures' cp312 wheels carried in .whl/ (sample_traces/
# README.md says how): the profiler's residue (bench_cupti_residue.py), its cost per op with and
# without shapes (bench_profiler_cost.py), `watch` on the GPU workload with its plain step times
# (record_watch_gpu.py), and the host-bound configuration recorded by `run` with shapes off and
# on beside its plain timings (record_h100.py). Everything lands in $OUT/gpu-checks.tar.gz.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
W=/tmp/gpu-checks
mkdir -p "$W"
pack() { tar czf "${OUT:-/tmp}/gpu-checks.tar.gz" -C "$W" .; }
trap pack EXIT
step() { echo "== $1 t=${SECONDS}s"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$W/gpu.txt" 2>&1
step cupti
timeout 110 python3 benchmarks/bench_cupti_residue.py --steps 200 --rounds 3 > "$W/cupti.txt" 2>&1
step opcost
timeout 90 python3 benchmarks/bench_profiler_cost.py --repeat 3 --json "$W/opcost.json" \
    > "$W/opcost.txt" 2>&1
step watch
timeout 170 python3 sample_traces/record_watch_gpu.py "$W/watch" --deadline 120 > "$W/watch.txt" 2>&1
step shapes-off
timeout 90 python3 sample_traces/record_h100.py "$W/shapes-off" --only hostbound --repeats 2 \
    > "$W/shapes-off.txt" 2>&1
step shapes-on
timeout 60 python3 sample_traces/record_h100.py "$W/shapes-on" --only hostbound --repeats 0 \
    --run-args=--record-shapes > "$W/shapes-on.txt" 2>&1
step done
tail -n 5 "$W"/*.txt
