"""The live dashboard in a real browser: Debian's Chromium, headless, driven by Playwright
against the service's test job (tests/support/served.py) while views arrive.

The page is used as a person would: the job is chosen from the list, its numbers and
charts move as views are produced, its results, dead letters and late events show up
without a reload. Chromium comes from the system's packages (``make test`` installs it
through ``kappaflow.install.browser``); a missing one fails the tests instead of skipping
them. Screenshots go to the test's temporary directory; with
``KAPPAFLOW_TEST_SCREENSHOTS=DIR`` the live one is also kept as ``DIR/dashboard.png``
(docs/images/ holds the README's).
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_jobs import send_json
from playwright.sync_api import BrowserContext, Locator, Page, expect, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from service import WATERMARK, WINDOW_MS, Served, expected_windows, serve

from kappaflow.api.auth import COOKIE, Role, TokenStore, tokens_path
from kappaflow.install.browser import INSTALL_HINT, find_chromium
from kappaflow.kafka.topics import create_topic
from kappaflow.timeutil import from_epoch_ms, iso

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # Chromium's own calls home: refused offline, and noise in a test.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: How long the page may take to show what a batch of the job made: the view is produced,
#: the job's next micro-batch commits it, the page's next poll or pushed change shows it.
LIVE_MS = 60_000
UI_MS = 15_000


@pytest.fixture(scope="module")
def site(served: Served) -> Iterator[str]:
    """The service's address, serving the dashboard over the test job."""
    with serve(served.settings) as client:
        yield str(client.base_url)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrowserContext]:
    chromium = find_chromium()
    assert chromium is not None, f"no Chromium: make test installs it as root, or {INSTALL_HINT}"
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=str(chromium),
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            yield context
        finally:
            context.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


@pytest.fixture
def page(browser: BrowserContext) -> Iterator[Page]:
    """A new tab; the test fails if the page's scripts raised."""
    tab = browser.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    try:
        yield tab
    finally:
        tab.close()
    assert errors == []


def output_cell(page: Page, output: str, field: str) -> Locator:
    return page.locator(f"[data-testid=outputs] tr[data-output='{output}'] td[data-field={field}]")


def number_of(locator: Locator) -> int:
    return int(float(locator.get_attribute("data-value") or 0))


def wait_number_at_least(page: Page, selector: str, least: int) -> None:
    """Until the element's ``data-value`` is a number of at least ``least``."""
    try:
        page.wait_for_function(
            """([selector, least]) => {
                const el = document.querySelector(selector);
                return Boolean(el) && Number(el.dataset.value) >= least;
            }""",
            arg=[selector, least],
            timeout=LIVE_MS,
        )
    except PlaywrightTimeoutError:
        shown = page.locator(selector).get_attribute("data-value", timeout=UI_MS)
        raise AssertionError(f"{selector} shows {shown}, not {least} or more") from None


def window_iso(ms: int) -> str:
    return iso(from_epoch_ms(ms - ms % WINDOW_MS))


def views(page_name: str, at: datetime, count: int) -> list[dict[str, Any]]:
    return [
        {"user": f"d{i}", "page": page_name, "at": iso(at), "id": uuid.uuid4().hex}
        for i in range(count)
    ]


def keep_screenshot(page: Page, shots: Path, name: str) -> None:
    path = shots / f"{name}.png"
    page.screenshot(path=path, full_page=True)
    kept = os.environ.get("KAPPAFLOW_TEST_SCREENSHOTS")
    if kept and name == "live":
        Path(kept).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, Path(kept) / "dashboard.png")


def test_the_root_leads_to_the_dashboard_under_a_strict_policy(site: str) -> None:
    with httpx.Client(base_url=site) as client:
        root = client.get("/")
        assert root.status_code == 307 and root.headers["location"] == "/dashboard/"
        index = client.get("/dashboard/")
        script = client.get("/dashboard/app.js")
    assert index.status_code == 200 and "text/html" in index.headers["content-type"]
    policy = index.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert script.headers["x-content-type-options"] == "nosniff"


