"""The agent's side of the coordinator: registration, the stream, identity and joining, the node's discovery,
the coordinators' liveness; imports nothing of tasks, hooks or code.
"""
