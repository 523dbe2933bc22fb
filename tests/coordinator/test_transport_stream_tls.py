"""The peer transport over TLS: the certificate rules of the peer port.

The listener wants a client certificate signed by the cluster's CA, and the certificate
must name the member the sender claims to be (``rallypoint-member-<id>``); the dialer wants
the listener's certificate signed by the CA and naming the host it dialled.
"""

from __future__ import annotations

import functools
import random
import shutil
import ssl
from pathlib import Path

import pytest

from rallypoint.coordinator.daemon import SettingsError, TlsFiles
from rallypoint.coordinator.peerwire.server import PeerListener
from rallypoint.coordinator.peerwire.transport import StreamSender
from rallypoint.coordinator.tls_reload import PeerTlsFiles
from tests.coordinator.test_transport import (
    Host,
    delivered_numbers,
    free_port,
    heartbeat,
    wait_for,
)
from tests.integration.peer_client import PeerClient
from tests.integration.test_daemon import _make_certificates

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


class TlsHost(Host):
    peer_names_required = True


def tls_files(certs: dict[str, Path], name: str) -> TlsFiles:
    return TlsFiles(str(certs[f"{name}.pem"]), str(certs[f"{name}.key"]), str(certs["ca.pem"]))


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("certs")
    return _make_certificates(directory)


async def test_members_talk_over_tls_and_a_certificate_must_name_its_member(
    tmp_path: Path, certs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = TlsHost(2, tmp_path)
    listener = PeerListener(receiver, tls_files(certs, "rallypoint-member-2").server_ssl_context())
    port = free_port()
    await listener.start(f"127.0.0.1:{port}")
    sender_host = TlsHost(1, tmp_path)
    sender_host.addresses[2] = f"127.0.0.1:{port}"
    sender = StreamSender(
        sender_host,
        2,
        tls_files(certs, "rallypoint-member-1").client_ssl_context(),
        random.Random(1),
    )
    sender.start()
    try:
        sender.send(heartbeat(1))
        await wait_for(lambda: 1 in delivered_numbers(receiver), 5.0, "the heartbeat over TLS")
        # A client's certificate, or another member's, will not do, even with the secret.
        for cert, claimed in (("client", 1), ("rallypoint-member-1", 3)):
            context = tls_files(certs, cert).client_ssl_context()
            peer = PeerClient(f"127.0.0.1:{port}", b"transport-test-secret", ssl_context=context)
            peer.cluster_id = sender_host.cluster_id
            batch = peer.batch(claimed, 2, [heartbeat(50)])
            code, details = await _in_thread(functools.partial(peer.send, [batch]))
            assert code.name == "PERMISSION_DENIED", (cert, code, details)
            assert f"not rallypoint-member-{claimed}" in details
        # No certificate at all: the listener ends the handshake (with TLS 1.3 the dialer
        # finds out at its first read).
        bare = ssl.create_default_context(cafile=str(certs["ca.pem"]))
        peer = PeerClient(f"127.0.0.1:{port}", b"transport-test-secret", ssl_context=bare)
        peer.cluster_id = sender_host.cluster_id
        await _refused_at_handshake(peer, 60)
        assert 50 not in delivered_numbers(receiver) and 60 not in delivered_numbers(receiver)
    finally:
        await sender.stop()
        await listener.stop(grace=None)


async def test_a_reload_puts_new_certificates_in_use_for_new_connections_only(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Rotation on the peer port (``PeerTlsFiles.reload``, run on SIGHUP): both members move
    to certificates of an unrelated CA; the connection already open keeps working, a new one
    (both ends using the reloaded contexts) is trusted, and the old CA's certificate is not."""
    first = _make_certificates(tmp_path_factory.mktemp("first"))
    second = _make_certificates(tmp_path_factory.mktemp("second"))
    live = {member: tmp_path / f"live-{member}" for member in (1, 2)}

    def install(certs: dict[str, Path]) -> None:
        for member, folder in live.items():
            folder.mkdir(exist_ok=True)
            for name, installed in (
                (f"rallypoint-member-{member}.pem", "member.pem"),
                (f"rallypoint-member-{member}.key", "member.key"),
                ("ca.pem", "ca.pem"),
            ):
                shutil.copyfile(certs[name], folder / installed)

    install(first)
    tls = {
        member: PeerTlsFiles(
            TlsFiles(str(folder / "member.pem"), str(folder / "member.key"), str(folder / "ca.pem"))
        )
        for member, folder in live.items()
    }
    receiver = TlsHost(2, tmp_path)
    listener = PeerListener(receiver, tls[2].server_ssl_context())
    port = free_port()
    await listener.start(f"127.0.0.1:{port}")
    sender_host = TlsHost(1, tmp_path)
    sender_host.addresses[2] = f"127.0.0.1:{port}"

    def sender() -> StreamSender:
        made = StreamSender(sender_host, 2, tls[1].client_ssl_context(), random.Random(1))
        made.start()
        return made

    before = sender()
    after = None
    try:
        before.send(heartbeat(1))
        await wait_for(lambda: 1 in delivered_numbers(receiver), 5.0, "a heartbeat")
        install(second)
        assert "new peer connections use them" in tls[1].reload()
        tls[2].reload()
        before.send(heartbeat(2))
        await wait_for(lambda: 2 in delivered_numbers(receiver), 5.0, "the open connection")
        await before.stop()
        after = sender()
        after.send(heartbeat(3))
        await wait_for(lambda: 3 in delivered_numbers(receiver), 5.0, "a new connection")
        # The old CA's member certificate: refused by the listener now.
        old = TlsFiles(
            str(first["rallypoint-member-1.pem"]),
            str(first["rallypoint-member-1.key"]),
            str(first["ca.pem"]),
        ).client_ssl_context()
        peer = PeerClient(f"127.0.0.1:{port}", b"transport-test-secret", ssl_context=old)
        peer.cluster_id = sender_host.cluster_id
        await _refused_at_handshake(peer, 4)
        assert 4 not in delivered_numbers(receiver)
        # A file that cannot be used: refused in one line, the contexts in use stay.
        (live[1] / "member.key").write_text("not a key\n")
        with pytest.raises(SettingsError, match="holds no PEM private key"):
            tls[1].reload()
        await after.stop()
        after = sender()
        after.send(heartbeat(5))
        await wait_for(lambda: 5 in delivered_numbers(receiver), 5.0, "after a refused reload")
    finally:
        await before.stop()
        if after is not None:
            await after.stop()
        await listener.stop(grace=None)


async def _refused_at_handshake(peer: PeerClient, number: int) -> None:
    """Member 1's heartbeat ``number`` sent by ``peer``, whose certificate the listener ends
    the handshake over (with TLS 1.3 the dialer finds out at its first read)."""
    try:
        code, details = await _in_thread(lambda: peer.send([peer.batch(1, 2, [heartbeat(number)])]))
    except (ssl.SSLError, OSError):
        return
    assert code.name == "UNAVAILABLE", (code, details)


async def _in_thread(call):  # type: ignore[no-untyped-def]
    import asyncio

    return await asyncio.get_running_loop().run_in_executor(None, call)
