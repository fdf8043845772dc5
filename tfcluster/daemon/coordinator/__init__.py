"""The coordinator: job state machine, scheduler and cluster model (pure), SQLite store, gRPC service."""
