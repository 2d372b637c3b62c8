"""Take the README's dialog screenshots (offscreen; no model needed):

    QT_QPA_PLATFORM=offscreen python docs/screenshots/take_dialogs.py

Writes preferences.png (Edit → Preferences…) and settings.png (a chat's settings, showing which values
it inherits) next to this file.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def main() -> None:
    from PySide6.QtWidgets import QApplication

    from app.preferences import PreferencesDialog
    from app.settings_dialog import ChatSettingsDialog
    from engine.api import Preferences, effective_settings, resolve_paths

    _app = QApplication.instance() or QApplication([])  # kept alive for the whole run
    paths = resolve_paths(tempfile.mkdtemp(prefix="hearth-shots-")).ensure()
    prefs = Preferences(system_prompt="You are a concise assistant. Answer in plain English.", temperature=0.6,
                        max_new_tokens=768, context_policy="drop_oldest")
    shots = {
        "preferences.png": PreferencesDialog(paths, prefs),
        "settings.png": ChatSettingsDialog("You are a careful reviewer of Python code.", {"temperature": 0.2, "seed": 42},
                                           inherited=effective_settings(prefs, {}, {})),
    }
    for name, dialog in shots.items():
        dialog.show()
        _app.processEvents()
        dialog.grab().save(str(HERE / name))
        dialog.close()
    print("wrote", *shots)


if __name__ == "__main__":
    main()
