"""Where the core's records are kept: the store contract (api.py) and its SQLite and etcd back-ends, the
documents' shapes and their migrations, the writer the core's changes go through, and jobs' code archives;
imports the core, never rpc, ha or web.
"""
