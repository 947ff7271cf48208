"""podvisor.services.status."""
