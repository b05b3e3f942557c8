"""What a decode step hands the fused run besides the layers: the token
embedding (``DecoderEmbedding``: the op takes the ids and the table), the
step's ints in one tensor (``AttentionMetadata.decode_ints``, or built from
the metadata), and the run's native plan (``fd_x86_run_plan_*``: the run's
tensors held under an id). Each against the path without it: the same bits
in the logits and every cache."""

from __future__ import annotations

import gc
import subprocess
import sys
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

import fd_x86.layer as fused  # noqa: E402
import fd_x86.run_step as run_step  # noqa: E402
from fd_x86 import build  # noqa: E402
from test_x86_layer import BLOCK, HIDDEN, _layer, _step, _t, usable  # noqa: E402, F401 (usable: its module fixture)
from test_x86_layer_head import VOCAB, _head  # noqa: E402
from test_x86_layer_moe_run import _block, _moe_layer  # noqa: E402

from fd_core.engine.model_runner import StepInput  # noqa: E402
from fd_core.engine.step_tensors import step_tensors  # noqa: E402
from fd_core.ops.decoder import DecoderEmbedding  # noqa: E402

pytestmark = pytest.mark.usefixtures("fused_switches_unset")


def _table(dtype: str, seed: int = 3) -> Any:
    rng = np.random.default_rng(seed)
    table = _t(rng.normal(0, 1, (VOCAB, HIDDEN)).astype(np.float32))
    return table if dtype == "float32" else table.astype(dtype)


def _ids(batch: int, seed: int = 5) -> Any:
    return paddle.to_tensor(np.random.default_rng(seed).integers(0, VOCAB, batch), dtype="int64")


def _layers(moe: bool, count: int = 2) -> list[Any]:
    """``count`` layers: [wint8, wint4], or with ``moe`` [wint8, MoE]; one layer: the first, or the MoE."""
    moe_layer = _moe_layer("wint8", _block("wint8", "wint8", True, seed=6))
    if moe:
        return [_layer("wint8"), moe_layer] if count == 2 else [moe_layer]
    return [_layer("wint8"), _layer("wint4")][:count]


def _run(x86_ops: Any, layers: list[Any], step: Any, hidden: Any, head: Any) -> tuple[np.ndarray, list[np.ndarray]]:
    caches = [step.caches() for _ in layers]
    logits = x86_ops.decoder_layers(layers, hidden, None, step.cos_sin, step.meta(), [c[0] for c in caches],
                                    [c[1] for c in caches], head)
    return logits.numpy(), [t.numpy() for c in caches for t in c]


