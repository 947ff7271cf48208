"""podvisor.services.pod."""
