"""The config tree's algo section (`Config.algo`): the policy loss and its hyperparameters, the advantage
estimator, the critic, the entropy and KL terms, PTX, the positive-example LM loss and the rollout/trainer
corrections; declared as config/tree.py declares the rest (one field, its type, domain, default and help)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Literal

from mathrl.config.schema import (
    Count,
    Finite,
    NonNeg,
    Positions,
    Positive,
    Range,
    Registered,
    Rule,
    Text,
    When,
    ZeroToOne,
    knob,
    positive,
    section,
    unit,
)
from mathrl.registry import ADVANTAGE_ESTIMATORS, POLICY_LOSSES

# domains of the algo section's fields
RATIO_WINDOW = Rule(lambda v: len(v) == 2 and all(math.isfinite(x) for x in v) and 0 < v[0] <= 1 <= v[1],
                    "[lower, upper] with 0 < lower <= 1 <= upper (a ratio pi_trainer / pi_rollout of 1 is on-policy and is kept)")
DISTINCT = Rule(lambda v: len(set(v)) == len(v), "a list without repeats")
DUAL_CLIP = Range(1, open_low=True, why="the dual-clip bound sits above the ratio clip")
LOWER_RATIO = unit(open_low=True, open_high=True, why="a ratio of 1 is on-policy; 0.5 is IcePop's")
TOKEN_SHARE = unit(why="the share of tokens kept; 0.2 is the paper's, 0 keeps the highest-entropy token (TRL)")


# what makes a field count (schema.When): a field set away from its default without it is refused
def _loss(*names: str) -> When:
    return When(("algo.policy_loss",), lambda c: c.algo.policy_loss in names, "algo.policy_loss=" + " or ".join(names))


def _estimator(*names: str) -> When:
    return When(("algo.adv.estimator",), lambda c: c.algo.adv.estimator in names,
                "algo.adv.estimator=" + " or ".join(names))


def _mask(*names: str) -> When:
    return When(("algo.rollout_correction.masks",), lambda c: any(n in c.algo.rollout_correction.masks for n in names),
                " or ".join(names) + " in algo.rollout_correction.masks")


CLIPPING = When(("algo.policy_loss",), lambda c: bool(POLICY_LOSSES.get(c.algo.policy_loss).defaults),
                "a policy loss with a ratio clip (ppo_clip, gspo, gspo_token, cispo, geo_mean, clip_cov)")
CRITIC = When(("algo.adv.estimator",), lambda c: ADVANTAGE_ESTIMATORS.get(c.algo.adv.estimator).needs_critic,
              "algo.adv.estimator=gae (an estimator with a learned critic)")
STD_NORMALIZING = ("grpo", "grpo_passk", "gdpo")  # the estimators that read algo.adv.std_normalize / std_scope
BATCH_STD = When(("algo.adv.estimator", "algo.adv.std_normalize"),
                 lambda c: c.algo.adv.estimator in STD_NORMALIZING and c.algo.adv.std_normalize,
                 "algo.adv.std_normalize=true and algo.adv.estimator=" + " or ".join(STD_NORMALIZING))
ENTROPY_ON = When(("algo.entropy.mode",), lambda c: c.algo.entropy.mode != "none", "algo.entropy.mode=fixed, adaptive or skywork")
CONTROLLED = When(("algo.entropy.mode",), lambda c: c.algo.entropy.mode in ("adaptive", "skywork"),
                  "algo.entropy.mode=adaptive or skywork")
KL_ON = When(("algo.kl.use",), lambda c: c.algo.kl.use != "none", "algo.kl.use=loss or reward")
KL_ADAPTIVE = When(("algo.kl.target",), lambda c: c.algo.kl.target is not None, "algo.kl.target set (the adaptive controller)")
PTX_ON = When(("algo.ptx.coef",), lambda c: c.algo.ptx.coef > 0, "algo.ptx.coef > 0")
WEIGHTED = When(("algo.rollout_correction.mode", "algo.off_policy"),
                lambda c: c.algo.rollout_correction.mode != "none" or c.algo.off_policy != "none",
                "algo.rollout_correction.mode=tis or mis, or algo.off_policy=tis or decoupled")
REJECTING = When(("algo.rollout_correction.mode", "algo.off_policy", "algo.rollout_correction.masks"),
                 lambda c: (c.algo.rollout_correction.mode != "none" or c.algo.off_policy != "none"
                            or bool(c.algo.rollout_correction.masks)),
                 "algo.rollout_correction.mode, algo.off_policy or algo.rollout_correction.masks")
DISTILL_ON = When(("algo.distill.mode",), lambda c: c.algo.distill.mode != "none",
                  "algo.distill.mode=reverse_kl, forward_kl_topk or jsd")


def _distill(*modes: str) -> When:
    return When(("algo.distill.mode",), lambda c: c.algo.distill.mode in modes, "algo.distill.mode=" + " or ".join(modes))


TEACHER_SELF = When(("algo.distill.mode", "teacher.self"), lambda c: c.algo.distill.mode != "none" and c.teacher.self,
                    "teacher.self=true with algo.distill.mode set")
TEACHER_URL = When(("algo.distill.mode", "teacher.url"), lambda c: c.algo.distill.mode != "none" and bool(c.teacher.url),
                   "teacher.url set with algo.distill.mode set")
TEACHER_VLLM = When(("algo.distill.mode", "teacher.engine"),
                    lambda c: c.algo.distill.mode != "none" and c.teacher.engine == "vllm",
                    "teacher.engine=vllm with algo.distill.mode set")
RC_ON = When(("algo.rollout_correction.mode",), lambda c: c.algo.rollout_correction.mode != "none",
             "algo.rollout_correction.mode=tis or mis")


@dataclass
class ClipConfig:
    """PPO's ratio clip; a policy loss published with other values (gspo 3e-4 / 4e-4, cispo's one-sided
    1.0 / 0.2, geo_mean's log-space 0.4 / 0.4) gets its own for each key the user does not set (its
    registered `defaults`; `mathrl config` and config.yaml say which values came from it)."""

    eps_low: ZeroToOne = knob(0.2, "ratio clipped below at 1 - eps_low (1.0: no lower bound, as CISPO)", when=CLIPPING)
    eps_high: NonNeg[float] = knob(0.28, "ratio clipped above at 1 + eps_high (clip-higher, DAPO section 3.1)",
                                   when=CLIPPING)
    dual_clip_c: Annotated[float, DUAL_CLIP] | None = knob(None,
        "dual clip bound for negative advantages (Ye et al. 2020); None = off")


@dataclass
class AdvConfig:
    estimator: Annotated[str, Registered(ADVANTAGE_ESTIMATORS)] = knob("grpo",
        "a registered advantage estimator (algo/estimators.py): grpo, rloo, reinforce_pp, gae (PPO with a learned "
        "critic, algo.critic), grpo_passk, reinforce_pp_baseline, opo, gpg, maxrl, gdpo, optimal_token_baseline, "
        "tir_optimal_token_baseline, or remax (the greedy response per prompt is its baseline; docs/tricks.md)")
    std_normalize: bool = knob(True,
        "divide by the reward std (GRPO; also grpo_passk and gdpo's per-component normalisation); False is Dr. GRPO",
        when=_estimator(*STD_NORMALIZING))
    std_scope: Literal["group", "batch"] = knob("group",
        "the std that normalises: per group or over the batch (grpo, grpo_passk, gdpo)", when=BATCH_STD)
    gpg_alpha: Literal["valid_groups", "nonzero_rewards", "none"] = knob("valid_groups",
        "gpg's scale alpha: valid_groups = N / (N - M), M the samples of all-equal groups "
        "(GPG paper and code); nonzero_rewards = N / #(reward != 0) (verl); none = 1", when=_estimator("gpg"))
    gdpo_whiten: Literal["token", "sequence", "none"] = knob("token",
        "gdpo's last step, whitening the summed advantage over the batch: token = over its counted tokens "
        "(verl), sequence = over its responses (TRL, NeMo-RL), none = the decoupled sum", when=_estimator("gdpo"))


@dataclass
class CriticConfig:
    """PPO with a learned critic (algo.adv.estimator: gae): GAE, VC-PPO value pretraining and decoupled
    lambdas, VAPO length-adaptive lambda."""

    path: str | None = knob(None, "critic initialisation (a causal LM or a saved critic); default: the starting policy",
                            when=CRITIC)
    lr: Positive[float] | None = knob(None, "critic learning rate; default: train.lr", when=CRITIC)
    gamma: Annotated[float, unit(open_low=True)] = knob(1.0, "discount", when=CRITIC)
    lam_actor: ZeroToOne = knob(0.95, "GAE lambda of the policy advantages", when=CRITIC)
    lam_critic: ZeroToOne = knob(1.0, "GAE lambda of the value targets (decoupled GAE, VC-PPO: 1.0)", when=CRITIC)
    length_adaptive_alpha: Annotated[float, positive("VAPO uses 0.05; null is off")] | None = knob(None,
        "VAPO: lam_actor = 1 - 1/(alpha * length) per response (0.05); None = off", when=CRITIC)
    value_clip: Annotated[float, positive("null is off")] | None = knob(0.2,
        "clip range of the value loss around the sampling-time values; None = off", when=CRITIC)
    pretrain_steps: NonNeg[int] = knob(0,
        "VC-PPO value pretraining: critic-only steps on the starting policy's rollouts (lambda 1)", when=CRITIC)
    whiten_advantages: bool = knob(True, "normalise the policy advantages over the batch's tokens (PPO practice)",
                                   when=CRITIC)


@dataclass
class RefGainClipConfig:
    """ref_gain_clip: no entropy bonus on tokens whose entropy already exceeds the reference model's."""

    max_gain: Finite | None = knob(None, "mask tokens with entropy - ref_entropy > max_gain (nats); None = off")
    max_ratio: Positive[float] | None = knob(None, "mask tokens with entropy > max_ratio * ref_entropy; None = off")