def test_a_job_its_state_accounting_and_final_results(
    page: Page, site: str, served: Served, shots: Path
) -> None:
    page.goto(site)
    # The page names the job it shows in its address's fragment.
    expect(page).to_have_url(re.compile(rf"{re.escape(site)}/dashboard/(#.*)?"), timeout=UI_MS)
    expect(page.locator("[data-testid=services] [data-service='serving store']")).to_have_attribute(
        "data-up", "true", timeout=UI_MS
    )
    row = page.locator(f"[data-testid=jobs] tr[data-job='{served.job}']")
    expect(row.locator("[data-testid=state]")).to_have_text("running", timeout=UI_MS)
    row.click()
    expect(page.locator("[data-testid=job-name]")).to_have_text(served.job)
    expect(page.locator("[data-testid=job-state]")).to_have_text("running", timeout=UI_MS)
    for field in ("events", "events_read"):
        expect(output_cell(page, "pages", field)).to_have_attribute("data-value", "25")
    for field in ("duplicates", "late", "dead_letters"):
        expect(output_cell(page, "pages", field)).to_have_attribute("data-value", "0")

    page.locator("[data-testid=outputs] tr[data-output=pages]").click()
    expect(page.locator("[data-testid=results-output]")).to_have_text("pages")
    cells = page.locator("[data-testid=results-table] [data-testid=cell][data-value]")
    expect(cells).to_have_count(len(expected_windows()), timeout=UI_MS)
    shown = {
        (c.get_attribute("data-key"), c.get_attribute("data-window")): (
            int(c.get_attribute("data-value") or -1),
            c.get_attribute("data-kind"),
        )
        for c in cells.all()
    }
    # The views' watermark passed the first windows' ends, not the later ones'.
    assert shown == {
        (page_name, window_iso(start)): (
            count,
            "final" if start + WINDOW_MS <= WATERMARK else "provisional",
        )
        for (page_name, start), count in expected_windows().items()
    }
    keep_screenshot(page, shots, "job")


def test_numbers_charts_results_and_letters_follow_new_views_live(
    page: Page, site: str, served: Served, shots: Path
) -> None:
    page.goto(f"{site}/dashboard/#job={served.job}&output=clicks")
    counted = output_cell(page, "clicks", "events")
    expect(counted).to_have_attribute("data-value", re.compile(r"\d+"), timeout=UI_MS)
    expect(page.locator("[data-testid=results-feed]")).to_have_attribute(
        "data-feed", "push", timeout=UI_MS
    )
    before = number_of(counted)
    letters_before = number_of(output_cell(page, "clicks", "dead_letters"))
    page.evaluate("window.notReloaded = true")

    now = datetime.now(UTC)
    name = f"/dash-{uuid.uuid4().hex[:8]}"
    bad = f"not json {uuid.uuid4().hex[:8]}".encode()
    # Two more pages beside it, so that the results show keys side by side.
    others = [*views(f"{name}/a", now, 2), *views(f"{name}/b", now, 1)]
    send_json(served.settings, served.live, [*views(name, now, 3), *others, bad], key="user")

    selector = "[data-testid=outputs] tr[data-output=clicks] td[data-field=events]"
    wait_number_at_least(page, selector, before + 6)
    wait_number_at_least(page, selector.replace("events", "dead_letters"), letters_before + 1)
    chart = "[data-testid=chart-accounting] [data-series=counted]"
    wait_number_at_least(page, chart, before + 6)
    expect(page.locator("[data-testid=chart-accounting] polyline")).not_to_have_count(0)

    window = window_iso(int(now.timestamp() * 1000))
    cell = page.locator(f"[data-testid=cell][data-key='{name}'][data-window='{window}']")
    expect(cell).to_have_attribute("data-value", "3", timeout=LIVE_MS)
    expect(cell).to_have_attribute("data-kind", "provisional")
    letter = page.locator("[data-testid=dlq-record]", has_text=bad.decode())
    expect(letter.locator(".reason")).to_have_text("not valid JSON", timeout=LIVE_MS)

    # One view more for the same window: the cell changes, and is marked as just changed.
    send_json(served.settings, served.live, views(name, now, 1), key="user")
    changed = page.locator(
        f"[data-testid=cell][data-key='{name}'][data-window='{window}'][data-changed=true]"
    )
    expect(changed).to_have_attribute("data-value", "4", timeout=LIVE_MS)

    # An hour behind the watermark the views made: too late for its window.
    send_json(served.settings, served.live, views(name, now - timedelta(hours=1), 1), key="user")
    late = page.locator("[data-testid=late-record]", has_text=name)
    expect(late.locator(".reason")).to_contain_text("too late", timeout=LIVE_MS)
    keep_screenshot(page, shots, "live")
    assert page.evaluate("window.notReloaded") is True


