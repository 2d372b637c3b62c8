"""Data files shipped with Hearth: the model manifest, icons, stylesheet, desktop entry."""

from importlib.resources import files


def resource_text(name: str) -> str:
    return files(__name__).joinpath(name).read_text(encoding="utf-8")
