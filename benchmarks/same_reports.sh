#!/bin/bash
# Reports of every sample and real trace, and of a few jobs, into OUT, to compare two commits:
#
#   benchmarks/same_reports.sh /tmp/before             # on the old commit
#   benchmarks/same_reports.sh /tmp/after              # on the new one
#   diff -r /tmp/before /tmp/after                     # nothing: every report is the same
#
# TREE=<checkout> analyses with that checkout's src (default: this one). RANKS=<folder of
# bench_ranks.py rank files> adds that job (e.g. /tmp/ranks/job128). Run by hand; with the
# public real traces of sample_traces/public.
set -u
out=${1:?usage: same_reports.sh OUT}
here=$(cd "$(dirname "$0")/.." && pwd)
tree=${TREE:-$here}
# This checkout's copy for both trees: the reports name the paths they read, so two checkouts
# must spell them alike.
real=$here/sample_traces/public
export PYTHONPATH=$tree/src
py=${PYTHON:-python}
rm -rf "$out" && mkdir -p "$out"
one() { # NAME ARGS...: report.json/md/html of `analyze ARGS` into OUT/NAME, and its exit code
  local name=$1; shift
  "$py" -m stallscope analyze "$@" -q --force -o "$out/.tmp-$name" >/dev/null 2>"$out/$name.stderr"
  echo "$?" >"$out/$name.rc"
  mkdir -p "$out/$name"
  for f in report.json report.md report.html; do
    [ -f "$out/.tmp-$name/$f" ] && cp "$out/.tmp-$name/$f" "$out/$name/"
  done
  rm -rf "$out/.tmp-$name"
}
for f in "$tree"/sample_traces/*.json.gz "$real"/hta/*.json.gz "$real"/kineto/*.json.gz; do
  [ -f "$f" ] || continue
  one "$(basename "$f" .json.gz)" "$f" &
  while [ "$(jobs -r | wc -l)" -ge 2 ]; do sleep 0.2; done
done
wait
one job-gloo "$tree"/sample_traces/cpu-gloo-ddp-rank{0,1}.pt.trace.json.gz
if [ -d "$real/hta" ]; then
  one job-128 "$real"/hta/rank{0,1}of128_sampled.pt.trace.json.gz
  one job-mixed "$real"/hta/v100_rank1of2_trace_diff_test.pt.trace.json.gz \
    "$real"/hta/a100_rank3of8_trace_diff_control.pt.trace.json.gz
fi
[ -n "${RANKS:-}" ] && one job-ranks "$RANKS"
echo "$(ls "$out" | grep -c '\.rc$') analyses in $out"
