#!/usr/bin/env bash
# The checks that need a GPU, as one script that fits 8 minutes on one GPU: the default job and a real
# architecture trained under torchrun (1 rank, FSDP2, bf16 mixed precision, NCCL) with the torch rollout
# engine, the engine-vs-trainer logprob mismatch, the update's MFU, a killed run resumed from its
# checkpoint, the memory plan against the measured peak, rollout throughput, the rollout/trainer logprob
# gap in float16 against bfloat16, the sampler, the memory of
# the chunked logprobs, a LoRA run, and generation in a process of its own sharing the trainer's GPU
# (rollout.max_staleness=1, weights over gloo).
#
#     bash scripts/gpu_wheels.sh                         # once, here: the wheels and the tiny base model
#     bash scripts/gpu_check.sh [--report DIR] [OUT_DIR] # the GPU machine
#     bash scripts/gpu_check.sh --dry-run [OUT_DIR]      # the same checks on the CPU, tiny sizes (~100 s of CPU time)
#
# The device call (the machine returns at most 8 files from $OUT, at most 2 folders down, so the run's
# own directory stays outside $OUT and --report puts two files there: gpu_check.txt, everything this
# script printed, and gpu_check.tar.gz, every check's logs, metrics and results without model weights):
#
#     command="bash scripts/gpu_check.sh --report \"$OUT\"" carry=[".gpu_wheels"] timeout_s=480
#
# Output: OUT_DIR holds each check's log (<check>.log), the run directories and torchrun's per-rank logs
# (<check>/ranks/). Default OUT_DIR: a fresh mktemp directory under ${TMPDIR:-/tmp}, outside the source
# tree. Every run starts from an empty directory: an OUT_DIR that exists and is not empty is left as it
# is, and the run goes into a fresh timestamped subdirectory of it, OUT_DIR/run-YYYYmmdd-HHMMSS (the
# first lines and the last line say where).
#
# Time: it prints one line per check (name, ok / FAILED / skip, its key number, seconds) and exits 1 if
# any check failed. Every check has a time limit; the limits sum to 440 s, under the budget that all
# checks share (--budget, default 450 s on the GPU: with the summary, under 8 minutes). A check may run
# past its own limit into the budget's slack (what the earlier checks left unused, less what the later
# ones reserve), so a slow check borrows from fast ones and never from the checks after it. A check the
# budget cannot fit any more is reported FAILED without running, as is one whose input failed (every
# check needs env; train, disagg, resume and lora need base; memory_plan needs workload). The dry
# run's budget is 540 s: it only stops a stuck check on slow shared CPUs.
#
# What the machine has: python 3.12, a CUDA torch, transformers, peft, pytest, and no internet. What it
# lacks and the deps check installs (into the ignored .gpu_site/, first on PYTHONPATH) are the
# pure-Python wheels of scripts/gpu_wheels.txt, carried there in .gpu_wheels/; .gpu_wheels/cache/ also
# carries the tiny base model (pretraining it takes minutes of CPU), copied into OUT_DIR/cache. vLLM is
# not carried (its wheels are gigabytes): the vLLM check runs only where `import vllm` works, on what the
# budget has left. Every python call is $PYTHON (default python3).
# --dry-run runs every check on the CPU (gloo instead of NCCL, float32) with tiny models, so that
# tests/project/test_gpu_check.py notices when the script, a benchmark or a config field it uses breaks.
set -uo pipefail
cd "$(dirname "$0")/.."

py=${PYTHON:-python3}
device_call='command="bash scripts/gpu_check.sh --report \"$OUT\"" carry=[".gpu_wheels"] timeout_s=480'
# each check's own time limit (s), in the order they run; vllm (only where vLLM imports) gets what is left
order=(env deps base train disagg update_mfu resume workload memory_plan rollout_engines fp16_gap sampler_speed
       entropy_memory weight_sync lora)
declare -A limit=([env]=20 [deps]=20 [base]=15 [train]=40 [disagg]=45 [update_mfu]=40 [resume]=45 [workload]=50
                  [memory_plan]=15 [rollout_engines]=35 [fp16_gap]=20 [sampler_speed]=15 [entropy_memory]=20
                  [weight_sync]=20 [lora]=40 [vllm]=0)
