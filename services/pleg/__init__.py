"""podvisor.services.pleg."""
