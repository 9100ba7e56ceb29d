#!/usr/bin/env bash
# Trains the "shapes v2" demo checkpoints with the schedule they were trained with:
# checkpoints/dense is stage att9, checkpoints/moe stage moe1, checkpoints/idefics3 stage
# idf0 (about 8 h on two cores; tests/models/README.md says what each stage taught).
# Copy a stage's files into checkpoints/VARIANT beside the calibration set to bundle it.
#
#     tests/models/shapes_v2/train_demo.sh
#
# A stage interrupted (a session that ends) continues where it stopped with the same
# command: train.py keeps its state in the stage's directory (--resume).
#
# Stages (in $WORK, default /work/shapes-v2-train):
#   dense0  the first 2000 steps of a 3000-step schedule from scratch (16 pictures x
#           6 questions a step, lr 3e-4)
#   dense1  the first 1000 steps of a 2000-step schedule from dense0's weights, lr 2e-4,
#           more descriptions and shape questions (dense0 had learned colours, counts and
#           the sign, not shapes)
#   dense2  the first 400 steps of a 1600-step schedule from dense1's weights
#   dense3  1200 steps from dense2's weights, almost no descriptions, the question kinds
#           not learned yet drawn more often (at dense2's step 400 the model described
#           pictures exactly, shapes included, but answered questions about them at 49%)
# dense0 and dense1 ran with the packing of commit b4196e9, which chained a picture's
# questions as one chat: later questions could read earlier answers (a description
# lists every object), and training loss fell while single questions stayed at 51%.
# From dense2 on, each question is its own segment (model.py Pipeline.pack); rerunning
# dense0 and dense1 with today's code gives other weights.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
WORK="${WORK:-/work/shapes-v2-train}"
PY=/usr/bin/python3
# One torch thread: the BLAS library's own threads use the second core (two torch
# threads on two cores were 1.6x slower here). glibc keeps its freed memory.
export MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=4294967296 MALLOC_TOP_PAD_=1073741824
TRAIN=("$PY" "$HERE/train.py" --threads 1 --workers 0)
FOCUS=(--kind-weight relation=2 --kind-weight read=1.5 --kind-weight position=1.5)
mkdir -p "$WORK"

stage() {  # stage NAME ARGS...: runs (or resumes) one stage in $WORK/NAME unless it is done
  local name=$1; shift
  local dir="$WORK/$name" resume=()
  [ -f "$dir/config.json" ] || [ -f "$dir/stopped" ] && return 0
  [ -f "$dir/train_state.pt" ] && resume=(--resume)
  "${TRAIN[@]}" --out "$dir" "$@" "${resume[@]}" 2>&1 | tee -a "$WORK/$name.log"
  if grep -q "^stopped before step" "$WORK/$name.log"; then touch "$dir/stopped"; fi
}

stage dense0 --variant dense --steps 3000 --stop-at 2000 --warmup 200 "${FOCUS[@]}"
stage dense1 --variant dense --init "$WORK/dense0/train_state.pt" --seed 1 --steps 2000 --lr 2e-4 --warmup 100 \
  --eval-every 500 --describe-fraction 0.3 --kind-weight shape_of_color=2 --kind-weight color_of_shape=1.5 \
  --kind-weight count_shape=1.5 --kind-weight relation=1.5 --kind-weight position=1.5 --stop-at 1000
stage dense2 --variant dense --init "$WORK/dense1/train_state.pt" --seed 2 --steps 1600 --lr 2e-4 --warmup 50 \
  --eval-every 400 --describe-fraction 0.2 --kind-weight shape_of_color=2 --kind-weight color_of_shape=1.5 \
  --kind-weight count_shape=1.5 --kind-weight relation=1.5 --kind-weight position=1.5 --stop-at 400
stage dense3 --variant dense --init "$WORK/dense2/train_state.pt" --seed 3 --steps 1200 --lr 2e-4 --warmup 50 \
  --eval-every 300 --describe-fraction 0.03 --kind-weight shape_of_color=2 --kind-weight color_of_shape=2 \
  --kind-weight count_shape=1.5 --kind-weight count_color=1.5 --kind-weight relation=1.5 --kind-weight position=2 \
  --kind-weight exists=1.5 --kind-weight read=0.3 --kind-weight count_all=0.3
