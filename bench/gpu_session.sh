#!/usr/bin/env bash
# The GPU measurements the open issues need, as one prepared script for a lent device machine (one H100 or H200,
# no package registry; see the tool library's device README). Two steps:
#
#   here, once:  bash bench/gpu_session.sh wheels
#                  downloads into .whl/ (git-ignored) the pinned packages the device image lacks or holds in
#                  other versions, as Python 3.12 wheels
#   there:       run(command="bash bench/gpu_session.sh run", carry=[".whl"], timeout_s=600)
#                  the GPU tests; then base at the paper's batch with torch's dropout placement (attention and ReLU
#                  dropout 0.1: what `auto` sends to our Triton kernels), each Triton kernel against its maintained
#                  path in the same rounds (bench/RESULTS.md, "The GPU kernels on a maintained path"): XLA's
#                  LayerNorm for `residual_norm`, XLA's two passes for the loss kernel, `chunked` for `flash_gpu`'s
#                  dropout kernels, and all three at once; then cuDNN's attention against `flash_gpu` (padded rows,
#                  no dropout: where `auto` takes cuDNN) at lengths 128 to 1024; then, in the time left, base and big
#                  against torch.compile. Logs and JSON lines under $OUT.
#
# Each step has its own time limit, so one that hangs cannot take all that is left; the steps come in order of what
# they decide, since the call's 600 s end the script wherever it is (what is under $OUT comes back); the last runs
# only if time is left.
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

budget() {  # SECONDS: that many, or what is left of the call's 570 s if less; fails when under 45 s are left
  local left=$((570 - SECONDS))
  (( left >= 45 )) || return 1
  echo $(( $1 < left ? $1 : left ))
}

throughput() {  # SECONDS NAME FLAGS...: one bench.train_throughput process, its JSON lines and table kept
  local seconds name=$2
  seconds=$(budget "$1") || { echo "== $name: skipped, too little time left"; return; }
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
  # torch's placement: attention, ReLU and residual dropout 0.1, the step whose kernels are all Triton's
  local dropout=(--config.model.attention=auto --config.model.attention_dropout=0.1 --config.model.relu_dropout=0.1)
  ab() {  # SECONDS NAME VARIANT...: base, ours against ours with the variant's model changes, in the same rounds
    local seconds=$1 name=$2
    shift 2
    throughput "$seconds" "$name" --models=base --impls=ours,ours_variant --rounds=3 --steps=5 "${dropout[@]}" "$@"
  }
  ab 100 residual_norm_against_xla --variant.model.residual_norm_kernel=False
  ab 100 loss_kernel_against_xla --variant.model.loss_kernel=False
  ab 100 flash_gpu_dropout_against_chunked --variant.model.attention=chunked
  ab 100 triton_free --variant.model.attention=chunked --variant.model.residual_norm_kernel=False \
    --variant.model.loss_kernel=False
  # Without attention dropout `auto` takes cuDNN's kernel for padded rows; at the paper's batch `flash_gpu` made base's
  # step 4.6% faster (seventh visit). Both alone, forward and backward, at the lengths users train with
  local seconds
  seconds=$(budget 60) || { echo "== bench.attention: skipped, too little time left"; return; }
  echo "== bench.attention"
  timeout "$seconds" python3 -m bench.attention --lengths=128,256,512,1024 --batch=32 --config.model.dtype=bfloat16 --repeats=7 \
    --implementations=dot_product,flash_gpu 2>&1 | tee "$out/attention_cudnn_flash.log"
  # the headline, in what is left: base against torch.compile, torch's placement
  throughput 570 base_dropout_torch --models=base --impls=ours,torch_compile --rounds=3 --steps=5 "${dropout[@]}"
}

case "${1:-}" in
  wheels) wheels ;;
  run) run ;;
  *) echo "usage: bash bench/gpu_session.sh wheels|run" >&2; exit 2 ;;
esac
