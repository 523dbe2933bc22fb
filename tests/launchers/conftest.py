"""Fixtures of the launcher tests: a coordinator cluster per test module, its members serving
clients on 127.0.0.1 (``cluster``) or on 127.0.0.2 (``remote_cluster``: the coordinator on
other hosts than the nodes, see harness.coordinator)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.harness import ProcessCluster

from .harness import coordinator


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    with coordinator(tmp_path_factory.mktemp("launcher-cluster")) as members:
        yield members


@pytest.fixture(scope="module")
def remote_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    with coordinator(tmp_path_factory.mktemp("launcher-cluster"), host="127.0.0.2") as members:
        yield members