@dataclass
class EntropyConfig:
    mode: Literal["none", "fixed", "adaptive", "skywork"] = knob("none",
        "entropy bonus: off, fixed coef, or a controller")
    coef: NonNeg[float] = knob(0.0, "the fixed coefficient, or the starting coefficient of a controller", when=ENTROPY_ON)
    target: NonNeg[float] = knob(0.2, "target token entropy (nats) of the adaptive and skywork controllers",
                                 when=CONTROLLED)
    kp: NonNeg[float] = knob(0.01, "adaptive: coef += kp * (target - entropy) each step",
                             when=When(("algo.entropy.mode",), lambda c: c.algo.entropy.mode == "adaptive",
                                       "algo.entropy.mode=adaptive"))
    step: NonNeg[float] = knob(0.0005, "skywork: coef moves by this much toward the target each step",
                               when=When(("algo.entropy.mode",), lambda c: c.algo.entropy.mode == "skywork",
                                         "algo.entropy.mode=skywork"))
    min_coef: NonNeg[float] = knob(0.0, "the controllers keep coef within [min_coef, max_coef]", when=CONTROLLED)
    max_coef: NonNeg[float] = knob(0.05, "upper bound of the controlled coefficient", when=CONTROLLED)
    ref_gain_clip: RefGainClipConfig = section(RefGainClipConfig)


