"""podvisor.services.server."""
