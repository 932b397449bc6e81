"""The config tree: every field declared once, with its type, domain, default and help side by side.

    steps: Count = knob(50, "RL steps (one rollout batch each)")
    lr: Positive[float] = knob(1e-4, "AdamW learning rate")
    mode: Literal["none", "tis", "mis"] = knob("none",
        "tis: weight min(ratio, cap) (Yao et al. 2025); mis: drop ratio > cap (Liu, Li et al. 2025)")
    kl: KLConfig = section(KLConfig, "KL to the reference model")

The type is what a recipe or override must give (`Literal` choices, int/float/bool/str, optional,
lists); the domain (`typing.Annotated` metadata: `Count` is `Annotated[int, at_least(1)]`, see
mathrl/config/schema.py) is what the value must be, checked before anything loads; the help (the
field's metadata, given by `knob` or `section`; a long one wrapped over several lines) is the doc
`mathrl config` prints, and a section without help is documented by its docstring. A list default is
copied for each config. The defaults ARE the embedded default experiment (`recipes/arith_grpo.yaml`
spells them out). Derived sizes are properties of `Config`; `validate` and the rules that tie fields
together are methods it inherits from rules.py (`ConfigRules`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from mathrl.config.rules import ConfigRules
from mathrl.config.schema import (
    INF,
    Count,
    Finite,
    NonNeg,
    Positive,
    Range,
    Registered,
    Rule,
    Seed,
    Text,
    ZeroToOne,
    at_least,
    knob,
    positive,
    section,
    unit,
)
from mathrl.config.shared import DEFAULT_REWARD_FN, TINY_BASE
from mathrl.registry import ADVANTAGE_ESTIMATORS, ARITH_SOURCES, ENGINES, POLICY_LOSSES, PROMPT_TEMPLATES, TOOL_FORMATS

# --------------------------------------------------------------------------------------------------
# domains shared by several fields, or too long for the field's line
# --------------------------------------------------------------------------------------------------
Digits = Annotated[int, Range(1, 18)]  # operand sizes of arithmetic problems
Carries = Annotated[int, Range(0, 18, why="at most data.arith.max_digits")]
Positions = Annotated[int, at_least(2)]  # a context length in tokens


def _names_ok(value: Any) -> bool:
    return bool(value) and all(isinstance(s, str) and s.strip() for s in value)


MODULE_NAMES = Rule(_names_ok, "a non-empty list of module names")
EVAL_SOURCES = Rule(_names_ok, "a non-empty list of sources (arith, arith_decimal, arith_hard, files, hf: datasets)")
TEMPLATE = Rule(lambda v: v == "chat" or v in PROMPT_TEMPLATES.names() or "{question}" in str(v),
                "arith, zero, plain, chat, or a string containing {question}")
SAMPLING_TEMPERATURE = positive(
    "training samples from the policy: at 0 (greedy) every sample of a group is the same, its advantages are 0, "
    "and the sampling logprobs the loss needs are undefined; eval.temperature=0 is allowed")
METRIC_NAME = Rule(lambda v: isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9_-]+", v) is not None,
                   "letters, digits, _ or - (it names the metrics reward/<name>/...)")
LENGTH_SCHEDULE = Rule(lambda v: all(isinstance(p, list) and len(p) == 2 and p[0] >= 0 and p[1] >= 1 for p in v),
                       "a list of [step >= 0, target_length >= 1] pairs")
RATIO_WINDOW = Rule(lambda v: len(v) == 2 and all(math.isfinite(x) for x in v) and 0 < v[0] <= 1 <= v[1],
                    "[lower, upper] with 0 < lower <= 1 <= upper (a ratio pi_trainer / pi_rollout of 1 is on-policy and is kept)")
DISTINCT = Rule(lambda v: len(set(v)) == len(v), "a list without repeats")
DUAL_CLIP = Range(1, open_low=True, why="the dual-clip bound sits above the ratio clip")
LOWER_RATIO = unit(open_low=True, open_high=True, why="a ratio of 1 is on-policy; 0.5 is IcePop's")
TOKEN_SHARE = unit(open_low=True, why="the share of tokens kept; 0.2 is the paper's")
GRAD_NORM = positive("gradients are clipped to this norm; a negative limit flips their sign")
WRONG_ANSWER = Range(-INF, 1, open_high=True, why="a wrong answer must score below a right one (1)")
STALENESS = at_least(0, "policy versions between the sampling weights and the trainer's")


# --------------------------------------------------------------------------------------------------
# the tree
# --------------------------------------------------------------------------------------------------
@dataclass
class BaseModelConfig:
    """Recipe of the tiny base model built when `model.path` is `tiny-arith` (cached by its hash)."""

    seed: Seed = knob(0, "seed of the weights and the pretraining text")
    min_digits: Digits = knob(1, "operand sizes in the pretraining problems")
    max_digits: Digits = knob(3, "(min_digits <= max_digits)")
    hidden_size: Count = knob(128, "model width (a multiple of num_heads)")
    intermediate_size: Count = knob(384, "MLP width")
    num_layers: Count = knob(4, "transformer layers")
    num_heads: Count = knob(4, "attention heads (a multiple of num_kv_heads)")
    num_kv_heads: Count = knob(2, "key/value heads (grouped-query attention)")
    max_positions: Positions = knob(128, "context length in tokens (prompt + response must fit)")
    steps: NonNeg[int] = knob(800, "pretraining optimizer steps")
    batch_size: Count = knob(32, "pretraining sequences per step")
    lr: Positive[float] = knob(3e-3, "pretraining learning rate")
    warmup_steps: NonNeg[int] = knob(30, "linear warm-up steps of the pretraining")
    slip_prob: ZeroToOne = knob(0.3, "per-column chance of a deliberate slip in the pretraining text")
    check_prob: ZeroToOne = knob(0.0,
        'per-column chance of a self-check ("?" and the column recomputed) in the pretraining text')
    decimal_share: ZeroToOne = knob(0.0,
        "share of pretraining problems with one-decimal-place operands (2.5+13.7); part of the cache key only when > 0")
    tool_share: ZeroToOne = knob(0.0,
        "share of pretraining solutions written as python tool calls "
        "(recipes/arith_tools.yaml); part of the cache key only when > 0")
    mul_share: ZeroToOne = knob(0.0,
        "share of pretraining problems that are products a*b, solved by long multiplication "
        "(recipes/arith_tools_mul.yaml); with mul_digits, part of the cache key only when > 0")
    mul_digits: Digits = knob(2, "digits of a pretraining product's second factor (the first: min_digits..max_digits)")


@dataclass
class LoraConfig:
    """LoRA adapters (peft): the base weights stay frozen and only the low-rank matrices A and B of the
    targeted linear layers train; the KL reference is the base with the adapters disabled. docs/lora.md."""

    r: NonNeg[int] = knob(0, "adapter rank; 0: no adapters, the whole model trains")
    alpha: Positive[float] = knob(32.0, "scaling numerator: the update is (alpha / r) * B @ A")
    dropout: Annotated[float, unit(open_high=True)] = knob(0.0,
        "dropout on the adapters' input during the policy update (scoring and sampling run without it)")
    target_modules: Annotated[list[str], MODULE_NAMES] = knob(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "names of the linear layers that get adapters (peft's target_modules)")


@dataclass
class ModelConfig:
    path: Text = knob(TINY_BASE, '"tiny-arith" (built locally from `base`) or a Hugging Face model directory / hub id')
    dtype: Literal["float32", "bfloat16", "float16"] = knob("float32",
        "weights and compute precision; float16: float32 master weights, float16 "
        "autocast, a dynamic loss scaler and float16 rollouts (docs/guide.md, Precision)")
    logprob_chunk_size: Count = knob(1024, "positions per chunk when computing logprobs and entropy")
    gradient_checkpointing: bool = knob(False, "recompute activations in the backward pass (less memory, more time)")
    max_position_embeddings: Positions | None = knob(None,
        "raise (or lower) the model's context, config.json's max_position_embeddings, "
        "for the trainer and vLLM alike; null: the model's own")
    init: Literal["pretrained", "random"] = knob("pretrained",
        "random: path config:<name> (model/configs/*.json, or config:<file>.json) "
        "with random weights and the character tokenizer (benchmarks, smoke tests)")
    lora: LoraConfig = section(LoraConfig, "train low-rank adapters instead of the whole model")


@dataclass
class ArithConfig:
    min_digits: Digits = knob(1, "operand sizes of the arithmetic problems")
    max_digits: Digits = knob(3, "(min_digits <= max_digits)")
    heldout_permille: Annotated[int, Range(1, 999)] = knob(50,
        "share of the problem space reserved for evaluation (1/1000)")
    decimal_share: ZeroToOne = knob(0.0,
        r"share of problems with one-decimal-place operands (2.5+13.7=...\boxed{16.2}), in the "
        "training stream and the arith eval set; the base model learns them with base.decimal_share")
    mul_share: ZeroToOne = knob(0.0,
        "share of problems that are products a*b (long multiplication; decimal_share must be 0), in "
        "the training stream and the arith eval set; the base model learns them with base.mul_share")
    mul_digits: Digits = knob(2, "digits of a product's second factor (the first: min_digits..max_digits)")
    min_carries: Carries = knob(0,
        "training stream: only problems whose column addition carries "
        "at least this often (0: every problem; at most max_digits)")
    hard_min_carries: Carries = knob(2,
        "the eval source arith_hard: held-out problems with at least this many carries (at most max_digits)")


@dataclass
class DynamicSamplingConfig:
    """Which groups reach the loss (DAPO dynamic sampling), and refilling the batch when groups are dropped."""

    mode: Literal["none", "nonconstant", "band"] = knob("nonconstant",
        "nonconstant: drop all-equal groups; band: keep accuracy in [low, high]; none: every group trains")
    band_low: ZeroToOne = knob(0.2, "mode=band: keep groups whose accuracy is >= band_low")
    band_high: ZeroToOne = knob(0.8, "... and <= band_high")
    max_rounds: Count = knob(4, "generation rounds per step to fill the batch with kept groups")
    on_exhausted: Literal["train_smaller", "error"] = knob("train_smaller", "when max_rounds cannot fill the batch")
    max_empty_steps: NonNeg[int] = knob(5,
        "stop after this many steps in a row with no group kept (every sample "
        "wrong, or right), explaining why; 0: never. With mode none: a warning")


@dataclass
class CurriculumConfig:
    mode: Literal["none", "field", "online"] = knob("none", "order training problems easiest-first (jsonl data)")
    field: str = knob("level", "the problem field holding the difficulty, for mode=field")


@dataclass
class DataConfig:
    train: Text = knob("arith",
        '"arith" (generated), a .jsonl or .parquet file, or hf:<name>[:<config>][@<split>] (split default train)')
    eval: Annotated[list[str], EVAL_SOURCES] = knob(["arith"],
        '"arith" (held-out split; arith_decimal: its decimal problems only, arith_hard: those with '
        ">= data.arith.hard_min_carries carries) and/or files / hf: datasets (split default test)")
    question_field: Text = knob("problem", "field mapping for data files (a known file or hf: dataset uses its preset)")
    answer_field: str | None = knob("answer", "field holding the gold answer (null with answer_from_solution)")
    answer_from_solution: str | None = knob(None, r"take the gold answer from the last \boxed{} of this field")
    answer_after: str | None = knob(None,
        'the gold answer is the text after this marker in the answer field (GSM8K: "####")')
    question_suffix: str = knob("",
        "appended to every question (after a space) before the template; DeepScaleR: "
        "\"Let's think step by step and output the final answer within \\\\boxed{}.\"")
    template: Annotated[str, TEMPLATE] = knob("arith",
        "prompt template: arith | zero | plain | chat | a string containing {question}")
    max_prompt_tokens: Count = knob(512, "longer prompts are dropped (counted), never truncated")
    eval_size: Count = knob(200, "problems per eval set (held-out arithmetic problems, or the first N rows)")
    on_error: Literal["raise", "skip"] = knob("raise",
        "a malformed jsonl row: stop naming file:line, or skip and count it")
    transform: Literal["none", "integer_answer"] = knob("none",
        "DAPO integer-answer rewrite of the training problems (data.train=arith: "
        "with data.arith.decimal_share > 0, decimal answers are dropped and redrawn)")
    sample_filter: list[str] = knob([],
        "drop samples that are: repetitive, garbled, no_answer, void_turn (a tool "
        "episode whose last turn has neither a call nor an answer; SimpleTIR)")
    dynamic_sampling: DynamicSamplingConfig = section(DynamicSamplingConfig)
    curriculum: CurriculumConfig = section(CurriculumConfig, "the order of the training problems")
    arith: ArithConfig = section(ArithConfig, "the built-in arithmetic task")


@dataclass
class VLLMConfig:
    """The vLLM rollout engine (rollout.engine: vllm): one colocated, in-process engine per training process,
    weights synced in memory after every update. Install: docs/guide.md, "Rollouts with vLLM"."""

    gpu_memory_utilization: Annotated[float, unit(open_low=True, why="a share of the GPU's memory")] = knob(0.5,
        "share of GPU memory vLLM may take (weights, activations, KV cache); the trainer needs the rest")
    kv_cache_gb: Annotated[float, positive("null lets vLLM size it")] | None = knob(None,
        "KV cache size in GiB, overriding gpu_memory_utilization; null: vLLM sizes it on a GPU, 1 GiB on a CPU")
    max_model_len: Positions | None = knob(None,
        "longest prompt + response in tokens; null: the model's context (max_position_embeddings)")
    tensor_parallel_size: Count = knob(1, "GPUs one engine shards the model over (the colocated engine supports 1)")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = knob("auto",
        "vLLM's weights and compute; auto: model.dtype")
    enforce_eager: bool | None = knob(None,
        "no CUDA graphs / compilation (slower decoding, faster start); null: eager "
        "on CPUs (compiling costs ~40 s there for little gain), compiled on GPUs")
    enable_sleep_mode: bool = knob(False,
        "GPU only: free the KV cache during the policy update, wake before generating")
    sleep_level: Literal[1, 2] = knob(1,
        "1: weights moved to host memory while asleep and copied back on waking; 2: dropped, no copy "
        "either way (every update is followed by a sync that overwrites them: the recipes use 2)")
    enable_prefix_caching: bool = knob(True, "the n samples of a prompt share its KV blocks")
    max_num_seqs: Count | None = knob(None, "sequences decoded together; null: vLLM's default")
    max_num_batched_tokens: Count | None = knob(None, "tokens per scheduler step; null: vLLM's default")


@dataclass
class GeneratorConfig:
    """The generator processes that sample while the trainer trains (train/generator.py, docs/async.md): each
    runs its own engine on its own cores (CPU) or GPU and receives every needed policy version over a
    torch.distributed group (gloo; NCCL between distinct GPUs), in buckets, never through disk."""

    workers: NonNeg[int] | None = knob(None,
        "generator processes; null: 1 when rollout.max_staleness >= 1, else 0 (the engine "
        "samples inside the trainer's process). With max_staleness=0 and workers >= 1 the "
        "workers sample the current weights (on-policy, disaggregated, no overlap)")
    threads: NonNeg[int] = knob(0,
        "torch threads of each generator; 0: the cores this process may use, "
        "split evenly between the trainer and the generators (one each on 2 cores)")
    pin_cores: bool = knob(True,
        "bind the trainer and each generator to cores of their "
        "own (os.sched_setaffinity) when there are enough for all")
    devices: Annotated[list[int], at_least(0, "CUDA device indices")] = knob([],
        "CUDA devices of the generators (worker i takes devices[i % len]); empty: the GPUs after "
        "the trainer's ranks when the machine has any left, else the trainer's own GPU (shared)")
    bucket_mb: Positive[float] = knob(256.0,
        "size of one weight-broadcast bucket in MiB (tensors of one dtype flattened together)")


@dataclass
class ToolConfig:
    """One tool the model may call inside its reasoning (docs/tools.md). Its fields are checked by
    `rules.tool_entry_problems`, which tools.ToolPool shares for the specs it is given in code, rather
    than by domains on the fields."""

    name: str = knob("python",
        "the name the model calls it by (python_blocks: code blocks go to the tool named `python`)")
    fn: str = knob("python",
        "a built-in (python: sandboxed code, calculator: exact arithmetic) or "
        '"package.module:function" / "path/file.py:function" taking (args, **kwargs) -> str')
    kwargs: dict[str, Any] = knob({}, "keyword arguments of the function (python: sandbox, cpu_s, memory_mb, ...)")
    timeout_s: float = knob(5.0,
        "wall-clock seconds per call; a call over it is killed and gives a timeout observation")
    description: str = knob("", "chat_tool_call: the description in the tool's schema")


@dataclass
class ToolTagsConfig:
    """The text around a call and an observation; null keeps the tool format's own (docs/tools.md)."""

    call_open: str | None = knob(None, r'the model opens a call with this (python_blocks: "```python\n")')
    call_close: str | None = knob(None,
        r'... and closes it with this; generation stops here and the tool runs (python_blocks: "```\n")')
    observation_open: str | None = knob(None,
        r'the observation appended after a call starts with this (python_blocks: "```output\n")')
    observation_close: str | None = knob(None, r'... and ends with this (python_blocks: "```\n")')


