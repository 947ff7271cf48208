"""docs/ARCHITECTURE.md's one-page map ("At a glance") names every built-in process, every
replicated map with its owner, and every bus message, as the code declares them: a subsystem,
map or message added without its line on the map fails here (issue 23: the map is kept true)."""

from __future__ import annotations

import re
from pathlib import Path

from podvisor.ipc import maps, messages
from podvisor.supervisor.registry import BUILTINS

DOC = Path(__file__).resolve().parents[2] / "docs" / "ARCHITECTURE.md"


def _glance() -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index("\n## At a glance\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def _section(title: str) -> str:
    glance = _glance()
    start = glance.index(f"**{title}**")
    end = glance.find("\n**", start + 1)
    return glance[start:] if end < 0 else glance[start:end]


def test_every_builtin_process_is_on_the_map() -> None:
    names = re.findall(r"[a-z][a-z-]*", _section("Processes"))
    missing = [b.name for b in BUILTINS if b.name not in names]
    assert not missing, f"At a glance, Processes, lacks {missing}"


def test_every_map_is_on_the_map_with_its_owner() -> None:
    rows = [line for line in _section("Replicated maps").splitlines() if line.startswith("| `")]
    table: dict[str, str] = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        owners = [o.strip() for o in cells[1].split(",")]
        for name, owner in zip(re.findall(r"`([a-z-]+)`", cells[0]), owners, strict=False):
            table[name] = owner if len(owners) > 1 else owners[0]
    wrong = {name: (table.get(name), spec.owner) for name, spec in maps.MAPS.items()
             if table.get(name) != spec.owner}
    assert not wrong, f"At a glance, Replicated maps: (on the map, in ipc/maps.py) {wrong}"


def test_every_message_topic_is_on_the_map() -> None:
    section = _section("Messages")
    topics = {cls.TOPIC for cls in vars(messages).values()
              if isinstance(cls, type) and issubclass(cls, messages.Message)
              and cls.TOPIC and cls.__module__ == messages.__name__}
    internal = {"clone", "bus.probe.sent", "supervisor.process.state.heartbeat"}
    missing = sorted(t for t in topics - internal if f"`{t}`" not in section
                     and t not in section)
    assert not missing, f"At a glance, Messages, lacks {missing}"
    assert "clone.<map>.update" in section
