"""Where jobs go and in what order: gang placement, the queue, preemption and the policy file; imports the model.
"""
