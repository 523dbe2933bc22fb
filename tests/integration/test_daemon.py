"""`rallypoint serve` settings (file, environment, flags; each unusable one refused in one
line with exit code 2), mutual TLS on both ports, and certificate rotation on SIGHUP."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rallypoint.client import Client, TlsConfig, UnavailableError
from rallypoint.coordinator.daemon import (
    Reloads,
    Settings,
    SettingsError,
    TlsFiles,
    parse_initial_cluster,
)
from rallypoint.proto.v1 import kv_pb2, kv_pb2_grpc
from rallypoint.raft.types import Message, MessageType, NodeId
from tests.integration.harness import (
    SERVE_COMMAND,
    ProcessCluster,
    free_ports,
    refused_to_start,
    wait_until,
)
from tests.integration.peer_client import PeerClient


def test_settings_precedence_file_then_environment_then_flags(tmp_path: Path) -> None:
    config = tmp_path / "member.toml"
    config.write_text('member_id = 2\ndata_dir = "/from/file"\ntick_ms = 70\n')
    settings = Settings()
    settings.merge_toml(str(config))
    settings.merge_environment({"RALLYPOINT_DATA_DIR": "/from/env", "RALLYPOINT_JOIN": "yes"})
    settings.merge({"tick_ms": 30}, "command line")
    assert (settings.member_id, settings.data_dir, settings.tick_ms) == (2, "/from/env", 30)
    assert settings.join is True


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"tick_ms": "fast"}, "wants a int"),
        ({"colour": "blue"}, "unknown setting 'colour'"),
        ({"join": "maybe"}, "wants a bool"),
    ],
)
def test_bad_settings_name_the_setting(values: dict[str, object], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        Settings().merge(values, "test")


def test_the_grpc_peer_transport_is_refused_saying_where_to_read_and_stream_still_runs(
    tmp_path: Path,
) -> None:
    """A configuration written for commit f771d74 may name either transport it had: stream
    runs, grpc is refused in one line."""
    settings = Settings()
    settings.merge({"data_dir": str(tmp_path), "peer_secret": "s" * 32}, "test")
    settings.merge_environment({"RALLYPOINT_PEER_TRANSPORT": "stream"})
    assert settings.node_config().peer_transport == "stream"
    settings.merge_environment({"RALLYPOINT_PEER_TRANSPORT": "grpc"})
    with pytest.raises(SettingsError, match="peer transport 'grpc' is gone") as refused:
        settings.node_config()
    assert "docs/operations.md, 'Upgrading'" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_initial_cluster_parsing() -> None:
    members = parse_initial_cluster("1=127.0.0.1:1@127.0.0.1:2, 2=h:3@h:4")
    assert members[2].peer_address == "h:3" and members[2].client_address == "h:4"
    for bad in ("1=a:1", "x=a:1@b:2", "1=a:1@b:2,1=c:3@d:4", "0=a:1@b:2"):
        with pytest.raises(SettingsError):
            parse_initial_cluster(bad)


@pytest.mark.parametrize(
    ("initial_cluster", "message"),
    [
        (
            "1=10.0.0.1:2380@10.0.0.1:2379,2=10.0.0.1:2380@10.0.0.2:2379",
            "initial cluster: member 1's peer address 10.0.0.1:2380 and member 2's peer "
            "address 10.0.0.1:2380 are the same: each member needs its own",
        ),
        (
            "1=10.0.0.1:2380@10.0.0.1:2379,2=10.0.0.2:2380@10.0.0.1:2379",
            "initial cluster: member 1's client address 10.0.0.1:2379 and member 2's client "
            "address 10.0.0.1:2379 are the same: each member needs its own",
        ),
        (
            "1=h1:2380@h1:2379,3=H1:2379@h3:2379",
            "initial cluster: member 1's client address h1:2379 and member 3's peer "
            "address H1:2379 are the same: each member needs its own",
        ),
    ],
)
def test_initial_cluster_refuses_two_members_on_one_address(
    initial_cluster: str, message: str
) -> None:
    with pytest.raises(SettingsError) as refused:
        parse_initial_cluster(initial_cluster)
    assert str(refused.value) == message


def test_serve_refuses_two_members_with_one_peer_address_in_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rallypoint.coordinator", "serve", "--member-id", "1",
         "--data-dir", str(tmp_path), "--peer-address", "127.0.0.1:27290",
         "--client-address", "127.0.0.1:27291",
         "--initial-cluster", "1=127.0.0.1:27290@127.0.0.1:27291,2=127.0.0.1:27290@127.0.0.1:27293",
         "--peer-secret", "0123456789abcdef0123"],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "member 1's peer address 127.0.0.1:27290 and member 2's peer address" in lines[0]


def test_serve_refuses_bad_settings_with_a_clear_message(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rallypoint.coordinator", "serve", "--member-id", "4",
         "--data-dir", str(tmp_path), "--initial-cluster", "1=a:1@a:2",
         "--peer-secret", "0123456789abcdef0123"],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "member 4 is not in the initial cluster" in result.stderr


def test_serve_refuses_a_bad_tokens_file_with_a_one_line_message(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('[[token]]\nrole = "root"\nsha256 = "' + "ab" * 32 + '"\n')
    result = subprocess.run(
        [sys.executable, "-m", "rallypoint.coordinator", "serve", "--data-dir", str(tmp_path),
         "--tokens-file", str(tokens), "--peer-secret", "0123456789abcdef0123"],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr == (
        f"rallypoint serve: tokens file {tokens}: token 1 (token 1): role 'root' is not one "
        "of admin, read, job:<job id>\n"
    )


def test_sighup_reloads_log_one_line_each_and_keep_what_failed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def failing() -> str:
        raise SettingsError("tokens file t.toml: not valid TOML")

    reloads = Reloads()
    with caplog.at_level(logging.INFO, logger="rallypoint.daemon"):
        reloads.run()
        reloads.register("tokens file t.toml", lambda: "2 tokens (admin 1, read 1)")
        reloads.register("tokens file u.toml", failing)
        reloads.run()
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "SIGHUP: nothing to reload"),
        ("INFO", "SIGHUP: tokens file t.toml reloaded: 2 tokens (admin 1, read 1)"),
        (
            "ERROR",
            "SIGHUP: tokens file u.toml not reloaded, the previous one stays in use: "
            "tokens file t.toml: not valid TOML",
        ),
    ]


PEER, CLIENT, OTHER = "127.0.0.1:24380", "127.0.0.1:24379", "127.0.0.1:24390"
OWN = f"1={PEER}@{CLIENT}"
SECRET = "0123456789abcdef0123"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        # Ports out of range, in every host:port setting.
        (["--peer-address=127.0.0.1:70000", f"--initial-cluster=1=127.0.0.1:70000@{CLIENT}"],
         "initial_cluster member 1's peer address: port must be in 1..65535, got 70000"),
        (["--peer-address=127.0.0.1:70000"],
         "peer_address: port must be in 1..65535, got 70000 in '127.0.0.1:70000'"),
        (["--client-address=127.0.0.1:0"], "client_address: port must be in 1..65535, got 0"),
        (["--metrics-address=127.0.0.1:99999"], "metrics_address: port must be in 1..65535"),
        ([f"--initial-cluster={OWN},2=127.0.0.1:70000@{OTHER}"],
         "initial_cluster member 2's peer address: port must be in 1..65535"),
        (["--metrics-address=9100"], 'metrics_address: expected "host:port", got \'9100\''),
        # This member's addresses against its own initial_cluster entry.
        ([f"--initial-cluster=1={OTHER}@{CLIENT}"],
         f"peer_address {PEER} differs from member 1's entry in initial_cluster ({OTHER})"),
        ([f"--initial-cluster=1={PEER}@{OTHER}"],
         f"client_address {CLIENT} differs from member 1's entry in initial_cluster ({OTHER})"),
        # Two listeners on one port.
        ([f"--client-address={PEER}", f"--initial-cluster=1={PEER}@{PEER}"],
         f"peer_address {PEER} and client_address {PEER} must be different ports"),
        ([f"--metrics-address=0.0.0.0:{CLIENT.rpartition(':')[2]}"],
         "client_address 127.0.0.1:24379 and metrics_address 0.0.0.0:24379 must be different"),
        ([f"--health-address={CLIENT}"],
         f"client_address {CLIENT} and health_address {CLIENT} must be different ports"),
        (["--health-address=127.0.0.1:0"], "health_address: port must be in 1..65535, got 0"),
        (["--log-level=LOUD"], "log_level must be one of DEBUG, INFO, WARNING, ERROR"),
        (["--wal-segment-size=lots"], "wal_segment_size: expected a size in bytes"),
        (["--wal-segment-size=4KiB"], "wal_segment_size must be between 1 MiB and 1024 MiB"),
        (["--tls-cert-file=member.pem"],
         "TLS needs all of tls_cert_file, tls_key_file and tls_ca_file (missing: tls_key_file, "
         "tls_ca_file)"),
    ],
)  # fmt: skip
def test_serve_refuses_each_unusable_setting_in_one_line(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    line = refused_to_start(
        [
            *SERVE_COMMAND,
            "--member-id=1",
            f"--data-dir={tmp_path / 'data'}",
            f"--peer-address={PEER}",
            f"--client-address={CLIENT}",
            f"--initial-cluster={OWN}",
            f"--peer-secret={SECRET}",
            *flags,
        ]
    )
    assert line.startswith("rallypoint serve: ") and message in line
    # Refused before the data dir was touched.
    assert not (tmp_path / "data").exists()


def test_a_wildcard_listening_address_may_stand_for_the_entry() -> None:
    """Listening on every interface, on the port the others use, is not a mismatch."""
    settings = Settings()
    settings.merge(
        {
            "peer_address": PEER.replace("127.0.0.1", "0.0.0.0"),
            "client_address": CLIENT,
            "initial_cluster": OWN,
            "peer_secret": SECRET,
            "wal_segment_size": "8MiB",
        },
        "test",
    )
    config = settings.node_config()
    assert config.wal_segment_size_bytes == 8 * 1024 * 1024


def test_lease_reads_are_on_by_default_and_can_be_turned_off() -> None:
    values = {"peer_secret": SECRET, "initial_cluster": OWN, "peer_address": PEER}
    values["client_address"] = CLIENT
    settings = Settings()
    settings.merge(values, "test")
    assert settings.node_config().lease_reads is True
    settings.merge_environment({"RALLYPOINT_LEASE_READS": "0"})
    assert settings.node_config().lease_reads is False


def test_serve_refuses_unusable_tls_files_naming_the_file(tmp_path: Path) -> None:
    certs = _make_certificates(tmp_path)
    cert, key, ca = (
        certs[name] for name in ("rallypoint-member-1.pem", "rallypoint-member-1.key", "ca.pem")
    )
    not_pem = tmp_path / "notes.txt"
    not_pem.write_text("not a certificate\n")
    missing = tmp_path / "missing.pem"
    other_key = certs["client.key"]
    cases = [
        ((missing, key, ca), f"tls_cert_file {missing}: No such file or directory"),
        ((not_pem, key, ca), f"tls_cert_file {not_pem}: holds no PEM certificate"),
        ((cert, other_key, ca),
         f"tls_key_file {other_key} and tls_cert_file {cert} do not make a usable pair"),
        ((cert, key, not_pem), f"tls_ca_file {not_pem}: holds no PEM certificate"),
    ]  # fmt: skip
    for files, message in cases:
        line = refused_to_start(
            [
                *SERVE_COMMAND,
                f"--data-dir={tmp_path / 'data'}",
                f"--peer-secret={SECRET}",
                *(
                    f"--tls-{kind}-file={path}"
                    for kind, path in zip(("cert", "key", "ca"), files, strict=True)
                ),
            ]
        )
        assert message in line


def _make_certificates(directory: Path) -> dict[str, Path]:
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            "/CN=rallypoint-test-ca", "-keyout", "ca.key", "-out", "ca.pem")  # fmt: skip
    (directory / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    # Each member's certificate names it (rallypoint-member-<id>), as the peer port requires.
    names = [f"rallypoint-member-{i}" for i in (1, 2, 3)] + ["client"]
    for name in names:
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                "-keyout", f"{name}.key", "-out", f"{name}.csr")  # fmt: skip
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-extfile", "san.cnf",
                "-out", f"{name}.pem")  # fmt: skip
    files = ["ca.pem"] + [f"{n}.{ext}" for n in names for ext in ("pem", "key")]
    return {name: directory / name for name in files}


@pytest.mark.integration
async def test_mutual_tls_on_both_ports(tmp_path: Path) -> None:
    certs_dir = tmp_path / "certs"
    certs_dir.mkdir()
    certs = _make_certificates(certs_dir)
    cluster = ProcessCluster(tmp_path, 3, extra_args=[f"--tls-ca-file={certs['ca.pem']}"])
    for member_id, member in cluster.members.items():
        name = f"rallypoint-member-{member_id}"
        member.extra_args = [
            f"--tls-cert-file={certs[name + '.pem']}",
            f"--tls-key-file={certs[name + '.key']}",
        ]
    cluster.start_all()
    try:
        tls = TlsConfig.from_files(
            str(certs["ca.pem"]), str(certs["client.pem"]), str(certs["client.key"])
        )
        # The members elect a leader over TLS peer links and serve TLS clients.
        async with Client(cluster.endpoints, tls=tls, timeout_s=30.0) as client:
            await client.put("secure", "yes")
            kv = await client.get("secure")
            assert kv is not None and kv.value == b"yes"
        # The peer port wants a member's certificate naming the member it claims to be:
        # neither a client's certificate nor another member's will do, even with the secret.
        secret = cluster.secret_path.read_bytes().strip()
        peer_address = cluster.members[2].peer_address
        for cert, claimed in (("client", 1), ("rallypoint-member-1", 3)):
            context = TlsFiles(
                str(certs[f"{cert}.pem"]), str(certs[f"{cert}.key"]), str(certs["ca.pem"])
            ).client_ssl_context()
            peer = PeerClient(peer_address, secret, ssl_context=context)
            heartbeat = Message(type=MessageType.MsgHeartbeat, to=NodeId(2), from_=NodeId(claimed))
            code, details = peer.send([peer.batch(claimed, 2, [heartbeat])])
            assert code is grpc.StatusCode.PERMISSION_DENIED, (cert, code, details)
            assert f"not rallypoint-member-{claimed}" in details
        # A client without a certificate is refused.
        no_cert = TlsConfig.from_files(str(certs["ca.pem"]))
        with pytest.raises(UnavailableError):
            async with Client(cluster.endpoints, tls=no_cert, timeout_s=3.0) as client:
                await client.get("secure")
    finally:
        cluster.shutdown()


@pytest.mark.integration
def test_the_health_port_answers_probes_without_tls_and_serves_nothing_else(
    tmp_path: Path,
) -> None:
    """A probe that cannot present a client certificate (Kubernetes' grpc probe) checks a
    member whose client port requires mutual TLS on --health-address: plaintext, no token,
    the health service alone."""
    certs = _make_certificates(_directory(tmp_path / "certs"))
    (health_port,) = free_ports(1)
    health_address = f"127.0.0.1:{health_port}"
    cluster = ProcessCluster(
        tmp_path,
        1,
        auth_token="admin-token",
        extra_args=[
            f"--tls-ca-file={certs['ca.pem']}",
            f"--tls-cert-file={certs['rallypoint-member-1.pem']}",
            f"--tls-key-file={certs['rallypoint-member-1.key']}",
            f"--health-address={health_address}",
        ],
    )
    cluster.start_all()
    try:

        def check(service: str) -> int | None:
            with grpc.insecure_channel(health_address) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                try:
                    answer = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1)
                except grpc.RpcError:
                    return None
                return int(answer.status)

        serving = health_pb2.HealthCheckResponse.SERVING
        assert wait_until(lambda: check(""), 60.0, "the health port answering") == serving
        assert check("rallypoint.v1.KV") == serving
        # The public API is not on the health port, with or without the token.
        with grpc.insecure_channel(health_address) as channel:
            stub = kv_pb2_grpc.KVStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                stub.Get(
                    kv_pb2.GetRequest(key=b"k"),
                    metadata=(("authorization", "Bearer admin-token"),),
                    timeout=5,
                )
            assert refused.value.code() is grpc.StatusCode.UNIMPLEMENTED
        # The client port itself still wants TLS: a plaintext health check there fails.
        client_port = cluster.members[1].client_address
        with grpc.insecure_channel(client_port) as channel, pytest.raises(grpc.RpcError):
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
        # SIGTERM: a clean stop, the health port closed with the member.
        assert cluster.stop(1) == 0
        assert check("") is None
    finally:
        cluster.shutdown()


@pytest.mark.integration
async def test_sighup_reloads_both_ports_certificates_without_a_restart(
    tmp_path: Path,
) -> None:
    """Certificate rotation: new files, SIGHUP, and clients of the new CA connect to the same
    process, whose peer port presents the new certificate to a new connection and trusts
    only the new CA; a broken file on a later SIGHUP is named in the log and changes
    nothing."""
    first, second = (_make_certificates(_directory(tmp_path / name)) for name in ("1", "2"))
    live = _directory(tmp_path / "live")

    def install(certs: dict[str, Path]) -> None:
        files = {"rallypoint-member-1.pem": "member.pem", "rallypoint-member-1.key": "member.key"}
        for name, installed in {**files, "ca.pem": "ca.pem"}.items():
            shutil.copyfile(certs[name], live / f"{installed}.new")
            # As an operator should: atomically.
            os.replace(live / f"{installed}.new", live / installed)

    def trusting(certs: dict[str, Path]) -> TlsConfig:
        return TlsConfig.from_files(
            str(certs["ca.pem"]), str(certs["client.pem"]), str(certs["client.key"])
        )

    install(first)
    cluster = ProcessCluster(
        tmp_path,
        1,
        extra_args=[
            f"--tls-cert-file={live / 'member.pem'}",
            f"--tls-key-file={live / 'member.key'}",
            f"--tls-ca-file={live / 'ca.pem'}",
        ],
    )
    cluster.start_all()
    member = cluster.members[1]
    assert member.proc is not None
    pid = member.proc.pid
    peer_address = member.peer_address
    try:
        async with Client(cluster.endpoints, tls=trusting(first), timeout_s=30.0) as client:
            await client.put("rotated", "before")
        assert _peer_port_certificate(peer_address, first) == _der(first)
        with pytest.raises(ssl.SSLError):
            _peer_port_certificate(peer_address, second)

        install(second)
        member.proc.send_signal(signal.SIGHUP)
        for port in ("client", "peer"):
            line = f"SIGHUP: {port} TLS files reloaded"
            wait_until(lambda line=line: line in cluster.log_text(1), 10.0, line)
        # The peer port: a new connection gets the new certificate, and a member still on
        # the old CA's certificate is refused.
        assert _peer_port_certificate(peer_address, second) == _der(second)
        with pytest.raises(ssl.SSLError):
            _peer_port_certificate(peer_address, first)
        async with Client(cluster.endpoints, tls=trusting(second), timeout_s=15.0) as client:
            kv = await client.get("rotated")
            assert kv is not None and kv.value == b"before"
        with pytest.raises(UnavailableError):
            async with Client(cluster.endpoints, tls=trusting(first), timeout_s=3.0) as client:
                await client.get("rotated")

        (live / "member.key").write_text("not a key\n")
        member.proc.send_signal(signal.SIGHUP)
        for port in ("client", "peer"):
            refused = f"SIGHUP: {port} TLS files not reloaded, the previous one stays in use"
            wait_until(lambda refused=refused: refused in cluster.log_text(1), 10.0, refused)
        assert _peer_port_certificate(peer_address, second) == _der(second)
        assert f"tls_key_file {live / 'member.key'}: holds no PEM private key" in (
            cluster.log_text(1)
        )
        async with Client(cluster.endpoints, tls=trusting(second), timeout_s=15.0) as client:
            await client.put("rotated", "after")
        assert member.running and member.proc.pid == pid
    finally:
        cluster.shutdown()


def _der(certs: dict[str, Path]) -> bytes:
    return ssl.PEM_cert_to_DER_cert(certs["rallypoint-member-1.pem"].read_text())


def _peer_port_certificate(address: str, certs: dict[str, Path]) -> bytes:
    """The certificate a new TLS connection to the peer port at ``address`` is shown, dialled
    as member 1 of ``certs`` would (its certificate presented, their CA trusted). With TLS 1.3
    the listener's refusal of our certificate arrives at the first read: read until EOF."""
    host, port = address.rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(certs["ca.pem"]))
    context.load_cert_chain(
        str(certs["rallypoint-member-1.pem"]), str(certs["rallypoint-member-1.key"])
    )
    with (
        socket.create_connection((host, int(port)), timeout=5.0) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        seen = tls.getpeercert(binary_form=True)
        tls.settimeout(0.5)
        # A refused certificate ends the connection with an alert here; an accepted one
        # finds the listener waiting for our first frame.
        with contextlib.suppress(TimeoutError):
            tls.recv(1)
        assert seen is not None
        return seen


def _directory(path: Path) -> Path:
    path.mkdir()
    return path
