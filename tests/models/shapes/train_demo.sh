#!/usr/bin/env bash
# Trains both bundled demo checkpoints with the schedule they were trained with, then
# writes their calibration sets. About 4 hours on two cores (the two variants' later
# stages run side by side, one torch thread each).
#
#     tests/models/shapes/train_demo.sh [OUT_DIR]     # default: tests/models/shapes/checkpoints
#
# Stages (intermediate checkpoints in $WORK, default /tmp/shapes-train):
#   dense0  6000 steps from scratch
#   dense1  3000 steps from dense0, lower learning rate, less weight on the patch loss
#   dense   3000 steps from dense1, spatial questions drawn more often
#   moe1    3000 steps, sparse-upcycled from dense0 (see train.py --upcycle)
#   moe     1500 steps from moe1, spatial questions drawn more often
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${1:-$HERE/checkpoints}"
WORK="${WORK:-/tmp/shapes-train}"
PY=/usr/bin/python3
TRAIN=("$PY" "$HERE/train.py")
FOCUS=(--describe-fraction 0.15 --kind-weight relation=3 --kind-weight position=2 --kind-weight count_shape=2)
mkdir -p "$WORK" "$OUT"

"${TRAIN[@]}" --variant dense --out "$WORK/dense0" --steps 6000 | tee "$WORK/dense0.log"

(
  "${TRAIN[@]}" --variant dense --init "$WORK/dense0" --out "$WORK/dense1" --steps 3000 --lr 1.5e-4 \
    --warmup 100 --aux-weight 0.2
  "${TRAIN[@]}" --variant dense --init "$WORK/dense1" --out "$OUT/dense" --steps 3000 --lr 1e-4 \
    --warmup 100 --aux-weight 0.2 "${FOCUS[@]}"
) > "$WORK/dense.log" 2>&1 &
dense_pid=$!

"${TRAIN[@]}" --variant moe --upcycle "$WORK/dense0" --out "$WORK/moe1" --steps 3000 --lr 2e-4 --warmup 100 \
  --aux-weight 0.2 > "$WORK/moe.log" 2>&1
"${TRAIN[@]}" --variant moe --init "$WORK/moe1" --out "$OUT/moe" --steps 1500 --lr 1e-4 --warmup 50 \
  --aux-weight 0.2 --eval-every 500 "${FOCUS[@]}" >> "$WORK/moe.log" 2>&1
wait "$dense_pid"
tail -n 11 "$WORK/dense.log" "$WORK/moe.log"

for v in dense moe; do
  "$PY" "$HERE/make_examples.py" --out "$OUT/$v" --count 16 --split train --size 128 \
    --images calibration --list calibration.jsonl
done
