#!/bin/bash
# The device checks of one lent-GPU session, in one call, run on the device from the repository
# root with msgspec's and ruptures' cp312 wheels carried in .whl/ (sample_traces/README.md says
# how): the profiler's residue in a fresh process (bench_cupti_residue.py), then stallscope's own
# figures against plain runs on the same host (`run`'s baseline and a watched run's steps after
# its first capture: --under-stallscope), then the before/after pairs re-recorded with three
# plain runs each (record_h100.py) for benchmarks/bench_gpu_pairs.py. Everything lands in
# $OUT/gpu-checks.tar.gz.
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
timeout 80 python3 benchmarks/bench_cupti_residue.py --steps 200 --rounds 3 > "$W/cupti.txt" 2>&1
step under-stallscope
timeout 200 python3 benchmarks/bench_cupti_residue.py --under-stallscope --only hostbound,w8 \
    --runs 3 --scratch "$W/under" > "$W/under.txt" 2>&1
step pairs
timeout 280 python3 sample_traces/record_h100.py "$W/pairs" --repeats 3 --deadline 240 \
    > "$W/pairs.txt" 2>&1
rm -rf "$W/under"
step done
tail -n 5 "$W"/*.txt
