"""A small W3C WebDriver client over the standard library, for the console's browser suite.

It speaks to ChromeDriver over HTTP on loopback and drives Debian's headless Chromium:
sessions, navigation, elements, typing, clicks, tabs, scripts and screenshots, and waits
on conditions (never fixed sleeps).
"""

import base64
import json
import os
import pathlib
import socket
import subprocess
import time
import urllib.error
import urllib.request

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"

# Without the background-networking flags Chromium tries to reach Google's hosts, which a
# closed network refuses many times over.
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
]


class WebDriverError(Exception):
    """An error ChromeDriver answered."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(condition, what: str, timeout: float = 20.0, every: float = 0.05):
    """Polls `condition` until it returns something true, which is returned."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except WebDriverError as error:
            last_error = error
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} ({last_error})")


class Driver:
    """ChromeDriver started on a free port, with one browser session."""

    def __init__(self, chromedriver: str, chromium: str, profile: pathlib.Path):
        self.port = free_port()
        self.process = subprocess.Popen(
            [chromedriver, f"--port={self.port}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.base = f"http://127.0.0.1:{self.port}"
        wait_for(self._ready, "ChromeDriver to answer")
        capabilities = {
            "capabilities": {
                "alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {
                        "binary": chromium,
                        "args": CHROMIUM_ARGS + [f"--user-data-dir={profile}"],
                    },
                }
            }
        }
        self.session = self._call("POST", "/session", capabilities)["sessionId"]

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base}/status", timeout=1) as answer:
                return json.load(answer)["value"]["ready"]
        except (OSError, ValueError, KeyError):
            return False

    def _call(self, method: str, path: str, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return json.load(answer)["value"]
        except urllib.error.HTTPError as error:
            detail = json.load(error)["value"]
            raise WebDriverError(f"{detail.get('error')}: {detail.get('message', '')[:300]}")

    def _session(self, method: str, path: str, body=None):
        return self._call(method, f"/session/{self.session}{path}", body)

    def quit(self):
        try:
            self._session("DELETE", "")
        finally:
            self.process.terminate()
            self.process.wait(timeout=10)

    def get(self, url: str):
        self._session("POST", "/url", {"url": url})

    def url(self) -> str:
        return self._session("GET", "/url")

    def find(self, css: str) -> "Element":
        found = self._session("POST", "/element", {"using": "css selector", "value": css})
        return Element(self, found[ELEMENT])

    def find_all(self, css: str) -> list:
        found = self._session("POST", "/elements", {"using": "css selector", "value": css})
        return [Element(self, item[ELEMENT]) for item in found]

    def wait_find(self, css: str, timeout: float = 20.0) -> "Element":
        return wait_for(lambda: self.find(css), f"an element `{css}`", timeout)

    def text(self, css: str) -> str:
        return self.find(css).text()

    def wait_text(self, css: str, expected: str, timeout: float = 20.0) -> str:
        """Waits until the element `css` holds `expected` in its text."""

        def holds():
            try:
                text = self.text(css)
            except WebDriverError:
                return None
            return text if expected in text else None

        return wait_for(holds, f"`{expected}` in `{css}`", timeout)

    def act(self, css: str, action, what: str, timeout: float = 20.0):
        """Finds `css` and runs `action(element)` on it, again if the page replaced the
        element meanwhile (a live refresh swaps in a new `<main>`)."""

        def attempt():
            return action(self.find(css)) or True

        return wait_for(attempt, what, timeout)

    def click(self, css: str):
        self.act(css, lambda element: element.click(), f"a click on `{css}`")

    def type_into(self, css: str, text: str):
        self.act(css, lambda element: element.type(text), f"typing into `{css}`")

    def texts(self, css: str) -> list:
        """The text of every element `css` selects, read again if the page changed."""

        def read():
            return [element.text() for element in self.find_all(css)] or None

        try:
            return wait_for(read, f"the texts of `{css}`", timeout=5.0)
        except AssertionError:
            return []

    def script(self, source: str, *args):
        return self._session("POST", "/execute/sync", {"script": source, "args": list(args)})

    def new_tab(self) -> str:
        return self._session("POST", "/window/new", {"type": "tab"})["handle"]

    def window(self) -> str:
        return self._session("GET", "/window")

    def switch_to(self, handle: str):
        self._session("POST", "/window", {"handle": handle})

    def screenshot(self, path: pathlib.Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self._session("GET", "/screenshot")))


class Element:
    def __init__(self, driver: Driver, element_id: str):
        self.driver = driver
        self.id = element_id

    def _call(self, method: str, path: str, body=None):
        return self.driver._session(method, f"/element/{self.id}{path}", body)

    def text(self) -> str:
        return self._call("GET", "/text")

    def click(self):
        self._call("POST", "/click", {})

    def type(self, text: str):
        self._call("POST", "/value", {"text": text})

    def attribute(self, name: str):
        return self._call("GET", f"/attribute/{name}")


def chromium_paths():
    """Debian's Chromium and ChromeDriver, or what the environment names."""
    return (
        os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"),
        os.environ.get("CHROMIUM", "/usr/bin/chromium"),
    )
