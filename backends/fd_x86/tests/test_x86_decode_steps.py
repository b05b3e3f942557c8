"""Multi-step decoding on x86 (``fd_decoder_steps``: ``fd_x86_run_plan_steps``): several decode steps of a
whole-model run in one call, against the same run one step at a time with the engine's draw between (numpy's
argmax for greedy rows, the plugin's ``fd_sample`` for sampled ones): the same tokens and the same bits in
every cache; then the engine, whose multi-step schedules take that call, against one step a schedule."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

from paged_tables import shuffled_tables  # noqa: E402
from test_x86_layer import BLOCK, MAX_POS, _t, usable  # noqa: E402, F401 (usable: its module fixture)
from test_x86_layer_head import VOCAB, _head  # noqa: E402
from test_x86_layer_step import _ids, _layers, _table  # noqa: E402

from fd_core.ops.attention import AttentionMetadata  # noqa: E402
from fd_core.ops.decoder import DecoderEmbedding, DecoderSampling  # noqa: E402
from fd_core.ops.rope import rope_cos_sin  # noqa: E402

pytestmark = pytest.mark.usefixtures("fused_switches_unset")


class Case:
    """``batch`` decoding rows over random cached context, their block tables long enough for ``steps``."""

    def __init__(self, batch: int, steps: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.seq_lens = [int(n) for n in rng.integers(1, 70, batch)]
        num_blocks, self.tables = shuffled_tables(rng, [n + steps - 1 for n in self.seq_lens], BLOCK)
        shape = (num_blocks * BLOCK, 2, 64)
        self.k, self.v = rng.normal(0, 1, shape).astype(np.float32), rng.normal(0, 1, shape).astype(np.float32)
        self.cos_sin = rope_cos_sin(64, MAX_POS, 10000.0)
        self.batch = batch

    def meta(self, step: int = 0) -> AttentionMetadata:
        return AttentionMetadata.build([1] * self.batch, [n + step for n in self.seq_lens], self.tables, BLOCK,
                                       self.batch)

    def caches(self, layers: list[Any]) -> list[tuple[Any, Any]]:
        return [(_t(self.k.copy()), _t(self.v.copy())) for _ in layers]


def _one_at_a_time(x86_ops: Any, layers: list[Any], case: Case, table: Any, ids: Any, head: Any, steps: int,
                   vocab: int, sampling: DecoderSampling | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
    caches = case.caches(layers)
    tokens = []
    for s in range(steps):
        logits = x86_ops.decoder_layers(layers, DecoderEmbedding(table, ids), None, case.cos_sin, case.meta(s),
                                        [c[0] for c in caches], [c[1] for c in caches], head)
        rows = logits[:, :vocab].contiguous()
        if sampling is None:
            tokens.append(rows.numpy().argmax(axis=-1))
        else:
            tokens.append(x86_ops.sample(rows, sampling.temperature, sampling.top_k, sampling.top_p,
                                         sampling.min_p, sampling.uniforms[s], sampling.method).numpy())
        ids = paddle.to_tensor(tokens[-1], dtype="int64")
    return np.stack(tokens), [t.numpy() for c in caches for t in c]


def _together(x86_ops: Any, layers: list[Any], case: Case, table: Any, ids: Any, head: Any, steps: int,
              vocab: int, sampling: DecoderSampling | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
    caches = case.caches(layers)
    tokens = x86_ops.decoder_steps(layers, DecoderEmbedding(table, ids), case.cos_sin, case.meta(),
                                   [c[0] for c in caches], [c[1] for c in caches], head, steps, vocab, sampling)
    assert tokens is not None, "the x86 plugin declined a run it takes one step at a time"
    return tokens.numpy(), [t.numpy() for c in caches for t in c]


def _sampling(batch: int, steps: int, seed: int, method: str = "sort") -> DecoderSampling:
    """Rows cycling through temperature / top-p / top-k / min-p settings, a greedy row among them."""
    rng = np.random.default_rng(seed)
    settings = [(0.8, 0, 0.8, 0.0), (1.0, 5, 1.0, 0.0), (0.0, 0, 1.0, 0.0), (1.3, 0, 1.0, 0.05), (0.6, 20, 0.9, 0.0)]
    rows = np.array([settings[i % len(settings)] for i in range(batch)], dtype=np.float64)
    return DecoderSampling(paddle.to_tensor(rows[:, 0].astype(np.float32)),
                           paddle.to_tensor(rows[:, 1].astype(np.int64)),
                           paddle.to_tensor(rows[:, 2].astype(np.float32)),
                           paddle.to_tensor(rows[:, 3].astype(np.float32)),
                           paddle.to_tensor(rng.random((steps, batch, 16), dtype=np.float32)), method)


@pytest.mark.parametrize("head_form", ["wint8", "bfloat16"])
@pytest.mark.parametrize("batch,steps", [(1, 1), (1, 6), (4, 5), (9, 3)])
@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_the_steps_in_one_call_equal_one_step_at_a_time(x86_ops: Any, batch: int, steps: int, moe: bool,
                                                        head_form: str) -> None:
    """Tokens [steps, T] and every cache bit for bit; the vocabulary narrower than the head (its padded
    columns never chosen), rows crossing into new blocks of their tables."""
    layers, head, case = _layers(moe), _head(head_form), Case(batch, steps, seed=31 + batch)
    table, ids, vocab = _table("bfloat16"), _ids(batch, seed=batch), VOCAB - 9
    got = _together(x86_ops, layers, case, table, ids, head, steps, vocab)
    want = _one_at_a_time(x86_ops, layers, case, table, ids, head, steps, vocab)
    np.testing.assert_array_equal(got[0], want[0])
    assert got[0].shape == (steps, batch) and got[0].max() < vocab
    for a, b in zip(got[1], want[1], strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("head_form", ["wint8", "bfloat16"])
@pytest.mark.parametrize("batch,steps", [(1, 7), (5, 4)])
@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_sampled_steps_in_one_call_draw_what_one_step_at_a_time_draws(x86_ops: Any, batch: int, steps: int,
                                                                      moe: bool, head_form: str) -> None:
    """Rows drawing with temperature, top-k, top-p and min-p (a greedy row among them), each step's uniforms
    given: the tokens of the run one step at a time with the plugin's own ``fd_sample`` between, and every
    cache bit for bit; the draws are not the argmax's."""
    layers, head, case = _layers(moe), _head(head_form), Case(batch, steps, seed=71 + batch)
    table, ids, vocab = _table("bfloat16"), _ids(batch, seed=batch + 3), VOCAB - 9
    sampling = _sampling(batch, steps, seed=batch)
    got = _together(x86_ops, layers, case, table, ids, head, steps, vocab, sampling)
    want = _one_at_a_time(x86_ops, layers, case, table, ids, head, steps, vocab, sampling)
    np.testing.assert_array_equal(got[0], want[0])
    for a, b in zip(got[1], want[1], strict=True):
        np.testing.assert_array_equal(a, b)
    greedy = _one_at_a_time(x86_ops, layers, case, table, ids, head, steps, vocab)[0]
    assert (got[0] != greedy).any()


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_the_portable_loops_take_the_same_steps(x86_ops: Any, monkeypatch: pytest.MonkeyPatch, sampled: bool) -> None:
    """With the argmax and the draw's plain loops (``FD_X86_SAMPLE_ISA=portable``: what a CPU without AVX-512
    runs), the steps in one call still equal one step at a time, and give the AVX-512 loops' tokens."""
    layers, head, case = _layers(True), _head("wint8"), Case(5, 4, seed=81)
    table, ids, vocab = _table("bfloat16"), _ids(5, seed=12), VOCAB - 9
    sampling = _sampling(5, 4, seed=5) if sampled else None
    fast = _together(x86_ops, layers, case, table, ids, head, 4, vocab, sampling)[0]
    monkeypatch.setenv("FD_X86_SAMPLE_ISA", "portable")
    got = _together(x86_ops, layers, case, table, ids, head, 4, vocab, sampling)
    want = _one_at_a_time(x86_ops, layers, case, table, ids, head, 4, vocab, sampling)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[0], fast)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])  # fp16 keeps both copies (tie_lm_head)
