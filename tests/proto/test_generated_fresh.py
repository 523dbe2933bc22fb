"""The committed generated code matches the ``.proto`` sources, and it imports and types."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rallypoint.proto import generate

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_is_fresh() -> None:
    problems = generate.stale_files()
    assert problems == [], "run `make proto`:\n" + "\n".join(problems)


def test_check_mode_reports_a_stale_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The check must be able to fail: point it at a copy of the tree with files altered.
    copy = tmp_path / "proto"
    shutil.copytree(generate.PROTO_ROOT, copy)
    stub = copy / "v1" / "kv_pb2.pyi"
    stub.write_text(stub.read_text() + "\n# edited by hand\n")
    (copy / "v1" / "lease_pb2.py").unlink()
    monkeypatch.setattr(generate, "PROTO_ROOT", copy)
    assert generate.stale_files() == ["missing: v1/lease_pb2.py", "stale: v1/kv_pb2.pyi"]


def test_every_proto_has_generated_modules() -> None:
    generated = {str(p) for p in generate.generated_files(generate.PROTO_ROOT)}
    for source in generate.proto_sources():
        stem = str(source.with_suffix(""))
        assert {f"{stem}_pb2.py", f"{stem}_pb2.pyi", f"{stem}_pb2_grpc.py"} <= generated


def test_mypy_checks_code_using_the_generated_modules(tmp_path: Path) -> None:
    # The stubs are precise enough that misuse is a type error, and correct use is clean.
    good = tmp_path / "good.py"
    good.write_text(
        textwrap.dedent(
            """
            import grpc.aio

            from rallypoint.proto.v1 import common_pb2, kv_pb2, kv_pb2_grpc
            from rallypoint.proto.v1 import watch_pb2, watch_pb2_grpc


            class KV(kv_pb2_grpc.KVServicer):
                async def Get(
                    self,
                    request: kv_pb2.GetRequest,
                    context: grpc.aio.ServicerContext[kv_pb2.GetRequest, kv_pb2.GetResponse],
                ) -> kv_pb2.GetResponse:
                    return kv_pb2.GetResponse(kv=common_pb2.KeyValue(key=request.key))


            async def read(channel: grpc.aio.Channel) -> int:
                response = await kv_pb2_grpc.KVStub(channel).Get(kv_pb2.GetRequest(key=b"k"))
                watch = watch_pb2_grpc.WatchStub(channel).Watch(watch_pb2.WatchRequest())
                async for item in watch:
                    return len(item.events)
                return response.header.revision
            """
        )
    )
    bad = tmp_path / "bad.py"
    bad.write_text(
        textwrap.dedent(
            """
            from rallypoint.proto.v1 import kv_pb2

            request = kv_pb2.PutRequest(key="not bytes", no_such_field=1)
            """
        )
    )
    command = [sys.executable, "-m", "mypy", "--strict", "--config-file", "pyproject.toml"]
    ok = subprocess.run([*command, str(good)], cwd=REPO_ROOT, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    wrong = subprocess.run([*command, str(bad)], cwd=REPO_ROOT, capture_output=True, text=True)
    assert wrong.returncode == 1, wrong.stdout
    assert "no_such_field" in wrong.stdout
