"""A prefill instance in a thread of the test process, for engine-level tests."""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

ENGINE = dict(backend="cpu", max_model_len=512, max_num_seqs=16, num_gpu_blocks_override=128, block_size=16)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def prefill_instance(model_dir: Any, **overrides: Any) -> Iterator[tuple[Any, str]]:
    """A PrefillEngine stepping on a thread; yields (it, its "127.0.0.1:port")."""
    from fd_core.config import EngineArgs
    from fd_core.disagg.config import DisaggConfig
    from fd_core.disagg.prefill import PrefillEngine
    from fd_core.engine.core import EngineCore

    args = dict(ENGINE)
    args.update(overrides)
    core = EngineCore(EngineArgs.from_kwargs(str(model_dir), **args))
    address = f"127.0.0.1:{free_port()}"
    engine = PrefillEngine(core, DisaggConfig("prefill", listen=(address,)))
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            if engine.has_unfinished_requests():
                engine.step()
            else:
                select.select([engine.wakeup_fd], [], [], 0.05)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield engine, address
    finally:
        stop.set()
        thread.join(timeout=10)
        engine.close()
