"""The pure core: records, the job state machine and restart policy, scheduling and access rules. It imports
nothing of the store, rpc, ha or web, nor gRPC, asyncio, sockets or threads: time comes in as an argument and
what is to be done goes out as return values. Within it, the model imports none of lifecycle, scheduling or
access, and those import none of each other's modules but the placement's shapes.
"""
