#!/usr/bin/env bash
# The checks that need a GPU, as one script of about 8 minutes on one GPU: the default job and a real
# architecture trained under torchrun (1 rank, FSDP2, bf16 mixed precision, NCCL) with the torch rollout
# engine, the engine-vs-trainer logprob mismatch, the update's MFU, a killed run resumed from its
# checkpoint, rollout throughput, the sampler, the memory of the chunked logprobs, a LoRA run, and
# generation in a process of its own beside the trainer (rollout.max_staleness=1).
#
#     bash scripts/gpu_wheels.sh                       # once, on a machine with a package index
#     bash scripts/gpu_check.sh [OUT_DIR]              # the GPU machine; OUT_DIR default: $OUT, else ./gpu_check_out
#     bash scripts/gpu_check.sh --dry-run OUT_DIR      # the same checks on the CPU, tiny sizes (~80 s of CPU)
#
# It prints one line per check (name, ok / FAILED / skip, its key number, seconds) and exits 1 if any
# check failed. Each check's full log is OUT_DIR/<check>.log; run directories and torchrun's per-rank
# logs (<check>/ranks/) stay under OUT_DIR. Every check has a time limit, and all of them share a budget
# (--budget, default 560 s: under the 10 minutes one command may take there), so the summary always
# prints; a check the budget cannot fit any more is reported FAILED.
#
# What the machine has: python 3.12, a CUDA torch, transformers, peft, accelerate, pytest, and no
# internet. What it lacks and the check step installs (into the ignored .gpu_site/, first on PYTHONPATH)
# are the pure-Python wheels of scripts/gpu_wheels.txt, carried there in .gpu_wheels/. vLLM is not
# carried (its wheels are gigabytes): the vLLM check runs only where `import vllm` works.
# --dry-run runs every check on the CPU (gloo instead of NCCL, float32) with tiny models, so that
# tests/test_gpu_check.py notices when the script, a benchmark or a config field it uses breaks.
set -uo pipefail
cd "$(dirname "$0")/.."

dry=0 budget=
while (( $# )); do
  case $1 in
    --dry-run) dry=1; shift ;;
    --budget) budget=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) break ;;
  esac
done
out="${1:-${OUT:-gpu_check_out}}"
mkdir -p "$out" && out=$(cd "$out" && pwd)
budget=${budget:-$(( dry ? 540 : 560 ))}  # the dry run's only stops a stuck check: shared CPUs are slow
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/.gpu_site${PYTHONPATH:+:$PYTHONPATH}"
torchrun=(python3 -m torch.distributed.run --standalone --nproc_per_node 1)

# ---- sizes: the GPU run, or the dry run's tiny ones --------------------------------------------------
if (( dry )); then
  export CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=1 MATHRL_CACHE="$out/cache"
  device=cpu
  # a 2-layer base model pretrained for 5 steps: it earns no reward, so every group trains (no dynamic sampling)
  common=(train.device=cpu base.steps=5 base.batch_size=8 base.hidden_size=32 base.intermediate_size=64 base.num_layers=2
        base.num_heads=2 base.num_kv_heads=1 data.dynamic_sampling.mode=none reward.num_workers=0)
  job=(train.steps=2 rollout.prompts_per_step=4 rollout.n=4 train.mini_batch_size=16 rollout.max_new_tokens=16
       data.eval_size=4 eval.n=1)
  workload=(--device cpu --threads 1 train.steps=2 rollout.prompts_per_step=4 rollout.n=4 train.mini_batch_size=16
            rollout.max_new_tokens=16 data.eval_size=4)
  mfu=(--device cpu --arch tiny --batch 2 --prompt 16 --response 48 --steps 2 --warmup 1)
  resume=(train.steps=6 train.save_every=2 rollout.prompts_per_step=4 rollout.n=4 train.mini_batch_size=16
          rollout.max_new_tokens=16 data.eval_size=4 eval.n=1 eval.every=1000)
  engines=(--device cpu --batch 8 --max-new-tokens 8 --repeats 1 --runners torch hf)
  sampler=(--device cpu --rows 4 --vocab 32000 --threads 1)
  entropy=(--device cpu --positions 64 --vocab 4096 --hidden 64 --chunk-size 32 --threads 1)
