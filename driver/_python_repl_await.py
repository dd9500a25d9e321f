"""Top-level await for the Python driver: a cell that awaits runs as a task on one loop.

Standard library only; asyncio is imported by the first cell that awaits.
"""

from _python_repl_code import CO_COROUTINE
from _python_repl_stdlib import stdlib_module


class AwaitRunner:
    """The interpreter's one asyncio loop (made on first use), and the cells run on it."""

    def __init__(self):
        self._loop = None

    def run(self, codes, namespace):
        """A cell with top-level await: all of it as one task on the interpreter's loop, so
        that tasks it creates before its await run during it (and during later awaits)."""
        loop = self._event_loop()
        task = loop.create_task(self._cell(codes, namespace))
        try:
            loop.run_until_complete(task)
        except BaseException:
            if not task.done():
                # Interrupted while the loop waited: the cell's code must not go on in a
                # later cell's await. One pass of the loop delivers the cancellation; the
                # other tasks stay.
                task.cancel()
                loop.call_soon(loop.stop)
                loop.run_forever()
            if task.done() and not task.cancelled():
                task.exception()  # retrieved, so asyncio does not log it again later
            raise

    async def _cell(self, codes, namespace):
        for code in codes:
            result = eval(code, namespace)
            if code.co_flags & CO_COROUTINE:
                await result

    def _event_loop(self):
        asyncio = stdlib_module("asyncio")
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        # Current, so that asyncio.get_event_loop() in a cell without await finds it (an
        # asyncio.run() meanwhile sets the current loop to None when it ends).
        asyncio.set_event_loop(self._loop)
        return self._loop
