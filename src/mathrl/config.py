"""One typed config tree: defaults here, YAML recipes on top, dotted command-line overrides last.

The defaults ARE the embedded default experiment (`recipes/arith_grpo.yaml` spells them out): GRPO
with the DAPO clip and token-level loss on the built-in arithmetic task, starting from the tiny base
model. Every field is documented once, in its dataclass.

    cfg = load_config("recipes/arith_grpo.yaml", ["rollout.n=8", "algo.clip.eps_high=0.28"])

Unknown keys are errors that name the closest valid key; values are checked against the field's
type (`Literal` choices, int/float/bool/str, optional, lists); derived sizes and cross-field rules
live in `Config.validate`.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import json
import math
import re
import types
import typing
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from mathrl.config_schema import check_domains, model_path_problem
from mathrl.registry import ADVANTAGE_ESTIMATORS, ARCHITECTURES, ARITH_SOURCES, ENGINES, REWARD_FUNCTIONS, TOOLS, load_callable

DATA_FILE_SUFFIXES = (".jsonl", ".parquet")  # the local data file formats tasks.loading reads
CONFIG_PREFIX = "config:"  # model.path=config:<name> names an architecture (model/init.py) with random weights
_FLOAT_RE = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


class ConfigError(ValueError):
    """A recipe or override that cannot be turned into a valid config; the message says how to fix it."""


# --------------------------------------------------------------------------------------------------
# the tree
# --------------------------------------------------------------------------------------------------
@dataclass
class BaseModelConfig:
    """Recipe of the tiny base model built when `model.path` is `tiny-arith` (cached by its hash)."""

    seed: int = 0  # seed of the weights and the pretraining text
    min_digits: int = 1  # operand sizes in the pretraining problems
    max_digits: int = 3  # (min_digits <= max_digits)
    hidden_size: int = 128  # model width (a multiple of num_heads)
    intermediate_size: int = 384  # MLP width
    num_layers: int = 4  # transformer layers
    num_heads: int = 4  # attention heads (a multiple of num_kv_heads)
    num_kv_heads: int = 2  # key/value heads (grouped-query attention)
    max_positions: int = 128  # context length in tokens (prompt + response must fit)
    steps: int = 800  # pretraining optimizer steps
    batch_size: int = 32  # pretraining sequences per step
    lr: float = 3e-3  # pretraining learning rate
    warmup_steps: int = 30  # linear warm-up steps of the pretraining
    slip_prob: float = 0.3  # per-column chance of a deliberate slip in the pretraining text
    check_prob: float = 0.0  # per-column chance of a self-check ("?" and the column recomputed) in the pretraining text
    decimal_share: float = 0.0  # share of pretraining problems with one-decimal-place operands (2.5+13.7); part of the cache key only when > 0
    tool_share: float = 0.0  # share of pretraining solutions written as python tool calls (recipes/arith_tools.yaml); part of the cache key only when > 0


@dataclass
class LoraConfig:
    """LoRA adapters (peft): the base weights stay frozen and only the low-rank matrices A and B of the
    targeted linear layers train; the KL reference is the base with the adapters disabled. docs/lora.md."""

    r: int = 0  # adapter rank; 0: no adapters, the whole model trains
    alpha: float = 32.0  # scaling numerator: the update is (alpha / r) * B @ A
    dropout: float = 0.0  # dropout on the adapters' input during the policy update (scoring and sampling run without it)
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])  # names of the linear layers that get adapters (peft's target_modules)


@dataclass
class ModelConfig:
    path: str = "tiny-arith"  # "tiny-arith" (built locally from `base`) or a Hugging Face model directory / hub id
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # weights and compute precision
    logprob_chunk_size: int = 1024  # positions per chunk when computing logprobs and entropy
    gradient_checkpointing: bool = False  # recompute activations in the backward pass (less memory, more time)
    max_position_embeddings: int | None = None  # raise (or lower) the model's context, config.json's max_position_embeddings, for the trainer and vLLM alike; null: the model's own
    init: Literal["pretrained", "random"] = "pretrained"  # random: path config:<name> (model/configs/*.json, or config:<file>.json) with random weights and the character tokenizer (benchmarks, smoke tests)
    lora: LoraConfig = field(default_factory=LoraConfig)  # train low-rank adapters instead of the whole model


@dataclass
class ArithConfig:
    min_digits: int = 1  # operand sizes of the arithmetic problems
    max_digits: int = 3  # (min_digits <= max_digits)
    heldout_permille: int = 50  # share of the problem space reserved for evaluation (1/1000)
    decimal_share: float = 0.0  # share of problems with one-decimal-place operands (2.5+13.7=...\boxed{16.2}), in the training stream and the arith eval set; the base model learns them with base.decimal_share
    min_carries: int = 0  # training stream: only problems whose column addition carries at least this often (0: every problem; at most max_digits)
    hard_min_carries: int = 2  # the eval source arith_hard: held-out problems with at least this many carries (at most max_digits)


@dataclass
class DynamicSamplingConfig:
    """Which groups reach the loss (DAPO dynamic sampling), and refilling the batch when groups are dropped."""

    mode: Literal["none", "nonconstant", "band"] = "nonconstant"  # nonconstant: drop all-equal groups; band: keep accuracy in [low, high]; none: every group trains
    band_low: float = 0.2  # mode=band: keep groups whose accuracy is >= band_low
    band_high: float = 0.8  # ... and <= band_high
    max_rounds: int = 4  # generation rounds per step to fill the batch with kept groups
    on_exhausted: Literal["train_smaller", "error"] = "train_smaller"  # when max_rounds cannot fill the batch
    max_empty_steps: int = 5  # stop after this many steps in a row with no group kept (every sample wrong, or right), explaining why; 0: never. With mode none: a warning


@dataclass
class CurriculumConfig:
    mode: Literal["none", "field", "online"] = "none"  # order training problems easiest-first (jsonl data)
    field: str = "level"  # the problem field holding the difficulty, for mode=field


@dataclass
class DataConfig:
    train: str = "arith"  # "arith" (generated), a .jsonl or .parquet file, or hf:<name>[:<config>][@<split>] (split default train)
    eval: list[str] = field(default_factory=lambda: ["arith"])  # "arith" (held-out split; arith_decimal: its decimal problems only, arith_hard: those with >= data.arith.hard_min_carries carries) and/or files / hf: datasets (split default test)
    question_field: str = "problem"  # field mapping for data files (a known file or hf: dataset uses its preset)
    answer_field: str | None = "answer"  # field holding the gold answer (null with answer_from_solution)
    answer_from_solution: str | None = None  # take the gold answer from the last \boxed{} of this field
    answer_after: str | None = None  # the gold answer is the text after this marker in the answer field (GSM8K: "####")
    question_suffix: str = ""  # appended to every question (after a space) before the template; DeepScaleR: "Let's think step by step and output the final answer within \\boxed{}."
    template: str = "arith"  # prompt template: arith | zero | plain | chat | a string containing {question}
    max_prompt_tokens: int = 512  # longer prompts are dropped (counted), never truncated
    eval_size: int = 200  # problems per eval set (held-out arithmetic problems, or the first N rows)
    on_error: Literal["raise", "skip"] = "raise"  # a malformed jsonl row: stop naming file:line, or skip and count it
    transform: Literal["none", "integer_answer"] = "none"  # DAPO integer-answer rewrite of the training problems (data.train=arith: with data.arith.decimal_share > 0, decimal answers are dropped and redrawn)
    sample_filter: list[str] = field(default_factory=list)  # drop samples that are: repetitive, garbled, no_answer, void_turn (a tool episode whose last turn has neither a call nor an answer; SimpleTIR)
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)  # the order of the training problems
    arith: ArithConfig = field(default_factory=ArithConfig)  # the built-in arithmetic task


@dataclass
class VLLMConfig:
    """The vLLM rollout engine (rollout.engine: vllm): one colocated, in-process engine per training process,
    weights synced in memory after every update. Install: docs/guide.md, "Rollouts with vLLM"."""

    gpu_memory_utilization: float = 0.5  # share of GPU memory vLLM may take (weights, activations, KV cache); the trainer needs the rest
    kv_cache_gb: float | None = None  # KV cache size in GiB, overriding gpu_memory_utilization; null: vLLM sizes it on a GPU, 1 GiB on a CPU
    max_model_len: int | None = None  # longest prompt + response in tokens; null: the model's context (max_position_embeddings)
    tensor_parallel_size: int = 1  # GPUs one engine shards the model over (the colocated engine supports 1)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # vLLM's weights and compute; auto: model.dtype
    enforce_eager: bool | None = None  # no CUDA graphs / compilation (slower decoding, faster start); null: eager on CPUs (compiling costs ~40 s there for little gain), compiled on GPUs
    enable_sleep_mode: bool = False  # GPU only: free the KV cache during the policy update, wake before generating
    sleep_level: Literal[1, 2] = 1  # 1: weights moved to host memory while asleep and copied back on waking; 2: dropped, no copy either way (every update is followed by a sync that overwrites them: the recipes use 2)
    enable_prefix_caching: bool = True  # the n samples of a prompt share its KV blocks
    max_num_seqs: int | None = None  # sequences decoded together; null: vLLM's default
    max_num_batched_tokens: int | None = None  # tokens per scheduler step; null: vLLM's default


@dataclass
class GeneratorConfig:
    """The generator processes that sample while the trainer trains (train/generator.py, docs/async.md): each
    runs its own engine on its own cores (CPU) or GPU and receives every needed policy version over a
    torch.distributed group (gloo; NCCL between distinct GPUs), in buckets, never through disk."""

    workers: int | None = None  # generator processes; null: 1 when rollout.max_staleness >= 1, else 0 (the engine samples inside the trainer's process). With max_staleness=0 and workers >= 1 the workers sample the current weights (on-policy, disaggregated, no overlap)
    threads: int = 0  # torch threads of each generator; 0: the cores this process may use, split evenly between the trainer and the generators (one each on 2 cores)
    pin_cores: bool = True  # bind the trainer and each generator to cores of their own (os.sched_setaffinity) when there are enough for all
    devices: list[int] = field(default_factory=list)  # CUDA devices of the generators (worker i takes devices[i % len]); empty: the GPUs after the trainer's ranks when the machine has any left, else the trainer's own GPU (shared)
    bucket_mb: float = 256.0  # size of one weight-broadcast bucket in MiB (tensors of one dtype flattened together)


@dataclass
class ToolConfig:
    """One tool the model may call inside its reasoning (docs/tools.md)."""

    name: str = "python"  # the name the model calls it by (python_blocks: code blocks go to the tool named `python`)
    fn: str = "python"  # a built-in (python: sandboxed code, calculator: exact arithmetic) or "package.module:function" / "path/file.py:function" taking (args, **kwargs) -> str
    kwargs: dict[str, Any] = field(default_factory=dict)  # keyword arguments of the function (python: sandbox, cpu_s, memory_mb, ...)
    timeout_s: float = 5.0  # wall-clock seconds per call; a call over it is killed and gives a timeout observation
    description: str = ""  # chat_tool_call: the description in the tool's schema


@dataclass
class ToolTagsConfig:
    """The text around a call and an observation; null keeps the tool format's own (docs/tools.md)."""

    call_open: str | None = None  # the model opens a call with this (python_blocks: "```python\n")
    call_close: str | None = None  # ... and closes it with this; generation stops here and the tool runs (python_blocks: "```\n")
    observation_open: str | None = None  # the observation appended after a call starts with this (python_blocks: "```output\n")
    observation_close: str | None = None  # ... and ends with this (python_blocks: "```\n")


