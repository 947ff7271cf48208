"""podvisor.services.sources."""