else
  device=cuda
  common=(train.device=cuda)  # every run: never the CPU by accident
  # the default job, shortened: the same model, task and tricks, 6 steps, evaluated before and after
  job=(train.steps=6 eval.every=6 data.eval_size=64)
  # a real architecture with random weights: it earns no reward, so every group trains (no dynamic sampling)
  workload=(--device cuda model.path=config:qwen2.5-0.5b model.init=random data.dynamic_sampling.mode=none
            train.steps=3 rollout.max_new_tokens=256)
  mfu=(--device cuda --arch qwen2.5-1.5b --batch 8 --prompt 128 --response 896 --steps 5 --warmup 2)
  resume=(train.steps=8 train.save_every=2 data.eval_size=16 eval.n=1 eval.every=1000)
  engines=(--device cuda --dtype bfloat16 --arch qwen2.5-0.5b --batch 128 --max-new-tokens 128 --repeats 2)
  sampler=(--device cuda --rows 256)
  entropy=(--device cuda --positions 1024 4096)
fi

# ---- running a check ---------------------------------------------------------------------------------
start=$SECONDS failed=0
report() {  # report NAME STATUS KEY SECONDS
  printf '%-16s %-7s %s (%s s)\n' "$1" "$2" "$3" "$4"
  [[ $2 == FAILED ]] && failed=$((failed + 1))
  return 0
}

check() {  # check NAME LIMIT_S COMMAND...: COMMAND's output goes to $out/NAME.log; then key_NAME, whose
           # stdout is the key number and whose failure fails the check
  local name=$1 limit=$2; shift 2
  local left=$(( budget - (SECONDS - start) )) t0=$SECONDS rc=0 key
  (( limit > left )) && limit=$left
  if (( limit < 5 )); then
    report "$name" FAILED "not run: the budget of $budget s is spent" 0; return
  fi
  timeout --kill-after 10 "$limit" "$@" >"$out/$name.log" 2>&1 || rc=$?
  if (( rc == 124 || rc == 137 )); then
    report "$name" FAILED "timed out after $limit s; $out/$name.log" $((SECONDS - t0))
  elif (( rc != 0 )); then
    report "$name" FAILED "exit $rc: $(grep -v '^\s*$' "$out/$name.log" | tail -n 1 | cut -c1-160)" $((SECONDS - t0))
  elif key=$("key_$name" 2>>"$out/$name.log"); then
    report "$name" ok "$key" $((SECONDS - t0))
  else
    report "$name" FAILED "${key:-$(tail -n 1 "$out/$name.log" | cut -c1-160)}" $((SECONDS - t0))
  fi
  if (( rc != 0 )); then tail -n 8 "$out/$name.log" | sed 's/^/    | /'; fi
}

run_summary() {  # run_summary RUN_DIR: steps, step time, logprob mismatch, pass@1 before -> after, peak memory
  python3 - "$1" <<'EOF'
import json, math, statistics, sys
from pathlib import Path
run = Path(sys.argv[1])
rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
steps = [r for r in rows if "perf/step_seconds" in r]
if not steps:
    sys.exit(f"no training step in {run}/metrics.jsonl")
mismatch = [r["rollout/logprob_mismatch"] for r in steps if "rollout/logprob_mismatch" in r]
if not mismatch or not all(math.isfinite(m) for m in mismatch):
    sys.exit(f"rollout/logprob_mismatch missing or not finite: {mismatch}")
pass1 = [v for r in rows for k, v in r.items() if k.endswith("/pass@1")]
timed = steps[1:] or steps  # the first step includes warm-up
print(f"{len(steps)} steps, {statistics.mean(r['perf/step_seconds'] for r in timed):.2f} s/step, "
      f"logprob mismatch {statistics.mean(mismatch):.1e} (max {max(mismatch):.1e}), "
      f"pass@1 {pass1[0]:.3f} -> {pass1[-1]:.3f}, peak {max(r['perf/peak_memory_gb'] for r in steps):.1f} GiB")
EOF
}

