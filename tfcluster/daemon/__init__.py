"""The two daemons: the coordinator and the per-node agent."""