@dataclass
class KLConfig:
    use: Literal["none", "loss", "reward"] = knob("none",
        "KL to the reference model as a loss term or a reward penalty")
    estimator: Literal["k1", "k2", "k3", "k1+", "k3+"] = knob("k3",
        "KL estimator (Schulman 2020): k1 log-ratio, k2 squared, k3 unbiased low-variance; "
        "k1+ / k3+ the value of k1 / k3 with the gradient of k2 (verl)", when=KL_ON)
    coef: NonNeg[float] = knob(0.001, "fixed coefficient, or the starting one when `target` is set", when=KL_ON)
    target: Annotated[float, positive("null is a fixed coefficient")] | None = knob(None,
        "adaptive controller (Ziegler et al. 2019): target per-token KL; None = fixed")
    horizon: Count = knob(10000, "adaptive controller horizon, in samples", when=KL_ADAPTIVE)


@dataclass
class PTXConfig:
    coef: NonNeg[float] = knob(0.0, "weight of the pretraining cross-entropy mixed into each optimizer step (0 = off)")
    data: Text = knob("arith",
        "\"arith\" (the tiny base model's pretraining text) or a .txt / .jsonl (\"text\" field) file", when=PTX_ON)
    batch_size: Count = knob(16, "pretraining sequences per optimizer step", when=PTX_ON)
    max_tokens: Positions = knob(256, "longer pretraining texts are cut to this many tokens", when=PTX_ON)


