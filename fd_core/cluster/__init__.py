"""Many instances acting as one: the Redis-backed global scheduler (issue 18).

Owns ``--scheduler-name global`` and FastDeploy's ``--scheduler-*`` flags
(``config.py``), the Redis keys and atomic scripts the instances share
(``store.py``), the wire format of requests and outputs in Redis
(``wire.py``), the side of an instance that takes queued work, its own or
stolen, and runs it on its engine (``executor.py``), and the engine client
the API server talks to (``client.py``: it puts each accepted request into
Redis and streams the results back, whichever instance ran it; ``instance.py``:
each API worker of ``--workers N`` an instance of its own). The engine
core knows nothing of this: ``GlobalSchedulerClient`` wraps the instance's
``EngineClient``. Prefill/decode disaggregation and the router come later.

May import: fd_core.engine, fd_core.sampling, fd_core.errors, fd_core.flags, fd_core.safe_pickle.
"""

from fd_core.cluster.config import GlobalSchedulerConfig, scheduler_config_from

__all__ = ["GlobalSchedulerConfig", "scheduler_config_from"]
