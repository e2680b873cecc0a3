"""`raftmq dashboard` (ops/dashboard) against a real cluster (one NameServer, one broker group of
three processes) in headless Chromium (Debian's chromium + chromium-driver through selenium):
every page loads and shows what Admin says (the lag equals `raftmq group lag`, a message is found
by id, key and time, a trace and a dead letter are shown); actions need --allow-actions and a
confirmation, and change nothing before it; a read-only dashboard refuses POSTs. Screenshots of
each page are kept under the test's tmp dir (RAFTMQ_DASHBOARD_SHOTS=<dir> keeps them there too;
docs/img/dashboard.png is the main page, refreshed with RAFTMQ_UPDATE_DOCS_IMG=1)."""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from raftmq.client.admin import Admin
from raftmq.client.consumer_push import ConsumeResult, PushConsumer
from raftmq.client.messages import ReceivedMessage
from raftmq.client.offset_reset import ResetTarget, ResetTo
from raftmq.client.offsets import StartFrom
from raftmq.client.producer import Producer, SendResult
from raftmq.common.errors import InvalidArgumentError
from raftmq.common.pb import common_pb2
from raftmq.common.types import QueueRef
from raftmq.ops import cli, cli_cluster, cli_data
from raftmq.ops.cluster_spec import Endpoint, SpecError, load, parse
from raftmq.ops.dashboard import app
from raftmq.ops.dashboard.app import Dashboard, Request, parse_reset_target
from raftmq.ops.dashboard.html import Raw, bar_chart, table
from raftmq.ops.dashboard.server import MAX_CONNECTIONS_PER_ADDRESS, DashboardServer
from tests.harness.local_cluster import free_ports
from tests.harness.procs import Cluster, start_cluster, wait_until

GROUP = "broker-a"
TOPIC, READERS = "dash-orders", "dash-readers"
POISON, DLQ_GROUP = "dash-poison", "dash-dlq"
REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


# ---- pure parts ---------------------------------------------------------------------------------


def test_cells_are_escaped_and_raw_markup_is_not() -> None:
    out = str(table(("a", "b"), [("<script>x</script>", Raw("<b>ok</b>"))]))
    assert "<script>" not in out and "&lt;script&gt;x&lt;/script&gt;" in out
    assert "<b>ok</b>" in out


def test_bar_chart_for_the_reports() -> None:
    svg = str(bar_chart([(1_700_000_000_000, 3), (1_700_000_060_000, 6)], label="<in>/min"))
    heights = [float(h) for h in re.findall(r'<rect [^>]*height="([0-9.]+)"', svg)]
    assert len(heights) == 2 and heights[1] == pytest.approx(2 * heights[0])
    assert "&lt;in&gt;/min" in svg and "<in>" not in svg and "(max 6)" in svg
    assert "no data" in str(bar_chart([])) and "<script" not in svg


