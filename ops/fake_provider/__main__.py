"""`python -m ops.fake_provider --host 127.0.0.1 --port 8765`: run the fake provider in the
foreground until SIGTERM or Ctrl-C. Prints one line whose last word is the server URL."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from ops.fake_provider.server import FakeProvider


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ops.fake_provider",
        description="Offline fake LLM provider (OpenAI and Anthropic API shapes).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8765, help="port (0 = any free port)")
    parser.add_argument("--latency-ms", type=int, default=0, help="delay every answer")
    parser.add_argument("--rps-limit", type=float, default=None, help="global requests/s limit")
    args = parser.parse_args(argv)

    done = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

    try:
        fake = FakeProvider(args.host, args.port).start()
    except OSError as exc:
        print(f"fake provider: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    try:
        fake.configure(latency_ms=args.latency_ms, rps_limit=args.rps_limit)
    except ValueError as exc:
        fake.stop()
        print(f"fake provider: {exc}", file=sys.stderr)
        return 2
    print(f"fake provider listening on {fake.url}", flush=True)
    try:
        while not done.wait(1.0):
            pass
    finally:
        fake.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
