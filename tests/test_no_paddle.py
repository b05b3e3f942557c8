"""Without any paddle build, fd_core imports, lists backends, and says what to
install the moment a model would run."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import sys
sys.modules["paddle"] = None  # as if no paddle build were installed
import fd_core
from fd_core.backends import format_listing, get_backend, list_backends
rows = {r.name: r for r in list_backends()}
assert not rows["cpu"].availability.usable, rows["cpu"]
print("LISTING:", rows["cpu"].availability.reason)
try:
    from fd_core.engine.model_runner import ModelRunner
except ImportError as exc:
    print("ERROR:", exc)
"""


def test_missing_paddle_is_a_clear_message() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "LISTING: paddle is not installed; pip install 'fd-core[cpu]'" in out.stdout
    error = out.stdout.split("ERROR:", 1)[1]
    assert "needs a PaddlePaddle build" in error
    assert "pip install 'fd-core[cpu]'" in error and "paddlepaddle-gpu" in error
