#!/usr/bin/env bash
# The diagnosis' acceptance runs: each training run prints its diagnosis at its end.
#
#   bash experiments/diagnose_acceptance.sh [LOGDIR]     (default logs/diagnose)
#
# Expected runtime on the 2-core development machine (Zen 3, AVX2, no AVX512_BF16):
# about 20 minutes (19.5 measured), most of it the mixed_bfloat16 run (~3.2 s/step).
# Expected result (each run's diagnosis.md; the recorded fixtures in tests/data/runs/
# were copied from these folders):
#   f32_fit     the default run: no findings
#   f32_custom  float32 baseline of the next run: no findings
#   f16_custom  `--policy=mixed_float16 --loop=custom`: top finding "float16 has no
#               fast path on this CPU", measured against f32_custom
#   bf16_seed   the seed convnet under mixed_bfloat16, profiled: bfloat16 has no fast
#               path (vs f32_fit), misaligned conv1 with its FLOP share, the float32
#               share (FLOPs, and traced time in float32 layers and casts)
#   slow_input  float32 with --input_work: top finding "input bound"
#   skips       mixed_float16 with an injected overflow: loss-scale trouble
#   sweep       float32 vs mixed_bfloat16 at batch 16 and 32, float32 forced OOM at 32
#               (test hook): bfloat16 slower everywhere, bfloat16 fits batch 32
set -euo pipefail
LOGDIR=${1:-logs/diagnose}
run() { python -m mpt.main --logdir="$LOGDIR" "$@"; }

run --run_name=f32_fit
run --run_name=f32_custom --loop=custom
run --run_name=f16_custom --policy=mixed_float16 --loop=custom
run --run_name=bf16_seed --policy=mixed_bfloat16 --profile_steps=20,22
run --run_name=slow_input --input_work=50 --epochs=1
run --run_name=skips --policy=mixed_float16 --epochs=1 --steps_per_epoch=30 \
    --fault_factor=1e30 --fault_steps=8,12
MPT_INJECT_FAULT=oom:32/float32 run --mode=sweep --run_name=sweep --batch_sizes=16,32 \
    --policies=float32,mixed_bfloat16 --epochs=1 --steps_per_epoch=12 --warmup_steps=3