@dataclass
class PosLMConfig:
    coef: NonNeg[float] = knob(0.0, "VAPO positive-example LM loss weight mu (0.1 in the paper; 0 = off)")


@dataclass
class RolloutCorrectionConfig:
    """Importance weights and rejection rules between the rollout engine's and the trainer's logprobs, or the
    bypass of the trainer's (algo.rollout_correction; docs/tricks.md, "Rollout/trainer mismatch")."""

    mode: Literal["none", "tis", "mis"] = knob("none",
        "tis: weight min(ratio, cap) (Yao et al. 2025); mis: drop ratio > cap (Liu, Li et al. 2025)")
    level: Literal["token", "sequence"] = knob("token", "ratio per token, or of the whole response", when=RC_ON)
    cap: Annotated[float, Range(1, open_low=True, why="a ratio of 1 is on-policy; 2.0 is common")] = knob(2.0,
        "C > 1: the truncation (tis) or rejection (mis) threshold of the ratio pi_trainer / pi_rollout", when=WEIGHTED)
    lower: Annotated[float, LOWER_RATIO] | None = knob(None,
        "L in (0, 1): tokens whose ratio is under it are rejected too (a "
        "two-sided bound: verl's 1/C, IcePop 0.5); null = no lower bound", when=WEIGHTED)
    rejected: Literal["zero", "drop"] = knob("zero",
        "a rejected token: zero = a zero term that stays in the loss normalisers "
        "(AReaL); drop = out of the loss mask and the normalisers (verl)", when=REJECTING)
    masks: Annotated[list[Literal["geo_rs", "icepop", "k3_rs", "k2_mean_rs", "k2_max_rs", "opsm"]], DISTINCT] = knob([],
        "rejection rules, chained (a token is kept only if every listed rule keeps it; "
        "rejected tokens follow `rejected`): geo_rs, icepop, k3_rs, k2_mean_rs, k2_max_rs compare "
        "pi_trainer with pi_rollout, opsm also reads the advantages (docs/tricks.md)")
    geo_rs_bounds: Annotated[list[float], RATIO_WINDOW] = knob([0.999, 1.001],
        "geo_rs: a response is kept when the geometric mean of its ratios pi_trainer "
        "/ pi_rollout is in [lower, upper] (verl's decoupled_geo_rs preset)", when=_mask("geo_rs"))
    icepop_bounds: Annotated[list[float], RATIO_WINDOW] = knob([0.5, 2.0],
        "icepop: a token is kept when its ratio pi_trainer / pi_rollout is in [lower, upper] (IcePop's [0.5, 2])",
        when=_mask("icepop"))
    k3_rs_threshold: Annotated[float, positive("a KL estimate in nats per token; 0.01 is verl's")] = knob(0.01,
        "k3_rs: a response is rejected when its mean k3 estimate of "
        "KL(pi_rollout || pi_trainer) is above it (verl's decoupled_k3_rs preset)", when=_mask("k3_rs"))
    k2_rs_threshold: Annotated[float, positive("a KL estimate in nats per token")] = knob(0.01,
        "k2_mean_rs: the same with k2 = (log ratio)^2 / 2; k2_max_rs: the largest token's k2 above it",
        when=_mask("k2_mean_rs", "k2_max_rs"))
    opsm_delta: Annotated[float, positive("the mean log-ratio of an on-policy response is 0")] = knob(0.5,
        "opsm (DeepSeek-V3.2): a response with negative advantage is rejected when "
        "its mean log(pi_rollout / pi_trainer) is above it (TRL's suggested start)", when=_mask("opsm"))
    bypass: bool = knob(False,
        "the PPO ratio against the rollout engine's logprobs: old logprobs := rollout logprobs, no scoring "
        "pass (verl's bypass_mode); mode and masks then weigh pi_theta against the engine in the loss "
        "(mode needs policy_loss=gpg, rejected=zero; no opsm, off_policy none)")


