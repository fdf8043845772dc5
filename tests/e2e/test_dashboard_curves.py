"""A job's live curves in a real browser (headless Chromium): while the job writes a scalar, the job page's loss
chart gains points without a reload, and the usage chart shows samples from heartbeats."""

from __future__ import annotations

import pytest

from harness import free_port
from test_dashboard import CHROMEDRIVER, CHROMIUM, browser, texts, wait_for  # noqa: F401 (browser: a fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="needs chromium")]

WRITER = """
import os, time
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter
writer = EventFileWriter(os.environ["TFCLUSTER_SUMMARY_DIR"])
for step in range(100000):
    value = summary_pb2.Summary.Value(tag="loss", simple_value=1 / (step + 1))
    writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=[value])))
    writer.flush()
    time.sleep(0.5)
"""


def test_the_job_page_draws_a_growing_curve_and_usage(make_cluster, browser):  # noqa: F811
    http = f"127.0.0.1:{free_port()}"
    cluster = make_cluster(3.0, "--http-listen", http)
    cluster.start_agents({"a": {}})
    job_id = cluster.cli("start", "--name", "live", "--strategy", "mirrored", "--", "python3", "-c", WRITER,
                         check=True).stdout.strip()
    browser.get(cluster.cli("dashboard", job_id, check=True).stdout.strip())
    points = "[data-tag='loss'] circle[data-run='worker:0']"
    wait_for(browser, lambda d: len(texts(d, points)) >= 3, 60, "the loss curve's first points")
    seen = len(texts(browser, points))
    wait_for(browser, lambda d: len(texts(d, points)) >= seen + 3, 30, "the curve to grow without a reload")
    wait_for(browser, lambda d: len(texts(d, "[data-usage='memory'] circle")) >= 1, 60, "usage samples")
    assert texts(browser, "#job-state") == ["RUNNING"]
    cluster.cli("stop", job_id, check=True)