@dataclass
class RolloutConfig:
    engine: Annotated[str, Registered(ENGINES)] = knob("torch",
        "a registered rollout engine (rollout/factory.py): torch (KV cache, any device) or vllm")
    prompts_per_step: Count = knob(16, "problems per rollout batch")
    n: Count = knob(8, "samples per problem (the GRPO group size)")
    temperature: Annotated[float, SAMPLING_TEMPERATURE] = knob(1.0,
        "sampling temperature (> 0: training samples from the policy)")
    top_p: Annotated[float, unit(open_low=True)] = knob(1.0,
        "nucleus sampling: keep the most likely tokens holding this much probability")
    max_new_tokens: Count = knob(48, "maximum response length in tokens")
    batch_size: Count = knob(512,
        "sequences decoded together by the torch engine; each such shard is seeded on its own, "
        "so 1 and N ranks draw the same samples when every rank's share is a multiple of it")
    draws: Literal["chunk", "row"] = knob("chunk",
        "the torch engine's random numbers: chunk = one generator per rollout.batch_size rows, "
        "so a row's draws depend on the other rows of its chunk; row = a stream per row, "
        "indexed by response column, so a row's tokens depend on (seed, row) alone, whatever "
        "the other rows do (tool calls included) and whatever the batch size (docs/tools.md)")
    decode: Literal["hf", "lean"] = knob("lean",
        "the torch engine's forward at each token: lean = rollout/lean.py's over a preallocated cache (Qwen2 "
        "and Llama models; any other keeps hf, with one log line); hf = the Hugging Face model's, with its "
        "KV cache, whose samples differ only where float rounding flips a draw (docs/performance.md)")
    vllm: VLLMConfig = section(VLLMConfig, "settings of the vllm engine")
    max_staleness: Annotated[int, STALENESS] = knob(0,
        "generate while training: 0 = the synchronous loop (generate, then train); "
        "k >= 1 = generator processes sample ahead and step t trains on samples of "
        "a policy at most k versions older than the trainer's (docs/async.md)")
    async_mode: Literal["fixed_lag", "free"] = knob("fixed_lag",
        "with max_staleness k >= 1: fixed_lag = step t trains on samples of version exactly "
        "max(0, t-1-k) (reproducible, resumes step for step); free = the freshest version the "
        "generator holds when it starts the step, never older than t-1-k (not reproducible)")
    generator: GeneratorConfig = section(GeneratorConfig,
        "the generator processes (placement, threads, weight buckets)")
    tools: list[ToolConfig] = knob([], "tools the model may call; empty: single-turn responses (docs/tools.md)")
    tool_format: Annotated[str, Registered(TOOL_FORMATS)] = knob("python_blocks",
        "a registered call format: python_blocks (Qwen2.5-Math / ToRL code and output "
        "blocks) or chat_tool_call (the chat template's <tool_call>{json}</tool_call>)")
    tool_tags: ToolTagsConfig = section(ToolTagsConfig, "override the format's call and observation tags")
    max_turns: Count = knob(4, "model turns per episode (a turn ends at a tool call or at the end of the response)")
    max_tool_calls: NonNeg[int] = knob(3,
        "tool calls run per episode; a call past it gets an observation saying so, and is not run")
    observation_max_tokens: Count = knob(32,
        "longer observations are cut in the middle, with a note saying "
        "how much was cut; at least 30, the note's room (docs/tools.md)")
    tool_workers: Count = knob(4, "tool calls run in parallel")
    tool_delay_steps: NonNeg[int] = knob(1,
        "torch engine: decode steps from a call's closing token to reading its output (the call runs while the "
        "other rows decode; the row feeds the observation's opening tag, then masked padding); 0 = the output "
        "is fed with the closing token in one window forward that waits for the step's calls (docs/tools.md)")


