"""``fd-serve``: the server command line (FastDeploy's flag names).

Today it lists backends (``--list-backends``); serving arrives with the
OpenAI server (issue 5), and until then any other use says so and exits 2.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["serve_main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fd-serve", description="fd-core OpenAI-compatible server (FastDeploy flags)"
    )
    parser.add_argument("--list-backends", action="store_true",
                        help="list installed backends, whether each is usable here and why not")
    parser.add_argument("--model", help="model directory or hub id")
    parser.add_argument("--backend", default="auto", help="auto, cpu, cuda, xpu, iluvatar, dcu, gcu, ...")
    return parser


def serve_main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.list_backends:
        from fd_core.backends.registry import format_listing, list_backends

        print(format_listing(list_backends()))
        return 0
    print(
        "fd-serve: the OpenAI-compatible server is not implemented yet (issue 5); "
        "today this command supports --list-backends only",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(serve_main())
