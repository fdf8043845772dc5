"""What runs inside role processes, and the pure TF_CONFIG builder shared with the coordinator."""
