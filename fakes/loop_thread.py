"""Run a fake server on its own event loop: in a daemon thread (the fakes' blocking clients need that),
or as the main loop of a process of its own (a benchmark's fake)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

START_SECONDS = 10.0


def serve_in_thread(
    name: str, serve: Callable[[], Awaitable[None]], cleanup: Callable[[], Awaitable[None]] | None = None
) -> threading.Thread:
    """Start `serve()` on a new loop in a thread, wait until it is bound, and keep the loop running.

    Stopping the loop (`loop.call_soon_threadsafe(loop.stop)`) runs `cleanup()`, cancels what is
    still pending and closes the loop. A failure to start is raised here.
    """
    ready = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(serve())
        except BaseException as error:
            failure.append(error)
            ready.set()
            return
        ready.set()
        loop.run_forever()
        if cleanup is not None:
            loop.run_until_complete(cleanup())
        pending = asyncio.all_tasks(loop)
        for task in pending:  # handlers still waiting on a scripted delay
            task.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    ready.wait(START_SECONDS)
    if failure:
        raise failure[0]
    return thread


def run_as_process(serve: Coroutine[Any, Any, None], *, uvloop: bool = True) -> None:
    """Run `serve` as this process's main loop until it ends or Ctrl-C; on uvloop if `uvloop` and
    it is installed."""
    runner: Callable[[Coroutine[Any, Any, None]], None] = asyncio.run
    if uvloop:
        with contextlib.suppress(ImportError):
            import uvloop as fast_loop

            runner = fast_loop.run
    with contextlib.suppress(KeyboardInterrupt):
        runner(serve)
