"""The prober process: liveness, readiness and startup probes (see docs/ARCHITECTURE.md)."""
