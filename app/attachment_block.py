"""An attachment in the transcript: a collapsed block (app/collapsible_block.py) with its name, kind and size;
expanding it shows the extracted text, as plain text (never HTML or Markdown: a document is anyone's)."""

from __future__ import annotations

from PySide6.QtWidgets import QWidget

from app.attachment_text import describe
from app.collapsible_block import DISPLAY_CHARS, TEXT_HEIGHT_PX, CollapsibleBlock

__all__ = ["DISPLAY_CHARS", "TEXT_HEIGHT_PX", "AttachmentBlock"]


class AttachmentBlock(CollapsibleBlock):
    def __init__(self, attachment, parent: QWidget | None = None):
        self.attachment = attachment
        label = describe(attachment.name, attachment.kind, attachment.size, attachment.pages)
        super().__init__(label, attachment.text, ("Show the text Hearth read from this file", "Hide the text"),
                         f"Text of {attachment.name}", parent, "attachmentBlock")

    def _describe(self) -> None:
        super()._describe()
        self.toggle.setAccessibleName(f"Attachment {self.toggle.text()}: show its text")