@dataclass
class ClipConfig:
    eps_low: ZeroToOne = knob(0.2, "ratio clipped below at 1 - eps_low (1.0: no lower bound, as CISPO)")
    eps_high: NonNeg[float] = knob(0.28, "ratio clipped above at 1 + eps_high (clip-higher, DAPO section 3.1)")
    dual_clip_c: Annotated[float, DUAL_CLIP] | None = knob(None,
        "dual clip bound for negative advantages (Ye et al. 2020); None = off")


@dataclass
class AdvConfig:
    estimator: Annotated[str, Registered(ADVANTAGE_ESTIMATORS)] = knob("grpo",
        "a registered advantage estimator (algo/estimators.py): grpo, rloo, reinforce_pp, gae (PPO with a learned "
        "critic, algo.critic), grpo_passk, reinforce_pp_baseline, opo, gpg, maxrl, or gdpo (docs/tricks.md)")
    std_normalize: bool = knob(True,
        "divide by the reward std (GRPO; also grpo_passk and gdpo's per-component normalisation); False is Dr. GRPO")
    std_scope: Literal["group", "batch"] = knob("group",
        "the std that normalises: per group or over the batch (grpo, grpo_passk, gdpo)")
    gpg_alpha: Literal["valid_groups", "nonzero_rewards", "none"] = knob("valid_groups",
        "gpg's scale alpha: valid_groups = N / (N - M), M the samples of all-equal groups "
        "(GPG paper and code); nonzero_rewards = N / #(reward != 0) (verl); none = 1")
    gdpo_whiten: bool = knob(True,
        "gdpo's last step (GDPO paper, verl): whiten the summed advantage "
        "over the batch's counted tokens; False keeps the decoupled sum")


