"""The demo in a real browser: Debian's Chromium (never a downloaded browser) driven by Playwright against the demo
launched in this process. Screenshots land in `test-artifacts/` (`MMSPEC_TEST_ARTIFACTS` overrides)."""

import os
import shutil
from pathlib import Path

import pytest

from tests.apps.test_demo_api import PROMPT

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("MMSPEC_TEST_ARTIFACTS", ROOT / "test-artifacts"))
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Chromium as root, offline: no sandbox (needs user namespaces), no GPU, and none of the background connections that
# this machine's closed network refuses
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
TIMEOUT_MS = 60_000
pytestmark = pytest.mark.slow  # a browser driving the demo end to end: the slow tier (the API tests stay)


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        message = "Debian chromium is not installed (tests/run.sh installs it)"
        if os.environ.get("MMSPEC_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=TIMEOUT_MS)  # a generation takes seconds on 2 CPU cores next to the browser
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, demo_url, request):
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(demo_url)
    yield page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=ARTIFACTS / f"{request.node.name}.png", full_page=True)
    page.close()


def data_rows(page, table_id: str):
    """A Gradio 6 dataframe's data rows (the grid's virtual rows)."""
    return page.locator(f"#{table_id} [role=row].virtual-row")


def cell(page, table_id: str, row: int, column: int):
    return page.locator(f'#{table_id} [data-testid="cell-{row}-{column}"]')


def test_generate_shows_both_images_and_the_stats(page):
    from playwright.sync_api import expect

    page.locator("#image-prompt textarea").fill(PROMPT)
    page.locator("#image-generate").click()
    expect(page.locator("#image-ar img")).to_be_visible()
    expect(page.locator("#image-fast img")).to_be_visible()
    expect(page.locator("#map-fast img")).to_be_visible()
    rows = data_rows(page, "image-stats")
    expect(rows).to_have_count(2)
    expect(cell(page, "image-stats", 1, 0)).to_contain_text("auto")
    speedup = cell(page, "image-stats", 1, 4).inner_text().strip()
    assert float(speedup) > 0, speedup
    assert cell(page, "image-stats", 0, 4).inner_text().strip() == "1.00"
    expect(page.locator("#image-status")).to_contain_text("AR's speed")


def test_empty_prompt_shows_a_clear_message(page):
    from playwright.sync_api import expect

    page.locator("#image-prompt textarea").fill("   ")
    page.locator("#image-generate").click()
    expect(page.get_by_text("Enter a prompt: the prompt is empty.")).to_be_visible()
    expect(data_rows(page, "image-stats")).to_have_count(0)
    # the server is still up: a valid prompt generates
    page.locator("#image-prompt textarea").fill(PROMPT)
    page.locator("#image-generate").click()
    expect(data_rows(page, "image-stats")).to_have_count(2)


def test_lantern_controls_appear_and_report_distortion(page):
    from playwright.sync_api import expect

    expect(page.locator("#setting-lantern-delta")).to_be_hidden()
    page.get_by_label("SJD (sjd)").check()
    page.get_by_label("lantern (lossy)").check()
    expect(page.locator("#setting-lantern-delta")).to_be_visible()
    page.locator("#image-generate").click()
    expect(page.locator("#image-status")).to_contain_text("Realised distortion")
    expect(data_rows(page, "image-stats")).to_have_count(2)
    assert float(cell(page, "image-stats", 1, 5).inner_text()) > 0


def test_text_tab_highlights_accepted_drafts(page):
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Text").click()
    page.get_by_label("ngram: prompt lookup").check()
    page.locator("#text-generate").click()
    expect(data_rows(page, "text-stats")).to_have_count(2)
    expect(page.locator("#text-fast span.draft").first).to_be_visible()
    expect(page.locator("#text-status")).to_contain_text("identical to AR")


def test_world_tab_plays_with_the_arrows(page):
    from playwright.sync_api import expect

    page.get_by_role("tab", name="World").click()
    page.locator("#world-start").click()
    expect(page.locator("#world-status")).to_contain_text("press an arrow")
    for button in ("right", "right", "up"):
        page.locator(f"#world-{button}").click()
        expect(page.locator("#world-status")).to_contain_text(f"({button})")
    expect(page.locator("#world-status")).to_contain_text("Frame 3 (up): the action changed")
    expect(page.locator("#world-sequential img")).to_be_visible()
    expect(page.locator("#world-speculative img")).to_be_visible()
    expect(data_rows(page, "world-stats")).to_have_count(2)
    expect(cell(page, "world-stats", 1, 3)).to_have_text("2")  # frames 3-4 of the first block discarded
