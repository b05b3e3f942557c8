"""A float LM head tied to the embeddings holds the table once (``layers.basic.tie_lm_head``)."""

from __future__ import annotations

import numpy as np
import pytest

from fd_core.engine.model_runner import ModelRunner
from fd_core.layers.basic import embed
from fd_core.model_loader.accounting import weight_bytes, weight_bytes_by_dtype
from fd_core.testing.greedy import greedy_generate


def _distinct_bytes(model) -> int:
    """Bytes of the distinct storages behind the model's float weights (views counted once)."""
    seen: dict[int, int] = {}
    for p in [*model.parameters().values(), model.lm_head.weight]:
        data = p.data
        if hasattr(data, "data_ptr"):
            seen[data.data_ptr()] = int(np.prod(data.shape)) * data.element_size()
    return sum(seen.values())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tied_table_is_a_view_of_the_head(checkpoint_factory, cpu_backend, dtype):
    runner = ModelRunner(checkpoint_factory("tiny-dense", "pytorch"), cpu_backend, num_blocks=16, block_size=16,
                         dtype=dtype)
    model = runner.model
    assert model.config.tie_word_embeddings
    head, table = model.lm_head.weight.data, model.embed_tokens.data
    assert head.is_contiguous() and not table.is_contiguous() and table.data_ptr() == head.data_ptr()
    v, d = model.config.vocab_size, model.config.hidden_size
    size = 4 if dtype == "float32" else 2
    # the accounting counts the table once, and that is what is really held
    assert weight_bytes(model) == _distinct_bytes(model)
    assert weight_bytes_by_dtype(model)[dtype] >= v * d * size
    everything = sum(int(np.prod(p.data.shape)) * p.data.element_size() for p in model.parameters().values())
    assert weight_bytes(model) == everything  # table (view) not counted, head counted: v * d once


def test_embedding_rows_from_the_view_equal_a_contiguous_table(checkpoint_factory, cpu_backend):
    import paddle

    model = ModelRunner(checkpoint_factory("tiny-dense", "pytorch"), cpu_backend, num_blocks=16,
                        block_size=16).model
    view = model.embed_tokens.data
    ids = paddle.to_tensor([0, 5, 2047, 5], dtype="int64")
    np.testing.assert_array_equal(embed(view, ids).numpy(), embed(view.contiguous(), ids).numpy())


def test_tied_and_untied_heads_give_the_same_tokens(checkpoint_factory, cpu_backend, monkeypatch):
    import fd_core.layers.basic as basic

    path = checkpoint_factory("tiny-moe", "pytorch")
    prompts = [[100, 200, 300], [7] * 20]
    once = greedy_generate(ModelRunner(path, cpu_backend, num_blocks=16, block_size=16), prompts, 8)

    def twice(lm_head, embed_tokens):  # the former behaviour: the head its own copy
        lm_head.weight.set(embed_tokens.data.t().contiguous())

    monkeypatch.setattr(basic, "tie_lm_head", twice)
    import fd_core.models.ernie4_5 as ernie

    monkeypatch.setattr(ernie, "tie_lm_head", twice)
    runner = ModelRunner(path, cpu_backend, num_blocks=16, block_size=16)
    assert runner.model.embed_tokens.data.is_contiguous()
    assert greedy_generate(runner, prompts, 8) == once
