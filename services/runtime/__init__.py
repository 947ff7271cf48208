"""podvisor.services.runtime."""
