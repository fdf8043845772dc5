"""Who a task runs as on this node, and the job's files on the node that this user may reach.

Each job's tasks run under the UID (and GID) the coordinator chose for the job, so no job can read the node's
key, the CA's, another job's environment or its files. The agent stays root: it writes the attempt dirs, reads
the tasks' output, events and checkpoints, and cleans them up. What a job's user gets on the node:

    <state>                           root 0711   traversable, not listable
    <state>/tls                       root 0700   (identity.py)
    <state>/jobs                      root 0711
    <state>/jobs/<job>                root:gid 0750
    <state>/jobs/<job>/checkpoints    uid:gid 0700   host-local checkpoints
    <state>/jobs/<job>/home           uid:gid 0700   HOME
    <state>/jobs/<job>/tmp            uid:gid 0700   /tmp (bind-mounted) or TMPDIR
    <state>/jobs/<job>/tasks/...      root:gid 0750  down to each attempt dir, where launch.json and
                                                     status.json are root 0600, the output root:gid 0640,
                                                     the events file uid:gid 0600, the control file root:gid 0640

With --task-user owner the task runs as the local account named as the job's owner (looked up in this node's
passwd, from LDAP or wherever NSS takes it), with that account's groups, the way Slurm runs a job as its
submitter: never as an account of uid 0, and never as anyone else when the owner has no account here (the task
fails to start and says so). The job's dirs above keep the job's own group, which the task gets as one more
supplementary group: the owner's primary group is often shared (`users`), and must not open a job's files to
its other members.

An agent that is not root cannot switch users: its tasks run as its own user. With --allow-root-tasks the
operator lets tasks run as root on this node, as they did before 0.3.
"""

from __future__ import annotations

import array
import fcntl
import logging
import os
import pwd
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from tfcluster import layout

log = logging.getLogger("tfcluster.agent")

STATE_DIR_MODE = 0o711
JOB_DIR_MODE = 0o750
PRIVATE_DIR_MODE = 0o700
JOB_READABLE_FILE_MODE = 0o640
PRIVATE_FILE_MODE = 0o600
HOME_NAME = "home"
TMP_NAME = "tmp"
PER_JOB, OWNER = "job", "owner"  # --task-user: the job's own UID from the coordinator, or the owner's account
TASK_USER_MODES = (PER_JOB, OWNER)


class TaskUserError(Exception):
    """A task that may not start under the user it was given; the message says what to do."""


@dataclass(frozen=True)
class TaskUser:
    """The user and group a task runs as; None: the agent's own (it cannot switch). An owner's account also
    has its supplementary groups, its login name and home, and the job's group for the job's files."""
    uid: int | None
    gid: int | None
    groups: tuple[int, ...] = ()
    login: str = ""
    home: str = ""
    job_gid: int | None = None  # the group of the job's files on this node; None: gid

    @property
    def switches(self) -> bool:
        return self.uid is not None

    @property
    def name(self) -> str:
        """USER and LOGNAME: the job's UID has no passwd entry, so the name says whose it is."""
        if self.login:
            return self.login
        return "root" if self.uid == 0 else f"tfcluster-{self.uid}" if self.switches else os.environ.get("USER", "")

    @property
    def file_group(self) -> int | None:
        return self.gid if self.job_gid is None else self.job_gid

    def owner(self, private: bool) -> tuple[int, int]:
        """The owner of a job's dir: the task user for its private dirs, else root with the job's group;
        (-1, -1): leave it as created (an agent that cannot switch users)."""
        if not self.switches:
            return -1, -1
        return (self.uid, self.file_group) if private else (0, self.file_group)


