"""``fd-router``: parse the flags, build the app, serve it with uvicorn (console script)."""

from __future__ import annotations

import logging
import sys

__all__ = ["main"]

logger = logging.getLogger("fd_core.router")


def main(argv: list[str] | None = None) -> int:
    from fd_core.router.config import build_parser, config_from

    parser = build_parser()
    ns = parser.parse_args(argv)  # an unknown flag: argparse names it and exits 2
    try:
        config = config_from(ns)
    except ValueError as exc:
        print(f"fd-router: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import uvicorn

    from fd_core.router.app import build_app

    app = build_app(config)
    mode = "prefill/decode (--splitwise)" if config.splitwise else "mixed"
    logger.info("fd-router on http://%s:%d, %s instances, policy %s", config.host, config.port, mode,
                f"{config.prefill_policy}/{config.decode_policy}" if config.splitwise else config.policy)
    uvicorn.run(app, host=config.host, port=config.port, log_config=None, log_level="info")
    return 0


if __name__ == "__main__":
    sys.exit(main())
