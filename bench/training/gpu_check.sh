#!/usr/bin/env bash
# The GPU smoke check (issues 3 and 28): on a fresh GPU machine, under 10 minutes on one GPU.
#   0. installs what it needs: `pip install -e '.[test]'`, held to the torch already there (the
#      machine's CUDA build is never replaced; a torch older than pyproject's floor fails here);
#      on a machine with no package registry, `--wheels DIR` installs the wheels in DIR (the
#      dependencies that machine lacks, downloaded elsewhere with `pip download`) and then s2s
#      itself, both without an index and without build isolation;
#   1. the GPU tests (pytest -m gpu: bf16 and fp16 training on CUDA, beam search on CUDA = CPU);
#   2. bench/training/gpu_step.py: the loss alone (chunks, CUDA kernel launches counted by the profiler),
#      then the base model's update at 25k + 25k tokens in bf16, fp16 and fp32 with TF32, timed
#      through Trainer.step with attention held to the fused kernels (a fall-back to the math
#      kernel fails the check), host syncs per step (torch.cuda.set_sync_debug_mode("warn")),
#      tokens/s and MFU against the bf16 matmul rate measured in the same run; JSON in
#      bench/training/results/gpu_check.json.
# Usage: bash bench/training/gpu_check.sh            (exit status 0 only if every part passes)
#        bash bench/training/gpu_check.sh --wheels DIR  (offline: the missing dependencies as wheels in DIR)
#        bash bench/training/gpu_check.sh --dry-run  (on CPU: every step up to the CUDA calls, tiny sizes;
#                                            nothing installed; tests/core/nn/test_gpu_logic_on_cpu.py runs it)
set -uo pipefail
cd "$(dirname "$0")/../.."
dry=0
wheels=""
case "${1:-}" in
    --dry-run) dry=1 ;;
    --wheels) wheels="${2:?--wheels needs a folder of wheels}" ;;
    "") ;;
    *) echo "gpu_check: unknown option ${1} (--dry-run or --wheels DIR)" >&2; exit 2 ;;
esac

if [ $dry -eq 0 ] && ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: torch sees no CUDA device; nothing to check (--dry-run runs the steps on CPU)" >&2
    exit 2
fi
command -v nvidia-smi >/dev/null && [ $dry -eq 0 ] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

status=0
echo "== install: pip install -e '.[test]', torch held at the installed build"
constraint=$(mktemp)
python -c "import torch; print('torch==' + torch.__version__)" > "$constraint"
install=(python -m pip install -q -e '.[test]' --constraint "$constraint")
offline=(python -m pip install -q --no-index --no-deps --no-build-isolation)
if [ $dry -eq 1 ]; then
    echo "(dry run: not run) ${install[*]}   # $(cat "$constraint")"
elif [ -n "$wheels" ]; then
    echo "offline: $(ls "$wheels"/*.whl | wc -l) wheels from $wheels, then s2s without its dependencies"
    timeout 240 "${offline[@]}" "$wheels"/*.whl && timeout 240 "${offline[@]}" -e . || status=1
else
    timeout 240 "${install[@]}" || status=1
fi
rm -f "$constraint"

echo "== GPU-marked tests"
if [ $dry -eq 1 ]; then
    timeout 120 python -m pytest -m gpu -q -p no:cacheprovider --collect-only tests/core/nn/test_gpu.py >/dev/null || status=1
    echo "(dry run: collected only)"
else
    timeout 240 python -m pytest -m gpu -q -rs -p no:cacheprovider tests/core/nn/test_gpu.py || status=1
fi

echo "== the loss alone; the base model's update at 25k + 25k tokens in bf16, fp16, fp32 (TF32)"
if [ $dry -eq 1 ]; then
    timeout 300 python bench/training/gpu_step.py --dry-run || status=1
else
    timeout 300 python bench/training/gpu_step.py --steps 10 || status=1
fi

what=$([ $dry -eq 1 ] && echo "dry run" || echo "check")
echo "gpu_check: $what $([ $status -eq 0 ] && echo passed || echo FAILED)"
exit $status
