"""From inside a job: the platform's secrets in /proc, the data directory, another project's checkpoint and host
files are out of reach; a job's own project storage works."""
import json
import os
import sys
import uuid
from shlex import quote

import pytest

from tests.conftest import ADMIN_TOKEN
from tests.e2e.helpers import logs_containing, submit, wait_phase
from tests.factories import job_body

pytestmark = pytest.mark.e2e

SAVE = ('import os, sys; '
        'open(os.path.join(os.environ["TRAINMASTER_CHECKPOINT_DIR"], "model.txt"), "w").write(sys.argv[1])')

PROBE = r'''
import glob, json, os, sys
data, other, secrets = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
result = {"uid": os.getuid(), "secrets_seen": [], "reads": {}}
for path in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/task/[0-9]*/environ"):
    try:
        text = open(path, "rb").read().decode(errors="replace")
    except OSError:
        continue
    result["secrets_seen"] += [s for s in secrets if s in text and s not in result["secrets_seen"]]
for path in [os.path.join(data, n) for n in ("admin-token", "creds", "db", "nats", "logs", "checkpoints")] + other:
    try:
        result["reads"][path] = sorted(os.listdir(path)) if os.path.isdir(path) else open(path).read()
    except OSError as exc:
        result["reads"][path] = type(exc).__name__
result["input"] = open(os.path.join(os.environ["TRAINMASTER_INPUT_MINE"], "mine.txt")).read()
import socket
try:
    socket.socket(socket.AF_UNIX).connect(sys.argv[4])
    result["database"] = "connected"
except OSError as exc:
    result["database"] = type(exc).__name__
print("PROBE " + json.dumps(result), flush=True)
'''


async def test_a_job_cannot_reach_the_platform_or_another_projects_storage(api, stack, project):
    data = stack.data_dir
    owner, intruder = f"{project}-a"[-64:], f"{project}-b"[-64:]
    weights = f"weights-{uuid.uuid4().hex}"
    saver = await submit(api, owner, command=f"{sys.executable} -c {quote(SAVE)} {weights}")
    saver_id = saver["metadata"]["id"]
    done = await wait_phase(api, owner, saver_id, "Completed", "Failed")
    assert done["status"]["phase"] == "Completed", done["status"]
    checkpoint = data / "checkpoints" / owner / saver_id / "model.txt"  # <checkpoint root>/<project>/<job>
    assert checkpoint.read_text() == weights

    mine = data / "storage" / intruder / "in"
    mine.mkdir(parents=True)
    (mine / "mine.txt").write_text("my own data")
    others = [str(checkpoint), str(data / "checkpoints" / saver_id), str(data / "checkpoints" / owner)]
    secrets = [ADMIN_TOKEN, "MONGO_URL=", "TRAINMASTER_NATS"]
    probe = await submit(api, intruder, command=f"{sys.executable} -c {quote(PROBE)} {data} "
                                                f"{quote(json.dumps(others))} {quote(json.dumps(secrets))} "
                                                f"{stack.database_socket}",
                         inputs=[{"name": "mine", "url": f"file://{mine}"}])
    done = await wait_phase(api, intruder, probe["metadata"]["id"], "Completed", "Failed")
    text = await logs_containing(api, intruder, probe["metadata"]["id"], "PROBE ")
    assert done["status"]["phase"] == "Completed", (done["status"], text)
    result = json.loads(next(line for line in text.splitlines() if line.startswith("PROBE "))[len("PROBE "):])
    assert result["secrets_seen"] == [], result
    for path, outcome in result["reads"].items():
        assert outcome in ("PermissionError", "FileNotFoundError"), (path, outcome)
    assert result["uid"] != 0 and result["uid"] != os.geteuid()
    assert result["input"] == "my own data"  # its own project's storage is there
    # the database has no TCP port (nx-27017 has no authentication) and its socket is out of reach
    assert stack.mongo_url.startswith("mongodb://%2F") and result["database"] in ("PermissionError", "FileNotFoundError")

    refused = {
        "algorithm.inputs.0.url": {"inputs": [{"name": "passwd", "url": "file:///etc/passwd"}]},
        "algorithm.outputs.0.url": {"outputs": [{"name": "x", "url": f"file://{checkpoint.parent}"}]},
        "algorithm.code_dir": {"code_dir": f"file://{mine}/../../{owner}", "command": "true"},
    }
    for field, fields in refused.items():
        response = await api.post(f"/v2/{intruder}/training-jobs", json=job_body(**fields))
        assert response.status_code == 400, response.text
        assert response.json()["error_code"] == "406001" and f"param[{field}]" in response.json()["error_msg"]
    assert checkpoint.read_text() == weights
