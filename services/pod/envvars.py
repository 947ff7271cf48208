"""A container's environment and command line as the kubelet builds them. Pure.

- ``expand(text, lookup)``: Kubernetes' ``$(VAR)`` expansion (third_party/forked/golang/
  expansion): ``$(NAME)`` becomes the variable's value when defined and stays verbatim when
  not; ``$$`` is an escaped ``$``; any other ``$`` is kept, as is an unclosed ``$(``.
- ``container_env(pod, container, node, pod_ips)``: ``makeEnvironmentVariables`` without an
  API server: each ``value`` expanded against the variables defined before it, each
  ``valueFrom`` (fieldRef, resourceFieldRef) resolved by ``downward``, never expanded; a name
  given twice keeps its first position and its last value.
- ``expand_command(container, env)``: ``ExpandContainerCommandAndArgs``, against the final
  environment.
- With ``objects`` (API pods): ``envFrom`` first (every key of the ConfigMap/Secret, with its
  prefix; keys that are not valid variable names are skipped, as the kubelet does), then
  ``env``, whose ``configMapKeyRef``/``secretKeyRef`` read one key; a missing object or key
  raises ``ValueError`` (the kubelet's CreateContainerConfigError) unless ``optional``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from podvisor.services.pod import names
from podvisor.services.pod.container import ApiKeyRef, Container, ObjectFieldSelector
from podvisor.services.pod.downward import NodeFacts, field_value, find_container, resource_value
from podvisor.services.pod.model import Pod


def expand(text: str, lookup: Callable[[str], str | None]) -> str:
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch != "$" or i + 1 >= n:
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            close = text.find(")", i + 2)
            if close < 0:
                out.append("$(")
                i += 2
                continue
            name = text[i + 2:close]
            value = lookup(name)
            out.append(f"$({name})" if value is None else value)
            i = close + 1
        else:
            out.append("$" + nxt)
            i += 2
    return "".join(out)


class ObjectReader(Protocol):
    """The API objects an API pod's env and volumes read: a ConfigMap's or Secret's data
    (values as bytes), or None when the object does not exist. Raises OSError when it cannot
    be read now (the API server unreachable and nothing cached)."""

    def data(self, kind: str, namespace: str, name: str) -> Mapping[str, bytes] | None: ...


def _object(objects: ObjectReader | None, kind: str, pod: Pod, name: str,
            optional: bool) -> Mapping[str, bytes] | None:
    what = "configmap" if kind.startswith("configMap") else "secret"
    if objects is None:
        raise ValueError(f"{what} {name!r}: this pod may not reference API objects")
    try:
        data = objects.data(what, pod.namespace, name)
    except OSError as err:
        raise ValueError(f"{what} {name!r}: {err}") from None
    if data is None and not optional:
        raise ValueError(f'{what} "{name}" not found')
    return data


def container_env(pod: Pod, container: Container, node: NodeFacts,
                  pod_ips: Sequence[str], objects: ObjectReader | None = None,
                  ) -> list[tuple[str, str]]:
    """Raises ValueError when a resourceFieldRef names a container the pod does not have, or
    an API object or key a variable needs is missing (not optional)."""
    env: dict[str, str] = {}
    for source in container.env_from:
        data = _object(objects, source.kind, pod, source.name, source.optional) or {}
        for key, raw in data.items():
            if names.env_var_name(source.prefix + key) is None:
                env[source.prefix + key] = raw.decode(errors="replace")
    for var in container.env:
        if var.value_from is None:
            value = expand(var.value, env.get) if var.value else ""
        elif isinstance(var.value_from, ApiKeyRef):
            ref = var.value_from
            found = _object(objects, ref.kind, pod, ref.name, ref.optional)
            if found is None or ref.key not in found:
                if ref.optional:
                    continue
                what = "configmap" if ref.kind == "configMapKeyRef" else "secret"
                raise ValueError(f'couldn\'t find key {ref.key} in {what.title()} '
                                 f'{pod.namespace}/{ref.name}')
            value = found[ref.key].decode(errors="replace")
        elif isinstance(var.value_from, ObjectFieldSelector):
            value = field_value(pod, var.value_from, node, pod_ips)
        else:
            sel = var.value_from
            target = find_container(pod, sel.container_name) if sel.container_name else container
            if target is None:
                raise ValueError(f"container {sel.container_name!r} not found")
            value = resource_value(sel, target, node)
        env[var.name] = value
    return list(env.items())


def expand_command(container: Container, env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    return ([expand(a, env.get) for a in container.command],
            [expand(a, env.get) for a in container.args])


def needs_pod_ip(container: Container) -> bool:
    """True when an env var reads ``status.podIP`` or ``status.podIPs``."""
    return any(isinstance(v.value_from, ObjectFieldSelector)
               and v.value_from.field_path in ("status.podIP", "status.podIPs")
               for v in container.env)
