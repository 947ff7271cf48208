"""The embedded CRI runtime process (``runtimeEndpoint: embedded``). Other packages reach it
only over the CRI (``podvisor.services.cri``); its entry is ``podvisor.services.runtime.main``
(the standalone server: ``python -m podvisor.services.runtime``).

The front door exports nothing: the rest of the package is private."""

__all__: list[str] = []
