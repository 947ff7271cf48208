"""podvisor.services.certificates: TLS bootstrap and certificate rotation (process
``certificates``, issue 26).

Front door: ``wanted(config)`` (whether the process runs), ``serving_pair_path(config)`` (the
main port's ``kubelet-server-current.pem`` with ``serverTLSBootstrap``), ``PairStore`` and
``load_pair`` (the pairs in ``certDir``), ``rotation_deadline``.
"""

from pathlib import Path

from podvisor.common.config import Config, cert_dir
from podvisor.services.certificates.manager import rotation_deadline
from podvisor.services.certificates.store import (
    CLIENT_PREFIX,
    SERVER_PREFIX,
    Pair,
    PairStore,
    load_pair,
    serving_context_for,
)


def wanted(config: Config) -> bool:
    return bool(config.kubeconfig) and (bool(config.bootstrap_kubeconfig)
                                        or config.rotate_certificates
                                        or config.server_tls_bootstrap)


def serving_pair_path(config: Config) -> Path:
    return PairStore(cert_dir(config), SERVER_PREFIX).current_path


__all__ = ["CLIENT_PREFIX", "SERVER_PREFIX", "Pair", "PairStore", "load_pair",
           "rotation_deadline", "serving_context_for", "serving_pair_path", "wanted"]
