"""1 prefill + 1 decode engine give the tokens one mixed engine gives, and
the KV bytes each request receives are the model's KV size of the blocks the
decode side lacked."""

from __future__ import annotations

import numpy as np
import pytest

from fd_core import LLM, SamplingParams
from fd_core.models.config import load_config
from tests.disagg.instances import ENGINE, prefill_instance

BLOCK = ENGINE["block_size"]
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(100, 2000, int(rng.integers(3, 90)))] for _ in range(n)]


def _kv_bytes(model_dir, num_blocks: int, itemsize: int = 4) -> int:
    c = load_config(model_dir)
    return c.num_layers * 2 * num_blocks * BLOCK * c.num_kv_heads * c.head_dim * itemsize


@pytest.fixture(scope="module")
def dense(checkpoint_factory):
    return checkpoint_factory("tiny-dense", "pytorch")


@pytest.fixture(scope="module")
def prefill(dense):
    with prefill_instance(dense) as (engine, address):
        yield engine, address


@pytest.fixture(scope="module")
def decode(dense, prefill):
    return LLM(str(dense), splitwise_role="decode", innode_prefill_ports=prefill[1], **ENGINE)


def test_greedy_tokens_equal_a_mixed_engine_and_bytes_match_the_kv_size(dense, decode):
    prompts = _prompts(6)
    mixed = LLM(str(dense), **ENGINE).generate(prompts, GREEDY, use_tqdm=False)
    pd = decode.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in pd] == [o.outputs[0].token_ids for o in mixed]
    for prompt, out in zip(prompts, pd):
        sent = -(-len(prompt) // BLOCK) - out.num_cached_tokens // BLOCK
        assert out.metrics.kv_transfer_bytes == _kv_bytes(dense, sent)
        assert out.metrics.kv_transfer_bytes > 0


def test_a_shared_prefix_sends_fewer_blocks(dense, decode):
    rng = np.random.default_rng(7)
    shared = [int(t) for t in rng.integers(100, 2000, 3 * BLOCK)]
    first = decode.generate([shared + [11, 12, 13]], GREEDY, use_tqdm=False)[0]
    second = decode.generate([shared + [21, 22]], GREEDY, use_tqdm=False)[0]
    assert first.metrics.kv_transfer_bytes == _kv_bytes(dense, 4)
    assert second.num_cached_tokens == 3 * BLOCK
    assert second.metrics.kv_transfer_bytes == _kv_bytes(dense, 1)
    mixed = LLM(str(dense), **ENGINE).generate([shared + [21, 22]], GREEDY, use_tqdm=False)[0]
    assert second.outputs[0].token_ids == mixed.outputs[0].token_ids


def test_seeded_sampling_continues_the_prefill_sides_stream(dense, decode):
    params = [SamplingParams(max_tokens=8, temperature=0.9, top_p=0.9, seed=100 + i, ignore_eos=True)
              for i in range(3)]
    prompts = _prompts(3, seed=3)
    mixed = LLM(str(dense), **ENGINE).generate(prompts, params, use_tqdm=False)
    pd = decode.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in pd] == [o.outputs[0].token_ids for o in mixed]


@pytest.mark.parametrize("shape, naming, kv_dtype, row_bytes", [
    ("tiny-moe", "paddle", "float32", None),
    ("tiny-dense", "pytorch", "int8", "int8"),
])
def test_other_models_and_an_8bit_kv_pool_transfer_exactly(checkpoint_factory, shape, naming, kv_dtype, row_bytes):
    model = checkpoint_factory(shape, naming)
    engine = dict(ENGINE, kv_cache_dtype=kv_dtype)
    prompts = _prompts(3, seed=5)
    mixed = LLM(str(model), **engine).generate(prompts, GREEDY, use_tqdm=False)
    with prefill_instance(model, kv_cache_dtype=kv_dtype) as (_, address):
        pd = LLM(str(model), splitwise_role="decode", innode_prefill_ports=address, **engine).generate(
            prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in pd] == [o.outputs[0].token_ids for o in mixed]
    c = load_config(model)
    for prompt, out in zip(prompts, pd):
        blocks = -(-len(prompt) // BLOCK)
        per_row = c.head_dim * 4 if row_bytes is None else c.head_dim * 1 + 4  # int8 codes + an fp32 scale
        assert out.metrics.kv_transfer_bytes == c.num_layers * 2 * blocks * BLOCK * c.num_kv_heads * per_row


def test_a_small_pool_with_a_host_tier_still_gives_the_mixed_tokens(dense):
    """Blocks evicted to the host tier while KV arrives, preemption of admitted requests."""
    engine = dict(ENGINE, num_gpu_blocks_override=24, swap_space=0.001, max_num_batched_tokens=64)
    prompts = _prompts(10, seed=11)
    mixed = LLM(str(dense), **engine).generate(prompts, GREEDY, use_tqdm=False)
    with prefill_instance(dense) as (_, address):
        pd = LLM(str(dense), splitwise_role="decode", innode_prefill_ports=address, **engine).generate(
            prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in pd] == [o.outputs[0].token_ids for o in mixed]
