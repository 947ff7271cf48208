"""podvisor.ipc."""