@dataclass
class CriticConfig:
    """PPO with a learned critic (algo.adv.estimator: gae): GAE, VC-PPO value pretraining and decoupled
    lambdas, VAPO length-adaptive lambda."""

    path: str | None = knob(None, "critic initialisation (a causal LM or a saved critic); default: the starting policy")
    lr: Positive[float] | None = knob(None, "critic learning rate; default: train.lr")
    gamma: Annotated[float, unit(open_low=True)] = knob(1.0, "discount")
    lam_actor: ZeroToOne = knob(0.95, "GAE lambda of the policy advantages")
    lam_critic: ZeroToOne = knob(1.0, "GAE lambda of the value targets (decoupled GAE, VC-PPO: 1.0)")
    length_adaptive_alpha: Annotated[float, positive("VAPO uses 0.05; null is off")] | None = knob(None,
        "VAPO: lam_actor = 1 - 1/(alpha * length) per response (0.05); None = off")
    value_clip: Annotated[float, positive("null is off")] | None = knob(0.2,
        "clip range of the value loss around the sampling-time values; None = off")
    pretrain_steps: NonNeg[int] = knob(0,
        "VC-PPO value pretraining: critic-only steps on the starting policy's rollouts (lambda 1)")
    whiten_advantages: bool = knob(True, "normalise the policy advantages over the batch's tokens (PPO practice)")


@dataclass
class RefGainClipConfig:
    """ref_gain_clip: no entropy bonus on tokens whose entropy already exceeds the reference model's."""

    max_gain: Finite | None = knob(None, "mask tokens with entropy - ref_entropy > max_gain (nats); None = off")
    max_ratio: Positive[float] | None = knob(None, "mask tokens with entropy > max_ratio * ref_entropy; None = off")


