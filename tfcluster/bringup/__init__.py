"""`tfcluster up` and `tfcluster down`: a whole cluster brought up over SSH from an operator's machine.

inventory.py reads the inventory (examples/cluster.toml); desired.py says what each host should hold (files, software, services);
plan.py compares that with what a probe of the host found and lists the steps, without any I/O; remote.py is
the helper each host runs (sent over SSH to the host's own python3, standard library only) to probe and to
apply steps; ssh.py runs OpenSSH's client; wheelhouse.py builds the software the hosts install; converge.py
puts them together for `up` (applying.py carries plans out; membership.py and reconfigure.py when the
coordinators change, upgrade.py for a new release), teardown.py for `down`.
"""
