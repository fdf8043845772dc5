"""The per-node agent: discovery, registration and command stream, task supervision."""
