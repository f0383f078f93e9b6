"""The README's picture of `watch`: the whole-run section of a real report.html, as headless
Chromium draws it (run by hand; needs Chromium, chromedriver, selenium and pillow, as the
browser tests do).

    python docs/watch_picture.py [REPORT_HTML] [--out docs/img/watch-slowdown.png]

Without REPORT_HTML it first runs `stallscope watch examples/watch_cases.py --case slowdown`
into a temporary folder (about 20 s). The picture spans the page from the section's heading to
the end of its list of captures.
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image
from selenium import webdriver
from selenium.webdriver.common.by import By

ROOT = Path(__file__).resolve().parents[1]


def report(out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "stallscope", "watch", "-q", "-o", str(out),
                    str(ROOT / "examples" / "watch_cases.py"), "--case", "slowdown"],
                   check=True, cwd=out.parent)
    return out / "report.html"


def shoot(page: Path, dest: Path) -> None:
    options = webdriver.ChromeOptions()
    options.binary_location = next(p for p in map(shutil.which, ("chromium", "google-chrome"))
                                   if p)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                "--force-device-scale-factor=1"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options)
    try:
        driver.set_window_size(1000, 3000)
        driver.get(page.resolve().as_uri())
        top = driver.find_element(By.ID, "whole-run").rect
        last = driver.find_element(By.ID, "watch-captures").rect
        shot = Image.open(io.BytesIO(driver.get_screenshot_as_png()))
        box = (0, int(top["y"]) - 8, shot.width, int(last["y"] + last["height"]) + 8)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shot.crop(box).save(dest, optimize=True)
    finally:
        driver.quit()
    print(f"{dest}: {dest.stat().st_size / 1e3:.0f} kB")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("report", nargs="?", type=Path)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "watch-slowdown.png")
    a = p.parse_args()
    if a.report is not None:
        shoot(a.report, a.out)
        return
    with tempfile.TemporaryDirectory() as tmp:
        shoot(report(Path(tmp) / "out"), a.out)


if __name__ == "__main__":
    main()
