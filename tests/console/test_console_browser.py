"""The console in a real browser: Playwright driving Debian's chromium (/usr/bin/chromium,
installed by ``make chromium``; never a downloaded browser), headless, against a live
``flight-serve serve`` (conftest.py). Screenshots go to build/console-screenshots/.

``make screenshot`` runs :func:`test_readme_screenshot` with ``CONSOLE_SCREENSHOT=docs/console.png``.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import (
    ADMIN_TOKEN,
    PIPELINE,
    READ_TOKEN,
    Deployment,
    start_serve,
    stop_serve,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.browser]

CHROMIUM = "/usr/bin/chromium"
SHOTS = Path(__file__).parents[2] / "build" / "console-screenshots"

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing (make chromium installs Debian's)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (the [test] extra)")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield browser
        browser.close()


def page_with(browser: Any, deployment: Deployment, token: str | None, path: str = "") -> Any:
    """A new page on the console, signed in with ``token`` (None: not signed in)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.errors = errors
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.requests = requests
    page.goto(deployment.live.console_url + path)
    if token is not None:
        page.fill("#token", token)
        page.click("#login-form button")
        page.wait_for_selector("#login", state="hidden")
    return page


def shot(page: Any, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def test_a_plot_moves_while_the_pipeline_runs(browser: Any, deployment: Deployment) -> None:
    deployment.feeder.start()
    page = page_with(browser, deployment, READ_TOKEN, f"#/pipeline/{deployment.pid}")
    page.wait_for_selector("#plot-throughput canvas")
    wait_until(lambda: int(page.get_attribute("#plot-lag", "data-points") or 0) >= 3, "3 points")
    first = int(page.get_attribute("#plot-lag", "data-points") or 0)
    first_lag = float(page.get_attribute("#plot-lag", "data-last") or "nan")
    time.sleep(3)
    later = int(page.get_attribute("#plot-lag", "data-points") or 0)
    later_lag = float(page.get_attribute("#plot-lag", "data-last") or "nan")
    assert later >= first + 2  # a sample a second
    assert later_lag < first_lag  # event time runs ~50x the wall clock: the lag shrinks
    wait_until(lambda: page.text_content("#card-rate") not in ("-", "0"), "a rate shown")
    assert page.locator("#graph .node").count() == 5
    assert "rows out" in (page.text_content('[data-node="source:events"]') or "")
    counts = r"rows in [\d,]+ · rows out [\d,]+ · late [\d,]+ · open windows [\d,]+ · watermark "
    assert re.search(counts, page.text_content('[data-node="query:0"] .counts') or "")
    assert re.fullmatch(  # the per-row query over LATE(events): no windows
        r"rows in [\d,]+ · rows out [\d,]+", page.text_content('[data-node="query:1"] .counts') or ""
    )
    wait_until(lambda: "submitted" in (page.text_content("#logs") or ""), "live logs")
    assert page.locator("#checkpoints-table tbody tr").count() >= 1
    assert page.is_disabled("#cancel")  # a read token: no admin buttons
    assert page.is_disabled("#checkpoint")
    # offline: every request went to the console itself (no CDN), and uPlot (from npm) loaded
    assert page.evaluate("typeof uPlot") == "function"
    origin = deployment.live.console_url
    assert [u for u in page.requests if not u.startswith(origin)] == []
    assert f"{origin}static/vendor/uPlot.iife.min.js" in page.requests
    # the y axes: one unit per axis, as few decimals as keep the ticks apart
    assert page.evaluate("shortDuration.ticks([7000, 7100, 7200])") == ["1.94 h", "1.97 h", "2.00 h"]
    assert page.evaluate("shortDuration.ticks([0, 30, 60, 90])") == ["0 s", "30 s", "60 s", "90 s"]
    assert page.evaluate("shortDuration.ticks([4e8, 4.2e8])") == ["4,630 d", "4,861 d"]
    assert page.evaluate("shortNumber.ticks([0, 10000, 20000])") == ["0", "10k", "20k"]
    shot(page, "pipeline-running")
    assert page.errors == []
    page.context.close()


def test_pipelines_page_numbers_equal_the_flight_status(browser: Any, deployment: Deployment) -> None:
    status = deployment.settle()
    page = page_with(browser, deployment, READ_TOKEN, "#/pipelines")
    row = page.locator(f'#pipelines tr[data-id="{deployment.pid}"]')
    row.wait_for()
    wait_until(
        lambda: row.locator('[data-col="rows_in"]').text_content() == f"{status['rows_in']:,}",
        "rows in shown",
    )
    cells = {c: row.locator(f'[data-col="{c}"]').text_content() for c in
             ("id", "state", "watermark", "watermark_lag_s", "rows_in", "late_rows")}  # fmt: skip
    watermark = status["watermark"].replace("T", " ").replace("+00:00", " UTC")
    assert cells["id"] == deployment.pid
    assert cells["state"] == "running"
    assert cells["watermark"] == watermark
    assert cells["rows_in"] == f"{deployment.feeder.rows:,}"
    assert cells["late_rows"] == f"{deployment.feeder.late:,}"
    h, m, s = (int(x) for x in (cells["watermark_lag_s"] or "").split(":"))
    assert abs(h * 3600 + m * 60 + s - deployment.live.status(deployment.pid)["watermark_lag_s"]) < 3
    page.fill("#filter", "no-such-pipeline")
    assert page.locator("#pipelines tbody tr").count() == 0
    page.fill("#filter", "run")
    assert page.locator("#pipelines tbody tr").count() == 1
    page.click('#pipelines th[data-key="rows_in"]')
    assert page.get_attribute('#pipelines th[data-key="rows_in"]', "class") == "sortable sorted-asc"
    shot(page, "pipelines")
    assert page.errors == []
    page.context.close()


def _date(iso: str) -> str:
    """app.js's date(): ISO 8601 UTC as "YYYY-MM-DD HH:MM:SS UTC" (no fraction)."""
    return re.sub(r"\.\d+", "", iso).replace("T", " ").replace("+00:00", " UTC")


def _kib(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KiB"


def test_pipeline_page_numbers_equal_the_flight_status(browser: Any, deployment: Deployment) -> None:
    """Cards, per-partition watermarks, the checkpoint history and the SQL of a settled
    pipeline, against pipeline.status and the API."""
    status = deployment.settle()
    page = page_with(browser, deployment, READ_TOKEN, f"#/pipeline/{deployment.pid}")
    page.wait_for_selector("#checkpoints-table tbody tr")
    wait_until(lambda: page.text_content("#card-rows-in") == f"{deployment.feeder.rows:,}", "rows in")
    assert page.text_content("#card-state") == "running"
    assert page.text_content("#card-watermark") == _date(status["watermark"])
    assert page.text_content("#card-late") == f"{deployment.feeder.late:,}"
    assert page.text_content("#card-panes") == f"{status['open_panes']:,}"
    # the window's input partition (the feeder's unnamed writer), its watermark as a date
    rows = [r.locator("td").all_text_contents() for r in page.locator("#partitions-table tbody tr").all()]
    assert rows == [["INSERT INTO counts (line 7)", "(unnamed writer)", _date(status["watermark"]), "active"]]
    marks = page.text_content('[data-node="query:0"] .marks')
    assert marks == f"(unnamed writer): {_date(status['watermark'])}"
    assert page.locator("#markers-table").count() == 0  # the feeder sends no watermark markers
    # the checkpoint history: epoch, when, duration, size, newest first, as the API has it
    base = deployment.live.console_url
    import json
    import urllib.request

    request = urllib.request.Request(f"{base}api/v1/pipelines/{deployment.pid}/checkpoints",
                                     headers={"Authorization": f"Bearer {READ_TOKEN}"})  # fmt: skip
    page.wait_for_timeout(1500)  # one more refresh of the table than the API call below
    with urllib.request.urlopen(request, timeout=30) as response:
        history = json.loads(response.read())["checkpoints"]
    shown = [r.locator("td").all_text_contents() for r in page.locator("#checkpoints-table tbody tr").all()]
    want = [[str(c["epoch"]), _date(c["taken_at"]), f"{c['duration_ms']:.1f}", _kib(c["bytes"])]
            for c in history[:50]]  # fmt: skip
    assert shown == want  # settled: no input, no new checkpoint
    assert int(shown[0][0]) == status["last_checkpoint"]["epoch"]
    assert [int(r[0]) for r in shown] == sorted((int(r[0]) for r in shown), reverse=True)
    assert (page.text_content("#sql") or "").strip() == PIPELINE.strip()
    logs = [line.split(" ", 1)[1] for line in (page.text_content("#logs") or "").splitlines()]
    assert logs == ["info: submitted"]
    assert page.errors == []
    page.context.close()


def test_streams_page(browser: Any, deployment: Deployment) -> None:
    deployment.settle()
    page = page_with(browser, deployment, READ_TOKEN, "#/streams")
    page.wait_for_selector("#streams tbody tr")
    names = page.locator('#streams [data-col="name"]').all_text_contents()
    assert names == ["counts", "events", "late_rows"]
    counts = page.locator('#streams tr[data-id="counts"] [data-col="writers"]').text_content()
    assert counts == f"counts ({deployment.pid})"
    events = page.locator('#streams tr[data-id="events"] [data-col="rows"]').text_content()
    assert events == f"{deployment.feeder.rows:,}"
    assert (page.text_content("main") or "").endswith("UTC")  # the table, nothing after it
    shot(page, "streams")
    page.click('#streams a:text-is("events")')
    page.wait_for_selector("#rows tbody tr")
    assert page.text_content("#card-rows") == f"{deployment.feeder.rows:,}"
    assert page.locator("#schema tbody tr").all_text_contents() == [
        "kstringyes", "ttimestamp[s]yes", "vint64yes"
    ]
    newest = deployment.feeder.batch(deployment.feeder.batches - 1).to_pylist()[-1]
    first_row = page.locator("#rows tbody tr").first.locator("td").all_text_contents()
    assert first_row == [str(deployment.feeder.batches - 1), newest["k"], newest["t"].isoformat(),
                         str(newest["v"])]  # fmt: skip
    shot(page, "stream-events")
    # live: a batch appended while the page is open shows up at the top within a refresh
    deployment.feeder.feed_one()
    added = deployment.feeder.batch(deployment.feeder.batches - 1).to_pylist()[-1]
    top = page.locator("#rows tbody tr").first
    wait_until(lambda: top.locator("td").first.text_content() == str(deployment.feeder.batches - 1),
               "the new batch shown", timeout_s=10)  # fmt: skip
    assert top.locator("td").all_text_contents() == [
        str(deployment.feeder.batches - 1), added["k"], added["t"].isoformat(), str(added["v"])
    ]
    assert page.errors == []
    page.context.close()


def test_sql_box_returns_the_right_rows(browser: Any, deployment: Deployment) -> None:
    deployment.settle()
    sql = "SELECT k, count(*) AS n, sum(v) AS total FROM events GROUP BY k ORDER BY k"
    expected = deployment.live.query(sql).to_pylist()
    page = page_with(browser, deployment, READ_TOKEN, "#/sql")
    page.fill("#sql-input", sql)
    page.click("#run")
    page.wait_for_selector("#result tbody tr")
    got = [row.locator("td").all_text_contents() for row in page.locator("#result tbody tr").all()]
    assert got == [[r["k"], str(r["n"]), str(r["total"])] for r in expected]
    assert re.fullmatch(r"2 rows in \d+\.\d ms", page.text_content("#sql-info") or "")
    with page.expect_download() as download:
        page.click("#csv")
    assert download.value.suggested_filename == "result.csv"
    text = Path(download.value.path()).read_text()
    assert text.splitlines() == ['"k","n","total"'] + [
        f'"{r["k"]}",{r["n"]},{r["total"]}' for r in expected
    ]
    with page.expect_download() as download:
        page.click("#parquet")
    assert download.value.suggested_filename == "result.parquet"
    import pyarrow.parquet as pq

    assert pq.read_table(download.value.path()).to_pylist() == expected
    shot(page, "sql")
    page.fill("#sql-input", "SELECT * FROM nope")
    page.click("#run")
    page.wait_for_selector("#sql-info.error")
    assert "nope" in (page.text_content("#sql-info") or "")
    assert page.errors == []
    page.context.close()


def test_late_rows_page(browser: Any, deployment: Deployment) -> None:
    feeder = deployment.feeder
    deployment.settle()
    before = feeder.late
    feeder.feed_late(150)  # one batch of 150 late rows: more than a page of 100
    wait_until(lambda: sum(deployment.live.status(deployment.pid)["late_rows"].values()) == feeder.late,
               "the late rows counted")  # fmt: skip
    total = feeder.late
    page = page_with(browser, deployment, READ_TOKEN, f"#/late/{deployment.pid}")
    page.wait_for_selector("#late-rows tbody tr")
    wait_until(lambda: page.text_content("#late-page") == f"rows 1 to 100 of {total}, newest first",
               "the first page")  # fmt: skip
    assert f"{total:,} late rows so far" in (page.text_content("#late-outputs") or "")
    values = page.locator('#late-rows tbody tr td:nth-child(4)')  # offset, k, t, v, ...
    assert values.all_text_contents() == [str(-2 - j) for j in range(149, 49, -1)]  # newest first
    assert page.is_disabled("#late-newer")
    shot(page, "late-rows")
    page.click("#late-older")  # the rest: 50 of the big batch, then the feeder's one a 5th batch
    page.wait_for_function("document.getElementById('late-page').textContent.startsWith('rows 101')")
    assert page.text_content("#late-page") == f"rows 101 to {total} of {total}, newest first"
    assert values.all_text_contents() == [str(-2 - j) for j in range(49, -1, -1)] + ["-1"] * before
    assert page.is_disabled("#late-older")
    page.click("#late-newer")
    page.wait_for_function("document.getElementById('late-page').textContent.startsWith('rows 1 to')")
    assert values.count() == 100
    assert page.errors == []
    page.context.close()


def test_a_bad_token_is_refused(browser: Any, deployment: Deployment) -> None:
    page = page_with(browser, deployment, None)
    page.wait_for_selector("#login", state="visible")
    assert page.text_content("#login-error") == ""
    page.fill("#token", "not-a-token")
    page.click("#login-form button")
    page.wait_for_function("document.getElementById('login-error').textContent !== ''")
    assert page.text_content("#login-error") == "unknown token or credentials"
    assert page.is_visible("#login")
    assert page.locator("#pipelines").count() == 0
    shot(page, "bad-token")
    page.context.close()


def test_a_read_token_cannot_cancel_and_an_admin_can(browser: Any, deployment: Deployment) -> None:
    page = page_with(browser, deployment, READ_TOKEN, f"#/pipeline/{deployment.pid}")
    page.wait_for_selector("#cancel")
    assert page.is_disabled("#cancel")
    answer = page.evaluate(
        """async (pid) => {
             const r = await fetch('/api/v1/pipelines/' + pid + '/cancel', {method: 'POST',
               headers: {Authorization: 'Bearer ' + sessionStorage.getItem('flight-serve-token')}});
             return [r.status, (await r.json()).error];
           }""",
        deployment.pid,
    )
    assert answer == [
        403, f"this token lacks the admin role that POST /api/v1/pipelines/{deployment.pid}/cancel needs"
    ]
    assert deployment.live.status(deployment.pid)["state"] == "running"
    page.context.close()

    # last: an admin cancels from the page (the pipeline stays cancelled for the module)
    page = page_with(browser, deployment, ADMIN_TOKEN, f"#/pipeline/{deployment.pid}")
    page.wait_for_selector("#cancel:not([disabled])")
    page.click("#checkpoint")
    page.wait_for_function("document.getElementById('action-message').textContent.includes('completed')")
    assert '"completed":true' in (page.text_content("#action-message") or "")
    assert "cancelled" not in (page.text_content("#logs") or "")
    page.click("#cancel")
    wait_until(lambda: deployment.live.status(deployment.pid)["state"] == "cancelled", "cancelled")
    page.wait_for_function("document.getElementById('card-state').textContent === 'cancelled'")
    # the logs are followed: the lines logged after the page opened arrive, once each
    wait_until(lambda: "checkpoints removed" in (page.text_content("#logs") or ""), "live log lines")
    lines = [line.split(" ", 1)[1] for line in (page.text_content("#logs") or "").splitlines()]
    assert lines[0] == "info: submitted"
    assert lines.count("info: cancelled") == 1
    assert lines[-1].startswith("info: checkpoints removed (")
    shot(page, "pipeline-cancelled")
    assert page.errors == []
    page.context.close()


def test_pipelines_table_sorts_and_filters(browser: Any, deployment: Deployment) -> None:
    """Two pipelines (the first cancelled above): clicking a header orders the rows by it,
    again reverses; the filter keeps the matching rows."""
    live = deployment.live
    sql = PIPELINE.replace("'counts'", "'counts_2'").replace("'late_rows'", "'late_2'")
    second = live.action("pipeline.submit", {"sql": sql, "name": "second"})["id"]
    deployment.feeder.feed_one()  # the second reads every row, the cancelled first not this one
    wait_until(lambda: live.status(second)["rows_in"] == deployment.feeder.rows, "second caught up")
    first_rows = live.status(deployment.pid)["rows_in"]
    assert first_rows < deployment.feeder.rows
    page = page_with(browser, deployment, READ_TOKEN, "#/pipelines")
    ids = page.locator('#pipelines tbody [data-col="id"]')
    wait_until(lambda: ids.count() == 2, "two rows")
    wait_until(lambda: page.locator(f'#pipelines tr[data-id="{second}"] [data-col="rows_in"]')
               .text_content() == f"{deployment.feeder.rows:,}", "second's rows")  # fmt: skip
    page.click('#pipelines th[data-key="rows_in"]')
    assert ids.all_text_contents() == [deployment.pid, second]
    assert page.locator('#pipelines [data-col="rows_in"]').all_text_contents() == [
        f"{first_rows:,}", f"{deployment.feeder.rows:,}"
    ]
    page.click('#pipelines th[data-key="rows_in"]')
    assert ids.all_text_contents() == [second, deployment.pid]
    assert page.get_attribute('#pipelines th[data-key="rows_in"]', "class") == "sortable sorted-desc"
    page.click('#pipelines th[data-key="state"]')  # cancelled < running
    assert page.locator('#pipelines [data-col="state"]').all_text_contents() == ["cancelled", "running"]
    page.wait_for_timeout(1200)  # a refresh keeps the order
    assert ids.all_text_contents() == [deployment.pid, second]
    page.fill("#filter", "second")
    assert ids.all_text_contents() == [second]
    page.fill("#filter", "cancel")
    assert ids.all_text_contents() == [deployment.pid]
    page.fill("#filter", "")
    assert ids.count() == 2
    shot(page, "pipelines-sorted")
    assert page.errors == []
    page.context.close()
    live.action("pipeline.cancel", {"id": second})


def test_readme_screenshot(browser: Any, deployment: Deployment) -> None:
    """The README's picture (docs/console.png with CONSOLE_SCREENSHOT set): a pipeline's page
    while it is fed."""
    out = os.environ.get("CONSOLE_SCREENSHOT")
    live = deployment.live
    pid = live.action(
        "pipeline.submit",
        {"sql": deployment_sql(), "name": "hourly"},
    )["id"]
    deployment.feeder.start()
    page = page_with(browser, deployment, ADMIN_TOKEN, f"#/pipeline/{pid}")
    wait_until(lambda: int(page.get_attribute("#plot-lag", "data-points") or 0) >= 12, "12 s of plot",
               timeout_s=60)  # fmt: skip
    deployment.feeder.stop()
    page.set_viewport_size({"width": 1400, "height": 1000})
    path = SHOTS / "readme.png"
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=False)
    if out:
        shutil.copyfile(path, out)
    page.context.close()


def deployment_sql() -> str:
    return PIPELINE.replace("'counts'", "'counts_hourly'").replace(
        "'late_rows'", "'late_hourly'"
    ).replace("INTERVAL '10' SECOND)", "INTERVAL '1' MINUTE)")


def test_https_with_the_servers_certificate(browser: Any, tmp_path: Path) -> None:
    """``flight-serve serve --tls-cert --tls-key --tokens-file``: the console speaks HTTPS with
    the server's own certificate, and chromium, told to trust exactly that certificate's key
    (``--ignore-certificate-errors-spki-list``), loads the page and signs in."""
    import base64
    import hashlib
    import ssl
    import subprocess

    def openssl(*args: str, data: bytes | None = None) -> bytes:
        return subprocess.run(["openssl", *args], cwd=tmp_path, input=data, check=True,
                              capture_output=True).stdout  # fmt: skip

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command line")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout", "server.key", "-out", "server.pem")  # fmt: skip
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{READ_TOKEN} read reader\n")
    live = start_serve(tmp_path, "--tls-cert", str(tmp_path / "server.pem"),
                       "--tls-key", str(tmp_path / "server.key"), "--tokens-file", str(tokens))  # fmt: skip
    try:
        assert live.console_url == f"https://127.0.0.1:{live.console_port}/"
        served = ssl.get_server_certificate(("127.0.0.1", live.console_port))
        assert ssl.PEM_cert_to_DER_cert(served) == ssl.PEM_cert_to_DER_cert(
            (tmp_path / "server.pem").read_text()
        )
        public = openssl("x509", "-in", "server.pem", "-pubkey", "-noout")
        spki = openssl("pkey", "-pubin", "-outform", "der", data=public)
        pin = base64.b64encode(hashlib.sha256(spki).digest()).decode()
        pinned = browser.browser_type.launch(  # the module's Playwright: a second chromium
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  f"--ignore-certificate-errors-spki-list={pin}"],
        )  # fmt: skip
        try:
            page = pinned.new_page()
            page.goto(live.console_url)
            page.wait_for_selector("#login", state="visible")
            page.fill("#token", READ_TOKEN)
            page.click("#login-form button")
            page.wait_for_selector("#no-pipelines", state="visible")
            assert page.text_content("#who") == "reader (read)"
            assert page.evaluate("location.protocol") == "https:"
            shot(page, "https")
        finally:
            pinned.close()
        # a browser that does not trust that certificate gets no page
        page = browser.new_page()
        with pytest.raises(sync_api.Error, match="ERR_CERT_AUTHORITY_INVALID"):
            page.goto(live.console_url)
        page.close()
    finally:
        stop_serve(live)


