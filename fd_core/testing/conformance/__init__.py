"""The backend conformance suite: a pytest plugin any backend runs to prove itself.

    pytest -p fd_core.testing.conformance --fd-backend cuda            # from any directory
    pytest -p fd_core.testing.conformance --fd-backend cuda -k attention
    pytest -p fd_core.testing.conformance --fd-backend xpu --fd-dtype bfloat16

Every kernel op of the plugin contract (``fd_core.plugins.hookspecs``) runs
on the selected backend and on the CPU reference with the same random
inputs, and the outputs are compared on the host. Ops the backend does not
implement still run (they exercise the fallback to the reference); the
terminal summary says which ops the backend answered itself.

How the plugin contributes its tests: when the command line names no paths,
``pytest_configure`` replaces the collection arguments with this package's
directory, and ``pytest_collect_file`` collects its ``cases_*.py`` modules
(they do not match pytest's ``test_*.py`` pattern, so a plain ``pytest
fd_core`` never picks them up without the plugin). With explicit paths the
plugin only adds them when asked: ``--pyargs fd_core.testing.conformance``.

Backend resolution happens at configure time: an unknown backend or one that
fails to import is a usage error (exit code 4, with the traceback); a backend
that is installed but cannot run here makes every case skip with the reason.

This package owns the suite. May import: pytest, numpy, paddle (lazily, in
the harness and the case modules), fd_core.backends, fd_core.ops.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

from fd_core.backends import Backend, get_backend, list_backends
from fd_core.plugins import hookspecs

if TYPE_CHECKING:
    from fd_core.testing.conformance.harness import Harness

__all__ = ["FUSED_OPS", "KERNEL_OPS", "SUITE_DIR"]

SUITE_DIR = Path(__file__).resolve().parent
_DTYPES = ("float32", "float16", "bfloat16")
_DEVICE_HOOKS = ("device_info", "device_availability", "device_memory", "device_capabilities",
                 "set_device")
_GENERAL_HOOKS = ("load_tokenizer",)  # general plugins' firstresult hooks: not kernels
# a factory of prefill/decode disaggregation's KV transport (fd_core.disagg): no numerics of its own;
# the blocks it carries are read and written with copy_kv_blocks, which the suite checks
_TRANSPORT_HOOKS = ("kv_transport",)
# Every kernel op of the contract (firstresult hooks other than the device
# description and the general plugins' hooks), without the ``fd_`` prefix, in hookspec order.
KERNEL_OPS = tuple(
    name[3:]
    for name, spec in vars(hookspecs).items()
    if name.startswith("fd_")
    and getattr(spec, hookspecs.PROJECT_NAME + "_spec", {}).get("firstresult")
    and name[3:] not in _DEVICE_HOOKS + _GENERAL_HOOKS + _TRANSPORT_HOOKS
)
# Optional fusions of other ops: the reference has no kernel of its own (the
# ``Ops`` method composes the unfused hooks); a backend's is checked against that.
FUSED_OPS = ("rope_and_write_kv_cache", "decoder_layers", "decoder_steps", "moe_layer_experts", "moe_layer")


@dataclass
class SuiteState:
    """What configure resolved, shared by the collection, fixtures and summary."""

    backend_name: str
    dtype: str
    rtol: float | None
    atol: float | None
    backend: Backend | None = None  # None when the backend cannot run here
    reference: Backend | None = None
    reference_module: ModuleType | None = None
    skip_reason: str | None = None
    implemented: dict[str, bool] = field(default_factory=dict)  # op -> backend has a hook
    answered: dict[str, set[str]] = field(default_factory=dict)  # op -> labels seen in reports
    ran_suite: bool = False

    def quant_methods(self) -> tuple[str, ...]:
        """The backend's quantization methods that float weights can be quantized to: the
        cases quantize generated weights, so methods that come only from offline-quantized
        checkpoints (wint2, w4a8_static; refused as ``--quantization``) are left out."""
        if self.backend is None:
            return ()
        from fd_core.quantization.methods import registry

        makeable = set(registry.names(implemented=True))
        return tuple(m for m in self.backend.capabilities().quantization_methods if m in makeable)


STATE_KEY = pytest.StashKey[SuiteState]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fd-core conformance")
    group.addoption(
        "--fd-backend", default="cpu", metavar="NAME",
        help="backend to test against the CPU reference (entry-point name; default: cpu)",
    )
    group.addoption(
        "--fd-dtype", default="float32", choices=_DTYPES,
        help="compute dtype of the float inputs given to the backend (default: float32); "
        "the reference computes in fp32 from the same rounded values",
    )
    group.addoption("--fd-rtol", type=float, default=None,
                    help="relative tolerance for every float comparison (default: per dtype)")
    group.addoption("--fd-atol", type=float, default=None,
                    help="absolute tolerance for every float comparison (default: per dtype)")


def _resolve(state: SuiteState) -> None:
    """Fill ``state`` with the backend, or a skip reason; raise UsageError when
    the backend is unknown or broken."""
    import fd_core.backends.cpu as reference_module

    name = state.backend_name
    rows = {row.name: row for row in list_backends()}
    row = rows.get(name)
    if row is not None and row.info is not None and not row.availability.usable:
        state.skip_reason = f"backend {name!r} unusable here: {row.availability.reason}"
        return
    try:
        state.backend = get_backend(name)
        state.reference = get_backend("cpu")
    except Exception as exc:
        raise pytest.UsageError(
            f"fd-core conformance: cannot test --fd-backend {name}: {type(exc).__name__}: {exc}"
        ) from exc
    state.reference_module = reference_module
    if state.dtype == "bfloat16" and not state.backend.capabilities().bf16:
        raise pytest.UsageError(
            f"fd-core conformance: backend {name!r} does not compute in bfloat16 "
            "(capabilities().bf16 is False); run it with --fd-dtype float32 or float16"
        )
    for op in KERNEL_OPS:
        impls = getattr(state.backend.pm.hook, "fd_" + op).get_hookimpls()
        state.implemented[op] = any(i.plugin is not reference_module for i in impls)


def pytest_configure(config: pytest.Config) -> None:
    state = SuiteState(
        backend_name=config.getoption("fd_backend"),
        dtype=config.getoption("fd_dtype"),
        rtol=config.getoption("fd_rtol"),
        atol=config.getoption("fd_atol"),
    )
    _resolve(state)
    config.stash[STATE_KEY] = state
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        # No paths on the command line: run the suite, not the current directory.
        config.args[:] = [str(SUITE_DIR)]
    config.pluginmanager.register(_SuiteHooks(state, config.rootpath), "fd-core-conformance-suite")


def _in_suite(path: Path) -> bool:
    return path.parent == SUITE_DIR and path.name.startswith("cases_") and path.suffix == ".py"


class _SuiteHooks:
    """Hooks that need the resolved state."""

    def __init__(self, state: SuiteState, rootpath: Path) -> None:
        self.state = state
        self.rootpath = rootpath  # report locations are relative to it

    def pytest_collect_file(self, file_path: Path, parent: pytest.Collector) -> Any:
        if _in_suite(file_path) and not parent.session.isinitpath(file_path):
            return pytest.Module.from_parent(parent, path=file_path)  # type: ignore[no-untyped-call]
        return None

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            if not _in_suite(item.path):
                continue
            self.state.ran_suite = True
            if self.state.skip_reason:
                item.add_marker(pytest.mark.skip(reason=self.state.skip_reason), append=False)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if _in_suite((self.rootpath / report.location[0]).resolve()):
            self.state.ran_suite = True
        for key, value in report.user_properties:
            if key == "fd_answered_by":
                op, _, labels = str(value).partition(": ")
                self.state.answered.setdefault(op, set()).update(labels.split(", "))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        state = self.state
        if not state.ran_suite:
            return
        tr = terminalreporter
        tr.write_sep("=", f"fd-core conformance: backend {state.backend_name!r}, dtype {state.dtype}")
        if state.skip_reason:
            tr.write_line(f"all cases skipped: {state.skip_reason}")
            return
        if state.backend_name == "cpu":
            tr.write_line("cpu is the reference itself: every op below ran the reference (a self-check)")
        else:
            native = [op for op, mine in state.implemented.items() if mine]
            fallback = [op for op, mine in state.implemented.items() if not mine]
            tr.write_line(f"implemented by the backend:         {', '.join(native) or '(none)'}")
            tr.write_line(f"not implemented (reference answers): {', '.join(fallback) or '(none)'}")
            tr.write_line("who answered each op in the cases that ran:")
        for op in state.implemented:
            seen = sorted(state.answered.get(op, ()))
            tr.write_line(f"  {op + ':':<25} {', '.join(seen) or 'not run'}")


@pytest.fixture(scope="session")
def conformance_harness(pytestconfig: pytest.Config) -> Harness:
    """The backend under test (device set) beside the CPU reference."""
    from fd_core.testing.conformance.harness import DEFAULT_TOLERANCES, Harness, Tolerance

    state = pytestconfig.stash[STATE_KEY]
    if state.skip_reason:
        pytest.skip(state.skip_reason)
    assert state.backend and state.reference and state.reference_module
    place = state.backend.set_device(0)
    default = DEFAULT_TOLERANCES[state.dtype]
    override = None
    if state.rtol is not None or state.atol is not None:
        override = Tolerance(
            rtol=default.rtol if state.rtol is None else state.rtol,
            atol=default.atol if state.atol is None else state.atol,
        )
    return Harness(
        backend=state.backend,
        reference=state.reference,
        reference_module=state.reference_module,
        place=place,
        dtype=state.dtype,
        tolerance=default,
        override=override,
    )


@pytest.fixture
def conformance(conformance_harness: Harness, request: pytest.FixtureRequest) -> Iterator[Harness]:
    """The harness for one case; records which plugin answered each op."""
    conformance_harness.answers = {}
    yield conformance_harness
    for op, labels in sorted(conformance_harness.answers.items()):
        request.node.user_properties.append(("fd_answered_by", f"{op}: {', '.join(sorted(labels))}"))
