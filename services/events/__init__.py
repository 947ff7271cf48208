"""Kubernetes-style events: built by the processes (``recorder``), kept by the supervisor
(``store``), listed by ``podvisorctl events``. See docs/ARCHITECTURE.md, "Events and logs"."""
