"""Graceful node shutdown (issue 27), the kubelet's ``pkg/kubelet/nodeshutdown``: the
``nodeshutdown`` process (``main.py``), its pure drain (``drain.py``) and logind's inhibitor
lock over D-Bus (``logind.py``)."""