class TaskUsers:
    """This node's rule for the user of each task."""

    def __init__(self, allow_root: bool = False, agent_is_root: bool | None = None, private_tmp: bool = False,
                 mode: str = PER_JOB):
        if mode not in TASK_USER_MODES:
            raise ValueError(f"--task-user: expected one of {', '.join(TASK_USER_MODES)}, got {mode!r}")
        self.allow_root = allow_root
        self.mode = mode
        # --private-tmp: a job's tasks see their own dir as /tmp (needs root). Off by default: it hides whatever
        # lies under the host's /tmp, a virtualenv or a checkout the task runs from included.
        self.private_tmp = private_tmp
        self.agent_is_root = os.geteuid() == 0 if agent_is_root is None else agent_is_root

    def announce(self) -> None:
        """Says once, at the agent's start, whose tasks run as whom here."""
        if not self.agent_is_root:
            log.warning("this agent is not root, so it cannot switch users: every task runs as the agent's own "
                        "user (uid %d), and jobs on this node can read each other's files", os.geteuid())
        elif self.allow_root:
            log.warning("--allow-root-tasks: EVERY TASK ON THIS NODE RUNS AS ROOT; whoever may submit a job owns "
                        "this node (its key, other jobs' secrets and files)")
        elif self.mode == OWNER:
            log.info("--task-user owner: each task runs as the local account named as its job's owner")

    def for_launch(self, uid: int, gid: int, owner: str = "", node: str = "") -> TaskUser:
        """Who the task of a launch runs as: uid and gid are the job's own from the coordinator, owner the name
        in its submitter's certificate, node this node's name (for the messages)."""
        if not self.agent_is_root:
            return TaskUser(None, None)
        if self.allow_root:
            return TaskUser(0, 0)
        if uid <= 0:
            raise TaskUserError("the coordinator gave this task no user to run as (uid 0): it is older than this "
                                "agent; upgrade the coordinator, or run this agent with --allow-root-tasks to run "
                                "tasks as root")
        job_user = TaskUser(uid, gid if gid > 0 else uid)
        return owner_account(owner, node, job_user.gid) if self.mode == OWNER else job_user


def owner_account(owner: str, node: str, job_gid: int) -> TaskUser:
    """The owner's local account, with its groups (initgroups: its primary group, every group that lists it)
    and the job's group; refused when there is none, or when it is root's."""
    why = "(the agent runs tasks as their owners' accounts: --task-user owner)"
    if not owner:
        raise TaskUserError(f"this job has no owner (it was submitted without a certificate), so it has no account "
                            f"on node {node} {why}")
    try:
        account = pwd.getpwnam(owner)
    except KeyError:
        raise TaskUserError(f"no account named {owner} on node {node} {why}") from None
    if account.pw_uid == 0:
        raise TaskUserError(f"the account {owner} on node {node} has uid 0: tasks never run as root {why}")
    groups = tuple(dict.fromkeys((*os.getgrouplist(owner, account.pw_gid), job_gid)))
    return TaskUser(account.pw_uid, account.pw_gid, groups, login=owner, home=account.pw_dir, job_gid=job_gid)


@dataclass(frozen=True)
class JobPaths:
    home: Path
    tmp: Path
    checkpoints: Path


def private_tmp_problem(state_dir: Path) -> str:
    """Why tasks here get no private /tmp although the agent is root ("": they get one)."""
    if Path("/tmp") in state_dir.resolve().parents:
        return f"the agent's state dir {state_dir} is under /tmp, which a private /tmp would hide from the task"
    return ""


def make_state_dir(state_dir: Path) -> None:
    """The agent's state dir and its jobs dir: traversable by the jobs' users, listable by root alone. The jobs
    dir is marked as the top of a hierarchy, where the filesystem has such a mark (spread_subdirs)."""
    state_dir.mkdir(mode=STATE_DIR_MODE, parents=True, exist_ok=True)
    make_dir(state_dir, STATE_DIR_MODE)
    make_dir(layout.jobs_dir(state_dir), STATE_DIR_MODE)
    spread_subdirs(layout.jobs_dir(state_dir))


# The inode flags' ioctls (linux/fs.h: _IOR('f', 1, long) and _IOW('f', 2, long)), and the flag `chattr +T` sets.
_LONG = struct.calcsize("l")
FS_IOC_GETFLAGS = (2 << 30) | (_LONG << 16) | (ord("f") << 8) | 1
FS_IOC_SETFLAGS = (1 << 30) | (_LONG << 16) | (ord("f") << 8) | 2
FS_TOPDIR_FL = 0x00020000


