"""The peer port: files other agents send for a job, and the code this node serves them; imports code and tasks,
never the session.
"""
