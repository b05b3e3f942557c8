"""The scheduler and KV cache manager import no tensor library (DESIGN.md):
the API process and the tests use them without paddle."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("paddle", "numpy", "torch", "transformers")


def test_scheduler_and_kv_cache_manager_import_no_tensor_library():
    code = (
        "import sys\n"
        "import fd_core.engine.scheduler, fd_core.engine.kv_cache_manager, fd_core.engine.block_pool\n"
        "import fd_core.engine.request, fd_core.engine.scheduler_output, fd_core.engine.config\n"
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
