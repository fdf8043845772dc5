"""The coordinator's records: jobs, tasks, nodes, the tables that hold them, what changed, usage, task UIDs;
imports nothing of the core's other parts.
"""