@dataclass
class RolloutConfig:
    engine: str = "torch"  # a registered rollout engine (rollout/factory.py): torch (KV cache, any device) or vllm
    prompts_per_step: int = 16  # problems per rollout batch
    n: int = 8  # samples per problem (the GRPO group size)
    temperature: float = 1.0  # sampling temperature (> 0: training samples from the policy)
    top_p: float = 1.0  # nucleus sampling: keep the most likely tokens holding this much probability
    max_new_tokens: int = 48  # maximum response length in tokens
    batch_size: int = 512  # sequences decoded together by the torch engine; each such shard is seeded on its own, so 1 and N ranks draw the same samples when every rank's share is a multiple of it
    vllm: VLLMConfig = field(default_factory=VLLMConfig)  # settings of the vllm engine
    max_staleness: int = 0  # generate while training: 0 = the synchronous loop (generate, then train); k >= 1 = generator processes sample ahead and step t trains on samples of a policy at most k versions older than the trainer's (docs/async.md)
    async_mode: Literal["fixed_lag", "free"] = "fixed_lag"  # with max_staleness k >= 1: fixed_lag = step t trains on samples of version exactly max(0, t-1-k) (reproducible, resumes step for step); free = the freshest version the generator holds when it starts the step, never older than t-1-k (not reproducible)
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)  # the generator processes (placement, threads, weight buckets)
    tools: list[ToolConfig] = field(default_factory=list)  # tools the model may call; empty: single-turn responses (docs/tools.md)
    tool_format: str = "python_blocks"  # a registered call format: python_blocks (Qwen2.5-Math / ToRL code and output blocks) or chat_tool_call (the chat template's <tool_call>{json}</tool_call>)
    tool_tags: ToolTagsConfig = field(default_factory=ToolTagsConfig)  # override the format's call and observation tags
    max_turns: int = 4  # model turns per episode (a turn ends at a tool call or at the end of the response)
    max_tool_calls: int = 3  # tool calls run per episode; a call past it gets an observation saying so, and is not run
    observation_max_tokens: int = 32  # longer observations are cut in the middle, with a note saying how much was cut
    tool_workers: int = 4  # tool calls run in parallel


@dataclass
class ClipConfig:
    eps_low: float = 0.2  # ratio clipped below at 1 - eps_low
    eps_high: float = 0.28  # ratio clipped above at 1 + eps_high (clip-higher, DAPO section 3.1)
    dual_clip_c: float | None = None  # dual clip bound for negative advantages (Ye et al. 2020); None = off


