"""The ``eviction`` process: node-pressure eviction, as the kubelet's eviction manager
(signals.py: the signals and where they are read; thresholds.py: when they are met and the
node conditions; rank.py: which pod first and its message; manager.py: one pass's decision;
usage.py: what each pod uses; service.py: the pass, the ``pressure`` map and ``FailPod``;
main.py: composition)."""

from podvisor.services.eviction.manager import Decision, EvictionManager
from podvisor.services.eviction.rank import ContainerUsage, Eviction, PodUsage, rank
from podvisor.services.eviction.signals import Observation
from podvisor.services.eviction.thresholds import Threshold, format_binary, parse_thresholds

__all__ = ["ContainerUsage", "Decision", "Eviction", "EvictionManager", "Observation",
           "PodUsage", "Threshold", "format_binary", "parse_thresholds", "rank"]
