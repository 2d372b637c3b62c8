"""An agent's parts of a message in the transcript (issue 30), each a collapsed block
(app/collapsible_block.py): a reply's thinking ("Thinking…" while it streams, then "Thought for 12 s"), each
tool call it made (the function's name; expanded, its arguments as indented JSON) and a tool's result."""

from __future__ import annotations

from PySide6.QtWidgets import QWidget

from app.collapsible_block import CollapsibleBlock
from engine.api import pretty_arguments

THINKING_HINTS = ("Show what the model thought before it answered", "Hide the thinking")


def thought_title(thought_ms: int | None, streaming: bool = False) -> str:
    """The thinking block's header: "Thinking…" while it streams, then how long it took, in whole seconds
    ("<1 s" below half a second: "0 s" reads as if nothing happened), or "Thought" when not known (an import)."""
    if streaming:
        return "Thinking…"
    if thought_ms is None:
        return "Thought"
    seconds = round(thought_ms / 1000)
    return f"Thought for {seconds} s" if seconds else "Thought for <1 s"


class ThinkingBlock(CollapsibleBlock):
    """A reply's thinking: collapsed by default; while it streams its header says so and an expanded block
    shows each piece as it comes."""

    def __init__(self, text: str = "", thought_ms: int | None = None, streaming: bool = False,
                 parent: QWidget | None = None):
        self.streaming = streaming
        self.thought_ms = thought_ms
        super().__init__(thought_title(thought_ms, streaming), text, THINKING_HINTS, "The model's thinking", parent,
                         "thinkingBlock")

    def finish(self, text: str, thought_ms: int | None) -> None:
        """It stopped thinking: the whole thinking (as stored) and how long it took."""
        self.streaming, self.thought_ms = False, thought_ms
        if text != self.text:
            self.set_text(text)
        self.set_title(thought_title(thought_ms))


class ToolCallBlock(CollapsibleBlock):
    def __init__(self, call, parent: QWidget | None = None):
        self.call = call  # engine.api's ToolCall
        super().__init__(f"Tool call: {call.name}", pretty_arguments(call.arguments),
                         ("Show the call's arguments", "Hide the arguments"), f"Arguments of the call to {call.name}",
                         parent, "toolCallBlock")


# How a call Hearth ran or refused ended (schema 11's tool_runs) → the block's title: a failure or a call that did
# not run reads as such while the block is collapsed, not only once it is opened.
RESULT_TITLES = {"error": "Tool failed", "denied": "Tool not run (denied)", "abandoned": "Tool not run"}


def result_title(name: str, state: str = "") -> str:
    head = RESULT_TITLES.get(state, "Tool result")
    return f"{head}: {name}" if name else head


class ToolResultBlock(CollapsibleBlock):
    def __init__(self, result: str, name: str = "", call_id: str = "", parent: QWidget | None = None,
                 state: str = ""):
        self.name, self.call_id, self.state = name, call_id, state
        super().__init__(result_title(name, state), pretty_arguments(result),
                         ("Show what the tool returned", "Hide the result"),
                         f"Result of {name or 'the tool'}", parent, "toolResultBlock")
        self.setToolTip(f"Answers the call {call_id}" if call_id else "")
