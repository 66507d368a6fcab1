"""`python -m grpo_launch.cpu_server MODEL [vllm-style flags]`: serve MODEL on CPU until SIGINT/SIGTERM."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from grpo_launch.errors import EXIT_USER_ERROR, UserError


def main(argv: Sequence[str] | None = None) -> int:
    from grpo_launch.cpu_server.settings import parse_settings

    try:
        settings = parse_settings(sys.argv[1:] if argv is None else argv)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USER_ERROR

    # Flags are valid: only now pay for torch and transformers.
    from aiohttp import web

    from grpo_launch.cpu_server.app import build_app
    from grpo_launch.cpu_server.engine import Engine
    from grpo_launch.cpu_server.server_info import ENGINE

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine = Engine(settings)
    logging.getLogger(__name__).info("%s: serving %s as %s on http://%s:%d", ENGINE, settings.model,
                                     settings.served_model_name, settings.host, settings.port)
    web.run_app(build_app(settings, engine), host=settings.host, port=settings.port, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
