"""The tools of an ``async def`` brain: every tool the session holds, awaitable.

``await turn.tools.agent_send(bob, "hi")`` runs the same tool as the sync
``turn.tools.agent_send`` (same rules, texts, errors and durability: there
is one implementation) on one of the runtime's blocking workers, so waiting
for the commit suspends only this turn, never the event loop. A foreground
``agent(..., run_in_background=False)`` holds no thread while it waits for
the child: it wakes when the child's turn ends. ``schemas()`` stays a plain
call (it reads nothing); the sync tools are at ``.sync``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .errors import RuntimeStateError, ToolError, tool_result
from .loop_calls import call_soon

if TYPE_CHECKING:
    from .async_host import AsyncHost

TURN_ENDS = frozenset({"turn_committed", "turn_failed"})


class AsyncTools:
    """An awaitable view of a session's tools (``turn.tools`` in an async turn)."""

    def __init__(self, sync_tools: Any, host: AsyncHost) -> None:
        self.sync = sync_tools
        """The same tools, as plain calls (for code that runs off the event loop)."""
        self._host = host

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        method = getattr(self.sync, name)
        if not callable(method):
            raise AttributeError(name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await self._host.blocking(method, *args, **kwargs)
        call.__name__ = name
        call.__doc__ = method.__doc__
        return call

    def schemas(self, shape: str = "openai") -> list[dict[str, Any]]:
        """The JSON Schemas of the tools this session holds (no I/O, so not awaitable)."""
        return self.sync.schemas(shape)  # type: ignore[no-any-return]

    async def call(self, name: Any, arguments: Any = None) -> dict[str, Any]:
        """Run a model's tool call by name (awaitable): the result, or the error as a dict."""
        if name == "agent" and isinstance(arguments, dict):
            try:
                args = await self._host.blocking(self.sync.call_arguments, name, arguments)
                return await self.agent(**args)
            except (ToolError, RuntimeStateError) as exc:
                return tool_result(exc)
        return await self._host.blocking(self.sync.call, name, arguments)  # type: ignore[no-any-return]

    def _release_if_started(self, start: asyncio.Future[Any]) -> None:
        """A foreground start whose caller was cancelled: give back the wait it counted."""
        if not start.cancelled() and start.exception() is None:
            self.sync.release_thread()

    async def agent(self, description: Any, run_in_background: Any = True, title: Any = None,
                    timeout: Any = 300) -> dict[str, Any]:
        """``agent`` without holding a thread while a foreground child runs."""
        host = self._host
        start = asyncio.ensure_future(host.blocking(self.sync.start_child, description,
                                                    run_in_background, title, timeout))
        try:
            result, wait = await asyncio.shield(start)
        except asyncio.CancelledError:  # the start goes on: its wait is never taken up
            if run_in_background is False:
                start.add_done_callback(self._release_if_started)
            raise
        if run_in_background:
            return result  # type: ignore[no-any-return]
        ctx = host.ctx
        changed = asyncio.Event()
        loop = asyncio.get_running_loop()

        def observe(event: str, data: dict[str, Any]) -> None:
            if ((event in TURN_ENDS and data.get("session_id") == result["agent_id"])
                    or (event == "stop_requested"
                        and data.get("session_id") == self.sync.caller_id)):
                call_soon(loop, changed.set)

        ctx.observers.append(observe)
        try:
            deadline = loop.time() + wait
            while not await host.blocking(self.sync.child_finished, result["task_id"]):
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise self.sync.still_running(result, wait)
                if (stopped := self.sync.stopped_waiting(result)) is not None:
                    raise stopped
                changed.clear()
                try:  # woken by the child's turn ending; re-checked at most each second
                    await asyncio.wait_for(changed.wait(), min(remaining, 1.0))
                except TimeoutError:
                    pass
        finally:
            self.sync.release_thread()
            ctx.observers.remove(observe)
        return await host.blocking(self.sync.child_outcome, result)  # type: ignore[no-any-return]
