#!/usr/bin/env bash
# The GPU measurements issue 21 still needs, as one prepared script for a lent device machine (one H100 or H200,
# no package registry; see the tool library's device README). Two steps:
#
#   here, once:  bash bench/gpu_session.sh wheels
#                  downloads into .whl/ (git-ignored) the pinned packages the device image lacks or holds in
#                  other versions, as Python 3.12 wheels
#   there:       run(command="bash bench/gpu_session.sh run", carry=[".whl"], timeout_s=600)
#                  the GPU tests; `flash_gpu` (our Triton kernels) on one attention call of the paper's base
#                  batch with attention dropout (bench.attention; the kernels took 5 ms of base's step at
#                  bench/RESULTS.md's sixth H100 visit, which also timed them on packed rows); base at the
#                  paper's batch with torch's dropout placement (attention and ReLU dropout 0.1: what `auto`
#                  sends to our Triton kernels) against torch.compile (every dropout mask a hash on a GPU since
#                  2026-11-27, so jax's key implementation no longer draws them); the same with a logits bias
#                  (XLA's loss passes instead of `loss_kernel`: what the kernel is worth); base without attention
#                  dropout through cuDNN (`auto`) and through `flash_gpu`; big with torch's dropout placement against
#                  torch.compile; base's dropout step without XLA's dot merger (jax 0.11); then, in the time
#                  left, base's dropout step by model part
#                  (bench.step_profile; CUDA graphs off so kernels name their ops). Logs and JSON lines under
#                  $OUT.
#
# Each step has its own time limit, so one that hangs leaves the others their time (~9.5 minutes in all); the
# profile runs last, in what is left.
set -uo pipefail
cd "$(dirname "$0")/.."

WHEELS=(flax==0.12.8 optax==0.2.8 orbax-checkpoint==0.12.8 grain==0.2.18 array_record==0.8.6 ml_collections==1.1.0
        portpicker==1.6.0)

wheels() {
  mkdir -p .whl
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "${WHEELS[@]}"
  ls -l .whl
}

throughput() {  # SECONDS NAME FLAGS...: one bench.train_throughput process, its JSON lines and table kept
  local seconds=$1 name=$2
  shift 2
  echo "== $name: bench.train_throughput $*"
  timeout "$seconds" python3 -m bench.train_throughput --gpu_paper_batch --malloc=system --warmup=2 --pipelined "$@" \
    2>&1 | tee "$out/$name.log"
}

run() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH="$PWD:/tmp/site" PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda
  out=${OUT:-/tmp/gpu_session}
  mkdir -p "$out"
  python3 -c "import jax, flax, optax, orbax.checkpoint, grain, ml_collections, torch
print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'torch', torch.__version__)
print(jax.devices())" 2>&1 | tee "$out/versions.log" || exit 1
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee -a "$out/versions.log"
  git log -1 --format='code: %h %s' 2>/dev/null | tee -a "$out/versions.log"

  echo "== tests/test_gpu.py"
  timeout 150 python3 -m pytest -q -m gpu tests/test_gpu.py 2>&1 | tee "$out/test_gpu.log"
  local dropout='attention=auto,attention_dropout=0.1,relu_dropout=0.1'
  echo "== attention_paper_batch: bench.attention"
  timeout 60 python3 -m bench.attention --lengths=128 --batch=196 --dtype=bfloat16 --dropout_rate=0.1 --repeats=15 \
    --implementations=flash_gpu 2>&1 | tee "$out/attention_paper_batch.log"
  throughput 190 base_dropout --configs=base --impls=ours,torch_compile --rounds=3 --steps=5 --override="$dropout"
  # The same step with a (zero-initialised) logits bias, which `loss_kernel` does not serve: XLA's two passes over
  # the logits instead of our kernel, so the two lines' step times say what the kernel is worth (untimed so far)
  throughput 100 base_dropout_xla_loss --configs=base --impls=ours --rounds=3 --steps=5 \
    --override="$dropout,logits_bias=True"
  # Without attention dropout, padded rows: cuDNN's kernel (what `auto` takes) against our Triton kernels, which
  # `flash_gpu` runs for every case since the sixth H100 visit (cuDNN was measured against jax's kernel)
  for attention in auto flash_gpu; do
    throughput 100 "base_$attention" --configs=base --impls=ours --rounds=3 --steps=5 --override="attention=$attention"
  done
  # Big with torch's dropout placement against torch.compile: its program moves 22% fewer bytes since the GPU lab
  # (bench/RESULTS.md, "The H100's program compiled on this CPU"); 1.18x at the H200's second visit
  throughput 150 big_dropout --configs=big --impls=ours,torch_compile --rounds=2 --steps=4 --override="$dropout"
  # jax 0.11's XLA merges the decoder's six cross-attention key-value products (they share the encoder's output) by
  # concatenating their operands: 1.07 GB more a base step than jax 0.10's program, which has none (bench/RESULTS.md,
  # "The device's jax compiled here"). The same step as base_dropout's without that merge says whether it pays
  if [[ "$(python3 -c 'import jax; print(jax.__version__)')" != 0.10.* ]]; then
    throughput 100 base_dropout_no_dot_merger --configs=base --impls=ours --rounds=3 --steps=5 \
      --override="$dropout" --xla_flags=--xla_gpu_dot_merger_threshold_mb=0
  fi
  local left=$((570 - SECONDS))  # what the call's 600 s leave: where base's dropout step spends its time
  if (( left > 90 )); then
    throughput "$((left - 20))" base_dropout_profile --configs=base --impls=ours --rounds=1 --steps=2 \
      --override="$dropout" --profile_dir=/tmp/profile --xla_flags=--xla_gpu_enable_command_buffer=
    timeout 20 python3 -m bench.step_profile /tmp/profile/base_ours --steps=3 2>&1 | tee "$out/base_dropout_parts.log"
  fi
}

case "${1:-}" in
  wheels) wheels ;;
  run) run ;;
  *) echo "usage: bash bench/gpu_session.sh wheels|run" >&2; exit 2 ;;
esac
