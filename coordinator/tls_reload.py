"""Certificate rotation: both ports' TLS files re-read on SIGHUP, without a restart.

Theory of operation. The client port is served with gRPC's dynamic SSL credentials, whose
fetcher gRPC calls (on its own threads) before each new TLS handshake.
:meth:`ReloadableServerCredentials.reload`, registered with the daemon's ``Reloads`` (run on
SIGHUP, on the event loop), reads and checks the certificate, key and CA completely
(``preflight.read_tls_files``, the checks made at start) and only then leaves the new
configuration for the fetcher, which hands it over once; until then, and whenever a check
fails (a SettingsError naming the file), gRPC keeps the configuration it has. Connections
already open keep theirs; every new one uses the newest files.

The peer port (coordinator/peerwire) is served and dialled through Python's ``ssl`` on the
event loop. :class:`PeerTlsFiles` gives it one :class:`RotatingSSLContext` for listening and
one for dialling, made once; each hands every new connection to the newest context it holds.
Its :meth:`PeerTlsFiles.reload` (SIGHUP) reads and checks the files the same way, builds both
new contexts, and only when both are built puts them in use (a file that fails leaves both
old ones in use): connections already open to and from other members keep theirs, every new
one (a reconnect, a snapshot transfer, a liveness link) presents the new certificate and
trusts only the new CA bundle.
"""

from __future__ import annotations

import hashlib
import socket
import ssl
import threading
from typing import Any, Protocol

import grpc

from .preflight import SettingsError, TlsPaths, read_tls_files


def certificate_fingerprint(cert_pem: bytes) -> str:
    """The SHA-256 of the first certificate's DER bytes, shortened for a log line."""
    text = cert_pem.decode("ascii", errors="replace")
    start = text.index("-----BEGIN CERTIFICATE-----")
    end = text.index("-----END CERTIFICATE-----", start) + len("-----END CERTIFICATE-----")
    der = ssl.PEM_cert_to_DER_cert(text[start:end])
    return "sha256:" + hashlib.sha256(der).hexdigest()[:16]


class ReloadableServerCredentials:
    """Mutual-TLS server credentials for the client port that :meth:`reload` re-reads from
    ``paths`` (clients must present a certificate signed by the CA)."""

    def __init__(self, paths: TlsPaths) -> None:
        self._paths = paths
        self._lock = threading.Lock()
        # A configuration not yet handed to gRPC; None when gRPC has the newest.
        self._pending: grpc.ServerCertificateConfiguration | None = None
        cert, key, ca = read_tls_files(paths)
        self.fingerprint = certificate_fingerprint(cert)
        self.credentials = grpc.dynamic_ssl_server_credentials(
            _configuration(cert, key, ca),
            # grpc-stubs leave out the None ("unchanged") that gRPC documents and accepts.
            self._fetch,  # type: ignore[arg-type]
            require_client_authentication=True,
        )

    def reload(self) -> str:
        cert, key, ca = read_tls_files(self._paths)
        configuration = _configuration(cert, key, ca)
        with self._lock:
            self._pending = configuration
        self.fingerprint = certificate_fingerprint(cert)
        return (
            f"certificate {self._paths.cert_file} ({self.fingerprint}), key "
            f"{self._paths.key_file}, CA {self._paths.ca_file}; new connections use them"
        )

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """Called by gRPC before each handshake, on its threads: the new configuration once,
        then None ("unchanged")."""
        with self._lock:
            pending, self._pending = self._pending, None
        return pending


def _configuration(cert: bytes, key: bytes, ca: bytes) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)


class RotatingSSLContext(ssl.SSLContext):
    """An SSLContext whose every new connection uses the context :meth:`use` last set.

    asyncio and uvloop make a connection's SSL object by calling the context's ``wrap_bio``
    (``wrap_socket`` for a blocking socket), once, at the connection's start: both are handed
    to the current context here, so a connection made after :meth:`use` presents the new
    certificate and checks its peer against the new CA, and one made before keeps the
    context it started with. The wrapper's own settings are never used for a connection."""

    current: ssl.SSLContext

    def __new__(cls, current: ssl.SSLContext) -> RotatingSSLContext:
        return super().__new__(cls, current.protocol)

    def __init__(self, current: ssl.SSLContext) -> None:
        self.use(current)

    def use(self, current: ssl.SSLContext) -> None:
        """Connections made from now on use ``current``."""
        self.current = current

    def wrap_bio(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        return self.current.wrap_bio(incoming, outgoing, server_side, server_hostname, session)

    def wrap_socket(self, sock: socket.socket, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        return self.current.wrap_socket(sock, *args, **kwargs)


class PeerContexts(Protocol):
    """How a member's peer port TLS contexts are made from its PEM files
    (``daemon.TlsFiles``)."""

    cert_file: str
    key_file: str
    ca_file: str

    def contexts(self, cert: bytes, key: bytes, ca: bytes) -> tuple[ssl.SSLContext, ssl.SSLContext]:
        """(listening context, dialling context) from the files' contents."""
        ...


class PeerTlsFiles:
    """The peer port's TLS (``node.config.PeerTls``), re-read from ``files`` on
    :meth:`reload` (module docstring)."""

    def __init__(self, files: PeerContexts) -> None:
        self._files = files
        cert, key, ca = read_tls_files(files)
        server, client = files.contexts(cert, key, ca)
        self.fingerprint = certificate_fingerprint(cert)
        self._server = RotatingSSLContext(server)
        self._client = RotatingSSLContext(client)

    def server_ssl_context(self) -> ssl.SSLContext:
        return self._server

    def client_ssl_context(self) -> ssl.SSLContext:
        return self._client

    def reload(self) -> str:
        cert, key, ca = read_tls_files(self._files)
        try:
            server, client = self._files.contexts(cert, key, ca)
        except ssl.SSLError as exc:
            raise SettingsError(
                f"tls files {self._files.cert_file}, {self._files.key_file}, "
                f"{self._files.ca_file}: {exc}"
            ) from None
        self._server.use(server)
        self._client.use(client)
        self.fingerprint = certificate_fingerprint(cert)
        return (
            f"certificate {self._files.cert_file} ({self.fingerprint}), key "
            f"{self._files.key_file}, CA {self._files.ca_file}; new peer connections use them"
        )
