"""The operator console in a real browser: headless Chromium, driven over WebDriver, against
a real `agent-kernel serve` on loopback and real `agent-kernel run` processes.

Signs in with the token; sees a `run --no-wait` request in the inbox, approves it and
watches the saga reach Done without reloading; sees a waiting run's request arrive live and
rejects it (the run rolls back); retries a dead letter; undoes a saga after its preview;
filters the saga list; verifies the audit chain. Saves a screenshot of each page under
target/browser-screenshots/ (or $SCREENSHOTS).

Run by tests/browser/run.sh, which installs Chromium and ChromeDriver when missing.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from webdriver import Driver, chromium_paths, wait_for  # noqa: E402

BIN = str(pathlib.Path(os.environ.get("AGENT_KERNEL_BIN", "target/debug/agent-kernel")).resolve())
SHOTS = pathlib.Path(os.environ.get("SCREENSHOTS", "target/browser-screenshots")).resolve()

# The command tool of the dead-letter tests, shared with the Rust suites.
FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures"


class Project:
    """A scratch folder with a policy, a tool, a log, and the console serving it."""

    def __init__(self, root: pathlib.Path):
        self.root = root
        (root / "ws").mkdir()
        (root / "sandbox.toml").write_text(
            '[fs]\nallow = ["ws"]\n\n[approval]\nrequire = ["fs.append"]\n'
        )
        shutil.copy(FIXTURES / "note-tools.toml", root / "tools.toml")
        shutil.copy(FIXTURES / "note.py", root / "note.py")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_KERNEL")}
        self.console = None

    def command(self, *args: str) -> list:
        return [BIN, "--db", str(self.root / "log.db"), *args]

    def run(self, *args: str, expect: int = 0) -> dict:
        """`agent-kernel --json ARGS`, its exit code checked; its JSON document."""
        done = subprocess.run(
            self.command("--json", *args),
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == expect, (args, done.returncode, done.stdout, done.stderr)
        return json.loads(done.stdout) if done.stdout.strip() else {}

    def plan(self, name: str, plan: dict) -> str:
        path = self.root / name
        path.write_text(json.dumps(plan))
        return str(path)

    def serve(self):
        self.console = subprocess.Popen(
            self.command("--json", "serve", "--listen", "127.0.0.1:0", "--operator", "olivia"),
            cwd=self.root,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        started = json.loads(self.console.stdout.readline())
        token = (self.root / started["token_file"]).read_text().strip()
        return started["url"], token

    def stop(self):
        if self.console:
            self.console.terminate()
            self.console.wait(timeout=10)


def sign_in(driver: Driver, url: str, token: str):
    driver.get(url)
    driver.type_into("input[name=token]", token)
    driver.click("form[action='/login'] button")
    driver.wait_text("main h1", "Overview")
    print("signed in with the token")


def mark(driver: Driver):
    """Marks the page: the mark is gone if the page is reloaded or left."""
    driver.script("window.__notReloaded = true;")


def still_marked(driver: Driver) -> bool:
    return driver.script("return window.__notReloaded === true;")


def live(driver: Driver):
    """Waits until the page's live updates are connected."""
    driver.wait_text("#live", "live")


def approve_a_no_wait_request(driver, project, url):
    plan = project.plan(
        "append.json",
        {
            "name": "append a line",
            "steps": [
                {"tool": "fs.write", "args": {"path": "ws/a.txt", "content": "a"}},
                {"tool": "fs.append", "args": {"path": "ws/log.txt", "content": "<script>alert(1)</script>"}},
            ],
        },
    )
    report = project.run("run", "--no-wait", "--plan", plan, expect=5)
    saga_id, approval_id = report["saga_id"], report["approval"]["id"]
    driver.get(url + "approvals")
    driver.wait_find(f"#approval-{approval_id}")
    shown = driver.act(f"#approval-{approval_id}", lambda article: article.text(), "the request's text")
    # The agent's markup is shown as text, never run.
    assert "<script>alert(1)</script>" in shown, shown
    assert driver.script("return document.querySelectorAll('main script').length;") == 0
    assert approval_id in shown and "fs.append" in shown, shown
    driver.screenshot(SHOTS / "inbox.png")
    print("the run --no-wait request is in the inbox, its markup shown as text")

    inbox = driver.window()
    timeline = driver.new_tab()
    driver.switch_to(timeline)
    driver.get(url + f"sagas/{saga_id}")
    driver.wait_text("dd.state", "AwaitingApproval")
    live(driver)
    mark(driver)

    driver.switch_to(inbox)
    driver.type_into(f"#approval-{approval_id} input[name=note]", "ticket 42, checked")
    driver.click(f"#approval-{approval_id} button[value=approve]")
    wait_for(lambda: not driver.find_all(f"#approval-{approval_id}"), "the request to leave the inbox")
    # Its process was told not to wait: whoever resumes it carries it on.
    project.run("resume", "--saga", saga_id)

    driver.switch_to(timeline)
    driver.wait_text("dd.state", "Done")
    assert still_marked(driver), "the timeline was reloaded"
    text = driver.text("section.approval")
    assert "olivia" in text and "ticket 42, checked" in text, text
    driver.screenshot(SHOTS / "saga-done.png")
    print("approved in the inbox; the open timeline reached Done without a reload")
    driver.switch_to(inbox)


