"""Builders of map values for tests, written the short way:

- ``status_value(api)``: a ``statuses`` value from a PodStatus as the API's JSON (absent fields
  take their defaults), with its typed ``PodStatus``;
- ``pod_wire(manifest)``: a ``desired`` pod as the sync loop publishes it, the wire form
  (``Pod.to_dict()``) of the manifest its source validated and defaulted (``kind`` and
  ``apiVersion`` may be left out).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from podvisor.ipc.maps import PodRef, PodStatusValue
from podvisor.ipc.podstatus import PodStatus
from podvisor.services.pod import pod_from_dict


def status_value(api: Mapping[str, Any], version: int = 0, pod: PodRef | None = None
                 ) -> PodStatusValue:
    return PodStatusValue(PodStatus.from_dict(api), version, pod or PodRef())


def pod_wire(manifest: Mapping[str, Any]) -> dict[str, Any]:
    return pod_from_dict({"apiVersion": "v1", "kind": "Pod", **manifest}).pod.to_dict()
