"""The embedded runtime's pod network: CNI plugins run the way libcni runs them.

``networkPlugin: cni`` (docs/ARCHITECTURE.md, "Pod network"): every sandbox that asks for
its own network (``NamespaceMode.POD``) gets a network namespace (``netns.py``) and the
plugins of one conflist: the first ``*.conflist`` (or ``*.conf``) in ``cniConfDir`` by name;
when the directory has none, podvisor writes ``10-podvisor.conflist`` there (``bridge`` with
``host-local`` IPAM, then ``portmap``; Debian's containernetworking-plugins), as containerd's
deploy/containerd/cni.py does for its private instance. ``loopback`` runs first for every pod
(containerd does the same). The plugins are found in ``cniBinDir`` (``:``-separated).

The exec protocol (CNI spec 1.0): the plugin's config on stdin with ``name`` and
``cniVersion`` of the list, ``prevResult`` of the plugin before it (ADD) or of the whole ADD
(DEL, cached), ``runtimeConfig.portMappings`` for a plugin with that capability; the
environment ``CNI_COMMAND``, ``CNI_CONTAINERID`` (the sandbox ID), ``CNI_NETNS``,
``CNI_IFNAME`` (eth0), ``CNI_PATH``, ``CNI_ARGS`` (the kubelet's ``K8S_POD_*``). ADD runs
the list in order, DEL in reverse; a plugin's error is its JSON ``msg`` (+ ``details``).

Exactly once (docs/ARCHITECTURE.md, "Exactly once"): before anything is made, the
*attachment* (``<root>/network/<sandbox id>.json``: the namespace path, the pod and its port
mappings: all a DEL needs) is written; the ADD's result is added to it; ``teardown`` runs the
DEL chain, removes the namespace and, last, the attachment. So a runtime killed anywhere in a
setup or a teardown leaves an attachment that names everything there may be, and
``Engine.start`` tears down every attachment no ready sandbox owns. DEL is idempotent (the
plugins' rule: a missing address, rule or interface is no error).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from podvisor.common import cninet
from podvisor.common.cninet import CONFLIST, tag_of
from podvisor.services.runtime import netns

DEFAULT_BIN_DIRS = "/usr/lib/cni:/opt/cni/bin"
POOL = ipaddress.IPv4Network("10.208.0.0/13")  # deploy/containerd's instances use 10.200.0.0/13
IFNAME = "eth0"
PLUGIN_TIMEOUT = 60.0
LOOPBACK = {"cniVersion": "1.0.0", "name": "cni-loopback", "plugins": [{"type": "loopback"}]}


class CniError(Exception):
    pass


@dataclass(frozen=True)
class PortMapping:
    host_port: int
    container_port: int
    protocol: str = "tcp"
    host_ip: str = ""

    def runtime_config(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hostPort": self.host_port, "containerPort": self.container_port,
                               "protocol": self.protocol}
        if self.host_ip:
            out["hostIP"] = self.host_ip
        return out


@dataclass(frozen=True)
class Attachment:
    """What a sandbox's network is made of; written before the first thing is made."""

    sandbox_id: str
    netns: str
    name: str
    namespace: str
    uid: str
    ports: tuple[PortMapping, ...] = ()
    result: Mapping[str, Any] = field(default_factory=dict)  # the ADD's, once it succeeded
    network: Mapping[str, Any] = field(default_factory=dict)  # the conflist it was made with

    def to_json(self) -> bytes:
        doc = asdict(self)
        doc["result"], doc["network"] = dict(self.result), dict(self.network)
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Attachment:
        doc = json.loads(data)
        return cls(str(doc["sandbox_id"]), str(doc["netns"]), str(doc["name"]),
                   str(doc["namespace"]), str(doc["uid"]),
                   tuple(PortMapping(**p) for p in doc.get("ports") or ()),
                   dict(doc.get("result") or {}), dict(doc.get("network") or {}))

    def cni_args(self) -> str:
        return (f"IgnoreUnknown=1;K8S_POD_NAMESPACE={self.namespace};K8S_POD_NAME={self.name};"
                f"K8S_POD_INFRA_CONTAINER_ID={self.sandbox_id};K8S_POD_UID={self.uid}")