def spread_subdirs(directory: Path) -> bool:
    """Marks directory as the top of a hierarchy (`chattr +T`), as /home is: its subdirs are unrelated trees, so
    ext2/3/4 place each new one in a block group of its own choosing (the Orlov allocator's rule for top-level
    dirs) instead of packing them all beside their parent: a job's files go in its own dir's group, not in one
    shared with every job removed before it. That matters without a journal, where ext4 passes over each inode
    freed in the last minutes, one at a time, at every create (docs/benchmarks.md, "Tiny jobs and the
    filesystem"). False where the filesystem has no such flag (tmpfs, XFS, btrfs...)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        flags = array.array("i", [0])  # the kernel reads and writes an int, whatever the ioctl's name says
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, flags, True)
        if not flags[0] & FS_TOPDIR_FL:
            flags[0] |= FS_TOPDIR_FL
            fcntl.ioctl(fd, FS_IOC_SETFLAGS, flags, True)
        return True
    except OSError as e:
        log.debug("%s: no top-of-hierarchy mark here (%s)", directory, e)
        return False
    finally:
        os.close(fd)


def prepare_job(state_dir: Path, job_id: str, user: TaskUser) -> JobPaths:
    """The job's dirs on this node, made (or set right) before one of its tasks starts."""
    job = layout.job_dir(state_dir, job_id)
    try:
        make_dir(job, JOB_DIR_MODE, *user.owner(private=False))
    except FileNotFoundError:  # the jobs dir itself was removed (by hand) since the agent made it: made again
        make_dir(layout.jobs_dir(state_dir), STATE_DIR_MODE)
        make_dir(job, JOB_DIR_MODE, *user.owner(private=False))
    paths = JobPaths(job / HOME_NAME, job / TMP_NAME, Path(layout.host_checkpoint_dir(str(state_dir), job_id)))
    for private in (paths.home, paths.tmp, paths.checkpoints):
        make_dir(private, PRIVATE_DIR_MODE, *user.owner(private=True))
    if user.login and paths.checkpoints.is_dir():
        hand_over(paths.checkpoints, user)
    return paths


def prepare_summary_dir(summary_dir: Path, user: TaskUser) -> None:
    """A task's own summary dir (layout.task_summary_dir), the task user's, in a folder of the job's that only
    root writes: the task cannot swap its summary dir for a link."""
    make_dir(summary_dir.parent, JOB_DIR_MODE, *user.owner(private=False))
    make_dir(summary_dir, PRIVATE_DIR_MODE, *user.owner(private=True))


def hand_over(directory: Path, user: TaskUser) -> None:
    """Gives the owner's account what lies in the job's checkpoint dir under any other user: copies other
    agents sent before the task started here were given to the job's UID (peers/files.py). Walked through dir
    descriptors, links never followed: the task (the owner) may change the tree meanwhile."""
    uid, gid = user.owner(private=True)
    for _, dirs, files, dir_fd in os.fwalk(directory, follow_symlinks=False):
        for name in (*dirs, *files):
            try:
                found = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if found.st_uid != uid:
                    os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed meanwhile


def prepare_attempt(attempt_dir: Path, user: TaskUser) -> None:
    """Every dir from the job's tasks dir (layout.attempt_dir) down to the attempt's: the job may read, only
    root writes."""
    for directory in (attempt_dir.parent.parent, attempt_dir.parent, attempt_dir):
        make_dir(directory, JOB_DIR_MODE, *user.owner(private=False))


def make_dir(path: Path, mode: int, uid: int = -1, gid: int = -1) -> None:
    """Makes path with mode from the start (the umask can only narrow it), or sets an existing one right. A
    symlink is refused: a job must not point root at files of its choosing."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    found = os.lstat(path)
    if not stat.S_ISDIR(found.st_mode):
        raise TaskUserError(f"{path} is not a directory")
    if (uid != -1 and found.st_uid != uid) or (gid != -1 and found.st_gid != gid):
        os.chown(path, uid, gid, follow_symlinks=False)
    if stat.S_IMODE(found.st_mode) != mode:
        os.chmod(path, mode)


def create_file(path: Path, mode: int, uid: int = -1, gid: int = -1) -> None:
    """An empty file the task writes into (or an existing one), owned as given."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        if uid != -1 or gid != -1:
            os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