@dataclass
class EntropyConfig:
    mode: Literal["none", "fixed", "adaptive", "skywork"] = knob("none",
        "entropy bonus: off, fixed coef, or a controller")
    coef: NonNeg[float] = knob(0.0, "the fixed coefficient, or the starting coefficient of a controller")
    target: NonNeg[float] = knob(0.2, "target token entropy (nats) of the adaptive and skywork controllers")
    kp: NonNeg[float] = knob(0.01, "adaptive: coef += kp * (target - entropy) each step")
    step: NonNeg[float] = knob(0.0005, "skywork: coef moves by this much toward the target each step")
    min_coef: NonNeg[float] = knob(0.0, "the controllers keep coef within [min_coef, max_coef]")
    max_coef: NonNeg[float] = knob(0.05, "upper bound of the controlled coefficient")
    ref_gain_clip: RefGainClipConfig = section(RefGainClipConfig)


@dataclass
class KLConfig:
    use: Literal["none", "loss", "reward"] = knob("none",
        "KL to the reference model as a loss term or a reward penalty")
    estimator: Literal["k1", "k2", "k3"] = knob("k3",
        "KL estimator (Schulman 2020): k1 log-ratio, k2 squared, k3 unbiased low-variance")
    coef: NonNeg[float] = knob(0.001, "fixed coefficient, or the starting one when `target` is set")
    target: Annotated[float, positive("null is a fixed coefficient")] | None = knob(None,
        "adaptive controller (Ziegler et al. 2019): target per-token KL; None = fixed")
    horizon: Count = knob(10000, "adaptive controller horizon, in samples")


@dataclass
class PTXConfig:
    coef: NonNeg[float] = knob(0.0, "weight of the pretraining cross-entropy mixed into each optimizer step (0 = off)")
    data: Text = knob("arith",
        "\"arith\" (the tiny base model's pretraining text) or a .txt / .jsonl (\"text\" field) file")
    batch_size: Count = knob(16, "pretraining sequences per optimizer step")
    max_tokens: Positions = knob(256, "longer pretraining texts are cut to this many tokens")


@dataclass
class PosLMConfig:
    coef: NonNeg[float] = knob(0.0, "VAPO positive-example LM loss weight mu (0.1 in the paper; 0 = off)")


@dataclass
class RolloutCorrectionConfig:
    """Importance weights and rejection rules between the rollout engine's and the trainer's logprobs, or the
    bypass of the trainer's (algo.rollout_correction; docs/tricks.md, "Rollout/trainer mismatch")."""

    mode: Literal["none", "tis", "mis"] = knob("none",
        "tis: weight min(ratio, cap) (Yao et al. 2025); mis: drop ratio > cap (Liu, Li et al. 2025)")
    level: Literal["token", "sequence"] = knob("token", "ratio per token, or of the whole response")
    cap: Annotated[float, Range(1, open_low=True, why="a ratio of 1 is on-policy; 2.0 is common")] = knob(2.0,
        "C > 1: the truncation (tis) or rejection (mis) threshold of the ratio pi_trainer / pi_rollout")
    lower: Annotated[float, LOWER_RATIO] | None = knob(None,
        "L in (0, 1): tokens whose ratio is under it are rejected too (a "
        "two-sided bound: verl's 1/C, IcePop 0.5); null = no lower bound")
    rejected: Literal["zero", "drop"] = knob("zero",
        "a rejected token: zero = a zero term that stays in the loss normalisers "
        "(AReaL); drop = out of the loss mask and the normalisers (verl)")
    masks: Annotated[list[Literal["geo_rs", "icepop", "k3_rs", "k2_rs", "opsm"]], DISTINCT] = knob([],
        "rejection rules, chained (a token is kept only if every listed rule keeps "
        "it; rejected tokens follow `rejected`): geo_rs, icepop, k3_rs, k2_rs compare "
        "pi_trainer with pi_rollout, opsm also reads the advantages (docs/tricks.md)")
    geo_rs_bounds: Annotated[list[float], RATIO_WINDOW] = knob([0.999, 1.001],
        "geo_rs: a response is kept when the geometric mean of its ratios pi_trainer "
        "/ pi_rollout is in [lower, upper] (verl's decoupled_geo_rs preset)")
    icepop_bounds: Annotated[list[float], RATIO_WINDOW] = knob([0.5, 2.0],
        "icepop: a token is kept when its ratio pi_trainer / pi_rollout is in [lower, upper] (IcePop's [0.5, 2])")
    k3_rs_threshold: Annotated[float, positive("a KL estimate in nats per token; 0.01 is verl's")] = knob(0.01,
        "k3_rs: a response is rejected when its mean k3 estimate of "
        "KL(pi_rollout || pi_trainer) is above it (verl's decoupled_k3_rs preset)")
    k2_rs_threshold: Annotated[float, positive("a KL estimate in nats per token")] = knob(0.01,
        "k2_rs: the same with k2 = (log ratio)^2 / 2")
    opsm_delta: Annotated[float, positive("the mean log-ratio of an on-policy response is 0")] = knob(0.5,
        "opsm (DeepSeek-V3.2): a response with negative advantage is rejected when "
        "its mean log(pi_rollout / pi_trainer) is above it (TRL's suggested start)")
    bypass: bool = knob(False,
        "the PPO ratio against the rollout engine's logprobs: old logprobs := rollout logprobs, no scoring "
        "pass (verl's bypass_mode); then nothing can weigh the gap (mode none, no masks, off_policy none)")


@dataclass
class SAPOConfig:
    """SAPO's soft gate (algo.policy_loss=sapo; Gao et al. 2025): sigmoid(tau (ratio - 1)) * 4 / tau."""

    tau_pos: Positive[float] = knob(1.0, "the gate's temperature where the advantage is > 0 (the paper's 1.0)")
    tau_neg: Positive[float] = knob(1.05,
        "... where it is <= 0 (the paper's 1.05: negative tokens' gates fall off faster)")


@dataclass
class DPPOConfig:
    """DPPO's trust region on the probability (algo.policy_loss=dppo_tv or dppo_kl; arXiv 2602.04879)."""

    delta_low: Positive[float] = knob(0.2,
        "the divergence bound where the advantage is < 0 (dppo_tv: p_old - p; dppo_kl: the binary KL)")
    delta_high: Positive[float] = knob(0.2, "... where it is > 0 (dppo_tv: p - p_old)")
    trunc_c: Annotated[float, Range(1, open_low=True, why="a truncation below 1 would cut on-policy tokens")] = knob(
        20.0, "the stopped importance weight is min(ratio, trunc_c) (the paper's §5.4: large)")


