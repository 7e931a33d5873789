"""Which driver to keep: the in-sandbox one (``inside/browserd.py``, CDP over Chromium's pipe,
one ``exec`` per step) against Playwright on the controller (``connect_over_cdp`` through
``orchard_async.forward`` to a Chromium in the same sandbox started with a debugging port).

    python -m orchard_async.recipes.gui.bench [--adapter local] [--steps 30] [--setups 5] [--no-playwright]

Both drive the same pages in the same sandbox and do the same work per step: the action,
then a PNG screenshot of the viewport and the full accessibility tree. Printed: p50/p99 of
a step without navigation (a tab switch), a step with one (opening a product page), and a
screenshot alone; plus the setup time of the in-sandbox path. Needs ``pip install playwright``
for the second column (no browser download: it drives the sandbox's Chromium).
"""

from __future__ import annotations

import argparse
import re
import time
from typing import Any

import anyio

import orchard_async as oa
from orchard_async.recipes.gui import actions
from orchard_async.recipes.gui.lines import SITES, TaskLine
from orchard_async.recipes.gui.policies import resolve
from orchard_async.recipes.gui.task import GuiTask

PRODUCT = "http://127.0.0.1:{port}/product/{n}"
PLAYWRIGHT_CDP_PORT = 9333


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def in_sandbox(box: Any, task: GuiTask, steps: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"tab": [], "navigate": [], "screenshot": []}
    page = await task._run(box, {"action": "goto", "url": PRODUCT.format(port=SITES["shop"], n=1)})
    for i in range(steps):
        name = "Specifications" if i % 2 == 0 else "Description"
        action = {"action": "click", "element": resolve({"role": "tab", "name": name}, page)}
        start = time.perf_counter()
        page = (await box.exec(actions.command(action), timeout=30)).text
        times["tab"].append(time.perf_counter() - start)
        times["screenshot"].append(float(re.search(r"screenshot=([\d.]+)", page).group(1)) / 1000)
    for i in range(steps):
        action = {"action": "goto", "url": PRODUCT.format(port=SITES["shop"], n=2 + i)}
        start = time.perf_counter()
        page = (await box.exec(actions.command(action), timeout=30)).text
        times["navigate"].append(time.perf_counter() - start)
    return times


async def playwright_side(box: Any, steps: int) -> dict[str, list[float]]:
    from playwright.async_api import async_playwright

    argv = (
        f"chromium --headless --no-sandbox --disable-gpu --remote-debugging-port={PLAYWRIGHT_CDP_PORT} --user-data-dir=$PWD/.pw"
        " --window-size=1280,720 --no-first-run --hide-scrollbars --disable-dev-shm-usage about:blank"
    )
    await box.exec(f"(setsid sh -c 'HOME=$PWD {argv}' >pw.log 2>&1 &)", timeout=10)
    times: dict[str, list[float]] = {"tab": [], "navigate": [], "screenshot": []}
    async with oa.forward(box, PLAYWRIGHT_CDP_PORT) as (host, port):
        for _ in range(100):  # wait for the debugging port
            try:
                async with oa.SandboxTransport(box, PLAYWRIGHT_CDP_PORT) as transport:
                    import httpx

                    async with httpx.AsyncClient(transport=transport) as client:
                        await client.get("http://127.0.0.1/json/version")
                break
            except Exception:  # noqa: BLE001 - not listening yet
                await anyio.sleep(0.1)
        async with async_playwright() as pw:
            browser = await pw.chromium.connect_over_cdp(f"http://{host}:{port}")
            context = browser.contexts[0]
            page = context.pages[0] if context.pages else await context.new_page()
            await page.set_viewport_size({"width": 1280, "height": 720})
            cdp = await context.new_cdp_session(page)

            async def observe() -> None:
                mark = time.perf_counter()
                await page.screenshot(type="png")
                times["screenshot"].append(time.perf_counter() - mark)
                await cdp.send("Accessibility.getFullAXTree")

            await page.goto(PRODUCT.format(port=SITES["shop"], n=1))
            for i in range(steps):
                name = "Specifications" if i % 2 == 0 else "Description"
                start = time.perf_counter()
                await page.get_by_role("tab", name=name).click()
                await observe()
                times["tab"].append(time.perf_counter() - start)
            for i in range(steps):
                start = time.perf_counter()
                await page.goto(PRODUCT.format(port=SITES["shop"], n=2 + i))
                await observe()
                times["navigate"].append(time.perf_counter() - start)
            await browser.close()
    return times


async def sandbox_memory(box: Any) -> int:
    """Bytes of memory the sandbox's processes hold (proportional set size: shared pages split)."""
    result = await box.exec(
        "cat /proc/[0-9]*/smaps_rollup 2>/dev/null | awk '/^Pss:/ {s += $2} END {print s}'", timeout=30
    )
    return int(result.text.strip() or 0) * 1024


async def setup_and_memory(adapter: Any, task: GuiTask, setups: int) -> tuple[list[float], list[int]]:
    """``setups`` sandboxes one after another: seconds from create to the start page observed
    (sandbox + sites + browser ready), and each one's memory once there."""
    seconds, memory = [], []
    for _ in range(setups):
        start = time.perf_counter()
        async with await adapter.create(task.spec) as box:
            await task.setup(box)
            seconds.append(time.perf_counter() - start)
            memory.append(await sandbox_memory(box))
    return seconds, memory


async def main(adapter_name: str, steps: int, setups: int, playwright: bool) -> None:
    adapter = oa.get_adapter(adapter_name)
    line = TaskLine(
        id="bench",
        site="shop",
        start_url=f"http://127.0.0.1:{SITES['shop']}/",
        intent="bench",
        eval=[{"type": "url_match", "contains": "/"}],
    )
    task = GuiTask(line)
    try:
        setup_s, memory = await setup_and_memory(adapter, task, setups)
        async with await adapter.create(task.spec) as box:
            await task.setup(box)
            results = {"in-sandbox driver (exec + CDP pipe)": await in_sandbox(box, task, steps)}
            if playwright:
                try:
                    results["Playwright via forward (connect_over_cdp)"] = await playwright_side(box, steps)
                except ImportError:
                    print("playwright is not installed: pip install playwright (no browser download needed)")
    finally:
        await adapter.close()
    mib = sorted(m / 2**20 for m in memory)
    print(
        f"adapter {adapter_name}: {setups} setups (create -> start page observed) p50 {_p(setup_s, 0.5):.0f} ms, "
        f"max {max(setup_s) * 1000:.0f} ms"
    )
    print(
        f"memory of one sandbox's processes (browser, driver, sites; PSS): {mib[len(mib) // 2]:.0f} MiB p50, {mib[-1]:.0f} MiB max"
    )
    print(f"{'driver':45s} {'tab p50':>9s} {'tab p99':>9s} {'nav p50':>9s} {'nav p99':>9s} {'shot p50':>9s}")
    for name, times in results.items():
        print(
            f"{name:45s} {_p(times['tab'], 0.5):8.0f}ms {_p(times['tab'], 0.99):8.0f}ms "
            f"{_p(times['navigate'], 0.5):8.0f}ms {_p(times['navigate'], 0.99):8.0f}ms {_p(times['screenshot'], 0.5):8.0f}ms"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapter", default="local")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--setups", type=int, default=5, help="sandboxes set up one after another (default 5)")
    parser.add_argument("--no-playwright", dest="playwright", action="store_false", help="only the in-sandbox driver")
    args = parser.parse_args()
    oa.run(main, args.adapter, args.steps, args.setups, args.playwright)
