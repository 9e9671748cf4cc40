#!/usr/bin/env bash
# Multi-GPU check of the trainer on LRA ListOps (paper model: 8 layers, d_model 128, L = 2000):
#  1. the same loss on 1 and N GPUs for 8 steps (float32 compute, highest matmul precision,
#     global batch 64 on both);
#  2. examples/s on 1 GPU (batch 64) and on N GPUs (batch 64 per GPU), bf16, 120 steps.
# Usage (on a machine with N >= 2 GPUs): bash experiments/multi_gpu_check.sh OUTDIR [N]
set -euo pipefail
out=${1:?usage: bash experiments/multi_gpu_check.sh OUTDIR [NUM_GPUS]}
n=${2:-2}
all=$(seq -s, 0 $((n - 1)))
common=(--config configs/lra/listops.py --config.data.cache_dir=/tmp/lion_listops_cache
        --config.data.num_val=200 --config.data.num_test=200 --config.eval_batch_size=200
        --config.eval_every=0 --config.checkpoint_every=100000 --config.progress_bar=False)

run() {  # run NAME DEVICES ARGS...
  local name=$1 devices=$2; shift 2
  echo "== $name (CUDA_VISIBLE_DEVICES=$devices)"
  CUDA_VISIBLE_DEVICES=$devices python3 -m experiments.train "${common[@]}" \
    --workdir "/tmp/multi_gpu_check/$name" "$@"
  mkdir -p "$out/$name" && cp "/tmp/multi_gpu_check/$name/metrics.jsonl" "$out/$name/"
}

f32=(--config.model.dtype=float32 --config.batch_size=64 --config.num_train_steps=8
     --config.log_every=1)
JAX_DEFAULT_MATMUL_PRECISION=highest run f32_1gpu 0 "${f32[@]}"
JAX_DEFAULT_MATMUL_PRECISION=highest run "f32_${n}gpu" "$all" "${f32[@]}"
python3 -m experiments.compare_runs "$out/f32_1gpu" "$out/f32_${n}gpu" --steps 8

speed=(--config.num_train_steps=120 --config.log_every=30)
run bf16_1gpu 0 "${speed[@]}" --config.batch_size=64
run "bf16_${n}gpu" "$all" "${speed[@]}" --config.batch_size=$((64 * n))
python3 -m experiments.compare_runs "$out/bf16_1gpu" --steps 0 --batch_size 64
python3 -m experiments.compare_runs "$out/bf16_${n}gpu" --steps 0 --batch_size $((64 * n))