# From here on the decoder is taught where to look (--attend-weight, model.attention_targets):
# dense3 described pictures but answered single-object questions at chance, and no head
# attended to the object a question names.
#   att0   1500 steps: a lookup head (layer 1, head 0) on the tokens of the named object
#   att1   the first 500 steps of 2500: and a count head (layer 1, head 1) on a sink and the
#          counted objects
#   att2   the first 1000 steps of 2000: and a head of layer 0 on the question's colour and
#          shape words (where the lookup head's query comes from)
#   att3   the first 800 steps of 1800: and the cell of each patch as an auxiliary target of
#          the vision features (a linear probe read the region of an object from them at chance)
#   att4   1000 steps: a relation's two objects looked up apart (--second-heads: the lookup
#          head on the first named, head 2 on the other, each from its own words)
#   att5   400 steps, half the pictures with only 25-100% of their image tokens, those
#          Kiln's --visual-tokens keeps (--prune-visual 0.5)
#   att6   800 steps, three pictures in four pruned so (--prune-visual 0.75); moe0 is
#          upcycled from it
#   att7   800 steps, every picture pruned so, position questions drawn twice as often
#   att8   600 steps at a lower rate, half the pictures pruned
#   att9   800 steps, three pictures in four pruned, each kept token at the RoPE position
#          it has unpruned (--original-positions, kiln-compile
#          --visual-token-positions=original): the bundled checkpoints/dense
#   moe0   the mixture-of-experts variant, upcycled from att6 (bundled until moe1)
#   moe1   the same, upcycled from att9 and trained with original positions: the
#          bundled checkpoints/moe
LOOK=(--attend-weight 0.5 --attend-layer 1 --attend-head 0)
HARD=(--kind-weight shape_of_color=2 --kind-weight color_of_shape=0.7 --kind-weight count_shape=1
  --kind-weight count_color=1.5 --kind-weight relation=2 --kind-weight position=2 --kind-weight exists=2
  --kind-weight read=0.3 --kind-weight count_all=0.3)
stage att0 --variant dense --init "$WORK/dense3" --seed 4 --steps 1500 --lr 3e-4 --warmup 50 --eval-every 250 \
  --describe-fraction 0.05 "${LOOK[@]}" --kind-weight shape_of_color=2 --kind-weight color_of_shape=2 \
  --kind-weight count_shape=1.5 --kind-weight count_color=1.5 --kind-weight relation=1.5 --kind-weight position=2 \
  --kind-weight exists=1.5 --kind-weight read=0.3 --kind-weight count_all=0.3
stage att1 --variant dense --init "$WORK/att0" --seed 5 --steps 2500 --lr 3e-4 --warmup 50 --eval-every 500 \
  --save-every 250 --describe-fraction 0.03 "${LOOK[@]}" --count-head 1 "${HARD[@]}" --stop-at 500
stage att2 --variant dense --init "$WORK/att1/train_state.pt" --seed 6 --steps 2000 --lr 3e-4 --warmup 30 \
  --eval-every 400 --save-every 200 --describe-fraction 0.03 "${LOOK[@]}" --count-head 1 --word-head 0 "${HARD[@]}" \
  --stop-at 1000
stage att3 --variant dense --init "$WORK/att2/train_state.pt" --seed 7 --steps 1800 --lr 2.5e-4 --warmup 30 \
  --eval-every 400 --save-every 200 --describe-fraction 0.03 --aux-position 0.5 "${LOOK[@]}" --count-head 1 \
  --word-head 0 --kind-weight shape_of_color=1 --kind-weight color_of_shape=0.5 --kind-weight count_shape=1.5 \
  --kind-weight count_color=1.5 --kind-weight relation=2.5 --kind-weight position=2.5 --kind-weight exists=1 \
  --kind-weight read=0.3 --kind-weight count_all=0.3 --stop-at 800
