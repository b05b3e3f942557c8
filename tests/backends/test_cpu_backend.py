"""The CPU reference backend's own helpers."""

from __future__ import annotations

import pytest

from fd_core import envs


def test_num_threads_follows_the_variable_and_names_bad_values(monkeypatch: pytest.MonkeyPatch) -> None:
    from fd_core.backends.cpu import num_threads

    for value, want in (("3", 3), ("1", 1)):
        monkeypatch.setenv("FD_CPU_NUM_THREADS", value)
        envs.reset()
        assert num_threads() == want
    monkeypatch.setenv("FD_CPU_NUM_THREADS", "0")
    envs.reset()
    # envs.py checks the range when it reads the variable; cpu.py again for direct callers
    with pytest.raises(ValueError, match=r"FD_CPU_NUM_THREADS.* >= 1, got '?0'?"):
        num_threads()
    monkeypatch.delenv("FD_CPU_NUM_THREADS")
    envs.reset()
    assert num_threads() >= 1
