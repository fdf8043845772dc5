"""The coordinator: one process places jobs' tasks on nodes and drives every job through its states.

Its parts, each a package whose docstring says what it holds and what it may import (tests/unit/test_layers.py
holds them to it): core (the pure model, lifecycle, scheduling and access rules), store (where the core's records
are kept), rpc (the gRPC services and the runtime they act on), web (the dashboard and /metrics) and ha (several
coordinators on one etcd store). The entry points stand beside them: grpc_server.py (one running coordinator,
its servers wired) and process.py (the `tfcluster coordinator` process, or a coordinator on a thread).
"""
