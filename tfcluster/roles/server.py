"""The built-in ps/worker program under ParameterServerStrategy: `python -m tfcluster.roles.server`.

Starts a tf.distribute.Server for this task from TF_CONFIG and serves until stopped; the chief (which
runs the training program through a ClusterCoordinator) sends it work. It never exits by itself: the
coordinator stops it once training is over.
"""

from __future__ import annotations

import json
import os
import sys

from tfcluster.model import PS, WORKER


def main() -> int:
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    task = config.get("task", {})
    if task.get("type") not in (PS, WORKER) or not config.get("cluster"):
        print(f"tfcluster.roles.server runs ps and worker tasks from TF_CONFIG; got {task or 'no TF_CONFIG'}",
              file=sys.stderr)
        return 2
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                  task_index=resolver.task_id, protocol=resolver.rpc_layer or "grpc", start=True)
    print(f"tfcluster: {resolver.task_type}:{resolver.task_id} serving on {server.target}", flush=True)
    server.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
