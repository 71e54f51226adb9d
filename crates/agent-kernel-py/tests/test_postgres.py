"""The package on a PostgreSQL log: the database ``$AGENT_KERNEL_TEST_POSTGRES`` names
(``.ci/run`` starts one with ``tests/postgres/server.sh``); skipped without it, unless
``$AGENT_KERNEL_TEST_POSTGRES_REQUIRED`` is 1."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SERVER = os.environ.get("AGENT_KERNEL_TEST_POSTGRES", "")
REQUIRED = os.environ.get("AGENT_KERNEL_TEST_POSTGRES_REQUIRED") == "1"

pytestmark = pytest.mark.skipif(
    not SERVER and not REQUIRED, reason="no PostgreSQL server (AGENT_KERNEL_TEST_POSTGRES)"
)


def test_live_sagas_on_a_postgres_log_commit_and_roll_back(project: Path, make_kernel, monkeypatch):
    assert SERVER, "AGENT_KERNEL_TEST_POSTGRES is not set, and the PostgreSQL tests are required"
    # This machine's head file for the log, in the test's folder.
    monkeypatch.setenv("XDG_STATE_HOME", str(project / "state"))
    kernel = make_kernel(db=SERVER)
    with kernel.saga(name="python on postgres") as saga:
        saga.call("fs.write", {"path": "ws/a.txt", "content": "committed"})
    assert (project / "ws" / "a.txt").read_text() == "committed"
    assert kernel.saga_record(saga.id)["state"] == "Done"

    with pytest.raises(RuntimeError, match="changed its mind"):
        with kernel.saga(name="python on postgres, rolled back") as saga:
            saga.call("fs.write", {"path": "ws/a.txt", "content": "overwritten"})
            raise RuntimeError("the agent changed its mind")
    assert (project / "ws" / "a.txt").read_text() == "committed"
    assert kernel.saga_record(saga.id)["state"] == "FailedRolledBack"
    assert list((project / "state" / "agent-kernel").glob("postgres-*.audit-head"))
