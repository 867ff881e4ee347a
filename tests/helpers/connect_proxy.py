"""An HTTP proxy that answers CONNECT and relays the tunnel's bytes, as a
corporate proxy does for `HTTPS_PROXY` clients. Prints "PORT <n>" once it
listens."""

import asyncio


async def relay(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


async def tunnel(reader, writer):
    request = await reader.readline()
    while (await reader.readline()) not in (b"\r\n", b""):
        pass
    method, target = request.split()[:2]
    if method != b"CONNECT":
        writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
        writer.close()
        return
    host, port = target.decode().rsplit(":", 1)
    up_reader, up_writer = await asyncio.open_connection(host, int(port))
    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
    await writer.drain()
    await asyncio.gather(relay(reader, up_writer), relay(up_reader, writer))


async def main():
    server = await asyncio.start_server(tunnel, "127.0.0.1", 0)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


asyncio.run(main())