@dataclass
class SAPOConfig:
    """SAPO's soft gate (algo.policy_loss=sapo; Gao et al. 2025): sigmoid(tau (ratio - 1)) * 4 / tau."""

    tau_pos: Positive[float] = knob(1.0, "the gate's temperature where the advantage is > 0 (the paper's 1.0)",
                                    when=_loss("sapo"))
    tau_neg: Positive[float] = knob(1.05,
        "... where it is <= 0 (the paper's 1.05: negative tokens' gates fall off faster)", when=_loss("sapo"))


@dataclass
class DPPOConfig:
    """DPPO's trust region on the probability (algo.policy_loss=dppo_tv or dppo_kl; arXiv 2602.04879)."""

    delta_low: Positive[float] = knob(0.2,
        "the divergence bound where the advantage is < 0 (dppo_tv: p_old - p; dppo_kl: the binary KL)",
        when=_loss("dppo_tv", "dppo_kl"))
    delta_high: Positive[float] = knob(0.2, "... where it is > 0 (dppo_tv: p - p_old)", when=_loss("dppo_tv", "dppo_kl"))
    trunc_c: Annotated[float, Range(1, open_low=True, why="a truncation below 1 would cut on-policy tokens")] = knob(
        20.0, "the stopped importance weight is min(ratio, trunc_c) (the paper's §5.4: large)",
        when=_loss("dppo_tv", "dppo_kl"))


@dataclass
class CovConfig:
    """Clip-Cov and KL-Cov (algo.policy_loss=clip_cov or kl_cov; Cui et al. 2025): the few tokens of high
    covariance between logp and the advantage."""

    ratio: Annotated[float, unit(open_low=True, why="the share of counted tokens picked")] = knob(2e-4,
        "share of a micro-batch's counted tokens picked (at least "
        "one): clip_cov cuts their gradient, kl_cov penalises them", when=_loss("clip_cov", "kl_cov"))
    lb: Finite = knob(1.0, "clip_cov: only tokens with covariance in (lb, ub) can be picked", when=_loss("clip_cov"))
    ub: Finite = knob(5.0, "clip_cov: the upper bound of that range", when=_loss("clip_cov"))
    kl_coef: NonNeg[float] = knob(0.1, "kl_cov: coefficient of |log ratio| on the picked tokens (verl's ppo_kl_coef)",
                                  when=_loss("kl_cov"))


@dataclass
class DROConfig:
    beta: Annotated[float, positive("the quadratic penalty's weight; dro needs one")] | None = knob(None,
        "algo.policy_loss=dro: the loss adds beta/2 (log ratio)^2 per token; required by dro", when=_loss("dro"))