def _same(a: tuple[np.ndarray, list[np.ndarray]], b: tuple[np.ndarray, list[np.ndarray]]) -> None:
    np.testing.assert_array_equal(a[0], b[0])
    for x, y in zip(a[1], b[1], strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("batch", [1, 5])
@pytest.mark.parametrize("moe,count", [(False, 2), (True, 2), (False, 1), (True, 1)],
                         ids=["dense", "dense+moe", "one-dense", "one-moe"])
def test_the_embedding_in_the_run_equals_the_rows_taken_before(x86_ops: Any, monkeypatch: pytest.MonkeyPatch,
                                                               dtype: str, batch: int, moe: bool, count: int) -> None:
    """A run that starts at the embedding (the op reads the ids' rows of an fp32 / bf16 / fp16 table) against
    the rows taken by the model's own embedding first (FD_X86_FUSED_EMBEDDING=0): the same bits; one layer
    or two, dense or MoE first (the rows sit in the buffer the second layer writes)."""
    layers, step, head = _layers(moe, count), _step(batch, False, seed=21), _head("wint8")
    embedding = DecoderEmbedding(_table(dtype), _ids(batch))
    calls: list[bool] = []
    real = build.load_ops().fd_x86_run_plan_step
    monkeypatch.setattr(build.load_ops(), "fd_x86_run_plan_step", lambda *a: calls.append(a[-1]) or real(*a))
    got = _run(x86_ops, layers, step, embedding, head)
    monkeypatch.setenv("FD_X86_FUSED_EMBEDDING", "0")
    want = _run(x86_ops, layers, step, embedding, head)
    assert calls == [True, False], "the op took the embedding in the first run only"
    _same(got, want)
    _same(got, _run(x86_ops, layers, step, embedding.run(), head))  # and the rows handed as hidden


def test_a_tied_heads_transposed_table_is_gathered_first(x86_ops: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tied float head's table is its [D, V] weight seen transposed (not contiguous): the op cannot read it
    in place, so the rows are taken first and the run still answers, with the same bits."""
    layers, step, head = _layers(False), _step(3, False, seed=22), _head("wint8")
    table = _table("float32").t().contiguous().t()
    assert not table.is_contiguous()
    calls: list[bool] = []
    real = build.load_ops().fd_x86_run_plan_step
    monkeypatch.setattr(build.load_ops(), "fd_x86_run_plan_step", lambda *a: calls.append(a[-1]) or real(*a))
    embedding = DecoderEmbedding(table, _ids(3))
    got = _run(x86_ops, layers, step, embedding, head)
    assert calls == [False]
    _same(got, _run(x86_ops, layers, step, embedding.run(), head))


def test_a_token_id_outside_the_table_is_refused_before_any_cache_write(x86_ops: Any) -> None:
    layers, step, head = _layers(True), _step(2, False, seed=23), _head("wint8")
    caches = [step.caches() for _ in layers]
    before = [t.numpy().copy() for c in caches for t in c]
    bad = DecoderEmbedding(_table("bfloat16"), paddle.to_tensor([3, VOCAB], dtype="int64"))
    with pytest.raises(Exception, match=f"token id {VOCAB} is outside the embedding's \\[0, {VOCAB}\\)"):
        x86_ops.decoder_layers(layers, bad, None, step.cos_sin, step.meta(), [c[0] for c in caches],
                               [c[1] for c in caches], head)
    for b, after in zip(before, (t for c in caches for t in c), strict=True):
        np.testing.assert_array_equal(b, after.numpy())


def test_ops_take_the_rows_first_for_plugins_without_the_flag(ref_ops: Any) -> None:
    """The reference declares no fused runs: Ops takes the embedding's rows, then composes the run and the
    head; a DecoderEmbedding with a residual, or without a head, is refused by name."""
    layers, step, head = [_layer("wint8")], _step(2, False, seed=24), _head("wint8")
    embedding = DecoderEmbedding(_table("float32"), _ids(2))
    assert not ref_ops.fuses_embeddings
    got = _run(ref_ops, layers, step, embedding, head)
    _same(got, _run(ref_ops, layers, step, embedding.run(), head))
    k, v = step.caches()
    with pytest.raises(ValueError, match="must be the model's first .residual None. and end with the head"):
        ref_ops.decoder_layers(layers, embedding, embedding.run(), step.cos_sin, step.meta(), [k], [v], head)
    with pytest.raises(ValueError, match="end with the head; got residual None, head None"):
        ref_ops.decoder_layers(layers, embedding, None, step.cos_sin, step.meta(), [k], [v])
    with pytest.raises(TypeError, match="hidden must be a .T, D. tensor or a DecoderEmbedding, got list"):
        ref_ops.decoder_layers(layers, [1, 2], None, step.cos_sin, step.meta(), [k], [v], head)


@pytest.fixture(scope="module")
def ref_ops() -> Any:
    from fd_core.backends import get_backend

    return get_backend("cpu").ops


@pytest.mark.parametrize("batch", [1, 4, 9])
@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_a_step_through_the_runs_plan_equals_the_op_with_every_input(x86_ops: Any, monkeypatch: pytest.MonkeyPatch,
                                                                     batch: int, moe: bool) -> None:
    """The run's native plan (the tensors held under an id, a step passing six) against every input passed
    to fd_x86_decoder_layers (FD_X86_RUN_PLAN=0): the same bits, with and without the head."""
    layers, step = _layers(moe), _step(batch, True, seed=25)
    for head in (_head("wint4"), None):
        outs = []
        for plan in ("1", "0"):
            monkeypatch.setenv("FD_X86_RUN_PLAN", plan)
            hidden, residual = step.inputs()
            caches = [step.caches() for _ in layers]
            out = x86_ops.decoder_layers(layers, hidden, residual, step.cos_sin, step.meta(),
                                         [c[0] for c in caches], [c[1] for c in caches], head)
            outs.append(([o.numpy() for o in (out if head is None else (out,))], [t.numpy() for c in caches
                                                                                  for t in c]))
        for a, b in zip(outs[0][0] + outs[0][1], outs[1][0] + outs[1][1], strict=True):
            np.testing.assert_array_equal(a, b)


def test_a_plan_is_freed_with_its_runs_cache_entry(x86_ops: Any) -> None:
    """The plan lives as long as the run's cache entry: once the model's cache goes, its id is unknown to the
    op, which says so by name. A step still checks its inputs against the plan (a bad slot is refused)."""
    layers, step = _layers(False), _step(2, True, seed=26)
    cos_sin = _t(step.cos_sin.numpy())  # this test's own rotary table: its own per-model cache
    caches = [step.caches() for _ in layers]
    run = fused._run_inputs(layers, cos_sin, [c[0] for c in caches], [c[1] for c in caches], 2)
    assert run is not None
    hidden, residual = step.inputs()
    assert fused.decoder_layers(layers, hidden, residual, cos_sin, step.meta(), [c[0] for c in caches],
                                [c[1] for c in caches]) is not None
    plan = run.plan.id
    ints = run_step.step_ints(step.meta())
    bad = ints.clone()
    bad[2] = 1 << 40  # the first token's cache slot
    ops = build.load_ops()
    with pytest.raises(Exception, match="slot"):
        ops.fd_x86_run_plan_step(hidden, residual, cos_sin, bad, bad, hidden, plan, True, 16, 1, 0, False)
    del run, cos_sin
    gc.collect()
    with pytest.raises(Exception, match=f"no run plan {plan} .freed, or never made."):
        ops.fd_x86_run_plan_step(hidden, residual, step.cos_sin, ints, ints, hidden, plan, True, 16, 1, 0, False)


def test_a_plan_dropped_outside_dynamic_mode_is_freed_at_the_next_step(x86_ops: Any) -> None:
    """A plan whose cache entry goes while paddle is in static mode (its op cannot run then) waits in
    ORPHANS and is freed by the next step that runs a plan."""
    layers, step = _layers(False), _step(2, True, seed=29)
    hidden, residual = step.inputs()
    caches = [step.caches() for _ in layers]
    k, v = [c[0] for c in caches], [c[1] for c in caches]
    cos_sin = _t(step.cos_sin.numpy())  # this test's own rotary table: its own per-model cache
    assert fused.decoder_layers(layers, hidden, residual, cos_sin, step.meta(), k, v) is not None
    plan = fused._run_inputs(layers, cos_sin, k, v, 2).plan.id
    paddle.enable_static()
    try:
        del cos_sin  # the model's cache goes, and with it the run and its plan
        gc.collect()
        assert run_step.ORPHANS == [plan]
    finally:
        paddle.disable_static()
    assert fused.decoder_layers(layers, hidden, residual, step.cos_sin, step.meta(), k, v) is not None
    assert run_step.ORPHANS == [] and plan not in run_step._LIVE
    ints = run_step.step_ints(step.meta())
    with pytest.raises(Exception, match=f"no run plan {plan} "):
        build.load_ops().fd_x86_run_plan_step(hidden, residual, step.cos_sin, ints, ints, hidden, plan, True, 16, 1,
                                              0, False)


def test_a_decode_steps_ints_are_one_tensor_equal_to_the_metadata() -> None:
    """step_tensors' decode-only form: the ids, positions and slots are views of one host tensor whose tail
    (decode_ints) is what the run reads, and equals what fd_x86 builds from metadata made the general way."""
    tables = [[4, 9], [7], [2, 3, 5]]
    step = StepInput(token_ids=[[11], [12], [13]], seq_lens=[70, 5, 130], block_tables=tables, num_decodes=3,
                     needs_logits=[True] * 3, all_logits=[False] * 3, mm_inputs=[])
    ids, meta, rows = step_tensors(step, 64, 100, 4096)
    assert rows is None and ids.numpy().tolist() == [11, 12, 13]
    ints = meta.decode_ints.numpy()
    np.testing.assert_array_equal(ints[:3], meta.positions.numpy())
    np.testing.assert_array_equal(ints[3:6], meta.slot_mapping.numpy())
    np.testing.assert_array_equal(ints[6:9], [70, 5, 130])
    np.testing.assert_array_equal(ints[9:].reshape(3, 3), [[4, 9, 0], [7, 0, 0], [2, 3, 5]])
    assert run_step.step_ints(meta) is meta.decode_ints
    meta.decode_ints = None  # a step whose metadata was built otherwise: the same tensor, built once per step
    built = run_step.step_ints(meta)
    np.testing.assert_array_equal(built.numpy(), ints)
    assert run_step.step_ints(meta) is built


def _engine_meta(step: Any, ids: list[int]) -> tuple[Any, Any]:
    """The step's ids and metadata as the engine makes them (step_tensors: decode_ints and its views)."""
    batch = len(ids)
    engine_step = StepInput(token_ids=[[i] for i in ids], seq_lens=step.seq_lens, block_tables=step.tables,
                            num_decodes=batch, needs_logits=[True] * batch, all_logits=[False] * batch, mm_inputs=[])
    flat, meta, _ = step_tensors(engine_step, BLOCK, VOCAB, 1 << 20)
    assert meta.decode_ints is not None
    return flat, meta


@pytest.mark.parametrize("batch", [1, 5])
def test_the_engines_step_ints_equal_the_metadata_built_the_general_way(x86_ops: Any, batch: int) -> None:
    """The op reads the step's positions, slots, lengths and block tables from the views step_tensors made of
    one host tensor (decode_ints, at an offset into it): the same bits as from AttentionMetadata.build's."""
    layers, step, head = _layers(True), _step(batch, False, seed=27), _head("wint8")
    ids = [int(i) for i in np.random.default_rng(2).integers(0, VOCAB, batch)]
    flat, meta = _engine_meta(step, ids)
    assert run_step.step_ints(meta) is meta.decode_ints
    table = _table("bfloat16")

    def run(metadata: Any, ids_tensor: Any) -> tuple[np.ndarray, list[np.ndarray]]:
        caches = [step.caches() for _ in layers]
        out = x86_ops.decoder_layers(layers, DecoderEmbedding(table, ids_tensor), None, step.cos_sin, metadata,
                                     [c[0] for c in caches], [c[1] for c in caches], head)
        return out.numpy(), [t.numpy() for c in caches for t in c]

    _same(run(meta, flat), run(step.meta(), paddle.to_tensor(np.array(ids, np.int64))))


def test_a_copy_of_the_metadata_with_other_positions_does_not_read_the_stale_ints() -> None:
    """dataclasses.replace(meta, positions=...) keeps decode_ints, whose positions are the old ones: the
    run builds the step's ints from the copy's own fields instead."""
    step = _step(3, False, seed=28)
    _, meta = _engine_meta(step, [1, 2, 3])
    moved = replace(meta, positions=meta.positions + 1)
    ints = run_step.step_ints(moved)
    assert ints is not moved.decode_ints
    np.testing.assert_array_equal(ints.numpy()[:3], meta.positions.numpy() + 1)
    np.testing.assert_array_equal(ints.numpy()[3:], meta.decode_ints.numpy()[3:])


def test_a_process_with_live_plans_exits_cleanly(tmp_path: Any) -> None:
    """An offline LLM on x86 still alive at exit: its plans hold weights in memory Python owns (huge-page
    mappings), freed at exit before Python is finalized (a crash at exit before, ~1 run in 3)."""
    script = tmp_path / "live.py"
    script.write_text(
        "import sys\n"
        "from fd_core import LLM, SamplingParams\n"
        "from fd_core.testing.checkpoints import generate_checkpoint\n"
        "path = generate_checkpoint(sys.argv[1], 'tiny-dense', naming='paddle', seed=1)\n"
        "llm = LLM(str(path), backend='x86', max_model_len=256, max_num_seqs=4, quantization='wint8')\n"
        "out = llm.generate([{'prompt_token_ids': [5, 6, 7, 8]}], SamplingParams(max_tokens=4, temperature=0,\n"
        "                   ignore_eos=True), use_tqdm=False)\n"
        "assert len(out[0].outputs[0].token_ids) == 4\n"
        "import fd_x86.run_step\n"
        "assert fd_x86.run_step._LIVE, 'no plan was made'\n"
    )
    for i in range(6):  # stdout to /dev/null: with it on a pipe the crash did not show
        done = subprocess.run([sys.executable, str(script), str(tmp_path / f"m{i}")], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, timeout=300)
        assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
