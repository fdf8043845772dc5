"""The coordinator's HTTP side: the read-only dashboard and its page, and the Prometheus metrics; imports the
core, the store and rpc, never ha.
"""
