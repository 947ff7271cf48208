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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from podvisor.services.pod.container import Container, ObjectFieldSelector
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


def container_env(pod: Pod, container: Container, node: NodeFacts,
                  pod_ips: Sequence[str]) -> list[tuple[str, str]]:
    """Raises ValueError when a resourceFieldRef names a container the pod does not have."""
    env: dict[str, str] = {}
    for var in container.env:
        if var.value_from is None:
            value = expand(var.value, env.get) if var.value else ""
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