def ips_of(result: Mapping[str, Any]) -> list[str]:
    """The addresses of a CNI result (1.0: ``ips[].address`` in CIDR form), IPv4 first."""
    out = [str(ip.get("address", "")).split("/")[0] for ip in result.get("ips") or ()]
    return sorted((a for a in out if a), key=lambda a: ":" in a)


def pick_subnet(tag: str) -> ipaddress.IPv4Network:
    """A /24 of ``POOL`` that no route or address of this machine overlaps (the tag picks
    where to start looking)."""
    subnet = cninet.pick_subnet(POOL, tag, cninet.used_networks())
    if subnet is None:
        raise CniError(f"every /24 of {POOL} overlaps a route or address of this machine")
    return subnet


def default_conflist(runtime_root: Path) -> dict[str, Any]:
    """The network podvisor writes when ``cniConfDir`` has none (``common/cninet.py``: a
    bridge ``pv<tag>`` that never forwards nor masquerades, host-local addresses in a free /24,
    portmap for hostPort), its IPAM state under ``<root>/network/ipam``."""
    tag = tag_of(str(runtime_root))
    return cninet.conflist(tag, pick_subnet(tag), str(runtime_root / "network" / "ipam"))


def bridge_of(conf: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(bridge, gateway, prefix length) of a conflist whose first plugin is a bridge without
    ``isGateway`` and with a host-local range naming its gateway: the address the runtime
    gives the bridge itself. None for any other network (its plugins do what they do)."""
    plugins = conf.get("plugins") or []
    if not plugins or plugins[0].get("type") != "bridge" or plugins[0].get("isGateway"):
        return None
    try:
        rng = plugins[0]["ipam"]["ranges"][0][0]
        net = ipaddress.ip_network(rng["subnet"], strict=False)
        return str(plugins[0]["bridge"]), str(rng["gateway"]), str(net.prefixlen)
    except (KeyError, IndexError, TypeError, ValueError):
        return None


class Cni:
    """Thread-safety: ``setup``/``teardown`` of different sandboxes may run at once (the
    plugins lock what they share: host-local its store, portmap iptables with -w)."""

    def __init__(self, root: Path, conf_dir: Path, bin_dirs: str) -> None:
        """``root``: the runtime's root (attachments under ``root/network``, namespaces under
        ``root/netns``)."""
        self.root = root
        self.conf_dir = conf_dir
        self.bin_dirs = [d for d in bin_dirs.split(":") if d]
        self.attach_dir = root / "network"
        self.netns_dir = root / "netns"
        self._conf: dict[str, Any] | None = None

    # --- the network's config ---
    def conflist(self) -> dict[str, Any]:
        """The network (loaded once; written first when the directory has none)."""
        if self._conf is not None:
            return self._conf
        path = self._find_conf()
        if path is None:
            conf = default_conflist(self.root)
            self.conf_dir.mkdir(parents=True, exist_ok=True)
            path = self.conf_dir / CONFLIST
            tmp = path.with_name(f".{CONFLIST}.tmp")
            tmp.write_text(json.dumps(conf, indent=2) + "\n", encoding="utf-8")
            tmp.rename(path)
        try:
            conf = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise CniError(f"CNI config {path}: {err}") from None
        if "plugins" not in conf:  # a single-plugin .conf
            conf = {"cniVersion": conf.get("cniVersion", "1.0.0"), "name": conf.get("name"),
                    "plugins": [conf]}
        if not conf.get("name") or not conf.get("plugins"):
            raise CniError(f"CNI config {path}: no name or no plugins")
        self._conf = conf
        return conf

    def _find_conf(self) -> Path | None:
        with contextlib.suppress(FileNotFoundError):
            for p in sorted(self.conf_dir.iterdir()):
                if p.suffix in (".conflist", ".conf", ".json") and not p.name.startswith("."):
                    return p
        return None

    def problem(self) -> str:
        """Why pods cannot get a network ('' when they can): not root, no config, a plugin
        missing. Status's ``NetworkReady`` reports it."""
        if os.geteuid() != 0:
            return ("pod network namespaces need root (the embedded runtime runs as uid "
                    f"{os.geteuid()}); set networkPlugin: host to run pods in the node's network")
        if shutil.which("unshare") is None:
            return "pod network namespaces need unshare (util-linux)"
        try:
            conf = self.conflist()
        except CniError as err:
            return str(err)
        for plugin in [{"type": "loopback"}, *conf["plugins"]]:
            if self._binary(str(plugin.get("type", ""))) is None:
                return (f"CNI plugin {plugin.get('type')!r} not found in "
                        f"{':'.join(self.bin_dirs)} (Debian: containernetworking-plugins); "
                        "set networkPlugin: host to run pods in the node's network")
        return ""

    def _binary(self, kind: str) -> str | None:
        if not kind or "/" in kind:
            return None
        for d in self.bin_dirs:
            p = os.path.join(d, kind)
            if os.access(p, os.X_OK):
                return p
        return None

    # --- attachments ---
    def _attach_path(self, sandbox_id: str) -> Path:
        return self.attach_dir / f"{sandbox_id}.json"

    def netns_path(self, sandbox_id: str) -> Path:
        return self.netns_dir / sandbox_id

    def _save(self, att: Attachment) -> None:
        self.attach_dir.mkdir(parents=True, exist_ok=True)
        path = self._attach_path(att.sandbox_id)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(att.to_json())
        tmp.rename(path)

    def attached(self) -> set[str]:
        """Sandbox IDs with an attachment or a namespace file (anything a setup made)."""
        ids = {p.stem for p in netns.listed(self.attach_dir) if p.suffix == ".json"}
        ids |= {p.name for p in netns.listed(self.netns_dir)}
        return ids

    # --- setup and teardown ---
    def setup(self, att: Attachment) -> list[str]:
        """Namespace, loopback, the network; returns the pod's IPs. On failure everything
        made is torn down before the error is raised."""
        conf = self.conflist()
        att = replace(att, network=conf)
        self._save(att)
        try:
            netns.make(Path(att.netns))
            self._ensure_bridge(conf)
            self._chain("ADD", LOOPBACK, att, None)
            result = self._chain("ADD", conf, att, None)
            self._save(replace(att, result=result))
        except BaseException:
            with contextlib.suppress(Exception):
                self.teardown(att.sandbox_id)
            raise
        ips = ips_of(result)
        if not ips:
            self.teardown(att.sandbox_id)
            raise CniError(f"network {conf['name']} gave sandbox {att.sandbox_id} no address")
        return ips

    def teardown(self, sandbox_id: str) -> None:
        """DEL through the chain, then the namespace, then the attachment. Idempotent."""
        path = self._attach_path(sandbox_id)
        try:
            att: Attachment | None = Attachment.from_json(path.read_bytes())
        except FileNotFoundError:
            att = None
        except (OSError, ValueError, KeyError, TypeError):
            att = Attachment(sandbox_id, str(self.netns_path(sandbox_id)), "", "", "")
        if att is not None:  # DEL with the network it was made with, whatever the config now
            conf = dict(att.network) if att.network.get("plugins") else self.conflist()
            self._chain("DEL", conf, att, att.result or None)
            if netns.is_namespace(Path(att.netns)):
                self._chain("DEL", LOOPBACK, att, None)
        netns.remove(self.netns_path(sandbox_id))
        if att is not None and att.netns != str(self.netns_path(sandbox_id)):
            netns.remove(Path(att.netns))
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

    def _ensure_bridge(self, conf: Mapping[str, Any]) -> None:
        spec = bridge_of(conf)
        if spec is None:
            return
        bridge, gateway, prefix = spec
        ip = shutil.which("ip") or "ip"
        if subprocess.run([ip, "link", "show", bridge], capture_output=True,
                          check=False).returncode != 0:
            _run([ip, "link", "add", "name", bridge, "type", "bridge"], f"bridge {bridge}")
        shown = subprocess.run([ip, "-4", "-o", "addr", "show", "dev", bridge],
                               capture_output=True, text=True, check=False).stdout
        if f" {gateway}/" not in shown:
            _run([ip, "addr", "add", f"{gateway}/{prefix}", "dev", bridge],
                 f"address {gateway} on bridge {bridge}")
        _run([ip, "link", "set", bridge, "up"], f"bridge {bridge} up")

    def _chain(self, command: str, conf: Mapping[str, Any], att: Attachment,
               prev: Mapping[str, Any] | None) -> dict[str, Any]:
        plugins = list(conf["plugins"])
        if command == "DEL":
            plugins.reverse()
        result: dict[str, Any] = dict(prev or {})
        for plugin in plugins:
            stdin: dict[str, Any] = {**plugin, "name": conf["name"],
                                     "cniVersion": conf.get("cniVersion", "1.0.0")}
            if result:
                stdin["prevResult"] = result
            if _wants_port_mappings(plugin) and att.ports:
                stdin["runtimeConfig"] = {"portMappings": [p.runtime_config()
                                                           for p in att.ports]}
            out = self._exec(command, str(plugin.get("type", "")), stdin, att)
            if command == "ADD":
                result = out
        return result

    def _exec(self, command: str, kind: str, stdin: Mapping[str, Any],
              att: Attachment) -> dict[str, Any]:
        binary = self._binary(kind)
        if binary is None and command == "DEL":
            return {}  # a plugin that cannot be found made nothing to delete
        if binary is None:
            raise CniError(f"CNI plugin {kind!r} not found in {':'.join(self.bin_dirs)}")
        env = {"CNI_COMMAND": command, "CNI_CONTAINERID": att.sandbox_id,
               "CNI_NETNS": att.netns if netns.is_namespace(Path(att.netns)) else "",
               "CNI_IFNAME": IFNAME, "CNI_PATH": ":".join(self.bin_dirs),
               "CNI_ARGS": att.cni_args(), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        try:
            done = subprocess.run([binary], input=json.dumps(stdin).encode(), env=env,
                                  capture_output=True, timeout=PLUGIN_TIMEOUT, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise CniError(f"plugin type={kind!r} {command}: {err}") from None
        if done.returncode != 0:
            raise CniError(f"plugin type={kind!r} failed ({command}): "
                           f"{_error_text(done.stdout, done.stderr)}")
        if command != "ADD" or not done.stdout.strip():
            return {}
        try:
            out = json.loads(done.stdout)
        except ValueError:
            raise CniError(f"plugin type={kind!r} {command}: not JSON: "
                           f"{done.stdout[:200]!r}") from None
        return out if isinstance(out, dict) else {}


def _wants_port_mappings(plugin: Mapping[str, Any]) -> bool:
    """The plugin declares the ``portMappings`` capability (portmap does)."""
    caps = plugin.get("capabilities")
    return isinstance(caps, dict) and bool(caps.get("portMappings"))


def _error_text(stdout: bytes, stderr: bytes) -> str:
    try:
        doc = json.loads(stdout)
        text = str(doc.get("msg", ""))
        if doc.get("details"):
            text += f"; {doc['details']}"
        return text or stdout.decode(errors="replace")
    except (ValueError, AttributeError):
        return (stderr or stdout).decode(errors="replace").strip()[:2000]


def _run(argv: Sequence[str], what: str) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise CniError(f"{what}: {done.stderr.strip() or done.returncode}")


# --- removal of a whole network (tests, ``podvisorctl``-less cleanup) ---

def remove_network(conf: Mapping[str, Any]) -> None:
    """Everything a network of ours leaves on the machine once no pod uses it: portmap's
    rules that name it (and their ``CNI-DN-*`` chains), the shared ``CNI-HOSTPORT-*`` chains
    when no other network has a mapping left, and the bridge the runtime made. For tests and
    for operators retiring a rootDir (by the network's name: nothing else is touched)."""
    cninet.remove_port_rules(str(conf["name"]))
    spec = bridge_of(conf)
    if spec is not None:
        subprocess.run(["ip", "link", "del", spec[0]], capture_output=True, check=False)
