"""The transports: HTTP (FastAPI: Connect, ingest, health, metrics, status) and gRPC, each a thin layer over one service call."""
