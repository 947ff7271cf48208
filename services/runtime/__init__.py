"""The embedded CRI runtime process (``runtimeEndpoint: embedded``). Other packages reach it
only over the CRI (``podvisor.services.cri``); its entry is ``podvisor.services.runtime.main``
(the standalone server: ``python -m podvisor.services.runtime``).

The front door exports only the image store, for ``podvisorctl images load`` (CRI has no import
call): the rest of the package is private."""

from podvisor.services.runtime.imagestore import ImageError, ImageStore

__all__ = ["ImageError", "ImageStore"]