@dataclass
class CovConfig:
    """Clip-Cov and KL-Cov (algo.policy_loss=clip_cov or kl_cov; Cui et al. 2025): the few tokens of high
    covariance between logp and the advantage."""

    ratio: Annotated[float, unit(open_low=True, why="the share of counted tokens picked")] = knob(2e-4,
        "share of a micro-batch's counted tokens picked (at least "
        "one): clip_cov cuts their gradient, kl_cov penalises them")
    lb: Finite = knob(1.0, "clip_cov: only tokens with covariance in (lb, ub) can be picked")
    ub: Finite = knob(5.0, "clip_cov: the upper bound of that range")
    kl_coef: NonNeg[float] = knob(0.1, "kl_cov: coefficient of |log ratio| on the picked tokens (verl's ppo_kl_coef)")


@dataclass
class DROConfig:
    beta: Annotated[float, positive("the quadratic penalty's weight; dro needs one")] | None = knob(None,
        "algo.policy_loss=dro: the loss adds beta/2 (log ratio)^2 per token; required by dro")


@dataclass(frozen=True)
class Correction:
    """The resolved importance weighting of the policy-gradient term (Config.correction)."""

    mode: str  # tis | mis (algo/rollout_correction.py)
    level: str  # token | sequence
    cap: float
    lower: float | None
    rejected: str  # zero | drop


@dataclass
class AlgoConfig:
    policy_loss: Annotated[str, Registered(POLICY_LOSSES)] = knob("ppo_clip",
        "a registered policy loss (algo/policy_losses.py): ppo_clip, gspo, gspo_token, "
        "cispo, sapo, geo_mean, dppo_tv, dppo_kl, clip_cov, kl_cov, gpg, dro (docs/tricks.md)")
    clip: ClipConfig = section(ClipConfig,
        "PPO ratio clipping (also gspo, cispo, geo_mean's log-space bounds, clip_cov)")
    sapo: SAPOConfig = section(SAPOConfig, "algo.policy_loss=sapo")
    dppo: DPPOConfig = section(DPPOConfig, "algo.policy_loss=dppo_tv / dppo_kl")
    cov: CovConfig = section(CovConfig, "algo.policy_loss=clip_cov / kl_cov")
    dro: DROConfig = section(DROConfig, "algo.policy_loss=dro")
    top_entropy_quantile: Annotated[float, TOKEN_SHARE] | None = knob(None,
        "80/20 forking tokens (Wang et al. 2025): the policy gradient only on the "
        "step's tokens whose old-policy entropy is in this top share; null = every token")
    adv: AdvConfig = section(AdvConfig, "advantage estimator")
    critic: CriticConfig = section(CriticConfig)
    entropy: EntropyConfig = section(EntropyConfig, "entropy bonus and its controllers")
    kl: KLConfig = section(KLConfig, "KL to the reference model")
    ptx: PTXConfig = section(PTXConfig, "pretraining loss mixed in (InstructGPT PPO-ptx)")
    pos_lm: PosLMConfig = section(PosLMConfig, "LM loss on correct responses (VAPO)")
    rollout_correction: RolloutCorrectionConfig = section(RolloutCorrectionConfig,
        "rollout/trainer mismatch (TIS, MIS)")
    off_policy: Literal["none", "tis", "decoupled"] = knob("none",
        "samples generated by older weights: tis = the PPO ratio against the trainer's logprobs before "
        "this step's update, weighted by min(pi_trainer / pi_behaviour, cap); decoupled = AReaL's "
        "decoupled PPO, the clip around that proximal policy and the behaviour -> proximal weight, "
        "rejected outside [lower, cap]. Both take cap, lower and rejected from algo.rollout_correction")
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"] = knob(
        "token_mean", "how token losses are averaged (docs/tricks.md)")


@dataclass
class DistConfig:
    """Data-parallel training under torchrun (train/dist.py); ignored in a single process."""

    timeout_s: Annotated[float, positive("seconds a collective may wait for the other ranks")] = knob(1800.0,
        "collective timeout: a rank that died or hangs stops the job after this long (covers rank 0's evaluations)")
    mixed_precision: bool = knob(True,
        "on CUDA: FSDP2 bf16 parameters in forward/backward, fp32 gradient reduction "
        "(CPU runs in model.dtype); model.dtype=float16 always casts to fp16 instead")
    cpu_offload: bool = knob(False, "FSDP2 keeps the sharded parameters, gradients and optimizer state in CPU memory")


@dataclass
class TrainConfig:
    steps: Count = knob(50, "RL steps (one rollout batch each)")
    mini_batch_size: Count = knob(64, "sequences per optimizer step; rollout batch / this = updates per epoch")
    epochs: Count = knob(1, "passes over each rollout batch")
    micro_batch_tokens: Count = knob(8192, "token budget of one forward/backward (gradient accumulation)")
    lr: Positive[float] = knob(1e-4, "AdamW learning rate")
    warmup_steps: NonNeg[int] = knob(5, "optimizer steps of linear warm-up")
    weight_decay: NonNeg[float] = knob(0.0, "AdamW weight decay")
    betas: Annotated[list[float], Range(0, 1, open_high=True, length=2, why="Adam's beta1 and beta2")] = knob(
        [0.9, 0.99], "AdamW [beta1, beta2]")
    max_grad_norm: Annotated[float, GRAD_NORM] = knob(1.0, "gradients are clipped to this global norm")
    save_every: NonNeg[int] = knob(10, "write a resumable checkpoint every N steps (0 = only the final model)")
    save_every_minutes: NonNeg[float] = knob(0.0,
        "also write one when this many minutes have passed since the "
        "last (0 = off); a SIGTERM saves the last completed step too")
    keep_last: Count = knob(2, "complete checkpoints kept (older ones are deleted once a newer one is complete)")
    keep_every: NonNeg[int] | None = knob(None,
        "also keep the weights (no optimizer state) of every checkpoint whose step is "
        "a multiple of this, for `mathrl eval RUN`'s curve; null: eval.every; 0: none")
    max_skipped_steps: Count = knob(5, "stop after this many consecutive steps with a non-finite loss or gradient")
    init_from: str | None = knob(None, "start this new run from another run's checkpoint dir (see init_from_mode)")
    init_from_mode: Literal["continue", "restart"] = knob("continue",
        "continue: its policy, optimizer, schedule and controllers, the KL reference stays "
        "model.path; restart: its policy weights as a new starting model (fresh optimizer "
        "and schedule, the KL reference is that checkpoint), as DeepScaleR's later stages do")
    old_logprobs: Literal["auto", "recompute", "reuse_engine"] = knob("auto",
        "the PPO ratio's old logprobs: recompute = a no-grad scoring pass of the training model; "
        "reuse_engine = the torch engine's sampling logprobs (same float32 weights, equal to float "
        "rounding; no actor/rollout_entropy); auto = reuse_engine where that holds (torch engine, "
        "float32, unsharded, no rollout correction, entropy mode none or fixed), else recompute")
    device: Literal["auto", "cpu", "cuda"] = knob("auto",
        "where training, scoring and the torch engine run: auto = this rank's "
        "GPU when CUDA is available (one process included), else the CPU")
    dist: DistConfig = section(DistConfig, "several processes (torchrun, mathrl train --nproc N)")


