"""fd-router: one OpenAI endpoint in front of many fd-serve instances (issue 18 item 3).

Owns the flags (``config.py``, FastDeploy's router names where it has them),
the table of instances with their health and load (``registry.py``), the
policies that pick one (``policy.py``: round robin, random, power of two,
least loaded, cache affinity), forwarding with retries and SSE pass-through
(``proxy.py``), instances found in the global scheduler's Redis registry
(``discovery.py``), the app (``app.py``), the console script (``cli.py``),
and the instance side of ``fd-serve --router`` (``announce.py``). It never
imports paddle and runs no model: it talks HTTP to instances (and reads
Redis).

May import: fd_core.cluster.
"""

from fd_core.router.config import RouterConfig

__all__ = ["RouterConfig"]