@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_a_tied_float_heads_transposed_table_gives_the_same_steps(x86_ops: Any, moe: bool, dtype: str) -> None:
    """The embedding a tied float head's [V, D] view of its [D, V] weight (the model's one copy): the op gathers
    the weight's columns itself; the same tokens and caches as one step at a time."""
    layers, case = _layers(moe), Case(3, 4, seed=50)
    head = _head("float32")
    head.weight = head.weight.astype(dtype)
    table = head.weight.t()
    assert not table.is_contiguous()
    ids = _ids(3, seed=9)
    got = _together(x86_ops, layers, case, table, ids, head, 4, VOCAB)
    want = _one_at_a_time(x86_ops, layers, case, table, ids, head, 4, VOCAB)
    np.testing.assert_array_equal(got[0], want[0])
    for a, b in zip(got[1], want[1], strict=True):
        np.testing.assert_array_equal(a, b)
    other = _head("float32", seed=8).weight.astype(dtype).t()  # a view of another weight: declined
    caches = case.caches(layers)
    assert x86_ops.decoder_steps(layers, DecoderEmbedding(other, ids), case.cos_sin, case.meta(),
                                        [c[0] for c in caches], [c[1] for c in caches], head, 4, VOCAB) is None


@pytest.mark.parametrize("columns,nan", [((37, 50), False), ((5, 21), False), ((3, 195), False),
                                         ((77, 120), True)], ids=["lanes", "one-lane", "tail", "nan"])
