"""podvisor.services.volumes: the volume manager process (issue 25)."""