KINDS4=(--kind-weight shape_of_color=1 --kind-weight color_of_shape=0.5 --kind-weight count_shape=1.5
  --kind-weight count_color=1 --kind-weight relation=3 --kind-weight position=2 --kind-weight exists=1
  --kind-weight read=0.3 --kind-weight count_all=0.3)
HEADS=(--aux-position 0.5 "${LOOK[@]}" --count-head 1 --word-head 0 --second-heads 2,1)
stage att4 --variant dense --init "$WORK/att3/train_state.pt" --seed 8 --steps 1000 --lr 2e-4 --warmup 30 \
  --eval-every 500 --save-every 100 --describe-fraction 0.03 "${HEADS[@]}" "${KINDS4[@]}"
stage att5 --variant dense --init "$WORK/att4" --seed 9 --steps 400 --lr 1e-4 --warmup 20 --eval-every 0 \
  --save-every 100 --describe-fraction 0.03 --prune-visual 0.5 "${HEADS[@]}" "${KINDS4[@]}"
stage att6 --variant dense --init "$WORK/att5" --seed 10 --steps 800 --lr 1e-4 --warmup 20 --eval-every 0 \
  --save-every 100 --describe-fraction 0.03 --prune-visual 0.75 "${HEADS[@]}" "${KINDS4[@]}" \
  --kind-weight position=3 --kind-weight count_all=1
KINDS7=(--kind-weight shape_of_color=1 --kind-weight color_of_shape=0.5 --kind-weight count_shape=1.5
  --kind-weight count_color=1 --kind-weight relation=3 --kind-weight position=4 --kind-weight exists=1
  --kind-weight read=0.3 --kind-weight count_all=1)
stage att7 --variant dense --init "$WORK/att6" --seed 12 --steps 800 --lr 1e-4 --warmup 20 --eval-every 0 \
  --save-every 100 --describe-fraction 0.03 --prune-visual 1.0 "${HEADS[@]}" "${KINDS7[@]}"
stage att8 --variant dense --init "$WORK/att7" --seed 13 --steps 600 --lr 6e-5 --warmup 20 --eval-every 0 \
  --save-every 100 --describe-fraction 0.03 --prune-visual 0.5 "${HEADS[@]}" "${KINDS7[@]}"
stage att9 --variant dense --init "$WORK/att8" --seed 14 --steps 800 --lr 1e-4 --warmup 20 --eval-every 0 \
  --save-every 100 --describe-fraction 0.03 --prune-visual 0.75 --original-positions "${HEADS[@]}" "${KINDS7[@]}"
# The mixture-of-experts variant, upcycled (each of 8 experts of width 128 a quarter of
# the dense MLP, the router learned from scratch), with the same heads: moe0 from att6,
# moe1 (bundled) from att9 with original positions.
stage moe0 --variant moe --upcycle "$WORK/att6" --seed 11 --steps 600 --lr 2e-4 --warmup 30 --eval-every 0 \
  --save-every 100 --describe-fraction 0.03 --prune-visual 0.5 "${HEADS[@]}" "${KINDS4[@]}"
stage moe1 --variant moe --upcycle "$WORK/att9" --seed 15 --steps 600 --lr 2e-4 --warmup 30 --eval-every 0 \
  --save-every 100 --describe-fraction 0.03 --prune-visual 0.75 --original-positions "${HEADS[@]}" "${KINDS7[@]}"
# The Idefics3/SmolVLM-layout variant: att9's decoder (--init-text), its SigLIP encoder
# (8 px patches: 576), pixel shuffle and connector trained from scratch with the same heads,
# pruning and original positions: idf0 (2000 steps, about 2 h 45 min), the bundled
# checkpoints/idefics3 (with the dense variant's calibration set).
stage idf0 --variant idefics3 --init-text "$WORK/att9" --seed 16 --steps 2000 --lr 2e-4 --warmup 50 \
  --eval-every 500 --save-every 100 --describe-fraction 0.03 --prune-visual 0.75 --original-positions \
  "${HEADS[@]}" "${KINDS7[@]}"