def reject_a_waiting_run(driver, project, url):
    driver.get(url + "approvals")
    driver.wait_text("main", "No approval is pending")
    live(driver)
    mark(driver)
    plan = project.plan(
        "reject.json",
        {
            "steps": [
                {"tool": "fs.write", "args": {"path": "ws/b.txt", "content": "b"}},
                {"tool": "fs.append", "args": {"path": "ws/b.txt", "content": " and more"}},
            ]
        },
    )
    waiting = subprocess.Popen(
        project.command("--json", "run", "--plan", plan),
        cwd=project.root,
        env=project.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        driver.wait_find("article.request", timeout=30)
        assert still_marked(driver), "the inbox was reloaded"
        print("a waiting run's request appeared in the open inbox without a reload")
        article_id = driver.act("article.request", lambda article: article.attribute("id"), "the request's id")
        driver.type_into(f"#{article_id} input[name=reason]", "not this file")
        driver.click(f"#{article_id} button[value=reject]")
        out, err = waiting.communicate(timeout=60)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    report = json.loads(out)
    assert report["state"] == "FailedRolledBack", (report, err)
    assert not (project.root / "ws/b.txt").exists(), "the rollback removed the file"
    driver.get(url + f"sagas/{report['saga_id']}")
    driver.wait_text("dd.state", "FailedRolledBack")
    driver.screenshot(SHOTS / "saga-rejected.png")
    print("rejected in the inbox; the waiting run rolled back at once")


def retry_a_dead_letter(driver, project, url):
    (project.root / "ws/block").write_text("")
    plan = project.plan(
        "letter.json",
        {"steps": [{"tool": "note.add", "args": {"item": "a"}}, {"tool": "fault.fail", "args": {}}]},
    )
    project.run("run", "--plan", plan, expect=3)
    driver.get(url + "dead-letters")
    driver.wait_find("form.retry button")
    driver.screenshot(SHOTS / "dead-letters.png")
    (project.root / "ws/block").unlink()
    driver.click("form.retry button")
    driver.wait_text("#retry-outcome", "Compensated")
    assert "FailedRolledBack" in driver.text("main")
    assert (project.root / "ws/notes.txt").read_text() == ""
    driver.screenshot(SHOTS / "dead-letter-retried.png")
    print("retried the dead letter: compensated")


def undo_after_the_preview(driver, project, url):
    plan = project.plan(
        "undo.json",
        {"name": "write u", "steps": [{"tool": "fs.write", "args": {"path": "ws/u.txt", "content": "u"}}]},
    )
    saga_id = project.run("run", "--plan", plan)["saga_id"]
    driver.get(url + f"sagas/{saga_id}")
    driver.wait_text("dd.state", "Done")
    driver.click(f"a[href='/sagas/{saga_id}/undo']")
    driver.wait_text("main", "Every step can be undone")
    driver.screenshot(SHOTS / "undo-preview.png")
    driver.type_into("form.confirm input[name=reason]", "the agent misread the ticket")
    driver.click("form.confirm button")
    driver.wait_text("dd.state", "Undone")
    assert not (project.root / "ws/u.txt").exists()
    driver.screenshot(SHOTS / "saga-undone.png")
    print("undid a saga after its preview")
    return saga_id


def filter_the_list(driver, url, undone_saga):
    driver.get(url + "sagas")
    driver.wait_find("form.filters")
    rows = driver.texts("table.sagas tbody tr")
    assert len(rows) >= 4, rows
    driver.type_into("form.filters input[name=name]", "write u")
    driver.click("form.filters button")
    wait_for(lambda: "name=write+u" in driver.url(), "the filtered list")
    rows = driver.texts("table.sagas tbody tr")
    assert len(rows) == 1 and undone_saga in rows[0], rows
    driver.screenshot(SHOTS / "sagas-filtered.png")
    print("filtered the saga list by name")


def verify_the_chain(driver, url):
    driver.get(url)
    driver.wait_find("form[action='/audit/verify'] button")
    driver.click("form[action='/audit/verify'] button")
    driver.wait_text("#audit-verdict", "Intact")
    driver.screenshot(SHOTS / "audit.png")
    driver.get(url)
    driver.wait_text("#audit-last", "Intact")
    driver.screenshot(SHOTS / "overview.png")
    print("verified the audit chain")


def main() -> int:
    chromedriver, chromium = chromium_paths()
    for program in (chromedriver, chromium, BIN):
        if not shutil.which(program):
            print(f"missing: {program}", file=sys.stderr)
            return 2
    SHOTS.mkdir(parents=True, exist_ok=True)
    for stale in SHOTS.glob("*.png"):
        stale.unlink()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        scratch = pathlib.Path(scratch)
        (scratch / "project").mkdir()
        project = Project(scratch / "project")
        # The console serves an existing log: a first saga makes it.
        first = project.plan(
            "first.json",
            {"name": "first", "steps": [{"tool": "fs.write", "args": {"path": "ws/first.txt", "content": "1"}}]},
        )
        project.run("run", "--plan", first)
        url, token = project.serve()
        driver = Driver(chromedriver, chromium, scratch / "profile")
        try:
            sign_in(driver, url, token)
            approve_a_no_wait_request(driver, project, url)
            reject_a_waiting_run(driver, project, url)
            retry_a_dead_letter(driver, project, url)
            undone = undo_after_the_preview(driver, project, url)
            filter_the_list(driver, url, undone)
            verify_the_chain(driver, url)
        except BaseException:
            try:
                driver.screenshot(SHOTS / "failure.png")
                print(f"the page at the failure: {SHOTS / 'failure.png'}", file=sys.stderr)
            except Exception:  # noqa: BLE001 (the failure itself is what matters)
                pass
            raise
        finally:
            driver.quit()
            project.stop()
    print(f"browser suite: passed in {time.monotonic() - started:.1f} s; screenshots in {SHOTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
