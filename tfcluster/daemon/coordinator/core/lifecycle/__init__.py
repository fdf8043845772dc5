"""A job's life: its state machine (transitions.py), the stops that send it back to the queue (back_to_queue.py),
the restart policy, completion, reconciling a node, what a task runs and the host-local checkpoint orders; imports
the model.
"""
