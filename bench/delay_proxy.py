#!/usr/bin/env python3
"""bench/delay_proxy.py — a TCP proxy that adds a round trip to every request (issue 9).

    bench/delay_proxy.py LISTEN_PORT TARGET_PORT DELAY_MS

Forwards 127.0.0.1:LISTEN_PORT to 127.0.0.1:TARGET_PORT. Whenever a client starts sending
after it last received (a new HTTP request on a kept-alive connection, or the first bytes
of a new connection), its bytes wait DELAY_MS before they go on: each request/response
exchange pays DELAY_MS once, as a round trip to a distant cloud does, whatever its size.
Used by bench/s3-peers.sh in place of `tc netem`, which needs the sch_netem kernel module
that this machine's kernel lacks. Prints "ready" once it listens.
"""
import asyncio
import sys


async def pipe(reader, writer, state, up, delay):
    try:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                break
            if up and state["last"] != "up":
                await asyncio.sleep(delay)
            state["last"] = "up" if up else "down"
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def main():
    listen, target, delay_ms = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    delay = delay_ms / 1000.0

    async def handle(cr, cw):
        try:
            sr, sw = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            cw.close()
            return
        state = {"last": None}
        await asyncio.gather(
            pipe(cr, sw, state, True, delay), pipe(sr, cw, state, False, delay)
        )

    server = await asyncio.start_server(handle, "127.0.0.1", listen, backlog=1024)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
