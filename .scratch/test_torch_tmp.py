import sys
from tests.unit.test_agent_isolation import make_agent, run, start
from tests.factories import unique

async def test_torch(tmp_path):
    sent = []
    agent = make_agent(tmp_path, sent, confined=True, disk_quota_gb=0.1)
    ended, output = await run(agent, start(unique("t"), f"{sys.executable} /work/wt-isolation/tests/e2e/isolation_scripts/torch_user.py", memory_gb=4), sent)
    print(ended, output[-3000:])
    assert ended.reason == "completed"
