"""Serve a model over HTTP: `python -m sglang_aux.launch_server [--model-path PATH] ...`.

Takes every ServerArgs flag (SGLang's names); with no `--model-path` it serves the built-in
default model. Routes and behaviour: `srt/entrypoints/http_server.py`.
"""

from __future__ import annotations

import argparse
import logging

from sglang_aux.srt.entrypoints.http_server import launch_server
from sglang_aux.srt.managers.scheduler_process import LOG_FORMAT
from sglang_aux.srt.server_args import ServerArgs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT)
    launch_server(ServerArgs.from_cli_args(args))


if __name__ == "__main__":
    main()
