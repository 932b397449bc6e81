"""The config tree's rollout section (`Config.rollout`): sampling, the engine (torch or vLLM), the
generator processes of asynchronous training and the tools of multi-turn episodes; declared as
config/tree.py declares the rest (one field, its type, domain, default and help)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from mathrl.config.schema import (
    Count,
    NonNeg,
    Positions,
    Positive,
    Registered,
    When,
    at_least,
    knob,
    positive,
    section,
    unit,
)
from mathrl.registry import ENGINES, TOOL_FORMATS

# domains of the rollout section's fields
SAMPLING_TEMPERATURE = positive(
    "training samples from the policy: at 0 (greedy) every sample of a group is the same, its advantages are 0, "
    "and the sampling logprobs the loss needs are undefined; eval.temperature=0 is allowed")
STALENESS = at_least(0, "policy versions between the sampling weights and the trainer's")

# what makes a field count (schema.When)
VLLM = When(("rollout.engine",), lambda c: c.rollout.engine == "vllm", "rollout.engine=vllm")
GENERATORS = When(("rollout.max_staleness", "rollout.generator.workers"), lambda c: c.generator_workers > 0,
                  "generator processes (rollout.max_staleness >= 1, or rollout.generator.workers >= 1)")
TOOLS_ON = When(("rollout.tools",), lambda c: bool(c.rollout.tools), "rollout.tools (at least one tool)")


@dataclass
class VLLMConfig:
    """The vLLM rollout engine (rollout.engine: vllm): one colocated, in-process engine per training process,
    weights synced in memory after every update. Install: docs/guide.md, "Rollouts with vLLM"."""

    gpu_memory_utilization: Annotated[float, unit(open_low=True, why="a share of the GPU's memory")] = knob(0.5,
        "share of GPU memory vLLM may take (weights, activations, KV cache); the trainer needs the rest", when=VLLM)
    kv_cache_gb: Annotated[float, positive("null lets vLLM size it")] | None = knob(None,
        "KV cache size in GiB, overriding gpu_memory_utilization; null: vLLM sizes it on a GPU, 1 GiB on a CPU", when=VLLM)
    max_model_len: Positions | None = knob(None,
        "longest prompt + response in tokens; null: the model's context (max_position_embeddings)", when=VLLM)
    tensor_parallel_size: Count = knob(1, "GPUs one engine shards the model over (the colocated engine supports 1)", when=VLLM)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = knob("auto",
        "vLLM's weights and compute; auto: model.dtype", when=VLLM)
    enforce_eager: bool | None = knob(None,
        "no CUDA graphs / compilation (slower decoding, faster start); null: eager "
        "on CPUs (compiling costs ~40 s there for little gain), compiled on GPUs", when=VLLM)
    enable_sleep_mode: bool = knob(False,
        "GPU only: free the KV cache during the policy update, wake before generating", when=VLLM)
    sleep_level: Literal[1, 2] = knob(1,
        "1: weights moved to host memory while asleep and copied back on waking; 2: dropped, no copy "
        "either way (every update is followed by a sync that overwrites them: the recipes use 2)",
        when=When(("rollout.vllm.enable_sleep_mode",), lambda c: c.rollout.vllm.enable_sleep_mode, "rollout.vllm.enable_sleep_mode=true"))
    enable_prefix_caching: bool = knob(True, "the n samples of a prompt share its KV blocks", when=VLLM)
    max_num_seqs: Count | None = knob(None, "sequences decoded together; null: vLLM's default", when=VLLM)
    max_num_batched_tokens: Count | None = knob(None, "tokens per scheduler step; null: vLLM's default", when=VLLM)


@dataclass
class GeneratorConfig:
    """The generator processes that sample while the trainer trains (train/generators/host.py, docs/async.md): each
    runs its own engine on its own cores (CPU) or GPU and receives every needed policy version over a
    torch.distributed group (gloo; NCCL between distinct GPUs), in buckets, never through disk."""

    workers: NonNeg[int] | None = knob(None,
        "generator processes; null: 1 when rollout.max_staleness >= 1, else 0 (the engine "
        "samples inside the trainer's process). With max_staleness=0 and workers >= 1 the "
        "workers sample the current weights (on-policy, disaggregated, no overlap)")
    threads: NonNeg[int] = knob(0,
        "torch threads of each generator; 0: the cores this process may use, "
        "split evenly between the trainer and the generators (one each on 2 cores)", when=GENERATORS)
    pin_cores: bool = knob(True,
        "bind the trainer and each generator to cores of their "
        "own (os.sched_setaffinity) when there are enough for all", when=GENERATORS)
    devices: Annotated[list[int], at_least(0, "CUDA device indices")] = knob([],
        "CUDA devices of the generators (worker i takes devices[i % len]); empty: the GPUs after "
        "the trainer's ranks when the machine has any left, else the trainer's own GPU (shared)", when=GENERATORS)
    bucket_mb: Positive[float] = knob(256.0,
        "size of one weight-broadcast bucket in MiB (tensors of one dtype flattened together)", when=GENERATORS)


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

    call_open: str | None = knob(None, r'the model opens a call with this (python_blocks: "```python\n")', when=TOOLS_ON)
    call_close: str | None = knob(None,
        r'... and closes it with this; generation stops here and the tool runs (python_blocks: "```\n")', when=TOOLS_ON)
    observation_open: str | None = knob(None,
        r'the observation appended after a call starts with this (python_blocks: "```output\n")', when=TOOLS_ON)
    observation_close: str | None = knob(None, r'... and ends with this (python_blocks: "```\n")', when=TOOLS_ON)


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
        "blocks) or chat_tool_call (the chat template's <tool_call>{json}</tool_call>)", when=TOOLS_ON)
    tool_tags: ToolTagsConfig = section(ToolTagsConfig, "override the format's call and observation tags")
    max_turns: Count = knob(4, "model turns per episode (a turn ends at a tool call or at the end of the response)", when=TOOLS_ON)
    max_tool_calls: NonNeg[int] = knob(3,
        "tool calls run per episode; a call past it gets an observation saying so, and is not run", when=TOOLS_ON)
    observation_max_tokens: Count = knob(32,
        "longer observations are cut in the middle, with a note saying "
        "how much was cut; at least 30, the note's room (docs/tools.md)", when=TOOLS_ON)
    tool_workers: Count = knob(4, "tool calls run in parallel", when=TOOLS_ON)
    tool_delay_steps: NonNeg[int] = knob(1,
        "torch engine: decode steps from a call's closing token to reading its output (the call runs while the "
        "other rows decode; the row feeds the observation's opening tag, then masked padding); 0 = the output "
        "is fed with the closing token in one window forward that waits for the step's calls (docs/tools.md)", when=TOOLS_ON)