@dataclass
class DistillConfig:
    """On-policy distillation from a teacher (the `teacher` section): the student samples, the teacher scores its
    tokens (algo/distill.py; docs/guide.md, "Distillation from a teacher")."""

    mode: Literal["none", "reverse_kl", "forward_kl_topk", "jsd"] = knob("none",
        "none; reverse_kl: the per-token advantage log pi_T - log pi_S through algo.policy_loss (on-policy "
        "distillation, Thinking Machines; mode-seeking); forward_kl_topk: KL(teacher || student) over the teacher's "
        "top-k as a direct loss (verl; mass-covering); jsd: TRL's generalized JSD with algo.distill.beta")
    reward_weight: NonNeg[float] = knob(0.0,
        "the task's advantage (algo.adv.estimator) is multiplied by this and its policy-gradient term kept beside "
        "the distillation term; 0 = distillation alone, > 0 = distillation + task reward", when=DISTILL_ON)
    student: Literal["sampler", "current"] = knob("sampler",
        "reverse_kl's student logprob: the sampler's (Thinking Machines, Tinker) or the current policy's, "
        "detached, at each micro-batch (verl); they differ once the ratio leaves 1", when=_distill("reverse_kl"))
    topk: Count = knob(128, "forward_kl_topk and jsd: the teacher's k most likely tokens per position "
                            "(verl's 128; capped at the vocabulary, where jsd is TRL's full-vocabulary loss)",
                  when=_distill("forward_kl_topk", "jsd"))
    beta: ZeroToOne = knob(0.5, "jsd: 0 = KL(teacher || student), 1 = KL(student || teacher) (TRL's beta; its default 0.5)",
                           when=_distill("jsd"))


@dataclass
class TeacherConfig:
    """The teacher of on-policy distillation (algo.distill.mode): frozen, in the trainer, scored through the same
    pass as the reference model, or behind a teacher server (teacher.url), with the student's tokenizer
    (docs/guide.md, "Distillation from a teacher")."""

    path: str | None = knob(None,
        "a Hugging Face model directory or hub id, or an earlier run's final/ (the same tokenizer as the student)",
        when=DISTILL_ON)
    url: str | None = knob(None,
        "a teacher server's address (`mathrl serve-teacher MODEL --port N`), e.g. http://10.0.0.2:8100: it scores the "
        "student's tokens over HTTP instead of a model in the trainer (the same tokenizer, checked at the start)",
        when=DISTILL_ON)
    engine: Literal["torch", "vllm"] = knob("torch",
        "where teacher.path's (or teacher.self's frozen) model scores: torch (in the trainer, the reference model's "
        "pass) or vllm (its own vLLM engine, the student's transcript as a prompt with prompt_logprobs; "
        "rollout.temperature 1 only: vLLM's prompt logprobs are of the untempered distribution)", when=DISTILL_ON)
    gpu_memory_utilization: ZeroToOne = knob(0.3,
        "teacher.engine=vllm on a GPU: the share of its memory the teacher's engine takes (weights and KV cache), "
        "beside the trainer and the rollout engine's rollout.vllm.gpu_memory_utilization", when=TEACHER_VLLM)
    timeout_s: Positive[float] = knob(120.0, "teacher.url: seconds per request attempt", when=TEACHER_URL)
    retries: NonNeg[int] = knob(2, "teacher.url: further attempts after a failed request (connection error, timeout, 5xx); "
                                   "then the run stops: a teacher's signal is never replaced by a zero", when=TEACHER_URL)
    self: bool = knob(False,
        "self-distillation: the teacher is the starting model itself, with teacher.context in its prompt only",
        when=DISTILL_ON)
    self_update: bool = knob(False, "with teacher.self: the current policy (no gradient) instead of the starting model",
                             when=TEACHER_SELF)
    context: Text = knob("{answer}:{question}",
        "teacher.self: the question the teacher's prompt is made of (data.template applied), with {question}, "
        "{answer} (the reference answer) and {solution} (the problem's solution, else its answer)", when=TEACHER_SELF)


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
        "step's tokens whose old-policy entropy is in this top share; 0 = only the highest-entropy token "
        "(ties too), as TRL; null = every token")
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
    distill: DistillConfig = section(DistillConfig, "on-policy distillation from the `teacher` section's model")