def test_the_topic_browser_lists_topics_and_peeks_at_records(
    page: Page, site: str, served: Served, shots: Path
) -> None:
    with httpx.Client(base_url=site) as client:
        views_topic = client.get(f"/v1/jobs/{served.job}").json()["params"]["topic"]
    page.goto(f"{site}/dashboard/#job={served.job}")
    row = page.locator(f"[data-testid=topics-table] tr[data-topic='{views_topic}']")
    expect(row).to_contain_text("25", timeout=UI_MS)
    expect(
        page.locator(f"[data-testid=topics-table] tr[data-topic='{served.live}']")
    ).to_be_visible()
    row.click()
    expect(page.locator("[data-testid=peek-topic]")).to_have_text(views_topic)
    records = page.locator("[data-testid=peek] tbody tr")
    expect(records).to_have_count(20, timeout=UI_MS)
    expect(records.first).to_contain_text('"page"')
    keep_screenshot(page, shots, "topics")


def test_results_are_polled_where_changes_are_not_pushed(
    page: Page, site: str, served: Served
) -> None:
    missing = {"code": "KF853", "error": "no endpoint"}
    page.route("**/changes", lambda route: route.fulfill(status=404, json=missing))
    page.route("**/v1/topics", lambda route: route.fulfill(status=404, json=missing))
    page.goto(f"{site}/dashboard/#job={served.job}&output=pages")
    expect(page.locator("[data-testid=results-feed]")).to_have_attribute(
        "data-feed", "poll", timeout=UI_MS
    )
    cells = page.locator("[data-testid=results-table] [data-testid=cell][data-value]")
    expect(cells).to_have_count(len(expected_windows()), timeout=UI_MS)
    expect(page.locator("[data-testid=topics-unavailable]")).to_contain_text("no topic browser")


def test_a_service_with_tokens_asks_for_one_and_signs_in_with_a_cookie(
    page: Page, served: Served, tmp_path: Path
) -> None:
    # A service of its own state: its token does not close the shared one's door.
    own = served.settings.model_copy(update={"state_dir": tmp_path / "state"})
    token = TokenStore(tokens_path(own)).create("viewer", Role.READ)
    with serve(own) as client:
        page.goto(f"{client.base_url}/")
        form = page.locator("[data-testid=sign-in]")
        expect(form).to_be_visible(timeout=UI_MS)
        form.locator("input[name=token]").fill("kf_not-a-token")
        form.locator("button[type=submit]").click()
        expect(page.locator("[data-testid=sign-in-error]")).to_contain_text("not one of")
        form.locator("input[name=token]").fill(token)
        form.locator("button[type=submit]").click()
        expect(form).to_be_hidden(timeout=UI_MS)
        expect(page.locator("[data-testid=who]")).to_have_text("viewer (read)", timeout=UI_MS)
        expect(page.locator("[data-testid=no-jobs]")).to_be_visible(timeout=UI_MS)
        cookies = page.context.cookies(str(client.base_url))
        assert [c["httpOnly"] for c in cookies if c["name"] == COOKIE] == [True]
        assert all(
            token not in request
            for request in page.evaluate(
                "performance.getEntriesByType('resource').map((e) => e.name)"
            )
        )
        page.locator("[data-testid=sign-out]").click()
        expect(form).to_be_visible(timeout=UI_MS)


