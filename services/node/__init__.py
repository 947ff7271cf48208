"""podvisor.services.node: the Node and its Lease in the API server (process ``node``)."""
