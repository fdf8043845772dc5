"""Jobs' code and environments on this node: the cache of archives, fetching and relaying them, unpacking, tasks'
working dirs, virtualenvs and what a job may ask of them; imports the shim and tasks' users.
"""
