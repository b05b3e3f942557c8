"""Parallelism beyond one device: worker processes per rank and tensor parallelism.

Owns: ``ParallelConfig`` (the frozen description of one rank: tensor-parallel
size, rank, rendezvous address), the TP transform of a finished single-device
model (``TensorParallel``: which slice of each weight a rank loads, and an
all-reduce / all-gather after the row-parallel blocks, the embedding and the
LM head, through the backend's communicator, ``Ops.communicator`` / the
``fd_communicator`` hook), the process group (``process_group``: a
``paddle.distributed`` group of the backend's collective, gloo on CPU), the
step channel (``channel``: each runner call written once by rank 0 into shared
memory, read by every worker), the worker main for ranks 1..N-1 (``worker``)
and ``ParallelRunner``, rank 0's ``ModelRunner`` stand-in that drives them.

Rank 0 is the engine core's own process (the driver): it runs the scheduler,
its own model shard, and samples. Expert parallelism (``expert_parallel.py``,
a transform) and several hosts (``multinode.py``) live here too; data
parallelism is replicas of the whole engine (``fd_core.engine.dp_client``). The engine sits above: it hands its ``ModelRunner`` class to
``make_runner``, which a worker builds its own from. May import: fd_core.models,
fd_core.layers, fd_core.ops, fd_core.backends, fd_core._paddle, fd_core.envs,
fd_core.errors (UnsupportedFeatureError for what TP cannot split).
"""

from fd_core.parallel.config import ParallelConfig, check_tensor_parallel

__all__ = ["ParallelConfig", "check_tensor_parallel"]