def test_ties_go_to_the_first_column_and_a_nan_wins(x86_ops: Any, columns: tuple[int, int], nan: bool) -> None:
    """Two head columns u and every other column -u: each row's logits tie at the two (h.u > 0) or at all the
    others (h.u < 0), and the token is the first of the tied, as numpy's argmax (the sampler) takes it; the two
    in different lanes of the kernel's 16, in one lane, and one in the tail past the last 16. NaN columns: the
    first NaN."""
    head, case = _head("float32"), Case(3, 2, seed=60)
    w = head.weight.numpy()
    u = w[:, 0].copy()
    w[:] = -u[:, None]
    for c in columns:
        w[:, c] = np.float32("nan") if nan else u
    head.weight = paddle.to_tensor(w)
    ids, table = _ids(3, seed=4), _table("float32")
    got = _together(x86_ops, _layers(False), case, table, ids, head, 2, VOCAB)
    want = _one_at_a_time(x86_ops, _layers(False), case, table, ids, head, 2, VOCAB)
    np.testing.assert_array_equal(got[0], want[0])
    first_other = next(c for c in range(VOCAB) if c not in columns)
    assert set(got[0].ravel()) <= ({columns[0]} if nan else {columns[0], first_other}), got[0]


@pytest.mark.parametrize("bad", ["table", "rotary", "slot"])
def test_steps_past_the_block_table_rotary_table_or_cache_are_refused_before_any_cache_write(
        x86_ops: Any, bad: str) -> None:
    """A later step's position past the rows' block tables, the rotary table or the cache (a block id past
    the pool) is refused by name before the first step writes anything."""
    layers, head, case = _layers(False), _head("wint8"), Case(2, 20, seed=40)
    steps, match = 20, r"row \d at position \d+ needs 20 steps, past its block table of \d+ blocks"
    if bad == "table":
        case.seq_lens = [len(t) * BLOCK for t in case.tables]  # every table full: no room for a second step
    elif bad == "rotary":
        case.cos_sin = rope_cos_sin(64, max(case.seq_lens) + 1, 10000.0)
        match = r"needs 20 steps, past the rotary table's \d+ positions"
    else:
        case.tables[0][-1] = 10_000  # the block the last steps of row 0 write: outside the pool
        match = r"row 0 at position \d+ maps to slot 160\d+, outside the cache's \d+ rows"
    caches = case.caches(layers)
    before = [t.numpy().copy() for c in caches for t in c]
    with pytest.raises(Exception, match=match):
        x86_ops.decoder_steps(layers, DecoderEmbedding(_table("float32"), _ids(2)), case.cos_sin,
                                     case.meta(), [c[0] for c in caches], [c[1] for c in caches], head, steps, VOCAB)
    for b, after in zip(before, (t for c in caches for t in c), strict=True):
        np.testing.assert_array_equal(b, after.numpy())


