"""The plugin system: hook specifications and plugin discovery.

Owns the plugin API (``hookspecs``; versioned by ``API_VERSION``), the data
types backends return (``types``) and entry-point discovery (``manager``).
May import: pluggy, fd_core.envs. Never imports paddle.

A backend module looks like::

    from fd_core.plugins import API_VERSION, hookimpl
    FD_API_VERSION = API_VERSION

    @hookimpl
    def fd_rms_norm(x, weight, eps, residual):
        ...
"""

from fd_core.plugins.hookspecs import API_VERSION, hookimpl, hookspec

__all__ = ["API_VERSION", "hookimpl", "hookspec"]
