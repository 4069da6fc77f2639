import asyncio

from shared import bus
from services.minter.app import MinterSettings, serve

if __name__ == "__main__":
    bus.EXIT_WHEN_CLOSED = True  # a bus that closes the connection for good ends the process (`BusLink.closed`)
    asyncio.run(serve(MinterSettings()))
