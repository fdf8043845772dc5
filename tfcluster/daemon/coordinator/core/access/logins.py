"""Browser logins to the dashboard, the way Jupyter does it: anyone whose certificate may read the cluster asks
for a one-time link (`tfcluster dashboard`), and opening it gives that browser a session cookie that reads as its
a user does (core/access/rules.py): a person with a user certificate sees their own jobs in full and others' without their
secrets; anyone else gets a viewer session (the dashboard only reads, so an admin's session needs no more).

Pure: time is passed in. Links and sessions live in memory only: a restarted coordinator logs browsers out,
and a new link is one command away. Both are bounded, the oldest going first.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from dataclasses import dataclass

from tfcluster.pki import USER, VIEWER, Identity

LINK_SECONDS = 120.0          # long enough to paste into a browser, short enough to be worthless in a log later
SESSION_SECONDS = 12 * 3600.0  # a working day; the cookie says so too
MAX_LINKS = 1000
MAX_SESSIONS = 10000
COOKIE = "tfcluster_session"


@dataclass(frozen=True)
class Login:
    holder: Identity  # a user, or a viewer, named after whoever asked for the link
    expires: float


class Logins:
    def __init__(self) -> None:
        self.links: OrderedDict[str, Login] = OrderedDict()
        self.sessions: OrderedDict[str, Login] = OrderedDict()

    def create_link(self, asker: Identity | None, now: float) -> tuple[str, float]:
        """A one-time token for asker (None: an --insecure cluster, where anyone may read)."""
        if asker is None:
            holder = Identity(VIEWER, "anyone")
        else:
            holder = Identity(USER if asker.role == USER else VIEWER, asker.name, groups=asker.groups)
        token = secrets.token_urlsafe(32)
        login = Login(holder, now + LINK_SECONDS)
        _put(self.links, token, login, MAX_LINKS, now)
        return token, login.expires

    def redeem(self, token: str, now: float) -> tuple[str, Login] | None:
        """A new session for a link's token, which is spent; None when it is unknown, spent or expired."""
        login = self.links.pop(token, None)
        if login is None or login.expires <= now:
            return None
        session = Login(login.holder, now + SESSION_SECONDS)
        session_id = secrets.token_urlsafe(32)
        _put(self.sessions, session_id, session, MAX_SESSIONS, now)
        return session_id, session

    def holder(self, session_id: str, now: float) -> Identity | None:
        """Who a session cookie belongs to; None when it is unknown or expired."""
        session = self.sessions.get(session_id)
        if session is None:
            return None
        if session.expires <= now:
            del self.sessions[session_id]
            return None
        return session.holder


def _put(entries: OrderedDict[str, Login], key: str, login: Login, limit: int, now: float) -> None:
    """Adds an entry; expired ones at the front go, then the oldest while there are too many."""
    while entries and next(iter(entries.values())).expires <= now:
        entries.popitem(last=False)
    entries[key] = login
    while len(entries) > limit:
        entries.popitem(last=False)
