"""Certificate rotation: the client port's TLS files re-read on SIGHUP, without a restart.

Theory of operation. The client port is served with gRPC's dynamic SSL credentials, whose
fetcher gRPC calls (on its own threads) before each new TLS handshake.
:meth:`ReloadableServerCredentials.reload`, registered with the daemon's ``Reloads`` (run on
SIGHUP, on the event loop), reads and checks the certificate, key and CA completely
(``preflight.read_tls_files``, the checks made at start) and only then leaves the new
configuration for the fetcher, which hands it over once; until then, and whenever a check
fails (a SettingsError naming the file), gRPC keeps the configuration it has. Connections
already open keep theirs; every new one uses the newest files. The peer port keeps the files
it started with (a restart picks up new ones).
"""

from __future__ import annotations

import hashlib
import ssl
import threading

import grpc

from .preflight import TlsPaths, read_tls_files


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