def test_runs_the_plugin_does_not_take_whole_are_declined(x86_ops: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the run plans or the fused embedding (A/B switches), or with a float64 head, the call answers
    None (the engine then steps one forward at a time); the reference answers None always."""
    from fd_core.backends import get_backend

    layers, head, case = _layers(False), _head("wint8"), Case(2, 3, seed=41)
    caches = case.caches(layers)
    args = (layers, DecoderEmbedding(_table("float32"), _ids(2)), case.cos_sin, case.meta(),
            [c[0] for c in caches], [c[1] for c in caches])
    assert x86_ops.decoder_steps(*args, head, 3, VOCAB) is not None
    assert get_backend("cpu").ops.decoder_steps(*args, head, 3, VOCAB) is None
    for name in ("FD_X86_RUN_PLAN", "FD_X86_FUSED_EMBEDDING", "FD_X86_FUSED_HEAD"):
        monkeypatch.setenv(name, "0")
        assert x86_ops.decoder_steps(*args, head, 3, VOCAB) is None, name
        monkeypatch.delenv(name)
    float64 = _head("float32")
    float64.weight = float64.weight.astype("float64")
    assert x86_ops.decoder_steps(*args, float64, 3, VOCAB) is None
    with pytest.raises(ValueError, match="steps and vocab_size must be >= 1, got 0 and"):
        x86_ops.decoder_steps(*args, head, 0, VOCAB)
    # sampled steps: only with the draw this plugin's fd_sample makes itself
    assert x86_ops.decoder_steps(*args, head, 3, VOCAB, _sampling(2, 3, seed=1)) is not None
    assert x86_ops.decoder_steps(*args, head, 3, VOCAB, _sampling(2, 3, seed=1, method="rejection")) is None
    monkeypatch.setenv("FD_X86_SAMPLE", "0")
    assert x86_ops.decoder_steps(*args, head, 3, VOCAB, _sampling(2, 3, seed=1)) is None
    assert x86_ops.decoder_steps(*args, head, 3, VOCAB) is not None
    monkeypatch.delenv("FD_X86_SAMPLE")
    with pytest.raises(ValueError, match=r"sampling arguments for 2 rows and 3 steps expected"):
        x86_ops.decoder_steps(*args, head, 3, VOCAB, _sampling(2, 4, seed=1))


# -- the engine -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from fd_core.testing.checkpoints import generate_checkpoint

    root = tmp_path_factory.mktemp("greedy-steps")
    return {shape: generate_checkpoint(root / shape, shape, naming="paddle", seed=2)
            for shape in ("tiny-dense", "tiny-moe")}


@pytest.mark.parametrize("shape,quantization", [
    ("tiny-dense", "wint8"), ("tiny-dense", {"quantization": "w4a8", "lm_head_quant_type": "w4a8"}),
    ("tiny-moe", "wint4"), ("tiny-moe", {"quantization": "wint8", "lm_head_quant_type": "wint8"})],
    ids=["dense-wint8", "dense-w4a8-head", "moe-wint4", "moe-wint8-head"])
def test_the_engine_takes_the_steps_in_one_call_and_gives_the_same_tokens(
        checkpoints: dict[str, Any], monkeypatch: pytest.MonkeyPatch, shape: str, quantization: Any) -> None:
    from fd_x86 import build

    from fd_core import LLM, SamplingParams

    rng = np.random.default_rng(3)
    prompts = [{"prompt_token_ids": [int(t) for t in rng.integers(5, 500, int(n))]} for n in (3, 40, 17, 70, 9)]
    params = [SamplingParams(max_tokens=int(m), temperature=0, ignore_eos=True) for m in (9, 1, 23, 14, 30)]
    params[1] = SamplingParams(max_tokens=11, temperature=0.9, top_p=0.8, seed=5, ignore_eos=True)
    params[3] = SamplingParams(max_tokens=14, temperature=1.2, top_k=7, min_p=0.02, seed=6, ignore_eos=True)

    def run(steps: int) -> list[list[int]]:
        llm = LLM(str(checkpoints[shape]), backend="x86", quantization=quantization, max_model_len=256,
                  max_num_seqs=3, num_scheduler_steps=steps, num_gpu_blocks_override=40, block_size=16)
        return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]

    want = run(1)
    calls: list[tuple[int, bool]] = []  # (steps, sampled)
    real = build.load_ops().fd_x86_run_plan_steps
    monkeypatch.setattr(build.load_ops(), "fd_x86_run_plan_steps",
                        lambda *a: calls.append((a[-4], a[-1])) or real(*a))
    assert run(6) == want
    assert calls and max(calls)[0] == 6 and min(calls)[0] > 1, calls
    assert {sampled for _, sampled in calls} == {True, False}, calls
