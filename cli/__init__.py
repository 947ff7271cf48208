"""podvisor.cli: the two commands, `podvisor` (`agent.py`: run, config, chaos) and
`podvisorctl` (`ctl.py` and its `ctl_*` modules), and the fault injector (`chaos.py`).

The top layer: it may import the supervisor, the services' front doors, common and ipc; nothing
imports it (the import contracts in ``pyproject.toml``)."""
