"""The main port's serving certificate from the API server (``serverTLSBootstrap``, issue 26).

``DynamicServing`` gives aiohttp one ``ssl.SSLContext`` whose ``sni_callback`` (OpenSSL's
servername callback, run for every ClientHello, with or without SNI) hands each handshake the
context of the current ``<certDir>/kubelet-server-current.pem``: the file is ``stat``-ed per
handshake and loaded again when the symlink names another pair, so a rotation reaches the next
connection without a restart and open connections keep theirs. Until the first certificate is
issued, ``tlsCertFile``/``tlsPrivateKeyFile`` serve when set; otherwise the handshake is refused,
as the kubelet refuses it ("no serving certificate available for the kubelet").
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Any

from podvisor.services.certificates import serving_context_for

__all__ = ["DynamicServing"]


class DynamicServing:
    """Not thread-safe: handshakes run on the web thread's event loop."""

    def __init__(self, pair: Path, client_ca_file: str, fallback: ssl.SSLContext | None,
                 log: Any) -> None:
        self.pair = pair
        self.client_ca_file = client_ca_file
        self.fallback = fallback
        self.log = log
        self._id: tuple[int, int, int] | None = None
        self._ctx: ssl.SSLContext | None = None
        self.loads = 0
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        if client_ca_file:
            self.context.load_verify_locations(cafile=client_ca_file)
            self.context.verify_mode = ssl.CERT_OPTIONAL
        self.context.sni_callback = self._pick
        self.current()

    def current(self) -> ssl.SSLContext | None:
        try:
            st = os.stat(self.pair)
        except OSError:
            return self.fallback
        ident = (st.st_ino, st.st_mtime_ns, st.st_size)
        if ident != self._id:
            try:
                self._ctx = serving_context_for(Path(os.path.realpath(self.pair)),
                                                self.client_ca_file)
            except (OSError, ssl.SSLError) as exc:
                self.log.error("mainport.certificate_unusable", file=str(self.pair),
                               error=str(exc))
                return self._ctx or self.fallback
            self._id = ident
            self.loads += 1
            self.log.info("mainport.certificate_loaded", file=os.path.realpath(self.pair))
        return self._ctx

    def _pick(self, sock: Any, server_name: str | None, _ctx: ssl.SSLContext) -> int | None:
        ctx = self.current()
        if ctx is None:
            return ssl.ALERT_DESCRIPTION_HANDSHAKE_FAILURE  # no serving certificate yet
        sock.context = ctx
        return None
