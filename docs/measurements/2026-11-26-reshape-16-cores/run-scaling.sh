#!/usr/bin/env bash
# On the device: 16 workers vs 1 on the bench table, the reshaped tree (src/) and the tree before
# the reshaping (.device/old-src, b98bb2f), in one call, so that both ratios come from one machine.
set -u
ROWS=${ROWS:-10000000}
ROUNDS=${ROUNDS:-1:1,16:3}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for tree in new old; do
  if [ "$tree" = new ]; then SRC=$PWD/src; else SRC=$PWD/.device/old-src/src; fi
  PYTHONPATH=/tmp/site:$SRC:$PWD python3 -m bench.scaling --rows "$ROWS" --rounds "$ROUNDS" \
    --default_rounds 0 --half_rows 0 --csv_rows 0 --dask_rounds 0 --parts parquet \
    --workdir /tmp/bench --log "$OUT/scaling-$tree.jsonl" > "$OUT/scaling-$tree.txt" 2>&1
  echo "== $tree"; grep -E "vs 1 worker|parquet|error|Error" "$OUT/scaling-$tree.txt" | tail -8
done
