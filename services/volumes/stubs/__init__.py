"""The CSI spec's and the plugin-registration API's gRPC stubs: generated at build time by
setup.py (grpcio-tools' protoc) from ../proto/*.proto into this folder (``csi_pb2``,
``csi_pb2_grpc``, ``pluginregistration_pb2``, ``pluginregistration_pb2_grpc``; not committed).
Regenerate with ``pip install -e .`` (``make venv``)."""
