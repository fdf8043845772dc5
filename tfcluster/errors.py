"""What goes wrong when talking to a cluster, as exceptions a program can catch by kind: the Python API (Cluster)
and the CLI raise these, never a gRPC error. Each message is one line that says what was wrong and, where there
is one, what to do about it; exit_code is what the CLI exits with (2 for bad input, 1 otherwise).
"""

from __future__ import annotations

import grpc


class ClusterError(Exception):
    """Anything that kept a call to the cluster from doing what it was asked."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
        self.status: grpc.StatusCode | None = None  # the coordinator's answer, when it came from one


class InvalidRequest(ClusterError):
    """Bad input: a spec that does not parse or check, a flag or an argument out of range, a request the
    coordinator refused as malformed."""

    exit_code = 2


class NotFound(ClusterError):
    """The coordinator knows no job (or node) of that name."""


class PermissionDenied(ClusterError):
    """The coordinator refused: the job is another user's, or the call is for admins."""


class NotAuthenticated(ClusterError):
    """The coordinator does not accept these credentials (another CA's, expired, or no token)."""


class Unreachable(ClusterError):
    """No coordinator answered at the address given (not running, another address, a TLS mismatch)."""


class Unavailable(ClusterError):
    """A coordinator answered but cannot do it now: a standby with no leader, or a store that cannot take the
    change. Trying again later may succeed."""


# The kind of error each answer of the coordinator's is, where the answer alone says it.
BY_STATUS = {grpc.StatusCode.INVALID_ARGUMENT: InvalidRequest, grpc.StatusCode.NOT_FOUND: NotFound,
             grpc.StatusCode.PERMISSION_DENIED: PermissionDenied, grpc.StatusCode.UNAUTHENTICATED: NotAuthenticated}
