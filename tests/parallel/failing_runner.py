"""A ``ModelRunner`` whose rank 1 cannot read its shard (imported by the worker process
by name: the test-only way to make one rank, and only it, fail to load)."""

from __future__ import annotations

from typing import Any

from fd_core.engine.model_runner import ModelRunner


class Rank1CannotReadItsShard(ModelRunner):
    def __init__(self, model_dir: Any, backend: Any, **kwargs: Any) -> None:
        tp = kwargs.get("tensor_parallel")
        if tp is not None and tp.rank == 1:
            raise OSError(f"cannot read {model_dir}/model.safetensors: Input/output error (test)")
        super().__init__(model_dir, backend, **kwargs)