@dataclass
class AdvConfig:
    estimator: str = "grpo"  # a registered advantage estimator (algo/estimators.py): grpo, rloo, reinforce_pp, or gae (PPO with a learned critic, algo.critic)
    std_normalize: bool = True  # divide by the reward std (GRPO); False is Dr. GRPO
    std_scope: Literal["group", "batch"] = "group"  # the std that normalises: per group or over the batch


@dataclass
class CriticConfig:
    """PPO with a learned critic (algo.adv.estimator: gae): GAE, VC-PPO value pretraining and decoupled
    lambdas, VAPO length-adaptive lambda."""

    path: str | None = None  # critic initialisation (a causal LM or a saved critic); default: the starting policy
    lr: float | None = None  # critic learning rate; default: train.lr
    gamma: float = 1.0  # discount
    lam_actor: float = 0.95  # GAE lambda of the policy advantages
    lam_critic: float = 1.0  # GAE lambda of the value targets (decoupled GAE, VC-PPO: 1.0)
    length_adaptive_alpha: float | None = None  # VAPO: lam_actor = 1 - 1/(alpha * length) per response (0.05); None = off
    value_clip: float | None = 0.2  # clip range of the value loss around the sampling-time values; None = off
    pretrain_steps: int = 0  # VC-PPO value pretraining: critic-only steps on the starting policy's rollouts (lambda 1)
    whiten_advantages: bool = True  # normalise the policy advantages over the batch's tokens (PPO practice)


@dataclass
class RefGainClipConfig:
    """ref_gain_clip: no entropy bonus on tokens whose entropy already exceeds the reference model's."""

    max_gain: float | None = None  # mask tokens with entropy - ref_entropy > max_gain (nats); None = off
    max_ratio: float | None = None  # mask tokens with entropy > max_ratio * ref_entropy; None = off


@dataclass
class EntropyConfig:
    mode: Literal["none", "fixed", "adaptive", "skywork"] = "none"  # entropy bonus: off, fixed coef, or a controller
    coef: float = 0.0  # the fixed coefficient, or the starting coefficient of a controller
    target: float = 0.2  # target token entropy (nats) of the adaptive and skywork controllers
    kp: float = 0.01  # adaptive: coef += kp * (target - entropy) each step
    step: float = 0.0005  # skywork: coef moves by this much toward the target each step
    min_coef: float = 0.0  # the controllers keep coef within [min_coef, max_coef]
    max_coef: float = 0.05  # upper bound of the controlled coefficient
    ref_gain_clip: RefGainClipConfig = field(default_factory=RefGainClipConfig)


@dataclass
class KLConfig:
    use: Literal["none", "loss", "reward"] = "none"  # KL to the reference model as a loss term or a reward penalty
    estimator: Literal["k1", "k2", "k3"] = "k3"  # KL estimator (Schulman 2020): k1 log-ratio, k2 squared, k3 unbiased low-variance
    coef: float = 0.001  # fixed coefficient, or the starting one when `target` is set
    target: float | None = None  # adaptive controller (Ziegler et al. 2019): target per-token KL; None = fixed
    horizon: int = 10000  # adaptive controller horizon, in samples


@dataclass
class PTXConfig:
    coef: float = 0.0  # weight of the pretraining cross-entropy mixed into each optimizer step (0 = off)
    data: str = "arith"  # "arith" (the tiny base model's pretraining text) or a .txt / .jsonl ("text" field) file
    batch_size: int = 16  # pretraining sequences per optimizer step
    max_tokens: int = 256  # longer pretraining texts are cut to this many tokens


@dataclass
class PosLMConfig:
    coef: float = 0.0  # VAPO positive-example LM loss weight mu (0.1 in the paper; 0 = off)


@dataclass
class RolloutCorrectionConfig:
    """Importance weights between the rollout engine's and the trainer's logprobs (algo.rollout_correction)."""

    mode: Literal["none", "tis", "mis"] = "none"  # tis: weight min(ratio, cap) (Yao et al. 2025); mis: drop ratio > cap (Liu, Li et al. 2025)
    level: Literal["token", "sequence"] = "token"  # ratio per token, or of the whole response
    cap: float = 2.0  # C > 1: the truncation (tis) or rejection (mis) threshold of the ratio pi_trainer / pi_rollout
    lower: float | None = None  # L in (0, 1): tokens whose ratio is under it are rejected too (a two-sided bound: verl's 1/C, IcePop 0.5); null = no lower bound
    rejected: Literal["zero", "drop"] = "zero"  # a rejected token: zero = a zero term that stays in the loss normalisers (AReaL); drop = out of the loss mask and the normalisers (verl)


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
    clip: ClipConfig = field(default_factory=ClipConfig)  # PPO ratio clipping
    adv: AdvConfig = field(default_factory=AdvConfig)  # advantage estimator
    critic: CriticConfig = field(default_factory=CriticConfig)
    entropy: EntropyConfig = field(default_factory=EntropyConfig)  # entropy bonus and its controllers
    kl: KLConfig = field(default_factory=KLConfig)  # KL to the reference model
    ptx: PTXConfig = field(default_factory=PTXConfig)  # pretraining loss mixed in (InstructGPT PPO-ptx)
    pos_lm: PosLMConfig = field(default_factory=PosLMConfig)  # LM loss on correct responses (VAPO)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)  # rollout/trainer mismatch (TIS, MIS)
    off_policy: Literal["none", "tis", "decoupled"] = "none"  # samples generated by older weights: tis = the PPO ratio against the trainer's logprobs before this step's update, weighted by min(pi_trainer / pi_behaviour, cap); decoupled = AReaL's decoupled PPO, the clip around that proximal policy and the behaviour -> proximal weight, rejected outside [lower, cap]. Both take cap, lower and rejected from algo.rollout_correction
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"] = "token_mean"  # how token losses are averaged (docs/tricks.md)


@dataclass
class DistConfig:
    """Data-parallel training under torchrun (train/dist.py); ignored in a single process."""

    timeout_s: float = 1800.0  # collective timeout: a rank that died or hangs stops the job after this long (covers rank 0's evaluations)
    mixed_precision: bool = True  # on CUDA: FSDP2 bf16 parameters in forward/backward, fp32 gradient reduction (CPU runs in model.dtype)
    cpu_offload: bool = False  # FSDP2 keeps the sharded parameters, gradients and optimizer state in CPU memory


