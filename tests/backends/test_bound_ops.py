"""Ops bound once (fd_core.backends.binding): the same answers, in the same
order, as pluggy's per-call dispatch."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from fd_core.backends import cpu
from fd_core.backends.base import OpNotProvidedError, Ops
from fd_core.backends.binding import bind_hook
from fd_core.plugins import hookimpl
from fd_core.plugins.manager import make_plugin_manager

KERNEL_OPS = [
    "rms_norm", "rotary_embedding", "silu_and_mul", "linear", "rope_and_write_kv_cache", "decoder_layers",
    "allocate_kv_cache", "copy_kv_blocks", "write_kv_cache", "prefill_attention", "decode_attention",
    "moe_select_experts", "moe_experts", "sample", "communicator",
]


class Claim:
    """Answers ``fd_silu_and_mul`` with its label when ``x`` is in ``claims``."""

    def __init__(self, label: str, claims: set[Any] | None = None) -> None:
        self.label, self.claims, self.asked = label, claims, 0

    def answer(self, x: Any) -> Any:
        self.asked += 1
        return self.label if self.claims is None or x in self.claims else None


def _plugin(claim: Claim, tryfirst: bool = False, trylast: bool = False) -> Any:
    class Plugin:
        @hookimpl(tryfirst=tryfirst, trylast=trylast)
        def fd_silu_and_mul(self, x: Any) -> Any:
            return claim.answer(x)

    return Plugin()


def _ops(pm: Any, name: str = "t", **flags: bool) -> Any:
    """``Ops`` typed loosely: these tests pass labels where tensors go."""
    return Ops(pm, name, **flags)


def _both(pm: Any) -> tuple[Any, Any]:
    return _ops(pm, "test"), _ops(pm, "test", bind=False)


def test_a_declining_backend_falls_through_to_the_reference() -> None:
    backend, reference = Claim("backend", {1}), Claim("reference")
    pm = make_plugin_manager(_plugin(reference, trylast=True), _plugin(backend))
    bound, pluggy = _both(pm)
    assert [bound.silu_and_mul(x) for x in (1, 2)] == ["backend", "reference"]
    assert [pluggy.silu_and_mul(x) for x in (1, 2)] == ["backend", "reference"]
    assert backend.asked == 4 and reference.asked == 2  # the reference is asked only when the backend declines


def test_the_later_registered_of_two_claimants_wins_and_tryfirst_beats_it() -> None:
    first, second, eager = Claim("first"), Claim("second"), Claim("eager")
    pm = make_plugin_manager(_plugin(first), _plugin(second))
    assert _ops(pm, "t").silu_and_mul(0) == _ops(pm, "t", bind=False).silu_and_mul(0) == "second"
    assert first.asked == 0
    pm = make_plugin_manager(_plugin(eager, tryfirst=True), _plugin(first), _plugin(second))
    assert _ops(pm, "t").silu_and_mul(0) == _ops(pm, "t", bind=False).silu_and_mul(0) == "eager"


def test_bound_order_equals_pluggy_order_for_any_registration() -> None:
    rng = random.Random(0)
    for _ in range(40):
        claims = [Claim(f"p{i}", set(rng.sample(range(6), rng.randint(0, 4)))) for i in range(rng.randint(1, 5))]
        plugins = [_plugin(c, **rng.choice([{}, {"tryfirst": True}, {"trylast": True}])) for c in claims]
        bound, pluggy = _both(make_plugin_manager(*plugins))
        for x in range(7):  # 6: claimed by none
            try:
                want: Any = pluggy.silu_and_mul(x)
            except OpNotProvidedError as exc:
                want = str(exc)
            try:
                got: Any = bound.silu_and_mul(x)
            except OpNotProvidedError as exc:
                got = str(exc)
            assert got == want


def test_none_from_every_plugin_raises_the_same_error() -> None:
    pm = make_plugin_manager(_plugin(Claim("a", set())), _plugin(Claim("b", set()), trylast=True))
    for ops in _both(pm):
        with pytest.raises(OpNotProvidedError, match=r"no kernel for silu_and_mul in backend 'test'"):
            ops.silu_and_mul(1)
    for ops in _both(make_plugin_manager()):  # no plugin at all
        with pytest.raises(OpNotProvidedError, match=r"no kernel for linear \(wint8\) in backend 'test'"):
            ops.linear(1, None, None, quant=type("Q", (), {"method": "wint8"})())


def test_a_single_implementation_is_called_directly() -> None:
    pm = make_plugin_manager(cpu)
    assert bind_hook(pm.hook.fd_silu_and_mul) is cpu.fd_silu_and_mul
    assert _ops(pm, "cpu")._fd_linear is cpu.fd_linear
    assert bind_hook(pm.hook.fd_decoder_layers)(layers=[], hidden=None, residual=None, cos_sin=None,
                                                metadata=None, k_caches=[], v_caches=[]) is None


def test_an_implementation_taking_fewer_arguments_gets_only_those() -> None:
    seen = []

    class Partial:
        @hookimpl
        def fd_linear(self, x: Any, quant: Any) -> Any:
            seen.append((x, quant))
            return "partial"

    for ops in _both(make_plugin_manager(cpu, Partial())):
        assert ops.linear("x", None, None, "q") == "partial"
    assert seen == [("x", "q"), ("x", "q")]


def test_a_hookwrapper_keeps_pluggy_dispatch_for_its_op() -> None:
    wrapped = []

    class Wrapper:
        @hookimpl(wrapper=True)
        def fd_silu_and_mul(self, x: Any) -> Any:
            result = yield
            wrapped.append(x)
            return result

    pm = make_plugin_manager(_plugin(Claim("ref"), trylast=True), Wrapper())
    assert bind_hook(pm.hook.fd_silu_and_mul) is pm.hook.fd_silu_and_mul
    assert _ops(pm, "t").silu_and_mul(3) == "ref"
    assert wrapped == [3]


def test_a_plugin_registered_after_binding_is_not_asked() -> None:
    pm = make_plugin_manager(_plugin(Claim("ref"), trylast=True))
    ops = _ops(pm, "t")
    late = Claim("late")
    pm.register(_plugin(late))
    assert ops.silu_and_mul(0) == "ref" and late.asked == 0
    assert _ops(pm, "t").silu_and_mul(0) == "late"  # a new Ops sees it


def test_implementers_name_the_plugins_in_asking_order() -> None:
    class Backend:
        @hookimpl
        def fd_linear(self, x: Any, weight: Any, bias: Any, quant: Any) -> Any:
            return None

    backend = Backend()
    pm = make_plugin_manager(cpu, backend)
    ops = _ops(pm, "t")
    assert ops.implementers("linear") == [pm.get_name(backend), "fd_core.backends.cpu"]
    assert ops.implementers("rope_and_write_kv_cache") == []
    with pytest.raises(ValueError, match="unknown op 'matmul'"):
        ops.implementers("matmul")


def test_every_kernel_op_is_bound_in_pluggy_order_on_the_reference() -> None:
    pm = make_plugin_manager(cpu)
    ops = _ops(pm, "cpu")
    for op in KERNEL_OPS:
        impls = getattr(pm.hook, "fd_" + op).get_hookimpls()
        if impls:  # the reference's function itself
            assert getattr(ops, "_fd_" + op) is impls[0].function, op
        else:  # fd_rope_and_write_kv_cache, fd_decoder_layers: always declined
            assert ops.implementers(op) == [], op


def _x86_backend() -> Any:
    from fd_core.backends import get_backend

    try:
        return get_backend("x86")
    except Exception as exc:  # not installed or not usable on this CPU
        pytest.skip(f"fd_x86 not usable here: {exc}")


@pytest.mark.parametrize("name", ["cpu", "x86"])
@pytest.mark.parametrize("fuse_layers", [True, False])
def test_bound_and_pluggy_dispatch_run_the_model_identically(
    name: str, fuse_layers: bool, checkpoint_factory: Any
) -> None:
    from fd_core.backends import get_backend
    from fd_core.engine.model_runner import ModelRunner, StepInput

    backend = _x86_backend() if name == "x86" else get_backend("cpu")
    model = checkpoint_factory("tiny-dense", naming="paddle", seed=3, dtype="float32")
    prompts = [[5, 9, 2, 7, 1], [3, 3, 8]]
    outs = []
    for bind in (True, False):
        backend.ops = Ops(backend.pm, backend.name, bind=bind, fuse_layers=fuse_layers)
        runner = ModelRunner(model, backend, num_blocks=8, block_size=16)
        tables = [[1, 2], [3, 4]]
        logits = [runner.execute(StepInput(prompts, [5, 3], tables, 0)).numpy()]
        for n in range(3):  # greedy decode steps
            ids = [[int(np.argmax(row))] for row in logits[-1]]
            logits.append(runner.execute(StepInput(ids, [6 + n, 4 + n], tables, 2)).numpy())
        outs.append(logits)
    for bound, pluggy in zip(*outs):
        np.testing.assert_array_equal(bound, pluggy)


def test_sampled_decoder_steps_go_only_to_the_first_drawer_and_only_if_it_takes_sampling() -> None:
    """Sampled multi-step runs go to the plugin asked first for ``fd_sample`` (its steps must draw what its
    draw gives), and only when its ``fd_decoder_steps`` takes ``sampling`` (one written without it would answer
    greedy tokens); greedy runs go to every implementation, as before."""
    asked: list[tuple[str, Any]] = []

    class GreedyOnly:
        @hookimpl
        def fd_decoder_steps(self, layers: Any, steps: int) -> Any:
            asked.append(("greedy-only", None))
            return "greedy-only"

        @hookimpl
        def fd_sample(self, logits: Any) -> Any:
            return None

    class Both:
        @hookimpl
        def fd_decoder_steps(self, layers: Any, steps: int, sampling: Any) -> Any:
            asked.append(("both", sampling))
            return "both" if sampling is not None else None

        @hookimpl
        def fd_sample(self, logits: Any) -> Any:
            return None

    class Drawer:  # another plugin's draw, asked first
        @hookimpl
        def fd_sample(self, logits: Any) -> Any:
            return None

    args = ("layers", "embedding", "cos_sin", "meta", [], [], "head", 2, 10)
    for ops in _both(make_plugin_manager(cpu, GreedyOnly())):
        assert ops.decoder_steps(*args) == "greedy-only"
        assert ops.decoder_steps(*args, sampling="draw") is None  # the engine runs the steps itself
    for ops in _both(make_plugin_manager(cpu, GreedyOnly(), Both())):
        asked.clear()
        assert ops.decoder_steps(*args) == "greedy-only"  # Both declined greedy steps
        assert ops.decoder_steps(*args, sampling="draw") == "both"
        assert asked == [("both", None), ("greedy-only", None), ("both", "draw")]
    for ops in _both(make_plugin_manager(cpu, Both(), GreedyOnly())):  # GreedyOnly draws first: nobody
        assert ops.decoder_steps(*args, sampling="draw") is None
    for ops in _both(make_plugin_manager(cpu, GreedyOnly(), Both(), Drawer())):
        assert ops.decoder_steps(*args, sampling="draw") is None
