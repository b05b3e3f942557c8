"""What crosses Redis: requests, outputs, errors, and the ``started`` mark.

A request body and each result entry are pickled, and read back by an
unpickler that builds only fd-core's own data classes and plain builtins, so
a value planted in Redis cannot run code in an instance. A result entry is
one byte of kind, then its payload:

- ``S``: ``ticket "\\n" executor`` -- the take script marks a request started
  (written by Lua inside Redis, hence plain text);
- ``O``: ``(ticket, seq, RequestOutput)`` -- the next output of a request;
- ``E``: ``(ticket, seq, kind, message)`` -- the request failed there
  (``kind``: ``request`` = refused, 400; ``engine`` = the engine failed).

``seq`` counts entries per ticket from 0, so the accepting instance sees a
gap (results lost, e.g. by a Redis restart without persistence) and fails
the request instead of streaming a hole.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

from fd_core.safe_pickle import restricted_loads

__all__ = ["Result", "decode_request", "decode_result", "encode_error", "encode_output", "encode_request",
           "ticket_of", "request_id_of"]

_SAFE_MODULES = ("fd_core.engine.outputs", "fd_core.sampling.params", "fd_core.engine.client")


def _loads(data: bytes) -> Any:
    return restricted_loads(data, _SAFE_MODULES, ("fd_core.sampling.",), "Redis")


def _dumps(value: Any) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def ticket_of(request_id: str, attempt: int) -> str:
    """The name of one attempt at a request in Redis (a request is re-queued as a new attempt)."""
    return f"{request_id}#{attempt}"


def request_id_of(ticket: str) -> tuple[str, int]:
    request_id, _, attempt = ticket.rpartition("#")
    return request_id, int(attempt)


def encode_request(prompt: Any, params: Any, arrival_time: float) -> bytes:
    return _dumps((prompt, params, arrival_time))


def decode_request(body: bytes) -> tuple[Any, Any, float]:
    prompt, params, arrival_time = _loads(body)
    return prompt, params, float(arrival_time)


def encode_output(ticket: str, seq: int, output: Any) -> bytes:
    return b"O" + _dumps((ticket, seq, output))


def encode_error(ticket: str, seq: int, kind: str, message: str) -> bytes:
    return b"E" + _dumps((ticket, seq, kind, message))


@dataclass
class Result:
    """One decoded result entry."""

    kind: str  # "started", "output" or "error"
    ticket: str
    seq: int = -1  # -1 for "started"
    output: Any = None  # RequestOutput for "output"
    executor: str = ""  # "started": the instance that took the request
    error_kind: str = ""  # "error": "request" or "engine"
    message: str = ""


def decode_result(entry: bytes) -> Result:
    """ValueError for an entry that is none of the kinds above."""
    tag, payload = entry[:1], entry[1:]
    try:
        if tag == b"S":
            ticket, _, executor = payload.decode().partition("\n")
            return Result("started", ticket, executor=executor)
        if tag == b"O":
            ticket, seq, output = _loads(payload)
            return Result("output", ticket, seq, output=output)
        if tag == b"E":
            ticket, seq, kind, message = _loads(payload)
            return Result("error", ticket, seq, error_kind=kind, message=message)
    except (pickle.UnpicklingError, ValueError, TypeError, EOFError, UnicodeDecodeError) as exc:
        raise ValueError(f"unreadable result entry: {exc}") from None
    raise ValueError(f"unknown result entry kind {tag!r}")