@dataclass
class TrainConfig:
    steps: int = 50  # RL steps (one rollout batch each)
    mini_batch_size: int = 64  # sequences per optimizer step; rollout batch / this = updates per epoch
    epochs: int = 1  # passes over each rollout batch
    micro_batch_tokens: int = 8192  # token budget of one forward/backward (gradient accumulation)
    lr: float = 1e-4  # AdamW learning rate
    warmup_steps: int = 5  # optimizer steps of linear warm-up
    weight_decay: float = 0.0  # AdamW weight decay
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])  # AdamW [beta1, beta2]
    max_grad_norm: float = 1.0  # gradients are clipped to this global norm
    save_every: int = 10  # write a resumable checkpoint every N steps (0 = only the final model)
    save_every_minutes: float = 0.0  # also write one when this many minutes have passed since the last (0 = off); a SIGTERM saves the last completed step too
    keep_last: int = 2  # complete checkpoints kept (older ones are deleted once a newer one is complete)
    keep_every: int | None = None  # also keep the weights (no optimizer state) of every checkpoint whose step is a multiple of this, for `mathrl eval RUN`'s curve; null: eval.every; 0: none
    max_skipped_steps: int = 5  # stop after this many consecutive steps with a non-finite loss or gradient
    init_from: str | None = None  # start this new run from another run's checkpoint dir (see init_from_mode)
    init_from_mode: Literal["continue", "restart"] = "continue"  # continue: its policy, optimizer, schedule and controllers, the KL reference stays model.path; restart: its policy weights as a new starting model (fresh optimizer and schedule, the KL reference is that checkpoint), as DeepScaleR's later stages do
    old_logprobs: Literal["auto", "recompute", "reuse_engine"] = "auto"  # the PPO ratio's old logprobs: recompute = a no-grad scoring pass of the training model; reuse_engine = the torch engine's sampling logprobs (same float32 weights, equal to float rounding; no actor/rollout_entropy); auto = reuse_engine where that holds (torch engine, float32, unsharded, no rollout correction, entropy mode none or fixed), else recompute
    device: Literal["auto", "cpu", "cuda"] = "auto"  # where training, scoring and the torch engine run: auto = this rank's GPU when CUDA is available (one process included), else the CPU
    dist: DistConfig = field(default_factory=DistConfig)  # several processes (torchrun, mathrl train --nproc N)


@dataclass
class SFTConfig:
    """Supervised fine-tuning (`mathrl sft`): (prompt, response) rows of data.train, the prompt rendered with
    data.template, loss on the response tokens only. AdamW betas / weight decay, max_grad_norm,
    micro_batch_tokens and the checkpoint settings (save_every, keep_last, keep_every) are train.*'s."""

    steps: int = 300  # optimizer steps
    batch_size: int = 32  # sequences per optimizer step (split into micro-batches by train.micro_batch_tokens)
    lr: float = 1e-3  # AdamW learning rate (the tiny model; ~1e-5 for 1B+ models)
    warmup_steps: int = 10  # optimizer steps of linear warm-up
    response_field: str = "response"  # field of data.train holding the response the model learns to write after the prompt
    max_response_tokens: int | None = None  # longer responses (EOS included) are dropped and counted, never truncated; null: rollout.max_new_tokens
    eval_rows: int = 64  # rows of data.train held out (a draw seeded by `seed`) for sft/eval_loss every eval.every steps
    eval_pass1: bool = True  # also evaluate data.eval (pass@1, pass@k) every eval.every steps, as train does


@dataclass
class OverlongConfig:
    filter: bool = False  # truncated responses are masked out of the loss (DAPO overlong filtering)
    soft_punishment: bool = False  # DAPO soft overlong punishment over the last cache_len tokens
    cache_len: int = 8  # tokens before rollout.max_new_tokens where the soft punishment starts


DEFAULT_REWARD_FN = "mathrl.reward:math_reward"  # the default and only component: today's math checker


@dataclass
class RewardFunctionConfig:
    """One component of the reward (docs/rewards.md): a function run in the verifier's worker processes
    (`fn`), or a server the trainer POSTs batches to (`url`). The sequence reward is the weighted sum of
    the components, before length shaping."""

    name: str = "math"  # the component's name in the metrics (reward/<name>/mean): letters, digits, _ and -
    fn: str | None = None  # "package.module:function", "path/to/file.py:function", or a built-in: math, format, choice, tool_call
    url: str | None = None  # instead of fn: http://host:port/path of a reward server (the JSON schema in docs/rewards.md)
    weight: float = 1.0  # the component's weight in the sum
    kwargs: dict[str, Any] = field(default_factory=dict)  # keyword arguments passed to the function (or sent to the server)
    timeout_s: float | None = None  # fn: seconds per call of batch_size samples (null: reward.timeout_s); url: seconds per request attempt (null: 30)
    batch_size: int | None = None  # samples per call or request; null: 1 for fn (each sample alone: its own timeout and failure), 64 for url
    retries: int = 2  # url: further attempts after a failed request (connection error, timeout, 5xx)


@dataclass
class RewardConfig:
    functions: list[RewardFunctionConfig] = field(default_factory=lambda: [RewardFunctionConfig(fn=DEFAULT_REWARD_FN)])  # the reward components, summed with their weights (default: the math checker alone)
    num_workers: int = 1  # verifier worker processes (0 = in-process, no timeout protection)
    timeout_s: float = 5.0  # per-item verification timeout
    boxed: Literal["all", "last", "any"] = "all"  # which boxes are the answer: all = the final run of boxes as one answer (\boxed{1}, \boxed{2} -> "1, 2"); last = the last box; any = correct if any box is (hackable: evaluation only, never train with it)
    incorrect: float = 0.0  # reward of a wrong or missing answer (a right one scores 1); -1 is DAPO's +-1 reward, against which the overlong penalty weighs half as much as against 0/1
    checker: Literal["mathrl", "math-verify"] = "mathrl"  # answer checker of rewards and evaluation: mathrl = one extractor for gold and answers, the rules of docs/evaluation.md, never rejecting what math-verify accepts except by a documented rule; math-verify = plain math-verify on the whole completion, exactly
    overlong: OverlongConfig = field(default_factory=OverlongConfig)  # truncated responses (DAPO section 3.4)
    kimi_length_coef: float = 0.0  # Kimi k1.5 length penalty coefficient (0 = off)
    length_bonus_coef: float = 0.0  # reward coef x length / max length (ablation only)
    length_schedule: list[list[int]] = field(default_factory=list)  # [[step, target_len], ...] (ablation only)
    length_schedule_coef: float = 0.0  # weight of the length_schedule reward (ablation only)


@dataclass
class EvalConfig:
    every: int = 10  # evaluate every N steps (and always before the first and after the last)
    n: int = 8  # samples per problem: pass@1 is averaged over them (avg@n); pass@k for k <= n
    temperature: float = 1.0  # sampling temperature; 0 is greedy decoding (then eval.n must be 1)
    top_p: float = 1.0  # nucleus sampling of evaluation
    max_new_tokens: int | None = None  # default: rollout.max_new_tokens
    seed: int = 1234  # sampling seed of evaluation (fixed, so checkpoints are compared on equal draws)


@dataclass
class LogConfig:
    rollouts_per_step: int = 8  # samples of rollouts (with per-token logprobs) written to rollouts.jsonl
    reflection_words: list[str] = field(default_factory=lambda: ["wait", "Wait", "verify", "double-check"])  # markers counted by rollout/reflection_rate
    tensorboard: bool = False  # also write <run_dir>/tensorboard (pip install tensorboard)
    wandb: bool = False  # also log to Weights & Biases (pip install wandb; WANDB_MODE=offline keeps it local)
    wandb_project: str = "mathrl"  # W&B project of the run
    mlflow: bool = False  # also log to MLflow at MLFLOW_TRACKING_URI (pip install mlflow-skinny)
    mlflow_experiment: str = "mathrl"  # MLflow experiment of the run


