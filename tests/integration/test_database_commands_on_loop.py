"""The embedded database server answers every command on its event loop: no worker thread takes a command and
hands its answer back (a hand-off each way cost about as much CPU as the command's SQL). A real server process."""

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote_plus

import psutil
import pytest
from pymongo import MongoClient

from services.stack.processes import wait_for_socket

pytestmark = pytest.mark.integration


def exercise(url: str, *, client_no: int) -> None:
    """Inserts, reads, updates, counts and an aggregate, as a service sends them."""
    with MongoClient(url) as client:
        jobs = client.trainmaster.jobs
        jobs.insert_many([{"_id": f"c{client_no}-{i}", "client": client_no, "n": i} for i in range(20)])
        jobs.update_one({"_id": f"c{client_no}-3"}, {"$set": {"n": 300}})
        assert jobs.find_one({"_id": f"c{client_no}-3"})["n"] == 300
        assert jobs.count_documents({"client": client_no}) == 20
        [total] = jobs.aggregate([{"$match": {"client": client_no}}, {"$group": {"_id": None, "n": {"$sum": "$n"}}}])
        assert total["n"] == sum(range(20)) - 3 + 300


def test_commands_from_several_clients_are_answered_without_a_worker_thread(tmp_path: Path):
    sock = tmp_path / "db" / "mongo.sock"
    sock.parent.mkdir(mode=0o700)
    server = subprocess.Popen(
        [sys.executable, "-m", "services.stack.database", str(sock), "--data-dir", str(sock.parent)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_socket(sock)
        url = "mongodb://" + quote_plus(str(sock))
        with ThreadPoolExecutor(4) as clients:  # commands arrive side by side, on four connections
            list(clients.map(lambda n: exercise(url, client_no=n), range(4)))
        with MongoClient(url) as client:
            assert client.trainmaster.jobs.count_documents({}) == 80
        assert psutil.Process(server.pid).num_threads() == 1  # to_thread's workers stay after their first command
    finally:
        server.kill()
        server.wait()
