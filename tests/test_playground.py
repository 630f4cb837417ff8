"""The playground in a real headless Chromium, against the API in front of the test session's
server (the tiny model): a completion streams into the page, and what it shows equals the
official client's answer with the same settings."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_server import ApiServer, openai_client
from chat_checkpoint import with_chat_template

from openai_api import Settings

PROMPT = "def fib(n):\n"
CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1100,720",
)


@pytest.fixture(scope="module")
def api(server, tiny_checkpoint) -> Iterator[ApiServer]:
    """The API as `make api` runs it: the checkpoint's tokenizer at hand (unary path)."""
    with ApiServer(Settings(triton_url=server.grpc_url, checkpoint=tiny_checkpoint)) as running:
        yield running


@pytest.fixture
def browser():
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} missing: `make setup-dev` installs Chromium and chromedriver "
            "(scripts/install-chromium.sh)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    try:
        yield driver
    finally:
        driver.quit()


RECORD_STREAMED_LENGTHS = """
window.streamedLengths = [];
const gen = document.querySelector('#output .gen');
new MutationObserver(() => {
  if (gen.textContent && document.getElementById('status').textContent.startsWith('generating'))
    window.streamedLengths.push(gen.textContent.length);
}).observe(gen, {childList: true, characterData: true, subtree: true});
"""


def test_the_playground_streams_a_completion_in_a_browser(api, browser, tmp_path):
    from selenium.webdriver.common.by import By

    asked = 400
    browser.get(api.url + "/")
    assert browser.title == "codegen playground"

    def field(name: str, value: str) -> None:
        element = browser.find_element(By.ID, name)
        element.clear()
        element.send_keys(value)

    field("prompt", PROMPT)
    field("max_tokens", str(asked))
    field("seed", "1")  # the page's defaults otherwise: temperature 0.8, top_p 0.95, top_k 40
    # The page records the generated text's length at every change while it says generating:
    # polling through the driver can miss a fast stream on a loaded machine; this cannot.
    browser.execute_script(RECORD_STREAMED_LENGTHS)
    browser.find_element(By.ID, "complete").click()

    deadline = time.monotonic() + 120
    while browser.find_element(By.ID, "status").text != "done":
        assert time.monotonic() < deadline, "the playground never finished"
        assert not browser.find_element(By.ID, "error").text, "the playground shows an error"
        time.sleep(0.05)
    seen = browser.execute_script("return window.streamedLengths")
    assert len(set(seen)) >= 2, f"no text appeared before the end: {seen}"

    shown = browser.execute_script("return document.querySelector('#output .gen').textContent")
    expected = openai_client(api).completions.create(
        model="ensemble",
        prompt=PROMPT,
        max_tokens=asked,
        temperature=0.8,
        top_p=0.95,
        seed=1,
        extra_body={"top_k": 40},
    )
    assert shown == expected.choices[0].text
    usage = expected.usage
    assert browser.find_element(By.ID, "tokens").text == (
        f"{usage.prompt_tokens} + {usage.completion_tokens}"
    )
    assert browser.find_element(By.ID, "finish").text == expected.choices[0].finish_reason
    assert re.fullmatch(r"\d+ ms", browser.find_element(By.ID, "ttft").text)
    assert re.fullmatch(r"\d+ ms", browser.find_element(By.ID, "latency").text)
    assert float(browser.find_element(By.ID, "rate").text) > 0

    screenshot = tmp_path / "playground.png"
    assert browser.save_screenshot(str(screenshot))
    assert screenshot.stat().st_size > 10_000
    if os.environ.get("PLAYGROUND_SCREENSHOT"):  # how docs/playground.png was made
        shutil.copy(screenshot, os.environ["PLAYGROUND_SCREENSHOT"])
    print(f"screenshot: {screenshot}")


@pytest.fixture(scope="module")
def chat_api(server, tiny_checkpoint, tmp_path_factory) -> Iterator[ApiServer]:
    """The API with a chat template in its checkpoint (tests/chat_checkpoint.py)."""
    folder = with_chat_template(tiny_checkpoint, tmp_path_factory.mktemp("chat") / "checkpoint")
    with ApiServer(Settings(triton_url=server.grpc_url, checkpoint=folder)) as running:
        yield running


def test_the_playground_chat_tab_holds_a_conversation(chat_api, browser):
    from selenium.webdriver.common.by import By

    browser.get(chat_api.url + "/")
    browser.find_element(By.ID, "tab-chat").click()
    assert browser.find_element(By.ID, "complete").text == "Send"
    system = "You complete Python."
    browser.find_element(By.ID, "system").send_keys(system)
    for name, value in (("max_tokens", "16"), ("temperature", "0")):
        browser.find_element(By.ID, name).clear()
        browser.find_element(By.ID, name).send_keys(value)
    messages = [{"role": "system", "content": system}]
    for question in (PROMPT, "def add(a, b):\n"):
        prompt = browser.find_element(By.ID, "prompt")
        prompt.clear()
        prompt.send_keys(question)
        browser.find_element(By.ID, "complete").click()
        deadline = time.monotonic() + 120
        while browser.find_element(By.ID, "status").text != "done":
            assert time.monotonic() < deadline, "the chat never finished"
            assert not browser.find_element(By.ID, "error").text, "the playground shows an error"
            time.sleep(0.05)
        messages.append({"role": "user", "content": question})
        expected = openai_client(chat_api).chat.completions.create(
            model="ensemble", messages=messages, max_tokens=16, temperature=0
        )
        answer = expected.choices[0].message.content
        shown = browser.execute_script("return document.querySelector('#output .gen').textContent")
        assert shown == answer  # the second turn is answered with the first in its messages
        messages.append({"role": "assistant", "content": answer})
        assert browser.find_element(By.ID, "prompt").get_attribute("value") == ""
