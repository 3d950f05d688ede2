"""Serve a model over HTTP: `python -m sglang_aux.launch_server [--model-path PATH] ...`.

Takes every ServerArgs flag (SGLang's names); with no `--model-path` it serves the built-in
default model. Routes and behaviour: `srt/entrypoints/http_server.py`.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket

from sglang_aux.srt.entrypoints.http_server import launch_server
from sglang_aux.srt.managers.scheduler.scheduler_process import LOG_FORMAT
from sglang_aux.srt.server_args import HelpFormatter, ServerArgs


def check_port(parser: argparse.ArgumentParser, host: str, port: int) -> None:
    """A usage error now, before the model loads, when `host:port` cannot be bound."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.create_server((host, port), family=family):
            pass
    except OSError as e:
        reason = os.strerror(e.errno) if e.errno else str(e)
        parser.error(f"--host {host} --port {port}: cannot listen there ({reason}); "
                     "stop what holds it or pass another --port")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=HelpFormatter)
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    server_args = ServerArgs.from_parsed(parser, args)
    if server_args.node_rank == 0:  # other nodes serve no HTTP
        check_port(parser, server_args.host, server_args.port)
    logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT)
    launch_server(server_args)


if __name__ == "__main__":
    main()
