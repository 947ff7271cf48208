"""podvisor.supervisor."""
