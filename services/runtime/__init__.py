"""The embedded CRI runtime process (``runtimeEndpoint: embedded``). Other packages reach it
only over the CRI (``podvisor.services.cri``); its entry is ``podvisor.services.runtime.main``
(the standalone server: ``python -m podvisor.services.runtime``).

The front door exports the image store, for ``podvisorctl images load`` (CRI has no import
call), and ``serve_in_process``, for ``podvisorctl shutdown --pods`` with no agent (the runtime
served on threads of the calling process while a block runs): the rest of the package is
private."""

from podvisor.services.runtime.imagestore import ImageError, ImageStore
from podvisor.services.runtime.inprocess import serve_in_process

__all__ = ["ImageError", "ImageStore", "serve_in_process"]
