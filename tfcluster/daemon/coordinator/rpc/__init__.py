"""The coordinator's gRPC side: the runtime every call acts on (coordinator.py), the control, agent and code
services, the listener that keeps connections across terms, the join port, per-caller limits, watchers and the
outbox; imports the core and the store, never ha or web.
"""
