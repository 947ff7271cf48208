"""podvisor.services.syncloop."""