def test_demo_sync_plots_move_while_the_months_are_appended(browser: Any, tmp_path: Path) -> None:
    """The issue's "done when": ``flight-serve demo --sync`` on a terminal (a pty) prints the
    console's address and waits for Enter; the console open, Enter appends the months, and the
    sync pipeline's lag and throughput plots move while they come."""
    import fcntl
    import pty
    import struct
    import subprocess
    import termios
    import threading

    from .conftest import CLI

    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 400, 0, 0))  # no wrapping
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHT_SERVE_")}
    command = [str(CLI), "demo", "--sync", "--months", "6", "--month-pause", "1",
               "--data-dir", str(tmp_path / "data")]  # fmt: skip
    proc = subprocess.Popen(command, stdin=child, stdout=child, stderr=child, env=env)
    os.close(child)
    out: list[str] = []

    def read() -> None:
        while True:
            try:
                data = os.read(main, 4096)
            except OSError:
                return
            if not data:
                return
            out.append(data.decode(errors="replace"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def text() -> str:
        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", "".join(out))

    try:
        wait_until(lambda: "press Enter" in text(), "the demo's prompt", timeout_s=180)
        url = re.search(r"open (https?://\S+#/pipeline/\S+), then press Enter", text())
        assert url is not None, text()
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url.group(1))
        page.wait_for_selector("#plot-lag canvas")
        assert "2013-01" not in text()  # nothing appended before Enter
        os.write(main, b"\n")
        seen: list[tuple[int, float, float]] = []

        def sample() -> bool:
            points = int(page.get_attribute("#plot-lag", "data-points") or 0)
            lag = page.get_attribute("#plot-lag", "data-last") or ""
            rate = page.get_attribute("#plot-throughput", "data-last") or ""
            if lag not in ("", "null") and rate not in ("", "null"):
                seen.append((points, float(lag), float(rate)))
            return "2013-06:" in text()

        wait_until(sample, "six months appended", timeout_s=120)
        shot(page, "demo-sync")
        assert len({p for p, _, _ in seen}) >= 3  # a sample a second, while the months come
        assert seen[-1][1] < seen[0][1]  # the watermark follows the months: its lag shrinks
        assert max(r for _, _, r in seen) > 1000  # tens of thousands of flights a month
        assert page.text_content("#card-state") == "running"
        page.close()
        assert proc.wait(180) == 0, text()
        assert "graph updated through 2013-07-01" in text()
    finally:
        if proc.poll() is None:  # SIGTERM first: the demo then stops the FalkorDB it started
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        os.close(main)
