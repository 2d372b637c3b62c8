"""Render ``resources/hearth.svg`` to the PNG sizes of the hicolor icon theme (Qt, offscreen).

    python packaging/render_icons.py OUT_DIR     →  OUT_DIR/<n>x<n>/apps/hearth.png, OUT_DIR/scalable/apps/hearth.svg
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

SIZES = (16, 24, 32, 48, 64, 128, 256, 512)
SVG = Path(__file__).resolve().parent.parent / "resources" / "hearth.svg"


def render(out: Path) -> list[Path]:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    _app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])
    renderer = QSvgRenderer(str(SVG))
    if not renderer.isValid():
        raise ValueError(f"{SVG} is not a valid SVG")
    made = []
    for n in SIZES:
        image = QImage(n, n, QImage.Format.Format_ARGB32)
        image.fill(Qt.GlobalColor.transparent)
        painter = QPainter(image)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        renderer.render(painter)
        painter.end()
        path = out / f"{n}x{n}" / "apps" / "hearth.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        if not image.save(str(path)):
            raise OSError(f"could not write {path}")
        made.append(path)
    scalable = out / "scalable" / "apps" / "hearth.svg"
    scalable.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SVG, scalable)
    return made + [scalable]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: render_icons.py OUT_DIR", file=sys.stderr)
        return 2
    try:
        made = render(Path(args[0]))
    except (OSError, ValueError) as exc:
        print(f"render_icons: error: {exc}", file=sys.stderr)
        return 1
    print(f"rendered {len(made)} icons into {args[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
