"""An audit record whose insert landed though its answer was lost is stored once, and the change goes on: the retry's
insert is refused by the record's own id, which only that earlier try can have stored."""

from pymongo.errors import AutoReconnect

from services.submitter import audit as audit_module
from services.submitter.audit import AuditLog
from tests.memory import MemoryCollection


async def test_a_record_whose_answer_was_lost_is_stored_once_and_begun(monkeypatch):
    log = AuditLog(MemoryCollection("api_audit"))
    real_insert, tries = audit_module.insert_grouped, []

    async def lands_then_raises(collection, doc):
        tries.append(await real_insert(collection, doc))
        if len(tries) == 1:
            raise AutoReconnect("the answer was lost")
        return tries[-1]

    monkeypatch.setattr(audit_module, "insert_grouped", lands_then_raises)
    entry_id = await log.begin(
        principal=None,
        action="job.create",
        method="POST",
        path="/v2/p/training-jobs",
        template="/v2/{project_id}/training-jobs",
        project_id="p",
        target_id=None,
        client_ip="127.0.0.1",
    )
    assert tries == [True, False]  # the retry was refused by the id its first try stored
    assert list(log.collection.docs) == [entry_id] and log.collection.docs[entry_id]["state"] == "begun"