declare -A needs=([train]=base [disagg]=base [resume]=base [lora]=base [memory_plan]=workload)
limit_sum=0
for name in "${order[@]}"; do limit_sum=$((limit_sum + limit[$name])); done
limits_line() {  # limits_line BUDGET
  local name parts=()
  for name in "${order[@]}"; do parts+=("$name ${limit[$name]}"); done
  echo "per-check limits sum to $limit_sum s against a budget of $1 s ($(IFS=,; echo "${parts[*]}" | sed 's/,/, /g'))"
}

dry=0 budget= report_dir=
while (( $# )); do
  case $1 in
    --dry-run) dry=1; shift ;;
    --budget) budget=$2; shift 2 ;;
    --report) report_dir=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
               echo; limits_line 450; echo "device call: $device_call"; exit 0 ;;
    -*) echo "unknown option $1 (--help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
budget=${budget:-$(( dry ? 540 : 450 ))}

# a fresh output directory for every run: the one given when it is new or empty, else a new
# timestamped subdirectory of it (nothing of an earlier run is moved, reused or deleted)
if (( $# )); then
  out=$1
  if [[ -e $out && ! -d $out ]]; then echo "$out is not a directory" >&2; exit 2; fi
  if [[ -d $out && -n $(ls -A "$out") ]]; then
    stamp=$(date +%Y%m%d-%H%M%S) n=0
    sub="$out/run-$stamp"
    while [[ -e $sub ]]; do n=$((n + 1)); sub="$out/run-$stamp-$n"; done
    out=$sub
  fi
  mkdir -p "$out" || exit 2
else
  out=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX") || exit 2
fi
out=$(cd "$out" && pwd)
if [[ -n $report_dir ]]; then
  mkdir -p "$report_dir" && report_dir=$(cd "$report_dir" && pwd) || exit 2
  exec > >(tee "$report_dir/gpu_check.txt")  # everything printed, also in the report
fi

(( dry )) && echo "device call: $device_call"
limits_line "$budget"
(( limit_sum < budget )) || echo "warning: the limits do not fit the budget of $budget s: the last checks may not run"
echo "output: $out"

export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/.gpu_site${PYTHONPATH:+:$PYTHONPATH}" MATHRL_CACHE="$out/cache"
torchrun=("$py" -m torch.distributed.run --standalone --nproc_per_node 1)
if (( ! dry )) && [[ -d .gpu_wheels/cache/base ]]; then  # the carried tiny base model (scripts/gpu_wheels.sh)
  mkdir -p "$out/cache/base" && cp -r .gpu_wheels/cache/base/. "$out/cache/base/"
fi

# ---- sizes: the GPU run, or the dry run's tiny ones --------------------------------------------------
if (( dry )); then
  export CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=1
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
  engines=(--device cpu --batch 8 --max-new-tokens 8 --repeats 1 --runners torch lean hf)
  fp16=(--device cpu --batch 4 --max-new-tokens 8)
  sampler=(--device cpu --rows 4 --vocab 32000 --threads 1)
  entropy=(--device cpu --positions 64 --vocab 4096 --hidden 64 --chunk-size 32 --threads 1)
  wsync=(--device cpu --mb 16 --repeats 2)
else
  device=cuda
  common=(train.device=cuda)  # every run: never the CPU by accident
  # the default job, shortened: the same model, task and tricks, 6 steps, evaluated before and after
  job=(train.steps=6 eval.every=6 data.eval_size=64)
  # Qwen2.5-0.5B's architecture with random weights: it earns no reward, so every group trains (no dynamic
  # sampling); 16 prompts x 8 samples in one engine call of 128 new tokens, 2 steps (the second timed). Its
  # prompts are short (one token per character), so a row is ~135 tokens and each mini-batch of 64 rows
  # fills one micro-batch of train.micro_batch_tokens (8192) almost to the brim, as the memory plan assumes
  workload=(--device cuda model.path=config:qwen2.5-0.5b model.init=random data.dynamic_sampling.mode=none
            train.steps=2 rollout.batch_size=128 rollout.max_new_tokens=128)
  mfu=(--device cuda --arch qwen2.5-1.5b --batch 8 --prompt 128 --response 896 --steps 5 --warmup 2)
  resume=(train.steps=4 train.save_every=2 data.eval_size=16 eval.n=1 eval.every=1000)
  engines=(--device cuda --dtype bfloat16 --arch qwen2.5-0.5b --batch 128 --max-new-tokens 64 --repeats 2)
  fp16=(--device cuda --arch qwen2.5-0.5b --batch 64 --max-new-tokens 64)
  sampler=(--device cuda --rows 256)
  entropy=(--device cuda --positions 1024 4096)
  wsync=(--device cuda --mb 1024 --repeats 3)  # a generator sharing the trainer's one GPU: gloo through host memory
fi

# ---- running a check ---------------------------------------------------------------------------------
start=$SECONDS failed=0
declare -A status
report() {  # report NAME STATUS KEY SECONDS
  printf '%-16s %-7s %s (%s s)\n' "$1" "$2" "$3" "$4"
  status[$1]=$2
  [[ $2 == FAILED ]] && failed=$((failed + 1))
  return 0
}

reserved_after() {  # the limits of the checks that run after NAME
  local name sum=0 after=0
  for name in "${order[@]}"; do
    (( after )) && sum=$((sum + limit[$name]))
    [[ $name == "$1" ]] && after=1
  done
  echo "$sum"
}

check() {  # check NAME COMMAND...: COMMAND's output goes to $out/NAME.log; then key_NAME, whose stdout is
           # the key number and whose failure fails the check
  local name=$1; shift
  local own=${limit[$name]} left=$(( budget - (SECONDS - start) )) t0=$SECONDS rc=0 key lim
  local input=${needs[$name]:-env}  # every check needs env (torch and the GPU); some also a check before them
  if [[ $name != env && ${status[$input]:-} != ok ]]; then
    report "$name" FAILED "not run: it needs $input, which failed" 0; return
  fi
  lim=$(( left - $(reserved_after "$name") ))  # its own limit and the slack the earlier checks left
  if (( own == 0 )); then lim=$left; elif (( lim < own )); then lim=$(( own < left ? own : left )); fi
  if (( lim < 5 )); then
    report "$name" FAILED "not run: the budget of $budget s is spent" 0; return
  fi
  timeout --kill-after 10 "$lim" "$@" >"$out/$name.log" 2>&1 || rc=$?
  if (( rc == 124 || rc == 137 )); then
    report "$name" FAILED "timed out after $lim s; $out/$name.log" $((SECONDS - t0))
  elif (( rc != 0 )); then
    report "$name" FAILED "exit $rc: $(own_lines "$out/$name.log" | tail -n 1 | cut -c1-160)" $((SECONDS - t0))
  elif key=$("key_$name" 2>>"$out/$name.log"); then
    report "$name" ok "$key" $((SECONDS - t0))
  else
    report "$name" FAILED "${key:-$(tail -n 1 "$out/$name.log" | cut -c1-160)}" $((SECONDS - t0))
  fi
  if (( rc != 0 )); then own_lines "$out/$name.log" | tail -n 8 | sed 's/^/    | /'; fi
}

own_lines() {  # own_lines LOG: its non-blank lines; under torchrun the rank's own ([default0]:...), not torchrun's report
  if grep -q '^\[default[0-9]*\]:' "$1"; then
    grep '^\[default[0-9]*\]:' "$1" | grep -v '^\[default[0-9]*\]:\s*$'
  else
    grep -v '^\s*$' "$1"
  fi
}

run_summary() {  # run_summary RUN_DIR: steps, step time, logprob mismatch, pass@1 before -> after, peak memory
  "$py" - "$1" <<'EOF'
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
check env "$py" -c "
import platform, sys, torch, transformers
if '$device' == 'cuda' and not torch.cuda.is_available():
    sys.exit('torch sees no CUDA device')
name = torch.cuda.get_device_name(0) if '$device' == 'cuda' else 'cpu (dry run)'
print(f'env: {name}, torch {torch.__version__} (cuda {torch.version.cuda}), transformers {transformers.__version__}, '
      f'python {platform.python_version()}')"

# the carried wheels of whatever does not import; in the dry run (where everything imports) they are
# installed into a scratch folder instead and imported from there, so broken wheels show up here too, and
# the carried tiny base model must be the one the default config builds
key_deps() { tail -n 1 "$out/deps.log"; }
check deps "$py" - "$dry" "$out/dry_site" <<'EOF'
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
base = ""
if dry and wheels.is_dir():
    from mathrl.config import load_config
    from mathrl.model.tiny import base_model_dir
    model = base_model_dir(load_config(None, [], check_paths=False).base, cache_root=wheels / "cache")
    if not (model / "config.json").is_file():
        sys.exit(f"{wheels}/cache/base/ lacks {model.name}, the default config's tiny base model: rerun scripts/gpu_wheels.sh")
    base = f"; the carried base model is {model.name}"
if dry:
    print((f"{len(todo)} carried wheels install and import" if todo else "no .gpu_wheels/ here (scripts/gpu_wheels.sh)") + base)
else:
    print("installed " + " ".join(r for _, r in missing) if missing else "everything imports")
EOF

# the tiny base model of the default job: on the GPU machine the one carried in .gpu_wheels/cache (never
# pretrained there: that takes minutes of CPU); the dry run pretrains its tiny one
key_base() { tail -n 1 "$out/base.log"; }
check base "$py" - "$dry" "${common[@]}" <<'EOF'
import sys
from mathrl.cli import main
from mathrl.config import load_config
from mathrl.model.tiny import base_model_dir
dry, overrides = sys.argv[1] == "1", sys.argv[2:]
model = base_model_dir(load_config(None, overrides).base)
if not dry and not (model / "config.json").is_file():
    sys.exit(f"no {model.name} in .gpu_wheels/cache/base/: run scripts/gpu_wheels.sh here, then carry .gpu_wheels")
sys.exit(main(["base", *overrides]))
EOF

# the default job under torchrun (FSDP2 at one rank: bf16 mixed precision and NCCL on the GPU)
key_train() { run_summary "$out/train/run"; }
check train "${torchrun[@]}" --log-dir "$out/train/ranks" --tee 3 -m mathrl.train "${common[@]}" "${job[@]}" \
  --run-dir "$out/train/run"

# generate while training, disaggregated: the default job with rollout.max_staleness=1, its batches sampled
# by a generator process (the torch engine) on the GPUs after the trainer's by default; on a 1-GPU machine
# it shares cuda:0 with the trainer and the weights go over gloo (NCCL refuses two ranks on one device),
# which this check requires there; docs/async.md
key_disagg() {
  "$py" - "$out/disagg/run" "$out/disagg.log" "$device" <<'EOF'
import json, re, statistics, sys
from pathlib import Path
from mathrl.rollout.placement import weight_backend
run, log, device = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
started = re.search(r"generating while training: \d+ generator\(s\) \(([^;]*);", log.read_text())
if not started:
    sys.exit(f"no generator process started ({log})")
where = re.findall(r"cuda:\d+|cpu", started.group(1))
gpus = [int(w.split(":")[1]) for w in where if w.startswith("cuda:")]
if device == "cuda" and gpus != [0]:
    sys.exit(f"the generator is on {started.group(1)}, not on the trainer's GPU cuda:0")
backend = weight_backend(gpus, [0]) if gpus else "gloo"
rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
steps = [r for r in rows if "perf/step_seconds" in r]
if not steps or any("rollout/staleness_max" not in r for r in steps):
    sys.exit("no generator-sampled step (rollout/staleness_max missing)")
if max(r["rollout/staleness_max"] for r in steps) > 1:
    sys.exit(f"staleness above rollout.max_staleness=1: {[r['rollout/staleness_max'] for r in steps]}")
timed = steps[1:] or steps
print(f"generator on {', '.join(where)} (trainer {'cuda:0' if device == 'cuda' else 'cpu'}), weights over {backend}; "
      f"{len(steps)} steps, {statistics.mean(r['perf/step_seconds'] + r['perf/wait_seconds'] for r in timed):.2f} s/step "
      f"(waiting {statistics.mean(r['perf/wait_seconds'] for r in timed):.2f}), staleness max "
      f"{max(r['rollout/staleness_max'] for r in steps):g}, mismatch KL {statistics.mean(r['rollout/mismatch_kl'] for r in steps):.1e}, "
      f"{max(r['perf/weight_sync_bytes'] for r in steps) / 2**20:.1f} MiB per weight sync")
EOF
}
check disagg "$py" -m mathrl.train "${common[@]}" "${job[@]}" rollout.max_staleness=1 --run-dir "$out/disagg/run"

# the update's tokens/s and MFU on a real architecture (FSDP2, bf16 compute), see benchmarks/update_mfu.py
key_update_mfu() {
  "$py" -c "
import json, sys
r = json.load(open(sys.argv[1]))
mfu = f'MFU {r[\"mfu\"]:.1%} of {r[\"peak_tflops\"]:g} TFLOP/s' if r['mfu'] is not None else 'no MFU on CPU'
print(f'{r[\"arch\"]}: {r[\"tokens_per_second\"]:.0f} tokens/s, {r[\"tflops_per_second\"]:.1f} TFLOP/s, {mfu}')" \
    "$out/update_mfu.json"
}
check update_mfu "${torchrun[@]}" benchmarks/update_mfu.py "${mfu[@]}" --out "$out/update_mfu.json"

# a run killed (SIGKILL of torchrun and its rank) after a checkpoint, then the same command again: it
# must resume from the last complete checkpoint and finish every step exactly once
key_resume() { tail -n 1 "$out/resume.log"; }
check resume "$py" - "$out/resume" "${torchrun[@]}" --log-dir "$out/resume/ranks" --tee 3 -m mathrl.train \
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
  "$py" -c "
import json, sys
r = json.load(open(sys.argv[1]))['results'][0]
print(f'{r[\"step_s\"]:.2f} s/step (rollout {r[\"rollout_s\"]:.2f}, train {r[\"train_s\"]:.2f}), '
      f'logprob mismatch {r[\"logprob_mismatch\"]:.1e}, peak {r[\"peak_gb\"]:.2f} GiB')" "$out/workload.json"
}
check workload "$py" benchmarks/dist_scaling.py --nproc 1 --run-root "$out/workload" --out "$out/workload.json" \
  "${workload[@]}" "${common[@]}"

# the memory plan against the measured peak: `mathrl plan` on the workload's own config (the overrides
# workload.json records) against its peak, torch.cuda.max_memory_allocated of the trainer (perf/peak_memory_gb).
# The allocator does not see the plan's runtime allowance (CUDA context, NCCL buffers), so the ratio is
# measured / (plan - runtime); ok within 15% on the GPU. The dry run prints the same numbers (its peak is
# the process's peak RSS against a CPU plan) without holding them to 15%.
key_memory_plan() { tail -n 1 "$out/memory_plan.log"; }
check memory_plan "$py" - "$out/workload.json" "$device" <<'EOF'
import json, re, subprocess, sys
workload, device = json.load(open(sys.argv[1])), sys.argv[2]
measured = workload["results"][0]["peak_gb"]  # GiB (2**30), the maximum over the steps
gpu_mem = 80.0
if device == "cuda":
    import torch
    gpu_mem = torch.cuda.get_device_properties(0).total_memory / 2**30
cmd = [sys.executable, "-m", "mathrl.cli", "plan", "--gpus", "1", "--gpu-mem", f"{gpu_mem:.0f}", *workload["overrides"]]
print("$ " + " ".join(cmd), flush=True)
done = subprocess.run(cmd, capture_output=True, text=True)
print(done.stdout + done.stderr, flush=True)
peaks = {phase: float(v) for phase, v in re.findall(r"^peak while (\w+)\s+([\d.]+)", done.stdout, flags=re.M)}
if not peaks:
    sys.exit(f"mathrl plan printed no peak (exit {done.returncode})")
phase, plan = max(peaks.items(), key=lambda kv: kv[1])
runtime = re.search(r"^runtime\s+([\d.]+)", done.stdout, flags=re.M)
runtime = float(runtime.group(1)) if runtime else 0.0
ratio = measured / (plan - runtime)
what = "max_memory_allocated" if device == "cuda" else "peak RSS (CPU)"
less = f"; {plan - runtime:.2f} less its {runtime:.2f} GiB runtime allowance" if runtime else ""
line = f"plan {plan:.2f} GiB (peak while {phase}{less}), measured {what} {measured:.2f} GiB: ratio {ratio:.2f}"
if device != "cuda":
    print(line + ", not held to 15% on the CPU")
elif abs(ratio - 1) <= 0.15:
    print(line + ", within 15%")
else:
    print(line + ", off by more than 15%")
    sys.exit(1)
EOF

# rollout throughput: the torch engine (HF forward, and the lean decode loop) vs model.generate (and vLLM where installed), same weights
key_rollout_engines() {
  "$py" -c "
import json, sys
r = json.load(open(sys.argv[1]))['results']
print(', '.join(f'{n} {v[\"tokens_per_second_median\"]:.0f} tokens/s (mean logprob {v[\"mean_token_logprob\"]:.3f})'
                for n, v in r.items()))" "$out/rollout_engines.json"
}
check rollout_engines "$py" benchmarks/rollout_engines.py "${engines[@]}" --out "$out/rollout_engines.json"

# the rollout/trainer logprob gap in float16 against bfloat16 (arXiv 2510.26788): the engine samples from a
# float16 (bfloat16) copy of the weights, the trainer scores under float16 (bfloat16) autocast; the ratio of
# the two mean |logprob_rollout - logprob_trainer| over response tokens (benchmarks/precision_mismatch.py)
key_fp16_gap() {
  "$py" -c "
import json, math, sys
d = json.load(open(sys.argv[1]))
g = {k: v['mean_abs_gap'] for k, v in d['results'].items()}
if not all(math.isfinite(v) for v in [*g.values(), d['ratio']]):
    sys.exit(f'a gap is not finite: {g}')
print(f'ratio float16 / bfloat16 {d[\"ratio\"]:.3f} (mean |gap| {g[\"float16\"]:.1e} vs {g[\"bfloat16\"]:.1e})')" \
    "$out/fp16_gap.json"
}
check fp16_gap "$py" benchmarks/precision_mismatch.py "${fp16[@]}" --out "$out/fp16_gap.json"

# one sampling call: the engine's sampler vs torch.multinomial, at the largest vocabulary
key_sampler_speed() {
  grep '^| [0-9]' "$out/sampler_speed.log" | tail -n 1 |
    awk -F'|' '{for (i = 2; i <= 6; i++) gsub(/^ +| +$/, "", $i)
                printf "vocabulary %s: torch.multinomial %s, sample_top_p %s\n", $2, $4, $6}'
}
check sampler_speed "$py" benchmarks/sampler_speed.py "${sampler[@]}"

# peak memory of logprobs + entropy, chunked vs the full logits
key_entropy_memory() {
  "$py" -c "
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
check entropy_memory "$py" benchmarks/entropy_memory.py "${entropy[@]}" --out "$out/entropy_memory.json"

# one policy version from the trainer's device to a generator process: gloo through host memory (the one-GPU
# path), and through one staging bucket on the device
key_weight_sync() { grep -E '^(host|staged) ' "$out/weight_sync.log" | sed 's/ to a generator process on [a-z]*//' | paste -sd ';' -; }
check weight_sync "$py" benchmarks/weight_sync.py "${wsync[@]}" --json "$out/weight_sync.json"

# LoRA (peft adapters, model.lora) on the default job under torchrun: FSDP2 at one rank, the reference
# as the base with the adapters disabled, the torch engine sampling the adapted model
key_lora() { run_summary "$out/lora/run"; }
check lora "${torchrun[@]}" --log-dir "$out/lora/ranks" --tee 3 -m mathrl.train "${common[@]}" "${job[@]}" \
  model.lora.r=16 train.lr=1e-3 algo.kl.use=loss algo.kl.coef=0.001 --run-dir "$out/lora/run"

# vLLM on CUDA: logprobs equal the trainer's after weight syncs, sleep mode frees and restores memory
key_vllm() { grep -E '[0-9]+ (passed|failed)' "$out/vllm.log" | tail -n 1; }
if (( dry )); then
  report vllm skip "the dry run leaves vLLM to its own tests" 0
elif "$py" -c "import vllm" >/dev/null 2>&1; then
  check vllm "$py" -m pytest -q tests/rollout/test_vllm_engine.py tests/train/test_vllm_resume.py
else
  report vllm skip "vLLM is not installed here (too big to carry: its wheels are gigabytes)" 0
fi

# the report: every check's logs, metrics and results (no model weights, checkpoints or caches), one file
if [[ -n $report_dir ]]; then
  bundle() {  # bundle EXCLUDED_NAME_PATTERN
    (cd "$out" && find . -type f \( -name '*.log' -o -name '*.json' -o -name '*.jsonl' -o -name '*.yaml' \) \
       -not -path './cache/*' -not -path './dry_site/*' -not -path '*/checkpoints/*' -not -path '*/final/*' \
       -not -name "$1" -print0 | sort -z | tar --null -czf "$report_dir/gpu_check.tar.gz" -T -)
  }
  bundle ''
  if (( $(stat -c %s "$report_dir/gpu_check.tar.gz") > 15 * 2**20 )); then bundle 'rollouts*.jsonl'; fi
fi
echo "$failed failed; $((SECONDS - start)) s of a $budget s budget; logs in $out${report_dir:+; report in $report_dir}"
(( failed == 0 ))
