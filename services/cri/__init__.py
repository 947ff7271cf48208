"""podvisor.services.cri."""