@dataclass
class Config:
    seed: int = 0  # seed of the training run (data order, sampling, dropout)
    run_dir: str | None = None  # default: runs/<timestamp>
    model: ModelConfig = field(default_factory=ModelConfig)  # the policy model
    base: BaseModelConfig = field(default_factory=BaseModelConfig)
    data: DataConfig = field(default_factory=DataConfig)  # problems, prompts and which samples reach the loss
    rollout: RolloutConfig = field(default_factory=RolloutConfig)  # sampling the training responses
    algo: AlgoConfig = field(default_factory=AlgoConfig)  # advantages, losses and their tricks
    train: TrainConfig = field(default_factory=TrainConfig)  # steps, optimizer, checkpoints
    reward: RewardConfig = field(default_factory=RewardConfig)  # verification and reward shaping
    eval: EvalConfig = field(default_factory=EvalConfig)  # held-out evaluation during training
    log: LogConfig = field(default_factory=LogConfig)  # what is written besides metrics.jsonl
    sft: SFTConfig = field(default_factory=SFTConfig)  # supervised fine-tuning (mathrl sft), before RL

    # -- derived sizes and cross-field rules, in one place -----------------------------------------
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
        if self.algo.off_policy != "none":
            return f"algo.off_policy={self.algo.off_policy}", "it weighs the gap between the two"
        if self.algo.entropy.mode not in ("none", "fixed"):
            return f"algo.entropy.mode={self.algo.entropy.mode}", "its controller needs the scoring pass's entropy"
        return None

    def validate(self, check_paths: bool = True) -> None:
        """Raise ConfigError listing every problem. `check_paths=False` skips the checks that local
        files exist (model, init_from checkpoint, data files): evaluating or inspecting a finished
        run must not need its training data.

        First every field against its domain (config_schema.DOMAINS: ranges, lengths, choices), then
        the rules that tie fields together; every message names the key, the value and the fix."""
        errors = check_domains(self)
        if errors:  # cross-field rules assume each field is in its own domain
            raise ConfigError("\n".join(errors))
        if self.train.mini_batch_size > self.rollout_batch_size:
            errors.append(
                f"train.mini_batch_size={self.train.mini_batch_size} is larger than the rollout batch "
                f"(rollout.prompts_per_step x rollout.n = {self.rollout_batch_size}); lower it or sample more"
            )
        elif self.rollout_batch_size % self.train.mini_batch_size:
            errors.append(
                f"the rollout batch ({self.rollout_batch_size}) is not a multiple of train.mini_batch_size "
                f"({self.train.mini_batch_size})"
            )
        if self.rollout.n == 1 and ADVANTAGE_ESTIMATORS.get(self.algo.adv.estimator).needs_groups:
            errors.append(
                f"algo.adv.estimator={self.algo.adv.estimator} needs groups of several samples; rollout.n is 1 "
                "(every advantage would be 0). Raise rollout.n or use an estimator without groups (reinforce_pp, gae)"
            )
        ent = self.algo.entropy
        if ent.mode == "none" and (ent.ref_gain_clip.max_gain is not None or ent.ref_gain_clip.max_ratio is not None):
            errors.append("algo.entropy.ref_gain_clip is set but algo.entropy.mode is none: there is no bonus to clip")
        if not ent.min_coef <= ent.max_coef:
            errors.append("algo.entropy.min_coef must be <= algo.entropy.max_coef")
        if self.algo.kl.target is not None and self.algo.kl.use == "none":
            errors.append("algo.kl.target is set but algo.kl.use is none")
        ds = self.data.dynamic_sampling
        if ds.band_low > ds.band_high:
            errors.append(f"data.dynamic_sampling.band_low={ds.band_low} is above band_high={ds.band_high}; "
                          "need band_low <= band_high")
        for name, section in (("base", self.base), ("data.arith", self.data.arith)):
            if section.min_digits > section.max_digits:
                errors.append(f"{name}.min_digits={section.min_digits} is above {name}.max_digits={section.max_digits}")
        if self.base.hidden_size % self.base.num_heads or self.base.num_heads % self.base.num_kv_heads:
            errors.append(f"base: hidden_size={self.base.hidden_size} must be a multiple of num_heads={self.base.num_heads}, "
                          f"and num_heads a multiple of num_kv_heads={self.base.num_kv_heads}")
        if self.model.path == "tiny-arith" and max(self.rollout.max_new_tokens, self.eval_max_new_tokens) >= self.base.max_positions:
            errors.append(f"rollout.max_new_tokens={self.rollout.max_new_tokens} / eval.max_new_tokens="
                          f"{self.eval.max_new_tokens} leave no room for a prompt in the tiny base model's "
                          f"{self.base.max_positions} positions (base.max_positions); lower them")
        if self.eval.temperature == 0 and self.eval.n > 1:
            errors.append(f"eval.temperature=0 is greedy decoding: all eval.n={self.eval.n} samples of a problem "
                          "would be the same; set eval.n=1 with it")
        if ds.mode != "none" and self.rollout.n == 1:
            errors.append(f"data.dynamic_sampling.mode={ds.mode} needs groups: rollout.n is 1, so every group would be "
                          "dropped. Raise rollout.n or set data.dynamic_sampling.mode=none")
        unknown = set(self.data.sample_filter) - {"repetitive", "garbled", "no_answer", "void_turn"}
        if unknown:
            errors.append(f"data.sample_filter: unknown reasons {sorted(unknown)}; choose from repetitive, garbled, no_answer, void_turn")
        if self.reward.overlong.soft_punishment and not 0 < self.reward.overlong.cache_len <= self.rollout.max_new_tokens:
            errors.append("reward.overlong.cache_len must be in (0, rollout.max_new_tokens]")
        why = self.engine_logprobs_not_old()
        if self.train.old_logprobs == "reuse_engine" and why:
            errors.append(f"train.old_logprobs=reuse_engine with {why[0]}: {why[1]}; use train.old_logprobs=recompute or auto")
        if self.algo.off_policy != "none" and self.algo.rollout_correction.mode != "none":
            errors.append(f"algo.off_policy={self.algo.off_policy} with algo.rollout_correction.mode="
                          f"{self.algo.rollout_correction.mode}: the policy-gradient term takes one importance weight; "
                          "set one of them (off_policy reads cap, lower and rejected from algo.rollout_correction)")
        if self.data.curriculum.mode != "none" and self.data.train == "arith":
            errors.append("data.curriculum orders a fixed problem set: use it with a dataset as data.train")
        if self.data.transform != "none" and self.data.train == "arith" and self.data.arith.decimal_share == 0:
            errors.append("data.transform rewrites dataset answers; the arithmetic task's answers are integers already "
                          "(set data.arith.decimal_share > 0 for decimal problems, which the transform drops)")
        carry_keys = ["min_carries"] + (["hard_min_carries"] if "arith_hard" in self.data.eval else [])
        for key in carry_keys:  # hard_min_carries only matters (and is only checked) when arith_hard is evaluated
            value, digits = getattr(self.data.arith, key), self.data.arith.max_digits
            if value > digits:
                errors.append(f"data.arith.{key}={value}: operands of at most {digits} digits (data.arith.max_digits) "
                              f"give at most {digits} carries; lower it or raise max_digits")
        if self.model.path == "tiny-arith" and self.data.arith.heldout_permille > 50:
            errors.append(
                "data.arith.heldout_permille > 50 would hold out problems the tiny base model was pretrained on "
                "(its pretraining excludes only the first 50 permille); use a value <= 50"
            )
        for where, source in self._data_files():
            if Path(source).suffix not in DATA_FILE_SUFFIXES:
                builtin = "arith" if where == "data.train" else ", ".join(ARITH_SOURCES.names())
                errors.append(f"{where}: {source!r} is not a data source (give {builtin}, a .jsonl or .parquet file, "
                              "or hf:<name>[:<config>][@<split>])")
        if check_paths:
            errors += self._missing_paths()
        errors += self._model_init_errors(check_paths)
        errors += ENGINES.get(self.rollout.engine).check(self)  # the engine's own settings
        errors += self._context_errors()
        errors += self._reward_function_errors()
        errors += self._async_errors()
        errors += self._tool_errors()
        if errors:
            raise ConfigError("\n".join(errors))  # one line per problem

    def _tool_errors(self) -> list[str]:
        """rollout.tools and the limits of an episode: unique names, a built-in or importable fn, limits
        that leave room for a call and an answer after it."""
        r = self.rollout
        errors = tool_entry_problems([(t.name, t.fn, t.kwargs, t.timeout_s) for t in r.tools])
        names = {t.name for t in r.tools}
        if not r.tools:
            return errors
        if r.max_turns < 2:
            errors.append(f"rollout.max_turns={r.max_turns} leaves no turn after a tool call; use >= 2 (or rollout.tools: [])")
        if r.max_tool_calls < 1:
            errors.append("rollout.max_tool_calls=0 runs no call; use >= 1 (or rollout.tools: [] for single-turn responses)")
        if r.observation_max_tokens >= r.max_new_tokens:
            errors.append(f"rollout.observation_max_tokens={r.observation_max_tokens} must be below rollout.max_new_tokens="
                          f"{r.max_new_tokens}: an episode holds its observations and the model's tokens")
        if r.tool_format == "python_blocks" and "python" not in names:
            errors.append("rollout.tool_format=python_blocks sends code blocks to the tool named `python`; name one "
                          "rollout.tools entry python (its fn may be any tool, e.g. calculator)")
        return errors

    def _reward_function_errors(self) -> list[str]:
        """Each reward.functions entry: a unique metric name, exactly one of fn and url, a function that
        imports and takes the batched contract (prompts, responses, fields, tokens, **kwargs), or an
        http(s) url; checked here, so a typo stops the run before any model loads."""
        errors, names, maths = [], set(), 0
        if not self.reward.functions:
            return ["reward.functions is empty; give at least one component (the default is "
                    f"[{{name: math, fn: {DEFAULT_REWARD_FN!r}}}])"]
        for i, e in enumerate(self.reward.functions):
            where = f"reward.functions[{i}] ({e.name})"
            if not re.fullmatch(r"[A-Za-z0-9_-]+", e.name):
                errors.append(f"{where}: name {e.name!r} must be letters, digits, _ or - (it names the metrics reward/<name>/...)")
            elif e.name in names:
                errors.append(f"{where}: the name {e.name!r} is used twice; give each component its own name")
            names.add(e.name)
            if not math.isfinite(e.weight):
                errors.append(f"{where}: weight={e.weight!r} must be a finite number")
            if e.timeout_s is not None and not (math.isfinite(e.timeout_s) and e.timeout_s > 0):
                errors.append(f"{where}: timeout_s={e.timeout_s!r} must be > 0 seconds (or null for the default)")
            if e.batch_size is not None and e.batch_size < 1:
                errors.append(f"{where}: batch_size={e.batch_size} must be >= 1 (or null for the default)")
            if e.retries < 0:
                errors.append(f"{where}: retries={e.retries} must be >= 0")
            if (e.fn is None) == (e.url is None):
                errors.append(f"{where}: give exactly one of fn (a function) and url (a reward server)")
            elif e.url is not None:
                parts = urllib.parse.urlsplit(e.url)
                if parts.scheme not in ("http", "https") or not parts.hostname:
                    errors.append(f"{where}: url={e.url!r} must look like http://host:port/path")
            else:
                problem, is_math = _reward_function_problem(e.fn, e.kwargs)
                maths += is_math
                if problem:
                    errors.append(f"{where}: fn={e.fn!r} {problem}")
                elif is_math and e.kwargs:
                    errors.append(f"{where}: the math checker takes no kwargs; it is set by reward.boxed and reward.checker")
        if maths > 1:
            errors.append("reward.functions: the math checker is listed more than once; keep one math component")
        return errors

    @property
    def generator_workers(self) -> int:
        """Generator processes (rollout.generator.workers; null: 1 with rollout.max_staleness >= 1, else 0)."""
        workers = self.rollout.generator.workers
        return workers if workers is not None else (1 if self.rollout.max_staleness > 0 else 0)

    def _async_errors(self) -> list[str]:
        """rollout.max_staleness and rollout.generator: the settings generation in other processes cannot work with."""
        r, g, errors = self.rollout, self.rollout.generator, []
        if r.max_staleness > 0 and self.generator_workers == 0:
            errors.append(f"rollout.max_staleness={r.max_staleness} samples in generator processes but "
                          "rollout.generator.workers=0; set workers >= 1 (or leave it null)")
        if r.async_mode == "free" and r.max_staleness == 0:
            errors.append("rollout.async_mode=free needs rollout.max_staleness >= 1 (with 0 every step samples the current weights)")
        if self.generator_workers > 1 and self.data.dynamic_sampling.mode != "none":
            errors.append(f"rollout.generator.workers={self.generator_workers} with data.dynamic_sampling.mode="
                          f"{self.data.dynamic_sampling.mode}: the problems of a step depend on the refill rounds of "
                          "the step before, which another worker generates; use workers=1 or dynamic_sampling.mode=none")
        if self.generator_workers > 1 and self.data.curriculum.mode == "online":
            errors.append(f"rollout.generator.workers={self.generator_workers} with data.curriculum.mode=online: the order "
                          "of a step's problems depends on the pass rates of the step before; use workers=1")
        if self.generator_workers and self.model.lora.r > 0:
            errors.append(f"rollout.generator.workers={self.generator_workers} with model.lora.r={self.model.lora.r}: "
                          "generator processes take whole weights and LoRA sends adapters; train without "
                          "generator processes (rollout.max_staleness=0, workers=0) or without LoRA")
        if g.devices and self.train.device == "cpu":
            errors.append(f"rollout.generator.devices={g.devices} names GPUs but train.device=cpu; clear it or train on cuda")
        return errors

    def _model_init_errors(self, check_paths: bool) -> list[str]:
        """model.init=random goes with model.path=config:<name> (a shipped architecture or a config.json), and only with it."""
        arch, names = parse_config_path(self.model.path), ", ".join(ARCHITECTURES.names())
        if self.model.init == "pretrained":
            if arch is None:
                return []
            return [f"model.path={self.model.path!r} names an architecture without weights: add model.init=random "
                    "(or give a model directory or hub id)"]
        if arch is None:
            return [f"model.init=random needs model.path=config:<name> (one of {names}) or config:<file>.json, "
                    f"got model.path={self.model.path!r}"]
        if arch in ARCHITECTURES.names():
            return []
        if not arch.endswith(".json"):
            return [f"model.path={self.model.path!r}: unknown architecture {arch!r}; choose one of {names} or give config:<file>.json"]
        if check_paths and not Path(arch).expanduser().is_file():
            return [f"model.path={self.model.path!r}: no such config file {arch!r}"]
        return []

    def _context_errors(self) -> list[str]:
        """Prompt plus response must fit the model's positions (model.max_position_embeddings, else its
        config.json where it can be read without loading the model); checked here, before any model loads."""
        if self.model.path == "tiny-arith":
            return []  # base.max_positions, checked above
        context = self.model.max_position_embeddings or context_length(self.model.path)
        if context is None:
            return []
        errors = []
        longest = max(self.rollout.max_new_tokens, self.eval_max_new_tokens)
        if longest >= context:  # data.max_prompt_tokens is a filter, not every prompt's length: not added here
            errors.append(f"rollout.max_new_tokens / eval.max_new_tokens = {longest} tokens leave no room for a prompt "
                          f"in the model's {context} positions ({self.model.path}); lower them, or raise the context "
                          "with model.max_position_embeddings")
        v = self.rollout.vllm
        if self.rollout.engine == "vllm" and v.max_model_len is not None and v.max_model_len > context:
            errors.append(f"rollout.vllm.max_model_len={v.max_model_len} exceeds the model's {context} positions "
                          f"({self.model.path}); lower it, or raise the context with model.max_position_embeddings")
        return errors

    def _missing_paths(self) -> list[str]:
        errors = []
        if self.model.path != "tiny-arith" and not self.model.path.startswith("config:"):
            problem = model_path_problem(self.model.path)
            if problem:
                errors.append(f"model.path={self.model.path!r} {problem}")
        if self.train.init_from is not None:
            source = Path(self.train.init_from)
            if self.train.init_from_mode == "continue" and not (source / "trainer_state.pt").exists():
                weights_only = (source / "trainer_state.json").exists() and (source / "config.json").exists()
                errors.append(f"train.init_from={self.train.init_from!r} " + (
                    "holds weights only (a checkpoint kept by train.keep_every, without its optimizer state): use "
                    "train.init_from_mode=restart, or a complete checkpoint" if weights_only else
                    "is not a complete checkpoint directory (expected e.g. runs/X/checkpoints/step_000050 with "
                    "trainer_state.pt)"))
            elif not ((source / "trainer_state.json").exists() and (source / "config.json").exists()):
                errors.append(f"train.init_from={self.train.init_from!r} is not a checkpoint directory (expected "
                              "e.g. runs/X/checkpoints/step_000050 with trainer_state.json and the model files)")
        for where, source in self._data_files():
            if Path(source).suffix in DATA_FILE_SUFFIXES and not Path(source).expanduser().is_file():
                errors.append(f"{where}: no such file {source!r}")
        return errors

    def _data_files(self) -> list[tuple[str, str]]:
        """(config key, source) of every data.train / data.eval source that names a local file."""
        sources = [("data.train", self.data.train), *(("data.eval", s) for s in self.data.eval)]
        builtin = {"data.train": ["arith"], "data.eval": ARITH_SOURCES.names()}
        return [(where, s) for where, s in sources if s not in builtin[where] and not s.startswith("hf:")]


TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")  # a chat template's function name rule, starting with a letter or _


def tool_entry_problems(entries: list[tuple[Any, Any, Any, Any]]) -> list[str]:
    """One-line problems of tool entries (name, fn, kwargs, timeout_s), each naming its
    ``rollout.tools[i]`` field: names unique and of the chat templates' form, a timeout > 0, a built-in
    `fn` (`registry.TOOLS`) with options it takes, or a "package.module:function" that imports and is
    callable. The config (`Config.validate`) and `tools.ToolPool` both check with it."""
    problems: list[str] = []
    first: dict[str, int] = {}
    for i, (name, fn, kwargs, timeout_s) in enumerate(entries):
        where = f"rollout.tools[{i}]"
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            problems.append(f"{where}.name={name!r} must be 1 to 64 letters, digits, _ or -, the first a letter or _")
        elif name in first:
            problems.append(f"{where}.name={name!r} is also rollout.tools[{first[name]}]'s; give each tool its own name")
        else:
            first[name] = i
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not (math.isfinite(timeout_s) and timeout_s > 0):
            problems.append(f"{where}.timeout_s must be a number of seconds > 0, got {timeout_s!r}")
        if not isinstance(kwargs, dict):
            problems.append(f"{where}.kwargs must be a mapping, got {type(kwargs).__name__}")
            continue
        problems += [f"{where}.{p}" for p in _tool_fn_problems(fn, kwargs)]
    return problems


