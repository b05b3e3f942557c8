"""Collectives for tensor and expert parallelism."""

from __future__ import annotations

from typing import Any

from fd_core._paddle import import_paddle

__all__ = ["Communicator"]

paddle = import_paddle()


class Communicator:
    """all_reduce / all_gather / all_to_all over ``paddle.distributed``.

    With ``world_size == 1`` every call returns its input, so single-process
    runs never touch the distributed runtime.
    """

    def __init__(self, world_size: int, rank: int, group: Any = None) -> None:
        self.world_size = world_size
        self.rank = rank
        self.group = group

    def all_reduce(self, x: Any) -> Any:
        """Sum ``x`` over ranks; returns the reduced tensor."""
        if self.world_size == 1:
            return x
        paddle.distributed.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: Any, axis: int = -1) -> Any:
        """Concatenate every rank's ``x`` along ``axis`` (rank order)."""
        if self.world_size == 1:
            return x
        parts: list[Any] = []
        paddle.distributed.all_gather(parts, x, group=self.group)
        return paddle.concat(parts, axis=axis)

    def all_to_all(self, x: Any) -> Any:
        """Split ``x`` into ``world_size`` equal chunks along axis 0 and
        exchange them: rank r receives chunk r of every rank, concatenated."""
        if self.world_size == 1:
            return x
        if paddle.distributed.get_backend(self.group).lower() == "gloo":
            # gloo has no all_to_all: gather every rank's x, keep our chunk of each
            parts: list[Any] = []
            paddle.distributed.all_gather(parts, x, group=self.group)
            outputs = [paddle.split(p, self.world_size, axis=0)[self.rank] for p in parts]
        else:
            inputs = list(paddle.split(x, self.world_size, axis=0))
            outputs = []
            paddle.distributed.alltoall(outputs, inputs, group=self.group)  # (out, in) order
        return paddle.concat(outputs, axis=0)
