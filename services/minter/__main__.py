import asyncio

from services.minter.app import MinterSettings, serve

if __name__ == "__main__":
    asyncio.run(serve(MinterSettings()))
