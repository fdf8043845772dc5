"""Who may do what: the rules for a job's readers and actors, the cluster's trust (join tokens, name holders,
revocations) and dashboard logins; imports the model.
"""