def test_a_plugin_module_adds_a_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """How the reports and alerts pages plug in: a module in PLUGIN_MODULES registering a page."""
    (tmp_path / "dash_plugin_demo.py").write_text(
        "from raftmq.ops.dashboard.app import register_page\n"
        "from raftmq.ops.dashboard.html import bar_chart\n"
        "register_page('/reports', 'Reports', lambda d, req: [bar_chart([(0, 1)], label='in')])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(app, "_PAGES", dict(app._PAGES))
    monkeypatch.setattr(app, "PLUGIN_MODULES", ("dash_plugin_demo", "dash_plugin_absent"))
    with Admin("127.0.0.1:1") as admin:
        d = Dashboard(admin)
        assert d.plugins == ["dash_plugin_demo"] and ("/reports", "Reports") in d.nav()
        r = d.handle(Request("GET", "/reports"))
        assert r.status == 200 and "<svg" in r.body and "class=on>Reports<" in r.body


def test_reset_targets_from_the_form() -> None:
    assert parse_reset_target("earliest") == ResetTarget(ResetTo.EARLIEST)
    assert parse_reset_target(" LATEST ") == ResetTarget(ResetTo.LATEST)
    assert parse_reset_target("offset:7") == ResetTarget(ResetTo.OFFSET, 7)
    assert parse_reset_target("shift:-3") == ResetTarget(ResetTo.SHIFT, -3)
    assert parse_reset_target("time:1700000000000") == ResetTarget(ResetTo.TIME, 1700000000000)
    for bad in ("", "offset:", "offset:x", "latest:3", "time:", "sideways"):
        with pytest.raises(InvalidArgumentError, match="earliest, latest"):
            parse_reset_target(bad)


def test_queue_holders_split_as_the_sdk_does() -> None:
    """Issue 27: the group page's holder per queue is the SDK's own AVERAGELY allocation."""
    from raftmq.client.rebalance import AllocationStrategy, allocate

    queues = [QueueRef("t", g, i) for g in ("a", "b") for i in range(3)]
    members = ["c2", "c1", "c3", "c4"]
    held = app.queue_holders(queues, members)
    for m in members:
        mine = allocate(AllocationStrategy.AVERAGELY, queues, members, m)
        assert sorted(q for q, h in held.items() if h == m) == mine
    assert set(held) == set(queues) and app.queue_holders(queues, []) == {}


def test_routing_without_a_cluster() -> None:
    """Unknown pages are 404, a POST to a read-only dashboard is 403 and a POST with a wrong
    token to an actions dashboard too; none of them reaches a NameServer."""
    with Admin("127.0.0.1:1") as admin:
        ro = Dashboard(admin)
        assert ro.handle(Request("GET", "/nope")).status == 404
        r = ro.handle(Request("POST", "/actions/create-topic", {"topic": "t", "queues": "1"}))
        assert r.status == 403 and "read-only" in r.body
        rw = Dashboard(admin, allow_actions=True, token="secret")
        r = rw.handle(Request("POST", "/actions/create-topic", {"topic": "t", "token": "other"}))
        assert r.status == 403 and "reload the page" in r.body
        r = rw.handle(Request("GET", "/actions/create-topic", {"topic": "t", "queues": "1"}))
        assert r.status == 405
        # issue 27: the new actions are checked alike (a forged token never reaches a node)
        for action, form in (
            ("/actions/broker-config", {"settings": "retention_ms=1"}),
            ("/actions/acl-remove", {"user": "u", "entry": "Topic:t=Pub", "decision": "Allow"}),
            ("/actions/acl-delete-user", {"user": "u"}),
        ):
            r = rw.handle(Request("POST", action, {**form, "confirm": "yes", "token": "other"}))
            assert r.status == 403 and "reload the page" in r.body, action
            r = ro.handle(Request("POST", action, {**form, "confirm": "yes", "token": ro.token}))
            assert r.status == 403 and "read-only" in r.body, action
        r = ro.handle(Request("GET", "/"))
        assert r.status == 503 and "BROKER_UNAVAILABLE" in r.body, "no NameServer: try again"
        r = ro.handle(Request("GET", "/message", {}))
        assert r.status == 400 and "id is required" in r.body
        r = ro.handle(Request("GET", "/message", {"id": "<script>alert(1)</script>"}))
        assert r.status == 400 and "<script>" not in r.body and "&lt;script&gt;" in r.body


def test_dashboard_address_in_the_cluster_description() -> None:
    text = (REPO / "ops" / "cluster.toml").read_text()
    shipped = load(REPO / "ops" / "cluster.toml")
    assert shipped.dashboard == Endpoint("127.0.0.1", 8080)
    # its metrics port (issue 27): listed with the processes' by `cluster up`, and in the
    # command it prints to start the dashboard
    assert shipped.dashboard_metrics == "127.0.0.1:10082"
    assert ("dashboard", "http://127.0.0.1:10082/metrics") in shipped.metrics_endpoints()
    listed = cli_cluster.metrics_lines(shipped)
    assert ["dashboard", "http://127.0.0.1:10082/metrics"] in [x.split() for x in listed], listed
    assert "--metrics-listen 127.0.0.1:10082`" in listed[-1], listed[-1]
    base = text.split("[dashboard]")[0]
    assert parse(base).dashboard is None and cli_cluster.dashboard_lines(parse(base)) == []
    [line] = cli_cluster.dashboard_lines(load(REPO / "ops" / "cluster.toml"))
    assert (
        line.startswith("dashboard: http://127.0.0.1:8080/") and "--listen 127.0.0.1:8080" in line
    )
    assert parse(base + "[dashboard]\nport = 9090\n").dashboard == Endpoint("127.0.0.1", 9090)
    assert parse(base + "[dashboard]\nport = 9090\n").dashboard_metrics == ""
    for bad, match in (
        ("port = 0", "port number"),
        ('port = 8080\nhots = "x"', "unknown dashboard key"),
        ('host = ""\nport = 8080', "non-empty string"),
        ("port = 8080\nmetrics_port = 0", "dashboard.metrics_port must be a port number"),
        ('port = 8080\nmetrics_port = "9090"', "dashboard.metrics_port must be a port number"),
        ("port = 8080\nmetrics_port = 8080", "must differ from dashboard.port"),
        ("port = 8080\nmetrics_port = 10911", "dashboard and broker-a-n0 both use"),
    ):
        with pytest.raises(SpecError, match=match):
            parse(base + f"[dashboard]\n{bad}\n")


def test_the_command_serves_until_interrupted(cluster: Cluster, tmp_path: Path) -> None:
    """Started with --spec: its NameServers and its [dashboard] metrics_port come from the
    description (the pages' port from --listen, which wins over the description's)."""
    port, metrics_port, spec_port, node_port, raft_port = free_ports(5)
    ns_host, _, ns_port = cluster.namesrv.rpartition(":")
    spec = tmp_path / "cluster.toml"
    spec.write_text(
        f"[cluster]\nname='dash'\ndata_dir='{tmp_path / 'data'}'\n"
        f"[[namesrv]]\nhost='{ns_host}'\nport={ns_port}\n"
        f"[[group]]\nname='{GROUP}'\n"
        f"nodes=[{{id='n0',host='127.0.0.1',port={node_port},raft_port={raft_port}}}]\n"
        f"[dashboard]\nport={spec_port}\nmetrics_port={metrics_port}\n"
    )
    argv = [sys.executable, "-m", "raftmq.ops.cli", "dashboard", "--spec", str(spec),
            "--listen", f"127.0.0.1:{port}"]  # fmt: skip
    # Started with SIGINT ignored, as a shell starts a background job (and CI its steps): the
    # command must install its own handler for Ctrl-C to stop it.
    ignoring = ["sh", "-c", "trap '' INT; exec \"$@\"", "sh", *argv]
    # The /metrics token comes from the environment, never a flag (issue 27).
    env = {**os.environ, "RAFTMQ_DASHBOARD_METRICS_BEARER_TOKEN": "dash-token"}
    proc = subprocess.Popen(
        ignoring, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:

        def up() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_until(up, 60, "the dashboard's /healthz")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as r:
            page = r.read().decode()
        assert GROUP in page and "leader" in page
        assert r.headers["X-Frame-Options"] == "DENY"

        # /metrics on its own port, with the brokers' scrape credentials
        metrics = f"http://127.0.0.1:{metrics_port}/metrics"
        assert _get(metrics)[0] == 401
        ask = urllib.request.Request(metrics, headers={"Authorization": "Bearer dash-token"})
        with urllib.request.urlopen(ask, timeout=10) as r:
            text = r.read().decode()
        assert 'raftmq_dashboard_answers_total{status="200"}' in text, text
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()  # the test fails, and leaves no server behind
            proc.communicate()
            raise
    assert f"dashboard: http://127.0.0.1:{port}/ (read-only)" in out, out
    assert f"dashboard metrics: http://127.0.0.1:{metrics_port}/metrics" in out, out
    assert "dash-token" not in out
    assert "Traceback" not in out and proc.returncode in (0, 130), out


# ---- against a cluster, in a browser ----------------------------------------------------------


@dataclass
class Data:
    orders: list[SendResult]
    poison: SendResult
    dead_letter: ReceivedMessage


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("dashboard"), groups=(GROUP,), namesrvs=1)
    try:
        c.wait_leaders()
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def data(cluster: Cluster) -> Data:
    """Twelve orders (keys order-0..11) over two queues, a group committed at offset 2 of each
    queue, and one traced message that its group dead-letters at the first failure (a
    concurrent consumer's retry is the broker's: its trace is the send and the failed consume)."""
    with Admin(cluster.namesrv) as admin, Producer(cluster.namesrv, trace=True) as producer:
        admin.create_topic(TOPIC, queues=2)
        admin.create_topic(POISON, queues=1)
        wait_until(lambda: admin.route(TOPIC) and admin.route(POISON), 30, "the routes")
        orders = [
            producer.send(
                TOPIC,
                f"order {i} <b>not bold</b>".encode(),
                keys=[f"order-{i}"],
                tags="new",
                queue=QueueRef(TOPIC, GROUP, i % 2),
            )
            for i in range(12)
        ]
        admin.reset_offsets(READERS, TOPIC, ResetTarget(ResetTo.OFFSET, 2), allow_new_group=True)
        poison = producer.send(POISON, b"poison pill", keys=["pill"])
        with PushConsumer(
            cluster.namesrv,
            DLQ_GROUP,
            POISON,
            lambda m: ConsumeResult.RECONSUME_LATER,
            start_from=StartFrom.EARLIEST,
            max_reconsume_times=0,
            commit_interval_ms=100,
            rebalance_interval_ms=1_000,
            heartbeat_interval_ms=1_000,
            trace=True,
        ):
            wait_until(lambda: len(admin.dead_letters(DLQ_GROUP)) == 1, 60, "the dead letter")
        [dead] = admin.dead_letters(DLQ_GROUP)

        def traced() -> bool:
            try:
                steps = admin.message_trace(poison.msg_id).steps()
            except Exception:
                return False
            return {"send", "consume"} <= {s.step for s in steps}

        wait_until(traced, 60, "the poison pill's trace: sent, consumed")
    return Data(orders, poison, dead)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (the dev extra has it)")
    if not CHROMIUM or not CHROMEDRIVER:
        pytest.skip("chromium and chromium-driver are not installed (apt-get install chromium "
                    "chromium-driver; `make test` does)")  # fmt: skip
    opts = Options()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000"):  # fmt: skip
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    keep = os.environ.get("RAFTMQ_DASHBOARD_SHOTS")
    path = Path(keep) if keep else tmp_path_factory.mktemp("dashboard-screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


class Served:
    def __init__(self, namesrv: str, allow_actions: bool) -> None:
        self.admin = Admin(namesrv)
        self.server = DashboardServer(
            Dashboard(self.admin, allow_actions=allow_actions, namesrv=namesrv), "127.0.0.1", 0
        )
        self.url = f"http://{self.server.start()}"

    def close(self) -> None:
        self.server.stop()
        self.admin.close()


@pytest.fixture
def served(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Served]:
    s = Served(cluster.namesrv, allow_actions=getattr(request, "param", False))
    try:
        yield s
    finally:
        s.close()


def cells(driver: Any, table_id: str) -> list[list[str]]:
    from selenium.webdriver.common.by import By

    rows = driver.find_elements(By.CSS_SELECTOR, f"#{table_id} tbody tr")
    return [[td.text for td in r.find_elements(By.TAG_NAME, "td")] for r in rows]


def click(driver: Any, css: str, then: str) -> Any:
    """Click the element at `css`, then wait for the element of id `then` on the next page (a
    click returns before the navigation it starts has finished)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver.find_element(By.CSS_SELECTOR, css).click()
    return WebDriverWait(driver, 30).until(ec.presence_of_element_located((By.ID, then)))


def visit(driver: Any, url: str, shots: Path, name: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(url)
    assert driver.find_elements(By.TAG_NAME, "main"), driver.page_source[:500]
    errors = driver.find_elements(By.ID, "error")
    assert not errors, f"{url}: {errors[0].text}"
    driver.save_screenshot(str(shots / f"{name}.png"))


def cli_lag_total(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> int:
    capsys.readouterr()
    code = cli.main(["--namesrv", cluster.namesrv, "group", "lag", READERS, "--topic", TOPIC])
    out = capsys.readouterr().out
    assert code == 0, out
    m = re.search(r"total\D+(\d+)", out)
    assert m, out
    return int(m.group(1))


def test_every_page_shows_what_admin_says(
    browser: Any,
    cluster: Cluster,
    data: Data,
    served: Served,
    shots: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from selenium.webdriver.common.by import By

    monkeypatch.setattr(cli_data.console, "width", 250)
    admin, url = served.admin, served.url

    visit(browser, f"{url}/", shots, "cluster")
    [g] = admin.groups()
    [row] = cells(browser, "broker-groups")
    assert row[1] == GROUP and row[2] == g.leader_node_id and row[4] == str(g.term), row
    nodes = cells(browser, "broker-nodes")
    assert len(nodes) == 3 and sum(r[3] == "leader" for r in nodes) == 1, nodes
    # issue 27: the cluster page's chart, one line per topic (the first 8 by name)
    per_topic = """const c = Chart.getChart(document.getElementById('tps'));
        if (!c) return null;
        return Object.fromEntries(c.data.datasets.map(
            d => [d.label, Math.round(d.data.reduce((x, y) => x + y, 0) * 60)]));"""
    wait_until(lambda: browser.execute_script(per_topic), 30, "the cluster chart")
    assert browser.execute_script(per_topic)[f"{TOPIC} (produced)"] == 12
    browser.save_screenshot(str(shots / "cluster.png"))
    if os.environ.get("RAFTMQ_UPDATE_DOCS_IMG"):
        shutil.copy(shots / "cluster.png", REPO / "docs" / "img" / "dashboard.png")

    visit(browser, f"{url}/topics", shots, "topics")
    topics = {r[0]: r for r in cells(browser, "topics")}
    assert topics[TOPIC][1:3] == [GROUP, "2"], topics

    click(browser, f"a[href='/topic?name={TOPIC}']", "queues")
    queues = cells(browser, "queues")
    assert queues[-1][4] == "12" and [r[3] for r in queues[:2]] == ["6", "6"], queues
    # issue 27: the TPS chart (the vendored Chart.js) draws the 12 sends and refreshes itself
    drawn = """const c = Chart.getChart(document.getElementById('tps'));
        if (!c) return null;
        const total = c.data.datasets.reduce((a, d) => a + d.data.reduce((x, y) => x + y, 0), 0);
        return [Math.round(total * 60), Number(c.canvas.dataset.refreshed)];"""
    wait_until(lambda: (browser.execute_script(drawn) or [0, 0])[1] >= 2, 30, "two refreshes")
    assert browser.execute_script(drawn)[0] == 12
    browser.save_screenshot(str(shots / "topic.png"))

    lag = sum(q.lag for q in admin.group_lag(READERS, TOPIC))
    assert lag == 8  # 12 stored, 2 + 2 consumed
    visit(browser, f"{url}/groups", shots, "groups")
    groups = {(r[0], r[1]): r for r in cells(browser, "groups")}
    assert groups[(READERS, TOPIC)][2] == str(lag), groups
    click(browser, f"#groups a[href='/group?name={READERS}&topic={TOPIC}']", "total-lag")
    shown = int(browser.find_element(By.ID, "total-lag").text)
    browser.save_screenshot(str(shots / "group.png"))
    assert shown == lag == cli_lag_total(cluster, capsys)
    rows = cells(browser, "lag")[:2]
    assert [r[1:3] for r in rows] == [["6", "2"], ["6", "2"]], rows  # broker, consumer offset
    assert [r[5] for r in rows] == ["nobody online"] * 2, rows
    assert browser.find_element(By.ID, "group-config").text == "default"

    # issue 27: a live member holds the queues (group detail), and the connections view lists it
    with PushConsumer(
        cluster.namesrv,
        "dash-live",
        TOPIC,
        lambda m: ConsumeResult.SUCCESS,
        heartbeat_interval_ms=500,
        rebalance_interval_ms=500,
    ) as live:
        wait_until(
            lambda: any(g.group == "dash-live" and g.members for g in admin.consumer_groups()),
            30,
            "the live member's heartbeat",
        )
        [member] = next(g.members for g in admin.consumer_groups() if g.group == "dash-live")
        visit(browser, f"{url}/group?name=dash-live&topic={TOPIC}", shots, "group-detail")
        assert [r[5] for r in cells(browser, "lag")[:2]] == [member.client_id] * 2
        [row] = cells(browser, "members")
        assert row[1] == member.client_id and TOPIC in row[2].split(", ") and row[3] == GROUP
        visit(browser, f"{url}/connections", shots, "connections")
        [conn] = [r for r in cells(browser, "connections") if r[0] == "dash-live"]
        assert conn[1] == member.client_id and TOPIC in conn[2].split(", "), conn
        assert [TOPIC, "dash-live", "1"] in cells(browser, "subscriptions")
        del live

    first = data.orders[0]
    visit(browser, f"{url}/messages", shots, "messages")
    browser.find_element(By.CSS_SELECTOR, "#by-id input[name=id]").send_keys(first.msg_id)
    click(browser, "#by-id button", "message")
    fields = dict((r[0], r[1]) for r in cells(browser, "message"))
    assert fields["msg id"] == first.msg_id and fields["keys"] == "order-0", fields
    assert browser.find_element(By.ID, "body").text == "order 0 <b>not bold</b>"
    browser.save_screenshot(str(shots / "message.png"))

    visit(browser, f"{url}/messages?topic={TOPIC}&key=order-7", shots, "by-key")
    [hit] = cells(browser, "messages")
    assert hit[0] == data.orders[7].msg_id and hit[5] == "order-7", hit
    visit(browser, f"{url}/messages?topic={TOPIC}&since=-1h", shots, "by-time")
    assert {r[0] for r in cells(browser, "messages")} == {o.msg_id for o in data.orders}

    visit(browser, f"{url}/trace?id={data.poison.msg_id}", shots, "trace")
    steps = [r[1] for r in cells(browser, "trace")]
    assert "send" in steps and "consume" in steps, steps
    assert any(r[5] == "reconsume_later" for r in cells(browser, "trace"))

    visit(browser, f"{url}/dlq?group={DLQ_GROUP}", shots, "dead-letters")
    [dead] = cells(browser, "dead-letters")
    assert dead[0] == data.dead_letter.msg_id and dead[1:3] == [POISON, data.poison.msg_id], dead
    # the failures counted (issue 27: the page showed 0, the stored field of the DLQ copy)
    assert dead[3] == data.dead_letter.properties["RECONSUME_TIME"] != "0", dead
    assert not browser.find_elements(By.TAG_NAME, "form") or not browser.find_elements(
        By.CSS_SELECTOR, "form[method=post]"
    ), "a read-only dashboard offers no action"

    # issue 27: every node's settings, read-only here (no form)
    visit(browser, f"{url}/broker-config", shots, "broker-config")
    settings = {r[0]: r[1:] for r in cells(browser, "broker-settings")}
    assert len(settings["retention_ms"]) == 3 and not browser.find_elements(By.ID, "broker-config")

    browser.get(f"{url}/message?id={data.orders[0].msg_id[:-4]}FFFF")
    assert "MESSAGE_NOT_FOUND" in browser.find_element(By.ID, "error").text
    browser.save_screenshot(str(shots / "not-found.png"))


def test_missing_message_is_an_error_page_not_a_traceback(
    cluster: Cluster, data: Data, served: Served
) -> None:
    bad = data.orders[0].msg_id[:-6] + "FFFFFF"
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{served.url}/message?id={bad}", timeout=30)
    body = err.value.read().decode()
    assert err.value.code in (400, 404) and 'id="error"' in body and "Traceback" not in body
    req = urllib.request.Request(
        f"{served.url}/actions/create-topic", data=b"topic=x&queues=1", method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=30)
    assert err.value.code == 403
    with Admin(cluster.namesrv) as admin:
        assert "x" not in admin.list_topics()


@pytest.mark.parametrize("served", [True], indirect=True)
def test_actions_ask_for_confirmation_first(
    browser: Any, cluster: Cluster, data: Data, served: Served, shots: Path
) -> None:
    from selenium.webdriver.common.by import By

    admin, url = served.admin, served.url

    def submit(form_id: str, then: str, **values: str) -> None:
        for name, value in values.items():
            box = browser.find_element(By.CSS_SELECTOR, f"#{form_id} input[name={name}]")
            box.clear()
            box.send_keys(value)
        click(browser, f"#{form_id} button", then)

    visit(browser, f"{url}/topics", shots, "actions-topics")
    submit("create-topic", "confirm-box", topic="dash-created", queues="3")
    assert "dash-created" in browser.find_element(By.ID, "confirm-box").text
    browser.save_screenshot(str(shots / "actions-confirm.png"))
    assert "dash-created" not in admin.list_topics(), "nothing before the confirmation"
    click(browser, "#confirm button", "done")
    assert "created dash-created" in browser.find_element(By.ID, "done").text
    assert admin.list_topics()["dash-created"][0][1].read_queue_nums == 3

    # issue 27: the topic's configuration edited from its page, confirmed first
    visit(browser, f"{url}/topic?name=dash-created", shots, "actions-topic-config")
    submit("update-topic", "confirm-box", queues="4", perm="r", ordered="yes")
    assert admin.list_topics()["dash-created"][0][1].read_queue_nums == 3, "not before"
    click(browser, "#confirm button", "done")
    [(_, cfg)] = admin.list_topics()["dash-created"]
    assert (cfg.read_queue_nums, cfg.perm, cfg.ordered) == (4, common_pb2.PERM_READ_ONLY, True)

    before = {q.queue.queue_id: q.committed for q in admin.group_lag(READERS, TOPIC)}
    visit(browser, f"{url}/group?name={READERS}&topic={TOPIC}", shots, "actions-group")
    submit("reset-offsets", "confirm-box", to="offset:5")
    plan = cells(browser, "reset-plan")
    assert [r[4] for r in plan] == ["5", "5"] and [r[5] for r in plan] == ["+3", "+3"], plan
    assert {q.queue.queue_id: q.committed for q in admin.group_lag(READERS, TOPIC)} == before
    click(browser, "#confirm button", "done")
    after = {q.queue.queue_id: q.committed for q in admin.group_lag(READERS, TOPIC)}
    assert after == {0: 5, 1: 5}
    admin.reset_offsets(READERS, TOPIC, ResetTarget(ResetTo.OFFSET, 2))  # as the data had it

    # issue 27: broker settings changed live from the console, confirmed first; a setting
    # read only at start is refused with the reason, and no Confirm is offered
    def intervals() -> set[str]:
        return {
            n.status.config["retention_check_interval_ms"]
            for n in admin.broker_statuses()
            if n.status is not None
        }

    [old] = intervals()
    visit(browser, f"{url}/broker-config", shots, "actions-broker-config")
    submit("broker-config", "confirm-box", settings="retention_check_interval_ms=4321")
    plan = cells(browser, "config-plan")
    assert [r[1:3] for r in plan] == [["retention_check_interval_ms", "4321"]] * 3, plan
    assert intervals() == {old}, "nothing before the confirmation"
    browser.save_screenshot(str(shots / "actions-broker-config-confirm.png"))
    click(browser, "#confirm button", "done")
    assert intervals() == {"4321"}
    visit(browser, f"{url}/broker-config", shots, "actions-broker-config")
    submit("broker-config", "refused", settings="data_dir=/elsewhere retention_check_interval_ms=5")
    reasons = {(r[0], r[1]): r[3] for r in cells(browser, "config-plan")}
    assert [key for _, key in reasons] == ["data_dir"] * 3, reasons  # only the refused key
    assert all("read once when the node starts" in why for why in reasons.values()), reasons
    assert not browser.find_elements(By.ID, "confirm") and intervals() == {"4321"}
    browser.save_screenshot(str(shots / "actions-broker-config-refused.png"))
    admin.update_broker_config({"retention_check_interval_ms": old})  # as it was

    high = admin.topic_status(POISON)[0].max_offset
    visit(browser, f"{url}/dlq?group={DLQ_GROUP}", shots, "actions-dlq")
    click(browser, "#dead-letters button", "confirm-box")
    assert data.dead_letter.msg_id in browser.find_element(By.ID, "confirm-box").text
    assert admin.topic_status(POISON)[0].max_offset == high
    click(browser, "#confirm button", "done")
    assert f"resent to {POISON}" in browser.find_element(By.ID, "done").text
    assert admin.topic_status(POISON)[0].max_offset == high + 1


# ---- a slow or hostile client (issue 27) --------------------------------------------------------


def _half_requests(hosts: list[str], per_host: int, port: int) -> list[socket.socket]:
    """Connections that send half a request line and then hold (a slowloris)."""
    held = []
    for host in hosts:
        for _ in range(per_host):
            s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(host, 0))
            s.sendall(b"GET /topics HT")
            held.append(s)
    return held


def _get(url: str, timeout_s: float = 10) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_slowloris_does_not_stop_another_client(served: Served) -> None:
    """Before: 40 half-sent request lines held every one of http.server's 8 workers, and the
    dashboard answered 503 to everything, /healthz included, for as long as they were held."""
    port = int(served.url.rsplit(":", 1)[1])
    # One host: at most its share is held, the rest refused at once with the reason.
    one = _half_requests(["127.0.0.2"], 40, port)
    # Several hosts, each under its share: held connections cost no worker.
    many = _half_requests([f"127.0.0.{i}" for i in range(3, 7)], 12, port)
    try:
        t0 = time.monotonic()
        assert _get(f"{served.url}/healthz") == (200, "ok\n")
        for page in ("/", "/topics", "/groups"):
            status, body = _get(f"{served.url}{page}", 30)
            assert status == 200 and "<main" in body, (page, body[:300])
        took_s = time.monotonic() - t0
        assert took_s < 10, f"pages beside a slowloris took {took_s:.1f} s"
        ready, _, _ = select.select(one, [], [], 2)  # the refused ones are answered at once
        refused = [s for s in ready if s.recv(64).startswith(b"HTTP/1.1 503")]
        assert len(refused) == 40 - MAX_CONNECTIONS_PER_ADDRESS, len(refused)
    finally:
        for s in one + many:
            s.close()
    status, body = _get(served.url + "/topics?" + "&".join(f"p{i}=x" for i in range(100)))
    assert status == 400 and "query parameters" in body
