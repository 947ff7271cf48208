"""The ``pods/<name>/resize`` subresource (InPlacePodVerticalScaling, beta and on in 1.33): the
API server's ``ValidatePodResize`` as far as the stand-in goes.

A PATCH (merge or strategic merge) or PUT of the Pod through ``resize`` may change only the
CPU and memory requests and limits of its containers (and of its sidecars); everything else
of the pod is kept as stored. Refused with 422 Invalid and the API server's messages: a static
(mirror) pod (``static pods cannot be resized``), a change of anything else (``only cpu and
memory resources are mutable``), of the QoS class (``Pod QOS Class may not change as a result
of resizing``), a removed request or limit (``resource removal is not supported``), a memory
limit that goes down while the container's memory resizePolicy is not RestartContainer
(``memory limits cannot be decreased unless resizePolicy is RestartContainer``).
"""

from __future__ import annotations

import copy
from typing import Any

from podvisor.common.quantity import cpu_millis, memory_bytes

Obj = dict[str, Any]
MIRROR = "kubernetes.io/config.mirror"
RESIZABLE = ("cpu", "memory")


class ResizeError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _amount(key: str, value: Any) -> int:
    return cpu_millis(value) if key == "cpu" else memory_bytes(value)


def _containers(spec: Obj) -> list[tuple[str, int, Obj]]:
    out = [("containers", i, c) for i, c in enumerate(spec.get("containers") or [])]
    out += [("initContainers", i, c) for i, c in enumerate(spec.get("initContainers") or [])
            if c.get("restartPolicy") == "Always"]
    return out


def qos(spec: Obj) -> str:
    """``GetPodQOS`` (``ComputePodQOS``) over the containers' CPU and memory."""
    requests: dict[str, int] = {}
    limits: dict[str, int] = {}
    guaranteed = True
    every = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    for c in every:
        res = c.get("resources") or {}
        req = {k: _amount(k, v) for k, v in (res.get("requests") or {}).items()
               if k in RESIZABLE}
        lim = {k: _amount(k, v) for k, v in (res.get("limits") or {}).items() if k in RESIZABLE}
        for k, v in req.items():
            requests[k] = requests.get(k, 0) + v
        for k, v in lim.items():
            limits[k] = limits.get(k, 0) + v
        if set(lim) != set(RESIZABLE) or any(req.get(k, lim[k]) != lim[k] for k in lim):
            guaranteed = False
    if not any(requests.values()) and not any(limits.values()):
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def _restarts_on_memory(c: Obj) -> bool:
    return any(p.get("resourceName") == "memory" and p.get("restartPolicy") == "RestartContainer"
               for p in c.get("resizePolicy") or [])


def resized(name: str, old: Obj, wanted: Obj) -> Obj:
    """The stored pod ``old`` with the resources of ``wanted`` (the patched or PUT pod), or
    ``ResizeError`` with the API server's message."""
    where = f'Pod "{name}" is invalid'
    if MIRROR in ((old.get("metadata") or {}).get("annotations") or {}):
        raise ResizeError(f"{where}: : Forbidden: static pods cannot be resized")
    spec, want = old.get("spec") or {}, wanted.get("spec") or {}
    new = copy.deepcopy(old)
    for key, i, c in _containers(spec):
        others = want.get(key) or []
        if i >= len(others) or others[i].get("name") != c.get("name"):
            raise ResizeError(f"{where}: spec: Forbidden: only cpu and memory resources are "
                              "mutable")
        res = others[i].get("resources") or {}
        path = f"spec.{key}[{i}].resources"
        before = c.get("resources") or {}
        for part in ("requests", "limits"):
            for k in before.get(part) or {}:
                if k not in (res.get(part) or {}):
                    raise ResizeError(f"{where}: {path}.{part}[{k}]: Forbidden: resource "
                                      "removal is not supported")
        old_mem = (before.get("limits") or {}).get("memory")
        new_mem = (res.get("limits") or {}).get("memory")
        if old_mem is not None and new_mem is not None and \
                memory_bytes(new_mem) < memory_bytes(old_mem) and not _restarts_on_memory(c):
            raise ResizeError(f"{where}: {path}.limits[memory]: Forbidden: memory limits "
                              "cannot be decreased unless resizePolicy is RestartContainer")
        new["spec"][key][i]["resources"] = copy.deepcopy(res) if res else {}
    if _others_changed(spec, want):
        raise ResizeError(f"{where}: spec: Forbidden: only cpu and memory resources are "
                          "mutable")
    if qos(new["spec"]) != qos(spec):
        raise ResizeError(f"{where}: spec: Invalid value: \"{qos(spec)}\": Pod QOS Class may "
                          "not change as a result of resizing")
    return new


def _others_changed(spec: Obj, want: Obj) -> bool:
    """Anything but the resizable resources differs between the stored and the wanted spec."""
    def strip(s: Obj) -> Obj:
        s = copy.deepcopy(s)
        for key in ("containers", "initContainers"):
            for c in s.get(key) or []:
                res = c.get("resources") or {}
                for part in ("requests", "limits"):
                    for k in RESIZABLE:
                        (res.get(part) or {}).pop(k, None)
                    if part in res and not res[part]:
                        del res[part]
                if "resources" in c and not c["resources"]:
                    del c["resources"]
        return s
    return strip(spec) != strip(want)
