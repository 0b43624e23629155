#!/usr/bin/env bash
# The GPU check (issue 3), for when a GPU machine is at hand; under 8 minutes on one GPU.
#   1. the test suite's GPU-marked tests (pytest -m gpu): bf16 autocast and fp16 with loss
#      scaling training on CUDA, beam search on CUDA equal to CPU;
#   2. a base-model training step at the paper's batch size (25k + 25k tokens) in bf16:
#      tokens/s and model-FLOPs utilisation against the bf16 matmul rate measured in the same run.
# Usage: bash bench/gpu_check.sh        (exit status: 0 only if both parts pass)
set -uo pipefail
cd "$(dirname "$0")/.."

if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: torch sees no CUDA device; nothing to check" >&2
    exit 2
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

status=0
echo "== GPU-marked tests"
timeout 300 python -m pytest -m gpu -q -rs -p no:cacheprovider || status=1

echo "== base-model training step, bf16, 25k + 25k tokens"
timeout 150 python bench/gpu_step.py --steps 10 || status=1

echo "== gpu_check: $([ $status -eq 0 ] && echo passed || echo FAILED)"
exit $status