@dataclass
class SFTConfig:
    """Supervised fine-tuning (`mathrl sft`): (prompt, response) rows of data.train, the prompt rendered with
    data.template, loss on the response tokens only. AdamW betas / weight decay, max_grad_norm,
    micro_batch_tokens and the checkpoint settings (save_every, keep_last, keep_every) are train.*'s."""

    steps: Count = knob(300, "optimizer steps")
    batch_size: Count = knob(32, "sequences per optimizer step (split into micro-batches by train.micro_batch_tokens)")
    lr: Positive[float] = knob(1e-3, "AdamW learning rate (the tiny model; ~1e-5 for 1B+ models)")
    warmup_steps: NonNeg[int] = knob(10, "optimizer steps of linear warm-up")
    response_field: Text = knob("response",
        "field of data.train holding the response the model learns to write after the prompt")
    max_response_tokens: Count | None = knob(None,
        "longer responses (EOS included) are dropped and counted, never truncated; null: rollout.max_new_tokens")
    eval_rows: NonNeg[int] = knob(64,
        "rows of data.train held out (a draw seeded by `seed`) for sft/eval_loss every eval.every steps")
    eval_pass1: bool = knob(True, "also evaluate data.eval (pass@1, pass@k) every eval.every steps, as train does")


@dataclass
class OverlongConfig:
    filter: bool = knob(False, "truncated responses are masked out of the loss (DAPO overlong filtering)")
    soft_punishment: bool = knob(False, "DAPO soft overlong punishment over the last cache_len tokens")
    cache_len: Count = knob(8, "tokens before rollout.max_new_tokens where the soft punishment starts")


@dataclass
class RewardFunctionConfig:
    """One component of the reward (docs/rewards.md): a function run in the verifier's worker processes
    (`fn`), or a server the trainer POSTs batches to (`url`). The sequence reward is the weighted sum of
    the components, before length shaping."""

    name: Annotated[str, METRIC_NAME] = knob("math",
        "the component's name in the metrics (reward/<name>/mean): letters, digits, _ and -")
    fn: str | None = knob(None,
        '"package.module:function", "path/to/file.py:function", or a built-in: math, format, choice, tool_call')
    url: str | None = knob(None,
        "instead of fn: http://host:port/path of a reward server (the JSON schema in docs/rewards.md)")
    weight: Finite = knob(1.0, "the component's weight in the sum")
    kwargs: dict[str, Any] = knob({}, "keyword arguments passed to the function (or sent to the server)")
    timeout_s: Annotated[float, positive("seconds, or null for the default")] | None = knob(None,
        "fn: seconds per call of batch_size samples (null: "
        "reward.timeout_s); url: seconds per request attempt (null: 30)")
    batch_size: Annotated[int, at_least(1, "or null for the default")] | None = knob(None,
        "samples per call or request; null: 1 for fn (each sample alone: its own timeout and failure), 64 for url")
    retries: NonNeg[int] = knob(2, "url: further attempts after a failed request (connection error, timeout, 5xx)")


@dataclass
class RewardConfig:
    functions: list[RewardFunctionConfig] = knob([RewardFunctionConfig(fn=DEFAULT_REWARD_FN)],
        "the reward components, summed with their weights (default: the math checker alone)")
    num_workers: NonNeg[int] = knob(1, "verifier worker processes (0 = in-process, no timeout protection)")
    timeout_s: Positive[float] = knob(5.0, "per-item verification timeout")
    boxed: Literal["all", "last", "any"] = knob("all",
        r'which boxes are the answer: all = the final run of boxes as one answer (\boxed{1}, \boxed{2} -> "1, '
        '2"); last = the last box; any = correct if any box is (hackable: evaluation only, never train with it)')
    incorrect: Annotated[float, WRONG_ANSWER] = knob(0.0,
        "reward of a wrong or missing answer (a right one scores 1); -1 is DAPO's +-1 "
        "reward, against which the overlong penalty weighs half as much as against 0/1")
    checker: Literal["mathrl", "math-verify"] = knob("mathrl",
        "answer checker of rewards and evaluation: mathrl = one extractor for gold and answers, "
        "the rules of docs/evaluation.md, never rejecting what math-verify accepts except by a "
        "documented rule; math-verify = plain math-verify on the whole completion, exactly")
    overlong: OverlongConfig = section(OverlongConfig, "truncated responses (DAPO section 3.4)")
    kimi_length_coef: NonNeg[float] = knob(0.0, "Kimi k1.5 length penalty coefficient (0 = off)")
    length_bonus_coef: Finite = knob(0.0, "reward coef x length / max length (ablation only)")
    length_schedule: Annotated[list[list[int]], LENGTH_SCHEDULE] = knob([], "[[step, target_len], ...] (ablation only)")
    length_schedule_coef: NonNeg[float] = knob(0.0, "weight of the length_schedule reward (ablation only)")


