#!/usr/bin/env bash
# Two checkouts of justonce in the shared peer harness, alternating, each beside raw_sql_b100
# in the same run: bench/ab_harness.sh BEFORE_SRC AFTER_SRC [ROUNDS] [OUT.jsonl]
#   e.g. git worktree add ../before 98fe766 && bench/ab_harness.sh ../before/src src 3
# (needs the bench venv of bench/README.md and $DATABASE_URL; summarize with
#  python3 ../shared/bench/summarize.py OUT.jsonl, labels before-N / after-N)
set -u
here=$(cd "$(dirname "$0")" && pwd)
before=$(cd "$1" && pwd); after=$(cd "$2" && pwd); rounds=${3:-3}
out=${4:-$here/results/ab.jsonl}
harness=${PEER_BENCH_DIR:-$here/../../shared/bench}
cd "$harness"
for i in $(seq 1 "$rounds"); do
  for side in before after; do
    if [ "$side" = before ]; then src=$before; else src=$after; fi
    PYTHONPATH=$src BENCH_ADAPTERS=$here/adapters \
      timeout 900 "${PYTHON:-$HOME/.venvs/qbench/bin/python}" run.py --systems justonce,raw_sql_b100 \
      --workloads w1,w2 -n "${N:-20000}" --json-out "$out" --label "$side-$i" > /dev/null
    echo "$side $i rc=$?"
  done
done
