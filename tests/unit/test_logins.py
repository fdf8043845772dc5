"""The dashboard's one-time links and sessions, and where a login may lead."""

from __future__ import annotations

from tfcluster.daemon.coordinator.core.access.logins import LINK_SECONDS, SESSION_SECONDS, Logins
from tfcluster.daemon.coordinator.web.dashboard import NEXT_PAGE
from tfcluster.pki import ADMIN, USER, VIEWER, Identity


def test_a_link_works_once_within_its_time_and_gives_a_viewer_session():
    logins = Logins()
    token, expires = logins.create_link(Identity(ADMIN, "ana"), now=100.0)
    assert expires == 100.0 + LINK_SECONDS
    session, login = logins.redeem(token, now=150.0)
    assert login.holder == Identity(VIEWER, "ana")  # read-only, whoever asked
    assert logins.redeem(token, now=151.0) is None  # spent
    assert logins.holder(session, now=200.0) == Identity(VIEWER, "ana")
    assert logins.holder(session, now=150.0 + SESSION_SECONDS) is None
    late, _ = logins.create_link(None, now=0.0)
    assert logins.redeem(late, now=LINK_SECONDS) is None
    assert logins.holder("made-up", now=0.0) is None


def test_a_login_leads_only_to_a_page_of_the_dashboard():
    for page in ("/", "/nodes", "/jobs/digits-7-k3f9", "/jobs/a%2Fb"):
        assert NEXT_PAGE.fullmatch(page), page
    for elsewhere in ("//evil.example", "/\t/evil.example", "https://evil.example", "/\\evil.example",
                      "/jobs/x/../../evil", "/jobs/", "", "/api/jobs"):
        assert not NEXT_PAGE.fullmatch(elsewhere), elsewhere


def test_a_users_link_gives_a_session_that_reads_as_that_user():
    logins = Logins()
    token, _ = logins.create_link(Identity(USER, "alice", groups=("vision",)), now=0.0)
    session, login = logins.redeem(token, now=1.0)
    assert login.holder == Identity(USER, "alice", groups=("vision",))  # so others' jobs stay redacted for her
    assert logins.holder(session, now=2.0).role == USER