# ---- the checks: each a command and the key_ function that reads its number ---------------------------
key_env() { grep '^env:' "$out/env.log" | cut -c6-; }
check env 30 python3 -c "
import platform, sys, torch, transformers
if '$device' == 'cuda' and not torch.cuda.is_available():
    sys.exit('torch sees no CUDA device')
name = torch.cuda.get_device_name(0) if '$device' == 'cuda' else 'cpu (dry run)'
print(f'env: {name}, torch {torch.__version__} (cuda {torch.version.cuda}), transformers {transformers.__version__}, '
      f'python {platform.python_version()}')"

# the carried wheels of whatever does not import; in the dry run (where everything imports) they are
# installed into a scratch folder instead and imported from there, so broken wheels show up here too
key_deps() { tail -n 1 "$out/deps.log"; }
check deps 60 python3 - "$dry" "$out/dry_site" <<'EOF'
import importlib.util, json, os, subprocess, sys
from pathlib import Path
dry, scratch = sys.argv[1] == "1", Path(sys.argv[2])
carried = [line.split()[:2] for line in Path("scripts/gpu_wheels.txt").read_text().splitlines()
           if line.strip() and not line.startswith("#")]
wheels = Path(".gpu_wheels")
def wheel(requirement):
    name, version = requirement.split("==")
    stem = name.replace("-", "_").lower() + "-" + version + "-"
    found = [w for w in wheels.glob("*.whl") if w.name.lower().startswith(stem)]
    if not found:
        sys.exit(f"{requirement} is not in {wheels}/: run scripts/gpu_wheels.sh where there is a package index")
    return str(found[0])
def imports(modules, pythonpath):  # {module: its file}, imported in a fresh interpreter
    code = "import importlib, json, sys; print(json.dumps({m: importlib.import_module(m).__file__ for m in sys.argv[1:]}))"
    done = subprocess.run([sys.executable, "-c", code, *modules], env={**os.environ, "PYTHONPATH": pythonpath},
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(done.stderr.strip().splitlines()[-1])
    return json.loads(done.stdout)
missing = [(m, r) for m, r in carried if importlib.util.find_spec(m) is None]
target = scratch if dry else Path(".gpu_site")  # .gpu_site is on the script's PYTHONPATH
todo = carried if dry and wheels.is_dir() else missing
if todo:
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--target",
                    str(target), *[wheel(r) for _, r in todo]], check=True)
    if dry:  # everything imports here anyway: import the installed copies instead
        files = imports([m for m, _ in todo], f"{target.resolve()}:{os.environ['PYTHONPATH']}")
        wrong = {m: f for m, f in files.items() if not f.startswith(str(target.resolve()))}
        if wrong:
            sys.exit(f"not imported from the installed wheels: {wrong}")
imports([m for m, _ in carried] + ["mathrl.reward", "yaml", "numpy", "safetensors", "tokenizers", "sympy"],
        os.environ["PYTHONPATH"])
if dry:
    print(f"{len(todo)} carried wheels install and import" if todo else "no .gpu_wheels/ here (scripts/gpu_wheels.sh)")
else:
    print("installed " + " ".join(r for _, r in missing) if missing else "everything imports")
EOF

key_base() { tail -n 1 "$out/base.log"; }
check base 120 python3 -m mathrl.cli base "${common[@]}"

# the default job under torchrun (FSDP2 at one rank: bf16 mixed precision and NCCL on the GPU)
key_train() { run_summary "$out/train/run"; }
check train 90 "${torchrun[@]}" --log-dir "$out/train/ranks" --tee 3 -m mathrl.train "${common[@]}" "${job[@]}" \
  --run-dir "$out/train/run"

