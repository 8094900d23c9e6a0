#!/usr/bin/env bash
# The GPU checks in one call on the lent GPU machine (one H200, torch 2.11, Python 3.12, no registry):
# the CUDA tests (Triton kernels == reference in fp32/bf16/fp16, no host synchronisation in a layer,
# launches independent of the head sets, fairseq-train/-validate in mixed precision), then the
# benchmark side by side with stock fairseq in bf16 and fp32 and fairseq-train --fp16 updates/s.
#
# Here, once:   make setup && bash ../shared/gpu/prepare.sh && bash scripts/gpu_check.sh --prepare
# There (the device tool's run, carry [".gpu"], timeout_s 560; the steps below take at most 510 s):
#               bash scripts/gpu_check.sh
# Tables and logs land in $OUT (the device tool brings them back).
set -euo pipefail
if [ "${1:-}" = "--prepare" ]; then  # pytest for the machine's Python 3.12, next to prepare.sh's wheels
  .venv/bin/pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any -d .gpu/whl \
    pytest pluggy iniconfig packaging pygments
  du -sh .gpu
  exit 0
fi
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
source .gpu/env.sh
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used --format=csv | tee "$OUT/gpu.txt"

set +e  # every step runs; the statuses are summed up at the end
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_heads.py tests/test_fast_path.py \
  "tests/test_cli.py::test_train_and_validate_in_mixed_precision_on_a_gpu" 2>&1 | tee "$OUT/tests.log"
tests=${PIPESTATUS[0]}
bench() {  # name, seconds, then benchmark options
  local name=$1 seconds=$2; shift 2
  timeout "$seconds" python3 examples/budgetformer/benchmark.py --device cuda --repeats 30 --warmup 3 --time-budget 5 \
    --json "$OUT/$name.json" --markdown "$OUT/$name.md" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: exit $?"
}
bench bf16 120 --dtype bfloat16 --sizes small base --batch-sizes 1 32 128 --seq-lens 128 512 \
  --head-ratios 1.0 0.5 0.25 --train-repeats 10
bench fp32 90 --dtype float32 --sizes small base --batch-sizes 1 32 128 --seq-lens 128 512 \
  --head-ratios 1.0 0.5 --train-repeats 10
bench minilm 40 --dtype bfloat16 --sizes minilm --batch-sizes 1 32 --seq-lens 128 --head-ratios 1.0 0.5 0.25 \
  --train-repeats 0
bench fairseq_train 80 --dtype float16 --sizes small --batch-sizes 32 --seq-lens 128 --head-ratios 0.5 \
  --train-repeats 0 --fairseq-train-updates 300
echo "tests: exit $tests"
exit "$tests"
