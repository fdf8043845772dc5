"""tfcluster: TensorFlow distributed training on bare-metal machines.

The Python API: `from tfcluster import Cluster` (cluster.py), its errors (errors.py) and its typed answers
(statuses.py). They are imported on first use, so that importing the package costs a command nothing.
"""

__version__ = "0.8.2"

_API = {"Cluster": "cluster", "Job": "cluster", "Sweep": "cluster", "ClusterError": "errors", "InvalidRequest": "errors",
        "NotFound": "errors", "PermissionDenied": "errors", "NotAuthenticated": "errors", "Unreachable": "errors",
        "Unavailable": "errors"}
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'tfcluster' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"tfcluster.{_API[name]}"), name)