# generate while training, disaggregated: the default job with rollout.max_staleness=1, its batches sampled
# by a generator process (the torch engine) on a device of its own: the GPUs after the trainer's by default
# (a 2-GPU machine: training on cuda:0, generation on cuda:1, weights over NCCL); on a 1-GPU machine both
# share cuda:0 and the weights go over gloo (NCCL refuses two ranks on one device); docs/async.md
key_disagg() {
  python3 - "$out/disagg/run" <<'EOF'
import json, statistics, sys
from pathlib import Path
rows = [json.loads(line) for line in (Path(sys.argv[1]) / "metrics.jsonl").read_text().splitlines() if line.strip()]
steps = [r for r in rows if "perf/step_seconds" in r]
if not steps or any("rollout/staleness_max" not in r for r in steps):
    sys.exit("no generator-sampled step (rollout/staleness_max missing)")
if max(r["rollout/staleness_max"] for r in steps) > 1:
    sys.exit(f"staleness above rollout.max_staleness=1: {[r['rollout/staleness_max'] for r in steps]}")
timed = steps[1:] or steps
print(f"{len(steps)} steps, {statistics.mean(r['perf/step_seconds'] + r['perf/wait_seconds'] for r in timed):.2f} s/step "
      f"(waiting {statistics.mean(r['perf/wait_seconds'] for r in timed):.2f}), staleness max "
      f"{max(r['rollout/staleness_max'] for r in steps):g}, mismatch KL {statistics.mean(r['rollout/mismatch_kl'] for r in steps):.1e}, "
      f"{max(r['perf/weight_sync_bytes'] for r in steps) / 2**20:.1f} MiB per weight sync")
EOF
}
check disagg 120 python3 -m mathrl.train "${common[@]}" "${job[@]}" rollout.max_staleness=1 --run-dir "$out/disagg/run"

# the update's tokens/s and MFU on a real architecture (FSDP2, bf16 compute), see benchmarks/update_mfu.py
key_update_mfu() {
  python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
mfu = f'MFU {r[\"mfu\"]:.1%} of {r[\"peak_tflops\"]:g} TFLOP/s' if r['mfu'] is not None else 'no MFU on CPU'
print(f'{r[\"arch\"]}: {r[\"tokens_per_second\"]:.0f} tokens/s, {r[\"tflops_per_second\"]:.1f} TFLOP/s, {mfu}')" \
    "$out/update_mfu.json"
}
check update_mfu 90 "${torchrun[@]}" benchmarks/update_mfu.py "${mfu[@]}" --out "$out/update_mfu.json"

# a run killed (SIGKILL of torchrun and its rank) after a checkpoint, then the same command again: it
# must resume from the last complete checkpoint and finish every step exactly once
key_resume() { tail -n 1 "$out/resume.log"; }
check resume 120 python3 - "$out/resume" "${torchrun[@]}" --log-dir "$out/resume/ranks" --tee 3 -m mathrl.train \
  "${common[@]}" "${resume[@]}" --run-dir "$out/resume/run" <<'EOF'
import json, os, signal, subprocess, sys, time
from pathlib import Path
from mathrl.train.checkpoint import complete_checkpoints
folder, cmd = Path(sys.argv[1]), sys.argv[2:]
run = folder / "run"
folder.mkdir(parents=True, exist_ok=True)
with open(folder / "killed.log", "w") as log:
    job = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
while not complete_checkpoints(run / "checkpoints"):
    if job.poll() is not None:
        sys.exit(f"the first run ended (exit {job.returncode}) before its first checkpoint; {folder}/killed.log")
    time.sleep(0.05)
def tree(pid):  # pid and its descendants: torchrun starts its ranks in sessions of their own
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        out.append(todo.pop())
        todo += children.get(out[-1], [])
    return out
for pid in tree(job.pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
job.wait()
if (run / "summary.json").exists():
    sys.exit("the first run finished before it was killed: give it more steps")
step = complete_checkpoints(run / "checkpoints")[-1][0]
print(f"killed after checkpoint {step}; running the same command again", flush=True)
with open(folder / "resumed.log", "w") as log:
    code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
text = (folder / "resumed.log").read_text()
if code != 0:
    sys.exit(f"the resumed run failed (exit {code}); {folder}/resumed.log")
if f"(step {step} of" not in text:
    sys.exit(f"the resumed run did not say it resumed at step {step}; {folder}/resumed.log")
config_steps = int(next(a for a in cmd if a.startswith("train.steps=")).split("=")[1])
logged = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "perf/step_seconds" in r]
if logged != list(range(1, config_steps + 1)):
    sys.exit(f"training rows of steps {logged}, expected 1..{config_steps} once each")
