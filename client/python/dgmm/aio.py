"""asyncio: dgmm.aio.Client, the same client with awaitable calls.

    import asyncio, numpy as np, dgmm.aio
    async def main():
        async with dgmm.aio.Client("127.0.0.1:50051") as client:
            c = await client.multiply(np.ones((3, 4)), np.arange(4.0))
    asyncio.run(main())

A job runs in the C++ client on a thread of its own (the event loop is not
blocked and holds no thread while it waits); cancelling the awaiting task
(task.cancel(), asyncio.wait_for's timeout) cancels the job's calls, every
part of a striped job, and the CancelledError is raised once they stopped,
so the output array is no longer written to.
"""

import asyncio

from . import client as _client

__all__ = ["Client"]


class Client:
    """dgmm.Client's arguments (see help(dgmm.Client)); multiply, server_info
    and health are coroutines. Usable with `async with`; the synchronous
    client is .sync (region calls, for one, are there)."""

    def __init__(self, target, **kwargs):
        self.sync = _client.Client(target, **kwargs)

    async def multiply(self, a, d, side="right", backend="auto", timeout=None, *,
                       stream=None, stripes=None, out=None, return_stats=False,
                       return_info=False, progress=None, traceparent=None, tracestate=None):
        """As dgmm.Client.multiply; `progress` is called from the client's
        threads, not the event loop's (use loop.call_soon_threadsafe in it)."""
        pending = self.sync._start(a, d, side, backend, timeout, stream, stripes, out,
                                   return_stats, return_info, progress, traceparent,
                                   tracestate)
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def on_done():  # On the job's thread.
            try:
                loop.call_soon_threadsafe(_resolve, done)
            except RuntimeError:
                pass  # The loop is closed: nobody waits any more.
        handle = pending.handle
        handle.add_done_callback(on_done)
        handle.start()  # On a pool thread of the C++ side.
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            handle.cancel()
            while not done.done():  # Until the calls have stopped: out is left alone after.
                try:
                    await asyncio.shield(done)
                except asyncio.CancelledError:
                    pass
            raise
        return pending.finish(wait=False)

    async def multiply_batch(self, jobs, timeout=None, *, return_stats=False, traceparent=None,
                             tracestate=None):
        """As dgmm.Client.multiply_batch, on a thread of its own."""
        return await asyncio.to_thread(self.sync.multiply_batch, jobs, timeout,
                                       return_stats=return_stats, traceparent=traceparent,
                                       tracestate=tracestate)

    async def server_info(self, timeout=None):
        return await asyncio.to_thread(self.sync.server_info, timeout)

    async def health(self, service="", timeout=None):
        return await asyncio.to_thread(self.sync.health, service, timeout)

    def close(self):
        self.sync.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.close()


def _resolve(future):
    if not future.done():
        future.set_result(None)
