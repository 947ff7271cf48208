"""podvisor.services."""
