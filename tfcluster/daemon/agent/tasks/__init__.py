"""One attempt's life on this node: its user, its dirs, its start, its record, the watch of its shim, and what it
hands back; imports the shim and code, never the session, hooks or peers.
"""
