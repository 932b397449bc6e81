"""Evaluation sharded across ranks gives one process's numbers.

Every rank samples a block of the evaluation rows (whole seed blocks of the engine, so each row draws
from the same random stream as in one process), verifies it, and the rows are gathered on every rank.
Before, rank 0 evaluated alone while the other ranks waited in a collective: on a long evaluation
that wait passes the collective timeout.
"""

from __future__ import annotations

import pickle

import pytest
import torch

from mathrl.evaluation.evaluate import evaluate
from mathrl.model.tiny import build_char_tokenizer
from mathrl.reward.verify import Verifier
from mathrl.rollout.engine import TorchEngine
from mathrl.shards import block_rows
from mathrl.tasks.base import Problem


@pytest.mark.parametrize("total, block, world", [(24, 8, 2), (1600, 512, 2), (7, 1, 3), (5, 8, 2), (10, 3, 4)])
def test_block_rows_are_whole_blocks_contiguous_and_complete(total, block, world):
    pieces = [block_rows(total, block, r, world) for r in range(world)]
    assert pieces[0][0] == 0 and pieces[-1][1] == total
    for (_, hi), (lo, _) in zip(pieces, pieces[1:]):
        assert hi == lo  # contiguous, in rank order
    for lo, hi in pieces:
        assert (lo % block == 0 or lo == total) and (hi % block == 0 or hi == total)  # whole seed blocks
    sizes = [-(-(hi - lo) // block) for lo, hi in pieces]
    assert max(sizes) - min(sizes) <= 1  # balanced to one block


def _setup():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_char_tokenizer()
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = Qwen2ForCausalLM(config).eval()
    problems = [Problem(id=str(i), question=f"{i}+{i}", answer=str(2 * i)) for i in range(6)]
    prompts = [tokenizer(f"{i}+{i}=")["input_ids"] for i in range(6)]
    engine = TorchEngine(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, batch_size=8)
    return tokenizer, problems, prompts, engine


def _run(rank: int, world_size: int, gather):
    tokenizer, problems, prompts, engine = _setup()
    with Verifier(num_workers=0) as verifier:
        return evaluate("t", problems, prompts, engine=engine, tokenizer=tokenizer, verifier=verifier, n=4,
                        max_new_tokens=6, temperature=1.0, top_p=1.0, seed=5, rank=rank, world_size=world_size,
                        gather=gather)


def _worker(rank: int, world_size: int, init_file: str, out: str) -> None:
    import torch.distributed as dist

    from mathrl.train.dist import all_gather_objects, close_distributed, exit_rank

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        result = _run(rank, world_size, all_gather_objects)
        with open(f"{out}.{rank}", "wb") as f:
            pickle.dump(result, f)
    except BaseException:
        dist.destroy_process_group()
        raise
    # a finished rank ends as mathrl's ranks do: a barrier, the group destroyed, then no interpreter
    # shutdown, during which gloo's worker threads can abort the process (train/dist.py)
    close_distributed()
    exit_rank(0)


@pytest.mark.slow
def test_two_ranks_evaluate_exactly_as_one_process(tmp_path):
    import torch.multiprocessing as mp

    one = _run(0, 1, lambda x: [x])
    out = str(tmp_path / "result")
    mp.spawn(_worker, args=(2, str(tmp_path / "store"), out), nprocs=2, join=True)
    for rank in range(2):  # 24 rows in blocks of 8: rank 0 samples 16, rank 1 samples 8; both return the whole
        with open(f"{out}.{rank}", "rb") as f:
            got = pickle.load(f)
        assert got == one
