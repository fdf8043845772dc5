"""What the node keeps and shows: retention of ended jobs' files, the agent's metrics, the logs it serves;
imports tasks and the shim.
"""
