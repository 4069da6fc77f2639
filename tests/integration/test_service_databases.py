"""A database per service under `make run`: each service's own embedded server, socket and database, and a data
directory of the single database before them split on the first start."""

import os
import stat

import pytest
from pymongo import MongoClient
from pymongo.errors import AutoReconnect

from shared.settings import database_name
from shared.store import embedded_socket
from services.stack.migrate import SET_ASIDE, SINGLE
from services.stack.processes import SERVICES, Stack, StackSettings, wait_for_socket
from tests.integration.embedded import embedded_database

pytestmark = pytest.mark.integration
OWNED = {
    "submitter": "api_jobs",
    "placement": "placement_jobs",
    "monitor": "monitor_jobs",
    "estimator": "estimator_jobs",
    "billing": "billing_ledger",
}


def single_database(data_dir) -> None:
    """What the stack before the split left: one server, one database `trainmaster` holding every collection."""
    with embedded_database(data_dir / "db") as url, MongoClient(url) as client:
        for service, collection in OWNED.items():
            client.trainmaster[collection].insert_one({"_id": f"{service}-1", "owner": service})


def test_an_old_data_directory_is_split_so_each_service_reads_its_own_collections(tmp_path):
    data = tmp_path / "data"
    single_database(data)
    stack = Stack(StackSettings(data_dir=data, mongo_url=None))
    try:
        stack.start_database()
        for service, collection in OWNED.items():
            with MongoClient(stack.mongo_url_of(service)) as client:
                assert client[database_name(service)][collection].find_one({"_id": f"{service}-1"})["owner"] == service
        assert not (data / "db" / SINGLE).exists() and (data / "db" / SET_ASIDE).exists()
    finally:
        stack.stop_all()
    stack.start_database()  # a second start copies nothing again and reads what each service wrote
    try:
        with MongoClient(stack.mongo_url_of("billing")) as client:
            assert client[database_name("billing")].billing_ledger.count_documents({}) == 1
    finally:
        stack.stop_all()


def test_each_service_has_its_own_server_on_its_own_private_socket(tmp_path):
    stack = Stack(StackSettings(data_dir=tmp_path / "data", mongo_url=None))
    try:
        stack.start_database()
        assert {f"database-{s}" for s in SERVICES} <= set(stack.processes)
        assert len({stack.processes[f"database-{s}"].pid for s in SERVICES}) == len(SERVICES)
        for service in SERVICES:
            socket = embedded_socket(stack.data_dir, service)
            assert stat.S_IMODE(socket.stat().st_mode) == 0o600
            assert stat.S_IMODE(socket.parent.stat().st_mode) == 0o700
            assert stat.S_IMODE(stack.data_dir.stat().st_mode) == 0o700
        with MongoClient(stack.mongo_url_of("submitter")) as client:
            client[database_name("submitter")].api_jobs.insert_one({"_id": "only-here"})
        with MongoClient(stack.mongo_url_of("billing")) as client:  # another server: none of the submitter's
            assert client[database_name("submitter")].api_jobs.find_one({"_id": "only-here"}) is None
    finally:
        stack.stop_all()
    assert os.path.isdir(stack.data_dir / "db" / "billing")


def test_a_database_server_that_died_is_started_again_by_the_supervisor_and_keeps_what_it_acknowledged(tmp_path):
    # `make run`'s supervisor left a dead database server dead: every write of its service failed until the whole
    # stack was restarted by hand
    stack = Stack(StackSettings(data_dir=tmp_path / "data", mongo_url=None))
    try:
        stack.start_database("billing")
        with MongoClient(stack.mongo_url_of("billing"), serverSelectionTimeoutMS=20_000) as client:
            ledger = client[database_name("billing")].billing_ledger
            ledger.insert_one({"_id": "before"})
            stack.processes["database-billing"].kill()
            stack.processes["database-billing"].wait()
            assert stack.restart_dead({}) == [("database-billing", True)]
            wait_for_socket(embedded_socket(stack.data_dir, "billing"))
            for attempt in range(3):  # the same client: its first command on the dead server's connection fails
                try:
                    ledger.insert_one({"_id": "after"})
                    break
                except AutoReconnect:
                    assert attempt < 2
            assert sorted(d["_id"] for d in ledger.find()) == ["after", "before"]
        assert stack.dead() == []
    finally:
        stack.stop_all()
