#!/usr/bin/env bash
# The checks that need a GPU, as one script: bf16 + NCCL training under torchrun/FSDP2, the torch
# rollout engine on CUDA against the trainer's logprobs, rollout throughput, the sampler, entropy memory, and
# (where vLLM is installed) vLLM on CUDA with sleep mode and in-memory weight sync.
#
#     bash scripts/gpu_check.sh [OUT_DIR]        # default OUT_DIR: $OUT, else ./gpu_check_out
#
# Each step has its own time limit and writes its log to OUT_DIR/<step>.log; a failed step is
# reported and the script goes on, so one run gives every answer. It needs: a CUDA torch, the
# packages in pyproject.toml (math-verify, rich, pyyaml, platformdirs, transformers, safetensors);
# vLLM only for the vLLM steps (skipped with a message when `import vllm` fails).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu_check_out}}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
status=0

step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  echo "== $name (limit ${limit}s)"
  if timeout "$limit" "$@" >"$out/$name.log" 2>&1; then
    echo "   ok"; tail -n 15 "$out/$name.log"
  else
    echo "   FAILED (exit $?)"; tail -n 30 "$out/$name.log"; status=1
  fi
}

step env 60 bash -c 'nvidia-smi; python3 -c "import torch, transformers; print(torch.__version__, torch.version.cuda, transformers.__version__, torch.cuda.get_device_name(0))"'
# the tiny base model (built once; about a minute on a GPU machine's CPUs)
step base 300 python3 -m mathrl.cli base
# bf16 mixed precision and NCCL: 1 rank under torchrun (FSDP2 path), then the scaling table on one GPU
step dist_scaling 420 python3 benchmarks/dist_scaling.py --device cuda --nproc 1
# the torch engine on CUDA in bf16 and float32 vs vLLM (if installed) vs model.generate, a real architecture
step rollout_engines 420 python3 benchmarks/rollout_engines.py --device cuda --dtype bfloat16 --arch qwen2.5-0.5b \
  --batch 128 --max-new-tokens 256 --out "$out/rollout_engines.json"
# one sampling call on the GPU: the engine's inverse-CDF sampler vs torch.multinomial, 256 rows
step sampler_speed 120 python3 benchmarks/sampler_speed.py --device cuda --rows 256
# peak memory of logprob + entropy over a real vocabulary, chunked vs naive
step entropy_memory 300 python3 benchmarks/entropy_memory.py --device cuda --out "$out/entropy_memory.json"
if python3 -c "import vllm" >/dev/null 2>&1; then
  # vLLM on CUDA: logprobs equal the trainer's after weight syncs, sleep mode frees and restores memory
  step vllm_tests 600 python3 -m pytest -q tests/test_vllm_engine.py tests/test_vllm_resume.py
else
  echo "== vllm: not installed on this machine; the vLLM-on-CUDA steps are skipped"
fi
exit $status
