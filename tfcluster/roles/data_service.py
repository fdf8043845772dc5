"""The tf.data service's built-in programs: `python -m tfcluster.roles.data_service dispatcher|data_worker`.

The dispatcher runs TensorFlow's tf.data service `DispatchServer` on the task's port, fault-tolerant, with its
journal in the job's checkpoint space (TFCLUSTER_CHECKPOINT_DIR/tf_data_service): restarted on the same port
it reads its journal back, and readers reconnect to the address they were given (TFCLUSTER_DATA_SERVICE). A
data worker runs `WorkerServer` on its port and registers with the dispatcher under the address other tasks
reach it at (TFCLUSTER_ADDRESS). Neither exits by itself: the coordinator stops both once training is over.
"""

from __future__ import annotations

import os
import sys

from tfcluster import layout
from tfcluster.model import DATA_WORKER, DISPATCHER

GRPC_PREFIX = "grpc://"


def dispatcher_config(tf, env: dict[str, str]):
    work_dir = os.path.join(env[layout.CHECKPOINT_DIR], layout.DATA_SERVICE_SUBDIR)
    return tf.data.experimental.service.DispatcherConfig(port=int(env[layout.PORT]), work_dir=work_dir,
                                                         fault_tolerant_mode=True)


def worker_config(tf, env: dict[str, str]):
    dispatcher = env[layout.DATA_SERVICE].removeprefix(GRPC_PREFIX)
    return tf.data.experimental.service.WorkerConfig(dispatcher_address=dispatcher, port=int(env[layout.PORT]),
                                                     worker_address=env[layout.ADDRESS])


def main(argv: list[str]) -> int:
    needed = {DISPATCHER: (layout.PORT, layout.CHECKPOINT_DIR),
              DATA_WORKER: (layout.PORT, layout.ADDRESS, layout.DATA_SERVICE)}
    if len(argv) != 1 or argv[0] not in needed:
        print(f"usage: python -m tfcluster.roles.data_service {'|'.join(needed)}", file=sys.stderr)
        return 2
    role = argv[0]
    missing = [name for name in needed[role] if not os.environ.get(name)]
    if missing:
        print(f"tfcluster {role}: {', '.join(missing)} not set (tfcluster sets them for the job's {role} tasks)",
              file=sys.stderr)
        return 2
    import tensorflow as tf

    env = dict(os.environ)
    if role == DISPATCHER:
        config = dispatcher_config(tf, env)
        server = tf.data.experimental.service.DispatchServer(config)
        print(f"tfcluster dispatcher: serving on port {config.port}, journal in {config.work_dir}", flush=True)
    else:
        config = worker_config(tf, env)
        server = tf.data.experimental.service.WorkerServer(config)
        print(f"tfcluster data worker: serving {config.worker_address} for dispatcher {config.dispatcher_address}",
              flush=True)
    server.join()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
