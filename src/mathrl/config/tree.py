"""The config tree: every field declared once, with its type, domain, default and help side by side.

    steps: Count = knob(50, "RL steps (one rollout batch each)")
    mode: Literal["none", "tis", "mis"] = knob("none",
        "tis: weight min(ratio, cap) (Yao et al. 2025); mis: drop ratio > cap (Liu, Li et al. 2025)")
    kl: KLConfig = section(KLConfig, "KL to the reference model")

The type is what a recipe or override must give (`Literal` choices, int/float/bool/str, optional, lists);
the domain (`typing.Annotated` metadata: `Count` is `Annotated[int, at_least(1)]`, see config/schema.py)
is what the value must be, checked before anything loads; the help (given by `knob` or `section`; a long
one wrapped over several lines) is what `mathrl config` prints, and a section without help is documented
by its docstring. A list default is copied for each config. The defaults ARE the embedded default
experiment (`recipes/arith_grpo.yaml` lists their main knobs). Derived sizes are properties of `Config`;
`validate` and the rules that tie fields together are methods it inherits from rules.py (`ConfigRules`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from mathrl.config.rules import ConfigRules
from mathrl.config.schema import (
    INF,
    Count,
    Finite,
    NonNeg,
    Positions,
    Positive,
    Range,
    Rule,
    Seed,
    Text,
    When,
    ZeroToOne,
    at_least,
    knob,
    positive,
    section,
    unit,
)
from mathrl.config.shared import DEFAULT_REWARD_FN, TINY_BASE
from mathrl.config.tree_algo import AlgoConfig, Correction, TeacherConfig
from mathrl.config.tree_rollout import RolloutConfig
from mathrl.registry import ARITH_SOURCES, ENGINES, PROMPT_TEMPLATES

# --------------------------------------------------------------------------------------------------
# domains shared by several fields, or too long for the field's line
# --------------------------------------------------------------------------------------------------
Digits = Annotated[int, Range(1, 18)]  # operand sizes of arithmetic problems
Carries = Annotated[int, Range(0, 18, why="at most data.arith.max_digits")]


def _names_ok(value: Any) -> bool:
    return bool(value) and all(isinstance(s, str) and s.strip() for s in value)


MODULE_NAMES = Rule(_names_ok, "a non-empty list of module names")
EVAL_SOURCES = Rule(_names_ok, "a non-empty list of sources (arith, arith_decimal, arith_hard, files, hf: datasets)")
TEMPLATE = Rule(lambda v: v == "chat" or v in PROMPT_TEMPLATES.names() or "{question}" in str(v),
                "arith, zero, plain, chat, or a string containing {question}")
METRIC_NAME = Rule(lambda v: isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9_-]+", v) is not None,
                   "letters, digits, _ or - (it names the metrics reward/<name>/...)")
LENGTH_SCHEDULE = Rule(lambda v: all(isinstance(p, list) and len(p) == 2 and p[0] >= 0 and p[1] >= 1 for p in v),
                       "a list of [step >= 0, target_length >= 1] pairs")
GRAD_NORM = positive("gradients are clipped to this norm; a negative limit flips their sign")
WRONG_ANSWER = Range(-INF, 1, open_high=True, why="a wrong answer must score below a right one (1)")


# --------------------------------------------------------------------------------------------------
# what makes a field count (schema.When): a field set away from its default without it is refused
# --------------------------------------------------------------------------------------------------
def _file_data(c: Any) -> bool:
    return c.data.train != "arith" or any(s not in ARITH_SOURCES.names() for s in c.data.eval)


def _arith_data(c: Any) -> bool:
    return c.data.train == "arith" or any(s in ARITH_SOURCES.names() for s in c.data.eval)


LORA = When(("model.lora.r",), lambda c: c.model.lora.r > 0, "model.lora.r > 0")
FILE_DATA = When(("data.train", "data.eval"), _file_data, "a data file or hf: dataset in data.train or data.eval")
ARITH_DATA = When(("data.train", "data.eval"), _arith_data, "data.train=arith or an arith source in data.eval")
ARITH_TRAIN = When(("data.train",), lambda c: c.data.train == "arith", "data.train=arith")
DROPPING = When(("data.dynamic_sampling.mode",), lambda c: c.data.dynamic_sampling.mode != "none",
                "data.dynamic_sampling.mode=nonconstant or band")
BAND = When(("data.dynamic_sampling.mode",), lambda c: c.data.dynamic_sampling.mode == "band", "data.dynamic_sampling.mode=band")


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
    alpha: Positive[float] = knob(32.0, "scaling numerator: the update is (alpha / r) * B @ A", when=LORA)
    dropout: Annotated[float, unit(open_high=True)] = knob(0.0,
        "dropout on the adapters' input during the policy update (scoring and sampling run without it)", when=LORA)
    target_modules: Annotated[list[str], MODULE_NAMES] = knob(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "names of the linear layers that get adapters (peft's target_modules)", when=LORA)


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
    min_digits: Digits = knob(1, "operand sizes of the arithmetic problems", when=ARITH_DATA)
    max_digits: Digits = knob(3, "(min_digits <= max_digits)", when=ARITH_DATA)
    heldout_permille: Annotated[int, Range(1, 999)] = knob(50,
        "share of the problem space reserved for evaluation (1/1000)", when=ARITH_DATA)
    decimal_share: ZeroToOne = knob(0.0,
        r"share of problems with one-decimal-place operands (2.5+13.7=...\boxed{16.2}), in the "
        "training stream and the arith eval set; the base model learns them with base.decimal_share", when=ARITH_DATA)
    mul_share: ZeroToOne = knob(0.0,
        "share of problems that are products a*b (long multiplication; decimal_share must be 0), in "
        "the training stream and the arith eval set; the base model learns them with base.mul_share", when=ARITH_DATA)
    mul_digits: Digits = knob(2, "digits of a product's second factor (the first: min_digits..max_digits)",
                              when=When(("data.arith.mul_share",), lambda c: c.data.arith.mul_share > 0, "data.arith.mul_share > 0"))
    min_carries: Carries = knob(0,
        "training stream: only problems whose column addition carries "
        "at least this often (0: every problem; at most max_digits)", when=ARITH_TRAIN)
    hard_min_carries: Carries = knob(2,
        "the eval source arith_hard: held-out problems with at least this many carries (at most max_digits)",
        when=When(("data.eval",), lambda c: "arith_hard" in c.data.eval, "arith_hard in data.eval"))


@dataclass
class DynamicSamplingConfig:
    """Which groups reach the loss (DAPO dynamic sampling), and refilling the batch when groups are dropped."""

    mode: Literal["none", "nonconstant", "band"] = knob("nonconstant",
        "nonconstant: drop all-equal groups; band: keep accuracy in [low, high]; none: every group trains")
    band_low: ZeroToOne = knob(0.2, "mode=band: keep groups whose accuracy is >= band_low", when=BAND)
    band_high: ZeroToOne = knob(0.8, "... and <= band_high", when=BAND)
    max_rounds: Count = knob(4, "generation rounds per step to fill the batch with kept groups", when=DROPPING)
    on_exhausted: Literal["train_smaller", "error"] = knob("train_smaller", "when max_rounds cannot fill the batch",
                                                          when=DROPPING)
    max_empty_steps: NonNeg[int] = knob(5,
        "stop after this many steps in a row with no group kept (every sample "
        "wrong, or right), explaining why; 0: never. With mode none: a warning")


@dataclass
class CurriculumConfig:
    mode: Literal["none", "field", "online"] = knob("none", "order training problems easiest-first (jsonl data)")
    field: str = knob("level", "the problem field holding the difficulty, for mode=field",
                      when=When(("data.curriculum.mode",), lambda c: c.data.curriculum.mode == "field", "data.curriculum.mode=field"))


@dataclass
class DataConfig:
    train: Text = knob("arith",
        '"arith" (generated), a .jsonl or .parquet file, or hf:<name>[:<config>][@<split>] (split default train)')
    eval: Annotated[list[str], EVAL_SOURCES] = knob(["arith"],
        '"arith" (held-out split; arith_decimal: its decimal problems only, arith_hard: those with '
        ">= data.arith.hard_min_carries carries) and/or files / hf: datasets (split default test)")
    question_field: Text = knob("problem", "field mapping for data files (a known file or hf: dataset uses its preset)",
                                when=FILE_DATA)
    answer_field: str | None = knob("answer", "field holding the gold answer (null with answer_from_solution)", when=FILE_DATA)
    answer_from_solution: str | None = knob(None, r"take the gold answer from the last \boxed{} of this field", when=FILE_DATA)
    answer_after: str | None = knob(None,
        'the gold answer is the text after this marker in the answer field (GSM8K: "####")', when=FILE_DATA)
    question_suffix: str = knob("",
        "appended to every question (after a space) before the template; DeepScaleR: "
        "\"Let's think step by step and output the final answer within \\\\boxed{}.\"")
    template: Annotated[str, TEMPLATE] = knob("arith",
        "prompt template: arith | zero | plain | chat | a string containing {question}")
    max_prompt_tokens: Count = knob(512, "longer prompts are dropped (counted), never truncated")
    eval_size: Count = knob(200, "problems per eval set (held-out arithmetic problems, or the first N rows)")
    on_error: Literal["raise", "skip"] = knob("raise",
        "a malformed jsonl row: stop naming file:line, or skip and count it", when=FILE_DATA)
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
    init_from: str | None = knob(None,
        "start this new run from another run's checkpoint dir (see init_from_mode); "
        "train.steps then counts this run's steps, from 1 (to extend a finished run in "
        "its own directory, rerun it with a larger train.steps instead)")
    init_from_mode: Literal["continue", "restart"] = knob("continue",
        "continue: its policy, optimizer, schedule and controllers, the KL reference stays "
        "model.path; restart: its policy weights as a new starting model (fresh optimizer "
        "and schedule, the KL reference is that checkpoint), as DeepScaleR's later stages do",
        when=When(("train.init_from",), lambda c: c.train.init_from is not None, "train.init_from (a checkpoint)"))
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
    cache_len: Count = knob(8, "tokens before rollout.max_new_tokens where the soft punishment starts", when=When(
        ("reward.overlong.soft_punishment",), lambda c: c.reward.overlong.soft_punishment, "reward.overlong.soft_punishment=true"))


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
    length_schedule: Annotated[list[list[int]], LENGTH_SCHEDULE] = knob([], "[[step, target_len], ...] (ablation only)",
        when=When(("reward.length_schedule_coef",), lambda c: c.reward.length_schedule_coef > 0, "reward.length_schedule_coef > 0"))
    length_schedule_coef: NonNeg[float] = knob(0.0, "weight of the length_schedule reward (ablation only)",
        when=When(("reward.length_schedule",), lambda c: bool(c.reward.length_schedule), "reward.length_schedule (a schedule)"))


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
    wandb_project: str = knob("mathrl", "W&B project of the run", when=When(("log.wandb",), lambda c: c.log.wandb, "log.wandb=true"))
    mlflow: bool = knob(False, "also log to MLflow at MLFLOW_TRACKING_URI (pip install mlflow-skinny)")
    mlflow_experiment: str = knob("mathrl", "MLflow experiment of the run",
                                  when=When(("log.mlflow",), lambda c: c.log.mlflow, "log.mlflow=true"))


@dataclass
class Config(ConfigRules):
    seed: Seed = knob(0, "seed of the training run (data order, sampling, dropout)")
    run_dir: str | None = knob(None, "default: runs/<timestamp>")
    model: ModelConfig = section(ModelConfig, "the policy model")
    base: BaseModelConfig = section(BaseModelConfig)
    data: DataConfig = section(DataConfig, "problems, prompts and which samples reach the loss")
    rollout: RolloutConfig = section(RolloutConfig, "sampling the training responses")
    algo: AlgoConfig = section(AlgoConfig, "advantages, losses and their tricks")
    teacher: TeacherConfig = section(TeacherConfig)
    train: TrainConfig = section(TrainConfig, "steps, optimizer, checkpoints")
    reward: RewardConfig = section(RewardConfig, "verification and reward shaping")
    eval: EvalConfig = section(EvalConfig, "held-out evaluation during training")
    log: LogConfig = section(LogConfig, "what is written besides metrics.jsonl")
    sft: SFTConfig = section(SFTConfig, "supervised fine-tuning (mathrl sft), before RL")
    # {dotted key: where its value came from} for the values load_config chose (a policy loss's own clip
    # range); not a field: config.yaml keeps its keys, and shows these as comments (load.dump_yaml)
    chosen: ClassVar[dict[str, str]] = {}

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
    def needs_teacher(self) -> bool:
        """A teacher scores the step's tokens only when algo.distill.mode asks for a signal."""
        return self.algo.distill.mode != "none"

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
