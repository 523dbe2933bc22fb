"""The Secrets make-secrets.sh makes run a real cluster: three members on loopback with the
script's peer secret, CA, member certificates (EC keys, the peer identity in the common
name, server and client use) and tokens file; a client with the job's certificate and token
is let in as that job and no further. Only the addresses differ from the StatefulSet's (the
certificates get 127.0.0.1 through EXTRA_SANS, as an operator adds their own names)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rallypoint.client import Client, JobNotFoundError, PermissionDeniedError, TlsConfig
from tests.integration.harness import ProcessCluster

from .files import make_secrets

pytestmark = pytest.mark.integration


async def test_the_scripts_secrets_run_a_mutual_tls_cluster_with_roles(tmp_path: Path) -> None:
    secrets = make_secrets(tmp_path / "secrets", "training", "resnet", "IP:127.0.0.1")
    tls = secrets["rallypoint-tls"]
    cluster = ProcessCluster(
        tmp_path / "cluster",
        3,
        extra_args=[
            f"--tls-ca-file={tls['ca.crt']}",
            f"--tokens-file={secrets['rallypoint-tokens']['tokens.toml']}",
        ],
    )
    cluster.secret_path = secrets["rallypoint-peer"]["peer-secret"]
    for member_id, member in cluster.members.items():
        member.extra_args = [
            f"--tls-cert-file={tls[f'member-{member_id}.crt']}",
            f"--tls-key-file={tls[f'member-{member_id}.key']}",
        ]
    cluster.start_all()
    try:
        job = secrets["rallypoint-job-resnet"]
        client_tls = TlsConfig.from_files(
            str(job["ca.crt"]), str(job["tls.crt"]), str(job["tls.key"])
        )
        admin = (tmp_path / "secrets" / "files" / "admin.token").read_text()
        # A leader elected over TLS peer links (each member's certificate names its id) and
        # a write committed: the members accept each other.
        async with Client(cluster.endpoints, tls=client_tls, token=admin, timeout_s=60.0) as c:
            await c.put("deployed", "yes")
        # The job's token: its own job, nothing else.
        token = job["token"].read_text()
        async with Client(cluster.endpoints, tls=client_tls, token=token, timeout_s=30.0) as c:
            with pytest.raises(JobNotFoundError):  # let in: the job is not there yet
                await c.get_job("resnet")
            with pytest.raises(PermissionDeniedError):
                await c.get_job("another-job")
            with pytest.raises(PermissionDeniedError):
                await c.get("deployed")
    finally:
        cluster.shutdown()