def test_a_device_metric_is_plotted_with_its_expected_range_and_explained_alerts(
    page: Page, site: str, served: Served, shots: Path
) -> None:
    suffix = uuid.uuid4().hex[:8]
    scores, alerts = f"scores-{suffix}", f"alerts-{suffix}"
    for topic in (scores, alerts):
        create_topic(served.settings.kafka, topic, partitions=2)
    start = datetime.now(UTC) - timedelta(minutes=30)

    def score(device: str, minute: int, value: float) -> dict[str, Any]:
        return {
            "device": device,
            "metric": "cpu_temp",
            "value": value,
            "time": iso(start + timedelta(minutes=minute)),
            "score": 0.9 if value > 60 else 0.05,
            "model": "likelihood",
            "expected_low": 48.0 + minute / 10,
            "expected_high": 52.0 + minute / 10,
            "likelihood": 0.5,
        }

    ours = [score("d1", m, 71.0 if m == 20 else 50.0 + m / 10) for m in range(40)]
    send_json(served.settings, scores, [*ours, score("d2", 5, 99.0)], key="device")
    raised = {
        "device": "d1",
        "metric": "cpu_temp",
        "rule": "anomaly",
        "status": "raised",
        "reason": "scored 0.9 >= 0.5: 71 where 50 to 54 was expected",
        "time": ours[20]["time"],
        "score": 0.9,
        "open": ["anomaly"],
        "model": "likelihood",
        "value": 71.0,
        "expected_low": 50.0,
        "expected_high": 54.0,
        "likelihood": 1.0 - 1e-9,
    }
    other = {**raised, "device": "d2", "time": ours[5]["time"], "value": 99.0}
    send_json(served.settings, alerts, [raised, other], key="device")
    page.goto(f"{site}/dashboard/#device=d1&metric=cpu_temp&scores={scores}&alerts={alerts}")
    values = page.locator("[data-testid=device-values]")
    # d1's forty readings (d2's are not drawn), the band they were expected in, the alert.
    expect(values).to_have_attribute("data-count", "40", timeout=LIVE_MS)
    expect(page.locator("[data-testid=device-band]")).to_have_count(1)
    marks = page.locator("[data-testid=device-alert-mark]")
    expect(marks).to_have_count(1)
    expect(marks.locator("title")).to_contain_text("71 seen, 50 to 54 expected")
    rows = page.locator("[data-testid=device-alerts] tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("71 seen, 50 to 54 expected (likelihood; 1 in 1e+09)")
    # The band is drawn where the readings were expected: the mark of the reading seen at
    # 71 is above it; the polyline's points lie inside it but for that one.
    band_box = page.locator("[data-testid=device-band]").bounding_box()
    mark_box = marks.bounding_box()
    assert band_box is not None and mark_box is not None
    assert mark_box["y"] + mark_box["height"] / 2 < band_box["y"]
    keep_screenshot(page, shots, "device")
    # New readings come into the picture without a reload.
    send_json(served.settings, scores, [score("d1", m, 50.0) for m in range(40, 45)], key="device")
    expect(values).to_have_attribute("data-count", "45", timeout=LIVE_MS)


def test_a_jobs_shadow_diff_shows_under_it_and_nothing_without_one(
    page: Page, site: str, served: Served
) -> None:
    # The test job has no shadow: the service answers KF792 and the panel stays hidden.
    page.goto(f"{site}/dashboard/#job={served.job}")
    expect(page.locator("[data-testid=job-name]")).to_have_text(served.job, timeout=UI_MS)
    expect(page.locator("[data-testid=shadow]")).to_be_hidden()
    # With one (the answer of `jobs diff`, tests/test_shadow.py has the real ones).
    diff = {
        "job": served.job,
        "shadow": f"{served.job}.shadow",
        "shadow_state": "running",
        "app": "shop:with_biggest",
        "started_from": {"replay": True, "why": "asked (--replay)"},
        "outputs": [
            {
                "output": "pages",
                "status": "compared",
                "live_topic": f"{served.job}.pages",
                "shadow_topic": f"{served.job}.shadow.pages",
                "aggregates": {"common": ["views"], "added": ["users"], "removed": []},
                "windows": {
                    "equal": 4,
                    "different": 2,
                    "only_live": 1,
                    "only_shadow": 0,
                    "pending": 3,
                    "before_shadow": 0,
                },
                "first_difference": {
                    "window_start": "2026-11-23T10:01:00.000Z",
                    "key": ["/home"],
                    "aggregates": ["views"],
                    "live": {"views": 2},
                    "shadow": {"views": 1},
                },
                "sample": [],
            }
        ],
    }
    page.route("**/diff", lambda route: route.fulfill(status=200, json=diff))
    page.reload()
    panel = page.locator("[data-testid=shadow]")
    expect(panel).to_be_visible(timeout=UI_MS)
    expect(panel.locator("[data-testid=shadow-name]")).to_contain_text(f"{served.job}.shadow")
    row = panel.locator("tr[data-output='pages']")
    expect(row.locator("td[data-field=different]")).to_have_text("2")
    expect(row.locator("td[data-field=pending]")).to_have_text("3")
    expect(row).to_contain_text("+users")
    expect(row.locator("td[data-field=first_difference]")).to_contain_text(
        '2026-11-23T10:01:00.000Z ["/home"]: live {"views":2}, shadow {"views":1}'
    )
