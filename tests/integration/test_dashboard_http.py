"""The dashboard over plain HTTPS, without a browser: every answer carries the headers that keep a page from
being framed, sniffed or fed inline script, a malformed id in a URL is a short 400 or 404, never a 500, and a
login link leads to the page it names on this dashboard and nowhere else."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.parse
import urllib.request

import pytest

from harness import LocalCluster, free_port

HEADERS = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    http = f"127.0.0.1:{free_port()}"
    cluster = LocalCluster(root=tmp_path_factory.mktemp("dash"))
    try:
        cluster.start_coordinator("--http-listen", http)
        cluster.start_agents({"a": {}})
        job_id = cluster.cli("start", "--name", "dash", "--strategy", "mirrored", "--", "true",
                             check=True).stdout.strip()
        cluster.wait_job(job_id)
        context = ssl.create_default_context(cafile=str(cluster.admin_dir / "ca.crt"))
        context.load_cert_chain(str(cluster.admin_dir / "client.crt"), str(cluster.admin_dir / "client.key"))
        yield f"https://{http}", context, job_id, cluster
    finally:
        cluster.teardown()


def fetch(dashboard, path: str, certificate: bool = True) -> tuple[int, dict, bytes]:
    base, context, *_ = dashboard
    if not certificate:
        context = ssl.create_default_context(cafile=None)
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with urllib.request.urlopen(base + path, context=context, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


@pytest.mark.parametrize("path, certificate", [
    ("/", True), ("/nodes", True), ("/static/app.js", True), ("/api/summary", True), ("/metrics", True),
    ("/api/jobs/nope", True), ("/", False), ("/login?token=x", False),
])
def test_every_answer_carries_the_security_headers(dashboard, path, certificate):
    status, headers, _ = fetch(dashboard, path, certificate)
    assert status in (200, 401, 403, 404), status
    for name, expected in HEADERS.items():
        assert headers.get(name) == expected, (path, name, headers)
    policy = headers["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in policy and "script-src 'self'" in policy and "unsafe-inline" not in policy


def test_the_page_has_no_inline_script_or_style(dashboard):
    _, _, body = fetch(dashboard, "/")
    page = body.decode()
    assert '<script src="/static/app.js"></script>' in page and "<style" not in page and " style=" not in page
    assert page.count("<script") == page.count('<script src="/static/') == 2  # app.js and training.js


@pytest.mark.parametrize("path, code", [
    ("/jobs/{job}/tasks/worker:" + "9" * 5000 + "/log", 400),
    ("/api/jobs/{job}/tasks/worker:" + "9" * 5000 + "/log", 400),
    ("/api/jobs/{job}/tasks/worker:-1/log", 400),
    ("/api/jobs/{job}/tasks/worker/log", 400),
    ("/api/jobs/{job}/tasks/nosuchtype:0/log", 404),
    ("/api/jobs/{job}/tasks/worker:7/log", 404),
    ("/jobs/{job}/tasks/%00:0/log", 404),
    ("/api/jobs/" + "x" * 5000, 404),
    ("/jobs/no-such-job", 404),
    ("/api/jobs/%ff%fe/tasks/worker:0/log", 404),
    ("/api/jobs?before=" + "9" * 5000, 400),
    ("/api/jobs/{job}/tasks/worker:0/log?tail=" + "9" * 5000, 400),
])
def test_malformed_ids_are_a_short_400_or_404(dashboard, path, code):
    status, _, body = fetch(dashboard, path.replace("{job}", dashboard[2]))
    assert status == code, (status, body[:200])
    assert len(body) < 300 and b"Traceback" not in body, body[:300]


def test_a_good_task_log_still_answers(dashboard):
    status, headers, _ = fetch(dashboard, f"/api/jobs/{dashboard[2]}/tasks/worker:0/log")
    assert status in (200, 503), status  # 503: the agent no longer has the ended task's log
    assert headers["X-Content-Type-Options"] == "nosniff"


class _Stay(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # the redirect itself is what is asked about


@pytest.mark.parametrize("page, lands", [
    ("/jobs/{job}", "/jobs/{job}"), ("/jobs/{job}/tasks/worker%3A0/log", "/jobs/{job}/tasks/worker:0/log"),
    ("/jobs/{job}/tasks/worker:0/log", "/jobs/{job}/tasks/worker:0/log"), ("/queue", "/queue"),
    ("https://elsewhere.example/", "/"), ("//elsewhere.example/jobs/x", "/"), ("/jobs/{job}/../../etc", "/"),
])
def test_a_login_link_leads_to_the_page_it_names_on_this_dashboard_only(dashboard, page, lands):
    base, context, job_id, cluster = dashboard
    link = urllib.parse.urlsplit(cluster.cli("dashboard", check=True).stdout.strip())
    token = urllib.parse.parse_qs(link.query)["token"][0]
    query = urllib.parse.urlencode({"token": token, "next": page.replace("{job}", job_id)})
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context), _Stay)
    with pytest.raises(urllib.error.HTTPError) as answer:
        opener.open(f"{base}/login?{query}", timeout=10)
    assert answer.value.code == 302
    assert answer.value.headers["Location"] == lands.replace("{job}", job_id)