def _tool_fn_problems(fn: Any, kwargs: dict) -> list[str]:
    if not isinstance(fn, str):
        return [f"fn must be a string, got {type(fn).__name__}"]
    if fn in TOOLS.names():
        return [f"kwargs: {p}" for p in TOOLS.get(fn).check_kwargs(kwargs)]  # a built-in checks its own options
    if ":" not in fn:
        return [f"fn={fn!r} is not a built-in tool ({', '.join(TOOLS.names())}) nor of the form "
                "package.module:function or path/file.py:function"]
    try:
        function = load_callable(fn)
    except ValueError as e:
        return [f"fn: {e}"]
    return [] if callable(function) else [f"fn={fn!r} is not callable"]


def _reward_function_problem(fn: str, kwargs: dict[str, Any]) -> tuple[str | None, bool]:
    """(why `fn` cannot be a reward function called with `kwargs`, or None; whether it is the math checker)."""
    if ":" not in fn:
        if fn not in REWARD_FUNCTIONS.names():
            return (f"is neither a built-in reward ({', '.join(REWARD_FUNCTIONS.names())}) nor of the form "
                    "package.module:function"), False
        function = REWARD_FUNCTIONS.get(fn)
    else:
        try:
            function = load_callable(fn)
        except ValueError as e:
            return str(e), False
    is_math = function is REWARD_FUNCTIONS.get("math")
    if not callable(function):
        return f"names a {type(function).__name__}, not a function", is_math
    try:
        inspect.signature(function).bind(prompts=[], responses=[], fields=[], tokens=[], **kwargs)
    except TypeError as e:
        return (f"has the wrong signature ({e}); a reward function takes "
                "(prompts, responses, fields, tokens, **kwargs)"), is_math
    except ValueError:  # a builtin without a signature: it is called and may fail, counted per sample
        pass
    return None, is_math


