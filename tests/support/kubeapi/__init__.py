"""The stand-in kube-apiserver the API membership tests drive (see server.py)."""

from tests.support.kubeapi.server import ApiError, KubeApi

__all__ = ["ApiError", "KubeApi"]
