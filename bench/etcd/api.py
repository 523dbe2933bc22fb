"""etcd's v3 gRPC API, the subset the benchmarks speak, compiled from the .proto files beside
this module when first asked for.

The .proto files (etcdserverpb/rpc.proto, mvccpb/kv.proto) are written from etcd's API
reference with etcd's package names, service names and field numbers, so a stock etcd server
accepts them. Their Python code is generated at run time with grpc_tools into a temporary
directory (added to sys.path for the life of the process) rather than committed: the
generated modules would need their own lint exclusions, and generating takes well under a
second.
"""

from __future__ import annotations

import atexit
import importlib
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

PROTO_ROOT = Path(__file__).resolve().parent
PROTO_FILES = ("mvccpb/kv.proto", "etcdserverpb/rpc.proto")


@dataclass(frozen=True, slots=True)
class EtcdApi:
    """The generated modules: messages in ``rpc``, stubs in ``rpc_grpc``, KeyValue in ``kv``."""

    rpc: ModuleType
    rpc_grpc: ModuleType
    kv: ModuleType


_loaded: EtcdApi | None = None


def load() -> EtcdApi:
    """Generate (once per process) and import etcd's API subset."""
    global _loaded
    if _loaded is not None:
        return _loaded
    from grpc_tools import protoc  # type: ignore[import-untyped]  # a dev dependency

    out_dir = tempfile.mkdtemp(prefix="etcd-api-")
    atexit.register(shutil.rmtree, out_dir, True)
    well_known = Path(protoc.__file__).resolve().parent / "_proto"
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"--proto_path={PROTO_ROOT}",
            f"--proto_path={well_known}",
            f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            *(str(PROTO_ROOT / name) for name in PROTO_FILES),
        ]
    )
    if status != 0:
        raise RuntimeError(f"protoc failed ({status}) compiling {PROTO_FILES} in {PROTO_ROOT}")
    sys.path.insert(0, out_dir)
    _loaded = EtcdApi(
        rpc=importlib.import_module("etcdserverpb.rpc_pb2"),
        rpc_grpc=importlib.import_module("etcdserverpb.rpc_pb2_grpc"),
        kv=importlib.import_module("mvccpb.kv_pb2"),
    )
    return _loaded
