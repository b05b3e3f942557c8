"""Prefill/decode disaggregation (issue 18 item 2): ``--splitwise-role prefill|decode``.

A decode instance takes the client's request, asks a prefill instance (one of
``--innode-prefill-ports``, chosen by load) to run the prompt; the prefill
instance samples the first token and ships the request's KV blocks that the
decode side lacks (block hashes tell); the decode instance writes them into
its paged pool and decodes on, so the client sees one stream.

- ``config.py``: the role, the addresses, the transfer protocol and timeout;
- ``wire.py``: what crosses between instances (task, reply, model fingerprint);
- ``kv_io.py``: a request's KV blocks out of / into the paged pool, through
  the backend's ``copy_kv_blocks`` op and a host staging pool;
- ``transport.py``: the built-in TCP transport (ZeroMQ) and the backend hook
  ``fd_kv_transport`` that may bring another (RDMA, IPC, NVLink);
- ``prefill.py`` / ``decode.py``: the two roles wrapped around an ``EngineCore``;
- ``engine.py``: ``disaggregate(core, args)``, called where an engine core is built.

The engine core knows nothing of this beyond three small scheduler entry
points (``hold_request``, ``admit_prefilled``, ``last_output``).

May import: fd_core.engine, fd_core.sampling, fd_core.ops, fd_core.plugins, fd_core.errors,
fd_core.envs, fd_core._paddle, fd_core.safe_pickle.
"""

from fd_core.disagg.config import ROLES, DisaggConfig, disagg_config_from

__all__ = ["ROLES", "DisaggConfig", "disagg_config_from"]
