"""Several coordinators on one etcd store: leadership under a lease, its keeper, the watch on the leader key, the
warm standby, and the runner that takes a coordinator from standby to leader and back; imports every other part
of the coordinator.
"""
