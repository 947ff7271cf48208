"""Defaults for static pods (file and HTTP sources), as the kubelet's ``applyDefaults``."""

from __future__ import annotations

import hashlib
from dataclasses import replace

from podvisor.services.pod import names
from podvisor.services.pod.errors import FieldIssue, PodValidationError
from podvisor.services.pod.hashing import canonical_json
from podvisor.services.pod.model import (
    CONFIG_HASH_ANNOTATION,
    CONFIG_SEEN_ANNOTATION,
    CONFIG_SOURCE_ANNOTATION,
    Origin,
    Pod,
    TaintEffect,
    Toleration,
    TolerationOperator,
)

SOURCE_FILE = "file"
SOURCE_HTTP = "http"
DEFAULT_NAMESPACE = "default"


def static_pod_uid(pod: Pod, node_name: str, source: str, location: str) -> str:
    """md5 of the defaulted pod, then ``host:<node>`` and ``file:<path>`` (or ``url:<url>``)."""
    digest = hashlib.md5(usedforsecurity=False)
    digest.update(canonical_json(replace(pod, origin=None).to_dict()))
    if source == SOURCE_FILE:
        digest.update(f"host:{node_name}".encode())
        digest.update(f"file:{location}".encode())
    else:
        digest.update(f"url:{location}".encode())
    return digest.hexdigest()


def with_static_toleration(tolerations: tuple[Toleration, ...]) -> tuple[Toleration, ...]:
    """``AddOrUpdateTolerationInPod`` with the file pods' ``NoExecute``/``Exists`` toleration:
    appended unless an equal one is there."""
    wanted = Toleration(operator=TolerationOperator.EXISTS, effect=TaintEffect.NO_EXECUTE)
    same = [t for t in tolerations if (t.key, t.operator, t.value, t.effect) ==
            (wanted.key, wanted.operator, wanted.value, wanted.effect)]
    if same:
        return tuple(wanted if t in same else t for t in tolerations)
    return (*tolerations, wanted)


def apply_static_defaults(pod: Pod, *, node_name: str, source: str, location: str, seen: str,
                          warnings: tuple[str, ...] = ()) -> Pod:
    """UID (unless the manifest sets one; the md5 of the API-defaulted pod, see ``defaults``),
    name ``<name>-<node>``, namespace ``default``, ``spec.nodeName``, for file pods the
    ``NoExecute``/``Exists`` toleration (after the UID, as the kubelet), the
    ``kubernetes.io/config.{hash,source,seen}`` annotations, phase Pending and ``origin``.
    Raises ``PodValidationError`` if the new name is invalid."""
    uid = pod.metadata.uid or static_pod_uid(pod, node_name, source, location)
    name = f"{pod.metadata.name}-{node_name.lower()}"
    if reason := names.dns1123_subdomain(name):
        raise PodValidationError(location, [FieldIssue("metadata.name",
                                                       f"with the node name: {reason}")])
    annotations = {**pod.metadata.annotations, CONFIG_HASH_ANNOTATION: uid,
                   CONFIG_SOURCE_ANNOTATION: source, CONFIG_SEEN_ANNOTATION: seen}
    metadata = replace(pod.metadata, uid=uid, name=name,
                       namespace=pod.metadata.namespace or DEFAULT_NAMESPACE,
                       annotations=annotations)
    spec = replace(pod.spec, node_name=node_name)
    if source == SOURCE_FILE:
        spec = replace(spec, tolerations=with_static_toleration(spec.tolerations))
    return Pod(metadata=metadata, spec=spec,
               status={**pod.status, "phase": "Pending"},
               origin=Origin(source=source, location=location, warnings=warnings))