print(f"killed after checkpoint {step}, resumed at step {step + 1}, steps 1..{config_steps} logged once each")
EOF

# a real architecture (random weights) trained for a few steps, its run dir and rank logs kept
key_workload() {
  python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))['results'][0]
print(f'{r[\"step_s\"]:.2f} s/step (rollout {r[\"rollout_s\"]:.2f}, train {r[\"train_s\"]:.2f}), '
      f'logprob mismatch {r[\"logprob_mismatch\"]:.1e}, peak {r[\"peak_gb\"]:.1f} GiB')" "$out/workload.json"
}
check workload 120 python3 benchmarks/dist_scaling.py --nproc 1 --run-root "$out/workload" --out "$out/workload.json" \
  "${workload[@]}" "${common[@]}"

# rollout throughput: the torch engine vs model.generate (and vLLM where installed), same weights
key_rollout_engines() {
  python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))['results']
print(', '.join(f'{n} {v[\"tokens_per_second_median\"]:.0f} tokens/s (mean logprob {v[\"mean_token_logprob\"]:.3f})'
                for n, v in r.items()))" "$out/rollout_engines.json"
}
check rollout_engines 90 python3 benchmarks/rollout_engines.py "${engines[@]}" --out "$out/rollout_engines.json"

# one sampling call: the engine's sampler vs torch.multinomial, at the largest vocabulary
key_sampler_speed() {
  grep '^| [0-9]' "$out/sampler_speed.log" | tail -n 1 |
    awk -F'|' '{for (i = 2; i <= 6; i++) gsub(/^ +| +$/, "", $i)
                printf "vocabulary %s: torch.multinomial %s, sample_top_p %s\n", $2, $4, $6}'
}
check sampler_speed 45 python3 benchmarks/sampler_speed.py "${sampler[@]}"

# peak memory of logprobs + entropy, chunked vs the full logits
key_entropy_memory() {
  python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
rows = [r for r in d['results'] if 'peak_extra_bytes' in r]
p = max(r['positions'] for r in rows)
peak = {r['mode']: r['peak_extra_bytes'] / 2**20 for r in rows if r['positions'] == p}
if not d.get('check', {}).get('ok', False):
    sys.exit('chunked and naive logprobs disagree: ' + json.dumps(d.get('check')))
print(f'P={p}: ' + ', '.join(f'{m} {v:.0f} MiB' for m, v in peak.items()) + '; chunked == naive')" \
    "$out/entropy_memory.json"
}
check entropy_memory 60 python3 benchmarks/entropy_memory.py "${entropy[@]}" --out "$out/entropy_memory.json"

# LoRA (peft adapters, model.lora) on the default job under torchrun: FSDP2 at one rank, the reference
# as the base with the adapters disabled, the torch engine sampling the adapted model
key_lora() { run_summary "$out/lora/run"; }
check lora 90 "${torchrun[@]}" --log-dir "$out/lora/ranks" --tee 3 -m mathrl.train "${common[@]}" "${job[@]}" \
  model.lora.r=16 train.lr=1e-3 algo.kl.use=loss algo.kl.coef=0.001 --run-dir "$out/lora/run"

# vLLM on CUDA: logprobs equal the trainer's after weight syncs, sleep mode frees and restores memory
key_vllm() { grep -E '[0-9]+ (passed|failed)' "$out/vllm.log" | tail -n 1; }
if (( dry )); then
  report vllm skip "the dry run leaves vLLM to its own tests" 0
elif python3 -c "import vllm" >/dev/null 2>&1; then
  check vllm 150 python3 -m pytest -q tests/test_vllm_engine.py tests/test_vllm_resume.py
else
  report vllm skip "vLLM is not installed here (too big to carry: its wheels are gigabytes)" 0
fi

echo "$failed failed; $((SECONDS - start)) s; logs in $out"
(( failed == 0 ))
