"""The prober process: liveness, readiness and startup probes (see docs/ARCHITECTURE.md).

The front door: how the ``probes`` map's verdicts read (``probe_verdicts``, ``liveness_failed``).
The process's entry is ``podvisor.services.prober.main`` (named by the supervisor's registry)."""

from podvisor.services.prober.verdicts import liveness_failed, probe_verdicts

__all__ = ["liveness_failed", "probe_verdicts"]
