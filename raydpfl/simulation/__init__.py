"""Orchestration without Ray: the server's round loop, the client worker, outputs."""
