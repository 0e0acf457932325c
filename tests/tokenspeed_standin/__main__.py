"""``python -m tests.tokenspeed_standin serve ...``: the stand-in ``tokenspeed serve`` (tests only)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tokenspeed serve (stand-in)")
    p.add_argument("command", choices=["serve"])
    p.add_argument("--model", required=True)
    p.add_argument("--tp", "--tensor-parallel-size", dest="tp", type=int, default=1)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--control-port", type=int, default=None)
    p.add_argument("--rl-control-port", type=int, default=None)
    p.add_argument("--enable-output-logprobs", action="store_true")
    p.add_argument("--enable-memory-saver", action="store_true")
    args, _ignored = p.parse_known_args(argv)  # engine flags a CPU stand-in has no use for
    return args


async def serve(args: argparse.Namespace) -> None:
    import uvicorn
    from tokenspeed.runtime.entrypoints.control_server import build_control_server
    from tokenspeed.runtime.entrypoints.sglang_compat_http import build_sglang_compat_app

    from .engine import Ranks, StandInAsyncLLM, gateway_app

    ranks = await asyncio.to_thread(Ranks, args.tp, args.model)
    llm = StandInAsyncLLM(ranks, args.model, args.enable_memory_saver)
    rl_port = args.rl_control_port or _free_port()
    local = "127.0.0.1"
    servers = [
        uvicorn.Server(
            uvicorn.Config(
                gateway_app(ranks, llm, args.enable_output_logprobs),
                host=local,
                port=args.port,
                log_level="warning",
            )
        ),
        uvicorn.Server(
            uvicorn.Config(build_sglang_compat_app(llm), host=local, port=rl_port, log_level="warning")
        ),
    ]
    tasks = [asyncio.ensure_future(s.serve()) for s in servers]
    while not all(s.started for s in servers):
        await asyncio.sleep(0.05)
    control = build_control_server(
        gateway_url=f"http://{local}:{args.port}",
        engine_grpc_addr=f"{local}:{_free_port()}",  # nothing listens: /generate's model lookup gives up
        rl_control_url=f"http://{local}:{rl_port}",
        host=local,
        port=args.control_port or args.port + 1,
    )
    tasks.append(asyncio.ensure_future(control.serve()))
    print(f"stand-in tokenspeed serve: scheduler pids {ranks.pids}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for s in [*servers, control]:
        s.should_exit = True
    await asyncio.gather(*tasks, return_exceptions=True)
    ranks.close()


def main() -> None:
    from . import kernel_stubs

    kernel_stubs.install()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    asyncio.run(serve(parse(sys.argv[1:])))


if __name__ == "__main__":
    main()
