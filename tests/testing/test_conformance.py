"""The conformance suite as a backend author runs it: ``pytest -p
fd_core.testing.conformance --fd-backend NAME`` in a subprocess, from a
directory outside the repository, with throwaway backends installed through
a ``.dist-info`` entry point on PYTHONPATH."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fd_core.backends import list_backends
from fd_core.testing.conformance import FUSED_OPS, KERNEL_OPS

_DEVICE_HOOKS = textwrap.dedent('''
    from fd_core.plugins import API_VERSION, hookimpl
    from fd_core.plugins.types import Availability, DeviceInfo

    FD_API_VERSION = API_VERSION

    @hookimpl
    def fd_device_info():
        return DeviceInfo(name="{name}", device_type="cpu", visible_devices_env=None,
                          collective_backend="gloo", paddle_package="paddlepaddle")

    @hookimpl
    def fd_device_availability():
        return {availability}

    @hookimpl
    def fd_set_device(device_id):
        import paddle
        paddle.set_device("cpu")
        return "cpu"
''')

# rms_norm that forgets the weight: right shape, wrong numbers.
_BROKEN_RMS_NORM = textwrap.dedent('''
    @hookimpl
    def fd_rms_norm(x, weight, eps, residual):
        import paddle
        if residual is not None:
            x = x + residual
        normed = x * paddle.rsqrt(paddle.mean(x * x, axis=-1, keepdim=True) + eps)
        return (normed, x) if residual is not None else normed
''')


# the fused split-rotate-store that stores k where v belongs: its q/k/v are right,
# only the attention over the cache can tell
_BROKEN_FUSED_STORE = textwrap.dedent('''
    @hookimpl
    def fd_rope_and_write_kv_cache(qkv, positions, cos_sin, interleaved, num_heads, num_kv_heads,
                                   k_cache, v_cache, slot_mapping):
        import paddle
        from fd_core.ops.attention import reference_write_kv_cache
        from fd_core.ops.rope import reference_rotary_embedding
        tokens, width = qkv.shape
        dh = width // (num_heads + 2 * num_kv_heads)
        q, k, v = paddle.split(qkv, [num_heads * dh, num_kv_heads * dh, num_kv_heads * dh], axis=-1)
        q, k = reference_rotary_embedding(q.reshape([tokens, num_heads, dh]),
                                          k.reshape([tokens, num_kv_heads, dh]), positions, cos_sin, interleaved)
        reference_write_kv_cache(k, k, k_cache, v_cache, slot_mapping)
        return q, k, v.reshape([tokens, num_kv_heads, dh])
''')


# fused decoder layers that skip the post-attention norm's weight on decode
# steps and decline the rest: only the fused cases can tell
_BROKEN_FUSED_LAYER = textwrap.dedent('''
    @hookimpl
    def fd_decoder_layers(layers, hidden, residual, cos_sin, metadata, k_caches, v_caches):
        import dataclasses
        import paddle
        from fd_core.backends import get_backend
        from fd_core.ops.decoder import compose_decoder_layers
        if metadata.num_decodes != hidden.shape[0]:
            return None
        layers = [dataclasses.replace(layer, post_norm=paddle.ones_like(layer.post_norm)) for layer in layers]
        return compose_decoder_layers(get_backend("cpu").ops, layers, hidden, residual, cos_sin, metadata,
                                      k_caches, v_caches)
''')


def _install_backend(site: Path, name: str, source: str) -> None:
    """A one-module distribution ``fd-test-{name}`` whose entry point in
    ``fd_core.backends`` is ``name``; importable once ``site`` is on PYTHONPATH."""
    module = f"fd_test_{name}_backend"
    (site / f"{module}.py").write_text(source)
    dist_info = site / f"fd_test_{name}-0.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fd-test-{name}\nVersion: 0.0\n")
    (dist_info / "entry_points.txt").write_text(f"[fd_core.backends]\n{name} = {module}\n")


def _run_suite(cwd: Path, *args: str, site: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "FD_PLUGINS"}
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "fd_core.testing.conformance", "-p",
         "no:cacheprovider", "-q", "-rfs", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )


def _counts(output: str) -> dict[str, int]:
    last = output.strip().splitlines()[-1]
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|error)", last)}


@pytest.fixture
def site(tmp_path: Path) -> Path:
    path = tmp_path / "site"
    path.mkdir()
    return path


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    path = tmp_path / "elsewhere"  # no conftest, no ini: like a backend author's checkout
    path.mkdir()
    return path


def test_cpu_passes_and_exercises_every_kernel_op_of_the_contract(workdir: Path) -> None:
    result = _run_suite(workdir, "--fd-backend", "cpu")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    counts = _counts(result.stdout)
    assert counts.get("passed", 0) > 50 and "failed" not in counts, output
    # nothing skips on a usable backend, the model-level cases included
    assert "skipped" not in counts, output
    assert "test_tiny_model_greedy_tokens_and_logprobs" in result.stdout or counts["passed"] > 90, output
    summary = result.stdout.split("fd-core conformance: backend 'cpu'")[1]
    for op in KERNEL_OPS:
        label = "unfused hooks" if op in FUSED_OPS else r"reference \("
        assert re.search(rf"^  {op}: +{label}", summary, re.M), f"{op} never ran:\n{summary}"


def test_pyargs_runs_the_suite_as_a_package(workdir: Path) -> None:
    result = _run_suite(workdir, "--pyargs", "fd_core.testing.conformance", "-k", "silu_and_mul")
    assert result.returncode == 0, result.stdout + result.stderr
    assert _counts(result.stdout).get("passed", 0) >= 4


def test_unknown_backend_is_a_usage_error(workdir: Path) -> None:
    result = _run_suite(workdir, "--fd-backend", "nope")
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert "cannot test --fd-backend nope" in result.stderr
    assert "unknown backend 'nope'; installed: cpu" in result.stderr


def test_backend_that_fails_to_import_is_a_usage_error_with_its_traceback(
    workdir: Path, site: Path
) -> None:
    _install_backend(site, "crashy", "import fd_test_module_that_does_not_exist\n")
    result = _run_suite(workdir, "--fd-backend", "crashy", site=site)
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert "plugin 'crashy'" in result.stderr and "failed to load" in result.stderr
    assert "Traceback" in result.stderr
    assert "No module named 'fd_test_module_that_does_not_exist'" in result.stderr


def test_installed_backend_without_its_device_skips_every_case_saying_why(
    workdir: Path, site: Path
) -> None:
    reason = "no ghost accelerator in this machine (test)"
    _install_backend(site, "ghost", _DEVICE_HOOKS.format(
        name="ghost", availability=f"Availability.unusable({reason!r})"))
    result = _run_suite(workdir, "--fd-backend", "ghost", site=site)
    assert result.returncode == 0, result.stdout + result.stderr
    counts = _counts(result.stdout)
    assert set(counts) == {"skipped"} and counts["skipped"] > 50, result.stdout
    skip_lines = [line for line in result.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skip_lines and all(f"backend 'ghost' unusable here: {reason}" in line
                              for line in skip_lines), result.stdout


@pytest.mark.skipif(importlib.util.find_spec("fd_cuda") is None, reason="fd-cuda is not installed")
def test_cuda_backend_skips_cleanly_without_a_gpu(workdir: Path) -> None:
    status = {row.name: row for row in list_backends()}["cuda"]
    result = _run_suite(workdir, "--fd-backend", "cuda")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    if status.availability.usable:  # a machine with a GPU: the real conformance run
        assert "failed" not in _counts(result.stdout), output
        return
    counts = _counts(result.stdout)
    assert set(counts) == {"skipped"}, output
    expected = f"backend 'cuda' unusable here: {status.availability.reason}"
    skip_lines = [line for line in result.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skip_lines and all(expected in line for line in skip_lines), output


def test_wrong_kernel_fails_the_suite_and_is_named(workdir: Path, site: Path) -> None:
    _install_backend(site, "broken", _DEVICE_HOOKS.format(
        name="broken", availability="Availability.ok()") + _BROKEN_RMS_NORM)
    result = _run_suite(workdir, "--fd-backend", "broken", "-k", "rms_norm or silu_and_mul",
                        site=site)
    output = result.stdout + result.stderr
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, output
    failed = re.findall(r"^FAILED \S+::(\w+)\[?", result.stdout, re.M)
    assert failed and set(failed) <= {"test_rms_norm", "test_rms_norm_small_activations_show_eps"}, output
    # silu_and_mul is not implemented by the backend: the reference answers and passes.
    assert _counts(result.stdout).get("passed", 0) >= 12, output
    assert re.search(r"AssertionError: rms_norm \[x\[\d+, \d+\] .*backend 'broken'; rms_norm: native\)"
                     r".*max abs err .* max rel err", result.stdout), output
    assert re.search(r"implemented by the backend: +rms_norm$", result.stdout, re.M), output
    assert re.search(r"^  silu_and_mul: +reference fallback$", result.stdout, re.M), output


def test_wrong_kernel_fails_the_model_level_cases(workdir: Path, site: Path) -> None:
    _install_backend(site, "broken", _DEVICE_HOOKS.format(
        name="broken", availability="Availability.ok()") + _BROKEN_RMS_NORM)
    result = _run_suite(workdir, "--fd-backend", "broken", "-k", "tiny_model", site=site)
    output = result.stdout + result.stderr
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, output
    failed = re.findall(r"^FAILED \S+::(\w+)\[?", result.stdout, re.M)
    assert set(failed) == {"test_tiny_model_greedy_tokens_and_logprobs"}, output
    assert "diverge from the reference (backend 'broken')" in result.stdout or "logprobs differ" in result.stdout, output


def test_wrong_fused_store_fails_its_case(workdir: Path, site: Path) -> None:
    _install_backend(site, "broken", _DEVICE_HOOKS.format(
        name="broken", availability="Availability.ok()") + _BROKEN_FUSED_STORE)
    result = _run_suite(workdir, "--fd-backend", "broken", "-k", "rope_and_write or paged_attention", site=site)
    output = result.stdout + result.stderr
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, output
    failed = re.findall(r"^FAILED \S+::(\w+)\[?", result.stdout, re.M)
    assert failed and set(failed) == {"test_rope_and_write_kv_cache_step"}, output
    assert "attention over the stored k/v" in result.stdout, output
    assert re.search(r"^  rope_and_write_kv_cache: +native$", result.stdout, re.M), output


def test_wrong_fused_layer_fails_its_decode_cases_only(workdir: Path, site: Path) -> None:
    _install_backend(site, "broken", _DEVICE_HOOKS.format(
        name="broken", availability="Availability.ok()") + _BROKEN_FUSED_LAYER)
    result = _run_suite(workdir, "--fd-backend", "broken", "-k", "decoder_layers", site=site)
    output = result.stdout + result.stderr
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, output
    failed = re.findall(r"^FAILED \S+::test_decoder_layers\[([^\]]+)\]", result.stdout, re.M)
    assert failed and all("decode-" in case for case in failed), output
    assert not any("mixed" in case for case in failed), output  # declined: the unfused hooks answered
    assert "decoder_layers [decode-b1: none layers=2" in result.stdout, output
    assert re.search(r"^  decoder_layers: +native, unfused hooks", result.stdout, re.M), output
