"""Light and dark colours for the whole app, and following the system's colour scheme.

Both themes are Fusion palettes defined here (Fusion draws the same on every platform, so the contrast
checked in the tests is the contrast people see). "System" picks one of them from the OS colour scheme
(``QStyleHints.colorScheme()``) and switches when the OS does.
"""

from __future__ import annotations

import logging
from enum import StrEnum
from pathlib import Path

from PySide6.QtCore import QObject, QSettings, Qt, Signal
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

log = logging.getLogger(__name__)
MIN_CONTRAST = 4.5  # WCAG AA for normal text


class ThemeMode(StrEnum):
    SYSTEM = "system"
    LIGHT = "light"
    DARK = "dark"


def parse_mode(value: object) -> ThemeMode:
    """A stored choice, or System when it is missing or not one we know (a hand-edited settings file)."""
    try:
        return ThemeMode(str(value).strip().lower()) if value is not None else ThemeMode.SYSTEM
    except ValueError:
        log.warning("unknown theme %r in the settings file; following the system", value)
        return ThemeMode.SYSTEM


R = QPalette.ColorRole
G = QPalette.ColorGroup

# role → colour, for the active/inactive groups; DISABLED_* for disabled widgets and dim notes.
LIGHT = {
    R.Window: "#f3f3f3", R.WindowText: "#1c1c1c", R.Base: "#ffffff", R.AlternateBase: "#f4f5f7",
    R.Text: "#1c1c1c", R.Button: "#e9e9e9", R.ButtonText: "#1c1c1c", R.BrightText: "#ffffff",
    R.Highlight: "#2a64b8", R.HighlightedText: "#ffffff", R.ToolTipBase: "#fffff0", R.ToolTipText: "#1c1c1c",
    R.PlaceholderText: "#62666d", R.Link: "#1a56a8", R.LinkVisited: "#6b3fa8",
    R.Light: "#ffffff", R.Midlight: "#f0f0f0", R.Mid: "#b8b8b8", R.Dark: "#9c9c9c", R.Shadow: "#707070",
}
DARK = {
    R.Window: "#202226", R.WindowText: "#e6e6e6", R.Base: "#17181b", R.AlternateBase: "#24262b",
    R.Text: "#e6e6e6", R.Button: "#2d3036", R.ButtonText: "#e6e6e6", R.BrightText: "#ffffff",
    R.Highlight: "#2f5fa6", R.HighlightedText: "#ffffff", R.ToolTipBase: "#2d3036", R.ToolTipText: "#e6e6e6",
    R.PlaceholderText: "#9a9ea6", R.Link: "#8ab4f8", R.LinkVisited: "#c3a6f5",
    R.Light: "#3a3d44", R.Midlight: "#32353b", R.Mid: "#4a4e56", R.Dark: "#111214", R.Shadow: "#000000",
}
DISABLED_LIGHT = {R.WindowText: "#5f6368", R.Text: "#5f6368", R.ButtonText: "#5f6368", R.Button: "#eeeeee"}
DISABLED_DARK = {R.WindowText: "#9a9ea6", R.Text: "#9a9ea6", R.ButtonText: "#9a9ea6", R.Button: "#26282d"}


def palette(dark: bool) -> QPalette:
    pal = QPalette()
    for role, colour in (DARK if dark else LIGHT).items():
        pal.setColor(role, QColor(colour))
    for role, colour in (DISABLED_DARK if dark else DISABLED_LIGHT).items():
        pal.setColor(G.Disabled, role, QColor(colour))
    return pal


def luminance(colour: QColor) -> float:
    """WCAG relative luminance."""
    def channel(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    return 0.2126 * channel(colour.redF()) + 0.7152 * channel(colour.greenF()) + 0.0722 * channel(colour.blueF())


def contrast(a: QColor, b: QColor) -> float:
    """WCAG contrast ratio, 1 (none) to 21 (black on white)."""
    la, lb = sorted((luminance(a), luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


ERROR_LIGHT, ERROR_DARK = "#b3261e", "#ff8a80"  # error text: ≥ 4.5:1 on each theme's window colour


def error_colour(pal: QPalette) -> str:
    """The colour for error text on ``pal`` (a fixed red reads at only ~2.7:1 on the dark theme)."""
    return ERROR_DARK if pal.color(QPalette.ColorRole.Window).lightness() < 128 else ERROR_LIGHT


def system_is_dark() -> bool:
    return QGuiApplication.styleHints().colorScheme() == Qt.ColorScheme.Dark


class ThemeController(QObject):
    """Applies the chosen theme to the application and re-applies it when the OS scheme changes
    (while the choice is System). ``changed(dark)`` fires after every palette switch."""

    changed = Signal(bool)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.mode = ThemeMode.SYSTEM
        self.dark: bool | None = None
        QGuiApplication.styleHints().colorSchemeChanged.connect(self.on_system_scheme_changed)

    def set_mode(self, mode: ThemeMode) -> None:
        self.mode = mode
        self._apply(system_is_dark() if mode == ThemeMode.SYSTEM else mode == ThemeMode.DARK)

    def on_system_scheme_changed(self, scheme: Qt.ColorScheme) -> None:
        """The OS switched between light and dark: follow it unless a theme was chosen."""
        if self.mode == ThemeMode.SYSTEM:
            self._apply(scheme == Qt.ColorScheme.Dark)

    def _apply(self, dark: bool) -> None:
        if apply_palette(dark):
            self.dark = dark
            self.changed.emit(dark)


def apply_palette(dark: bool) -> bool:
    """Use the dark or light palette app-wide; False when there is no application yet."""
    app = QApplication.instance()
    if app is None:
        return False
    if app.style().name().lower() != "fusion":
        app.setStyle("Fusion")  # the palettes above are designed (and contrast-checked) for Fusion
    app.setPalette(palette(dark))
    repolish_styled(app)
    return True


def apply_saved_theme(settings_file: Path) -> None:
    """Before the window exists (the database check may show a dialog): the remembered theme, once.
    The window's ThemeController takes over from there, following the system when asked to."""
    mode = parse_mode(QSettings(str(settings_file), QSettings.Format.IniFormat).value("theme"))
    apply_palette(system_is_dark() if mode == ThemeMode.SYSTEM else mode == ThemeMode.DARK)


def repolish_styled(app: QApplication) -> None:
    """A widget with a style sheet (and its children) keeps the palette it was polished with: set the
    sheet again so banners, message bodies and the like take the new colours."""
    for widget in app.allWidgets():
        if widget.styleSheet():
            widget.setStyleSheet(widget.styleSheet())
