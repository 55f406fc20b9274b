#!/usr/bin/env python3
"""A plain TCP proxy for tests/load (honest_load.py): listens on
127.0.0.1:<ephemeral> and opens one upstream connection to --upstream for each
client connection, copying bytes both ways with backpressure (a side that
stops reading stops the other side's reads too). The server sees every
client as 127.0.0.1 on the proxy's ports, as behind an L4 load balancer or a
Kubernetes Service.

Prints "port N" once listening; exits on SIGTERM and writes
{"connections": n, "bytes_up": n, "bytes_down": n} to --report.
"""
import argparse
import asyncio
import json
import signal
import sys


async def pipe(reader, writer, counter, key):
    try:
        while True:
            data = await reader.read(256 * 1024)
            if not data:
                break
            counter[key] += len(data)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def main_async(args):
    host, port = args.upstream.rsplit(":", 1)
    counter = {"connections": 0, "bytes_up": 0, "bytes_down": 0}

    async def handle(client_reader, client_writer):
        counter["connections"] += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(pipe(client_reader, up_writer, counter, "bytes_up"),
                             pipe(up_reader, client_writer, counter, "bytes_down"))

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=4096)
    print("port %d" % server.sockets[0].getsockname()[1], flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    await stop.wait()
    server.close()
    with open(args.report, "w") as f:
        json.dump(counter, f)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--upstream", required=True, help="HOST:PORT of the server")
    p.add_argument("--report", required=True)
    args = p.parse_args()
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