def shipped_architecture_of(hub_id: str) -> str | None:
    """The shipped architecture (`registry.ARCHITECTURES`: name -> config.json path) whose source model
    is the Hugging Face hub id `hub_id` (the `_name_or_path` in its config file, compared
    case-insensitively), or None. Lets a recipe that names a hub model be checked and planned on a
    machine that has never downloaded it."""
    for name in ARCHITECTURES.names():
        source = json.loads(Path(ARCHITECTURES.get(name)).read_text()).get("_name_or_path", "")
        if source.lower() == hub_id.lower():
            return name
    return None


def context_length(model_path: str) -> int | None:
    """max_position_embeddings of `model_path` without loading or downloading anything: a shipped
    architecture (config:<name>, or a hub id it was taken from), a config:<file>.json, or a local model
    directory's config.json (also the Hugging Face cache's copy of a hub id); None when unknown."""
    arch = parse_config_path(model_path) or shipped_architecture_of(model_path)
    if arch is not None:
        files = [Path(ARCHITECTURES.get(arch)) if arch in ARCHITECTURES.names() else Path(arch).expanduser()]
    else:
        files = [Path(model_path).expanduser() / "config.json"]
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model_path, "config.json")
            if isinstance(cached, str):
                files.append(Path(cached))
        except Exception:  # not a hub id, or no hub library: unknown
            pass
    for f in files:
        if f.is_file():
            data = json.loads(f.read_text())
            value = data.get("text_config", data).get("max_position_embeddings")
            return int(value) if value is not None else None
    return None


def parse_config_path(path: str) -> str | None:
    """The name or .json path after `config:` in a model.path, or None when it is not a `config:` path."""
    if not path.startswith(CONFIG_PREFIX):
        return None
    return path[len(CONFIG_PREFIX) :]


# --------------------------------------------------------------------------------------------------
# building a config from dicts, YAML and overrides
# --------------------------------------------------------------------------------------------------
def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return "mapping"
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check `value` against the annotation `tp`; ints are accepted for floats. Raises ConfigError."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        choices = [str(a) for a in typing.get_args(tp)]
        lowered = {c.lower(): c for c in choices}
        word = str(value).lower()
        if word in lowered:
            close = [lowered[word]]
        elif word in ("off", "no", "false"):  # switching a choice field off
            close = ["none"] if "none" in choices else []
        elif word in ("on", "yes", "true"):  # "on" is not a typo of "none": which choice is meant is the user's call
            close = []
        else:
            close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        shown = str(value).lower() if isinstance(value, bool) else repr(value)  # as typed: true, not True
        raise ConfigError(f"{where}: {shown} is not one of {_type_name(tp)}{hint}")
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError:
                pass
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")
        return [_coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:  # dict[str, Any]: free-form keyword arguments, any YAML value
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ConfigError(f"{where}: expected a mapping of names to values, got {type(value).__name__} {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):  # an item of a list of sections, e.g. reward.functions[0]
        if isinstance(value, tp):
            return value
        return from_dict(tp, value, where + ".")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _YAML11_BOOLS:
            return _YAML11_BOOLS[value.strip().lower()]  # YAML 1.1's yes/no/on/off, kept as strings by the loader
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and _FLOAT_RE.fullmatch(value.strip()):
            return float(value)  # PyYAML (YAML 1.1) reads "1e-3" as a string: accept it as the number it is
    elif tp is str:
        if isinstance(value, str):
            return value
    else:
        raise TypeError(f"unsupported config annotation {tp!r} at {where}")
    raise ConfigError(f"{where}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")


def _all_keys(cls: type, prefix: str = "") -> list[str]:
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = prefix + f.name
        keys.append(path)
        if dataclasses.is_dataclass(hints[f.name]):
            keys += _all_keys(hints[f.name], path + ".")
    return keys


def _unknown_key_error(cls: type, key: str, prefix: str) -> ConfigError:
    local = [f.name for f in dataclasses.fields(cls)]
    close = difflib.get_close_matches(key, local, n=1, cutoff=0.5)
    close = close or [k for k in local if len(k) > 1 and (key.startswith(k) or k.startswith(key))][:1]  # lr_rate -> lr
    if close:
        hint = f"did you mean {prefix + close[0]!r}?"
    else:  # maybe it lives under another section, e.g. `n` given at top level instead of rollout.n
        elsewhere = [k for k in _all_keys(Config) if k.rsplit(".", 1)[-1] == key]
        hint = f"did you mean {elsewhere[0]!r}?" if elsewhere else f"valid keys under {prefix.rstrip('.') or 'the top level'}: {', '.join(local)}"
    return ConfigError(f"unknown config key {prefix + key!r}; {hint}")


def from_dict(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Build the dataclass `cls` from a nested dict, starting from its defaults."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            raise _unknown_key_error(cls, str(key), prefix)
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = from_dict(tp, value if value is not None else {}, prefix + key + ".")
        else:
            kwargs[key] = _coerce(value, tp, prefix + key)
    return cls(**kwargs)


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    node = tree
    *parents, last = dotted.split(".")
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted!r}: {part!r} is a value, not a section")
        node = child
    node[last] = value


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's booleans: only true/false are bools.

    YAML 1.1 also reads yes/no/on/off as bools, so `algo.kl.use=yes` reached the check as True and
    the message showed a value the user never typed. Here those words stay strings: a choice field
    reports 'yes' as typed, and a bool field accepts them (`_coerce`), as it did before."""


_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_YAML11_BOOLS = {"yes": True, "on": True, "no": False, "off": False}


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass


def parse_override(text: str) -> tuple[str, Any]:
    """`a.b=value` with the value read as YAML (so 0.2 is a float, true a bool, [1,2] a list, null None)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key.path=value (e.g. rollout.n=8)")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = _load_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def load_config(
    recipe: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (), *, check_paths: bool = True
) -> Config:
    """Defaults <- recipe YAML (if given) <- dotted overrides, then validated (see Config.validate)."""
    tree: dict[str, Any] = {}
    if recipe is not None:
        path = Path(recipe)
        if not path.exists():
            raise ConfigError(f"recipe {str(path)!r} does not exist")
        if not path.is_file():
            raise ConfigError(f"recipe {str(path)!r} is not a file; give a .yaml recipe")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"recipe {str(path)!r} is not a text file (byte {e.start} is not UTF-8); "
                              "a recipe is a YAML file") from None
        except OSError as e:
            raise ConfigError(f"recipe {str(path)!r} cannot be read: {e.strerror}") from None
        try:
            loaded = _load_yaml(text) or {}
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
            what = " ".join(str(x) for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x) or str(e)
            raise ConfigError(f"recipe {where}: not valid YAML: {' '.join(what.split())}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"recipe {str(path)!r} must be a mapping at the top level")
        tree = loaded
    for text in overrides:
        key, value = parse_override(text)
        _set_dotted(tree, key, value)
    cfg = from_dict(Config, tree)
    cfg.validate(check_paths=check_paths)
    return cfg


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
