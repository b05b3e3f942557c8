"""Bind a ``firstresult`` kernel hook once: the implementations pluggy would
call, in its order, as one plain function.

pluggy's ``HookCaller(**kwargs)`` merges spec defaults, checks the
arguments, copies the implementation list and walks it in ``_multicall`` on
every call; for a kernel called a few hundred times per decode step that is
the larger part of an op's host cost. The backends of an engine are fixed at
start-up, so the list can be read once and the functions called directly:

- the order is ``_multicall``'s: ``reversed(get_hookimpls())`` (``tryfirst``
  first, then later registrations before earlier ones, ``trylast`` -- the CPU
  reference -- last);
- each implementation gets the arguments it names, as keywords (an
  implementation may take a subset of the hook's arguments);
- the first non-None result is returned, None when every one declines.

Where binding could change behaviour the hook caller itself is returned, so
pluggy runs that op as before: a hook with a wrapper (``hookwrapper`` or
``wrapper``), a hookspec with argument defaults, an implementation with
positional-only parameters or with a default for one of the hook's
arguments (pluggy versions differ on whether they pass it). Plugins registered, unregistered or blocked after
binding, and ``pm.enable_tracing()`` / ``add_hookcall_monitoring()`` set up
after it, are not seen by a bound op.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from pluggy import HookCaller, HookImpl

__all__ = ["Dispatch", "bind_hook", "call_order"]

# an op resolved: called with every argument of its hookspec as keywords
Dispatch = Callable[..., Any]


def call_order(hook: HookCaller) -> list[HookImpl]:
    """The implementations of ``hook`` in the order pluggy calls them
    (wrappers included, where they sit in that order)."""
    return list(reversed(hook.get_hookimpls()))


def _decline(**kwargs: Any) -> None:
    """No plugin implements the hook: every call answers None."""
    return None


def _needs_pluggy(impl: HookImpl, offered: frozenset[str]) -> bool:
    """Whether a direct keyword call of ``impl`` might differ from pluggy's."""
    if impl.hookwrapper or impl.wrapper or offered.intersection(impl.kwargnames):
        return True
    try:
        params = inspect.signature(impl.function).parameters.values()
    except (TypeError, ValueError):  # no signature to check: let pluggy call it
        return True
    return any(p.kind is inspect.Parameter.POSITIONAL_ONLY for p in params)


def _direct(impl: HookImpl, offered: frozenset[str]) -> Dispatch:
    """``impl`` called with the hook arguments it names, as keywords."""
    takes = tuple(impl.argnames)
    function = impl.function
    if frozenset(takes) == offered:
        return function  # takes every argument of the hook: no adapter

    def subset(**kwargs: Any) -> Any:
        return function(**{name: kwargs[name] for name in takes})

    return subset


def _first_of(calls: tuple[Dispatch, ...]) -> Dispatch:
    if len(calls) == 2:  # a backend and the reference: the common case
        first, second = calls

        def first_or_second(**kwargs: Any) -> Any:
            result = first(**kwargs)
            return result if result is not None else second(**kwargs)

        return first_or_second

    def first_answer(**kwargs: Any) -> Any:
        for call in calls:
            result = call(**kwargs)
            if result is not None:
                return result
        return None

    return first_answer


def bind_hook(hook: HookCaller) -> Dispatch:
    """One function that, called with every argument of ``hook``'s spec as
    keywords, returns what ``hook(**kwargs)`` returns today.

    A single implementation is returned as itself (no wrapper at all); none
    gives a function answering None; a hook binding cannot reproduce exactly
    (see the module docstring) is returned unchanged.
    """
    spec = hook.spec
    if spec is None or not spec.opts.get("firstresult"):
        raise ValueError(f"{hook.name} is not a firstresult hookspec; only kernel hooks are bound")
    impls = call_order(hook)
    offered = frozenset(spec.argnames)
    if spec.kwargnames or any(_needs_pluggy(impl, offered) for impl in impls):
        return hook
    calls = tuple(_direct(impl, offered) for impl in impls)
    if not calls:
        return _decline
    if len(calls) == 1:
        return calls[0]
    return _first_of(calls)
