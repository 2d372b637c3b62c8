"""Browser benchmark (not a test): what a keystroke in the browser's search box costs end to end —
the search, refilling the table and painting it — at 10,000 conversations and 200,000 messages.

    QT_QPA_PLATFORM=offscreen python bench/browser_search.py

Uses the store and the queries of ``bench/search.py``; prints p50 / p95 / max per keystroke and writes
bench/results/browser_search.json. Target: p95 under 50 ms.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
_spec = importlib.util.spec_from_file_location("bench_search", ROOT / "bench" / "search.py")
bench_search = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_search)


def main() -> None:
    from PySide6.QtWidgets import QApplication

    from app.config import AppConfig
    from app.main_window import MainWindow
    from engine.paths import resolve_paths

    app = QApplication.instance() or QApplication([])  # noqa: F841 - kept alive for the run
    paths = resolve_paths(Path(tempfile.mkdtemp(prefix="hearth-browser-"))).ensure()
    bench_search.build(paths.conversations_db, 10_000, 200_000)
    window = MainWindow(AppConfig(paths), start_engine=False)
    started = time.perf_counter()
    window.show_browser()
    app.processEvents()
    open_ms = (time.perf_counter() - started) * 1000
    browser, times = window.browser, []
    for query in bench_search.QUERIES:
        browser.query.clear()
        for ch in query:
            t = time.perf_counter()
            browser.query.insert(ch)  # textChanged → search → table → paint
            app.processEvents()
            times.append((time.perf_counter() - t) * 1000)
    window.host.stop()
    times.sort()
    result = {"open_ms": round(open_ms, 1), "keystrokes": len(times), "p50_ms": round(times[len(times) // 2], 2),
              "p95_ms": round(times[int(0.95 * len(times))], 2), "max_ms": round(times[-1], 2)}
    print(f"open the browser: {result['open_ms']} ms; {len(times)} keystrokes: p50 {result['p50_ms']} ms, "
          f"p95 {result['p95_ms']} ms, max {result['max_ms']} ms (target p95 < 50 ms)")
    out = ROOT / "bench" / "results" / "browser_search.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
