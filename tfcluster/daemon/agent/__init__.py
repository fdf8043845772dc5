"""The agent: one process per node runs, watches and reports its tasks.

Its parts, each a package whose docstring says what it holds and what it may import (tests/unit/test_layers.py
holds them to it): shim (the per-task root process), tasks (one attempt's life), code (jobs' code and
environments), hooks (per-task features), peers (the peer port), session (the coordinator's stream) and node
(retention, metrics, logs). The entry points stand beside them: agent.py (an agent, its parts wired) and main.py
(the `tfcluster agent` process); taskrunner.py and launcher.py keep the module paths that processes of earlier
releases were started with.
"""