@dataclass
class EvalConfig:
    every: Count = knob(10, "evaluate every N steps (and always before the first and after the last)")
    n: Count = knob(8, "samples per problem: pass@1 is averaged over them (avg@n); pass@k for k <= n")
    temperature: Annotated[float, Range(0, why="0 is greedy decoding")] = knob(1.0,
        "sampling temperature; 0 is greedy decoding (then eval.n must be 1)")
    top_p: Annotated[float, unit(open_low=True)] = knob(1.0, "nucleus sampling of evaluation")
    max_new_tokens: Count | None = knob(None, "default: rollout.max_new_tokens")
    seed: Seed = knob(1234, "sampling seed of evaluation (fixed, so checkpoints are compared on equal draws)")


@dataclass
class LogConfig:
    rollouts_per_step: NonNeg[int] = knob(8,
        "samples of rollouts (with per-token logprobs) written to rollouts.jsonl per step; "
        'a step that kept no group writes its dropped samples, marked "dropped": true')
    reflection_words: list[str] = knob(["wait", "Wait", "verify", "double-check"],
        "markers counted by rollout/reflection_rate")
    tensorboard: bool = knob(False, "also write <run_dir>/tensorboard (pip install tensorboard)")
    wandb: bool = knob(False, "also log to Weights & Biases (pip install wandb; WANDB_MODE=offline keeps it local)")
    wandb_project: str = knob("mathrl", "W&B project of the run")
    mlflow: bool = knob(False, "also log to MLflow at MLFLOW_TRACKING_URI (pip install mlflow-skinny)")
    mlflow_experiment: str = knob("mathrl", "MLflow experiment of the run")


@dataclass
class Config(ConfigRules):
    seed: Seed = knob(0, "seed of the training run (data order, sampling, dropout)")
    run_dir: str | None = knob(None, "default: runs/<timestamp>")
    model: ModelConfig = section(ModelConfig, "the policy model")
    base: BaseModelConfig = section(BaseModelConfig)
    data: DataConfig = section(DataConfig, "problems, prompts and which samples reach the loss")
    rollout: RolloutConfig = section(RolloutConfig, "sampling the training responses")
    algo: AlgoConfig = section(AlgoConfig, "advantages, losses and their tricks")
    train: TrainConfig = section(TrainConfig, "steps, optimizer, checkpoints")
    reward: RewardConfig = section(RewardConfig, "verification and reward shaping")
    eval: EvalConfig = section(EvalConfig, "held-out evaluation during training")
    log: LogConfig = section(LogConfig, "what is written besides metrics.jsonl")
    sft: SFTConfig = section(SFTConfig, "supervised fine-tuning (mathrl sft), before RL")

    # -- derived sizes, in one place (validate and the cross-field rules: rules.py) ----------------
    @property
    def rollout_batch_size(self) -> int:
        return self.rollout.prompts_per_step * self.rollout.n

    @property
    def needs_reference(self) -> bool:
        """A reference model is loaded only when a term needs its logprobs or entropy."""
        clip = self.algo.entropy.ref_gain_clip
        return self.algo.kl.use != "none" or clip.max_gain is not None or clip.max_ratio is not None

    @property
    def eval_max_new_tokens(self) -> int:
        return self.eval.max_new_tokens or self.rollout.max_new_tokens

    def correction(self) -> Correction | None:
        """The importance weights the policy-gradient term gets (algo.off_policy, else
        algo.rollout_correction), or None for none: tis and decoupled are token-level weights between the
        trainer's logprobs before the step's update (the proximal policy) and the sampling ones."""
        rc, mode = self.algo.rollout_correction, self.algo.off_policy
        if mode == "none" and rc.mode == "none":
            return None
        if mode == "none":
            return Correction(rc.mode, rc.level, rc.cap, rc.lower, rc.rejected)
        return Correction("tis" if mode == "tis" else "mis", "token", rc.cap, rc.lower, rc.rejected)

    @property
    def keep_every_steps(self) -> int:
        """Checkpoints whose step is a multiple of this keep their weights when pruned (0: none)."""
        return self.eval.every if self.train.keep_every is None else self.train.keep_every

    def engine_logprobs_not_old(self) -> tuple[str, str] | None:
        """(setting, reason) why the rollout engine's sampling logprobs cannot stand in for the old-policy
        logprobs (train.old_logprobs); None where they can: an engine whose logprobs are the trainer's own
        (rollout/factory.py), float32 weights, no rollout correction weighing the gap, and no entropy
        controller needing the scoring pass's entropy. An FSDP-sharded model is judged when it is built."""
        if not ENGINES.get(self.rollout.engine).logprobs_match_trainer:
            return f"rollout.engine={self.rollout.engine}", "its logprobs come from other kernels"
        if self.rollout.max_staleness > 0:
            return f"rollout.max_staleness={self.rollout.max_staleness}", "the samples come from older weights than the trainer's"
        if self.model.dtype != "float32":
            return f"model.dtype={self.model.dtype}", "the sampler's cached decoding and the trainer's forward round differently"
        if self.algo.rollout_correction.mode != "none":
            return f"algo.rollout_correction.mode={self.algo.rollout_correction.mode}", "it weighs the gap between the two"
        if self.algo.rollout_correction.masks:
            return f"algo.rollout_correction.masks=[{', '.join(self.algo.rollout_correction.masks)}]", "they reject by the gap between the two"
        if self.algo.off_policy != "none":
            return f"algo.off_policy={self.algo.off_policy}", "it weighs the gap between the two"
        if self.algo.entropy.mode not in ("none", "fixed"):
            return f"algo.entropy.mode={self.algo.entropy.mode}", "its controller needs the scoring pass's entropy"
        if self.algo.top_entropy_quantile is not None:
            return f"algo.top_entropy_quantile={self.algo.top_entropy_quantile}", "it picks tokens by the scoring pass's entropy"
        return None

    @property
    def generator_workers(self) -> int:
        """Generator processes (rollout.generator.workers; null: 1 with rollout.max_staleness >= 1, else 0)."""
        workers = self.rollout.generator.workers
        return workers if workers is not None else (1 if self.rollout.max_staleness > 0 else 0)

    def _data_files(self) -> list[tuple[str, str]]:
        """(config key, source) of every data.train / data.eval source that names a local file."""
        sources = [("data.train", self.data.train), *(("data.eval", s) for s in self.data.eval)]
        builtin = {"data.train": ["arith"], "data.eval": ARITH_SOURCES.names()}
        return [(where, s) for where, s in sources if s not in builtin[where] and not s.startswith("hf:")]
