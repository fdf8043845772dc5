"""The per-task shim: the root process that starts a task as its user, copies its output, stops it and records how
it ended, and what it does before (isolation, cgroups); imports nothing else of the agent.
"""
