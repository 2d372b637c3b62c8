"""Issue 18, the transcript: code blocks (highlighted, labelled, a Copy link per block, on light and dark
palettes), bare URLs as links, the over-long message (defect 3), a last message with no reply, and edit
mode (defect 14). Real engine thread with the tiny model (256-token context), real SQLite, real widgets."""

from __future__ import annotations

import re

from PySide6.QtCore import QPoint, Qt, QUrl
from PySide6.QtGui import QColor, QGuiApplication, QPalette, QTextCursor

from app.conversation_events import TurnStarted
from app.markdown_view import code_background, contrast, highlight, render
from app.transcript import MessageWidget, TranscriptView, copy_to_clipboard, open_link

from .qt_helpers import TIMEOUT, send, use_settings, wait_idle

STOP = {"temperature": 0.0, "max_new_tokens": 8}
CODE_REPLY = ("Two ways:\n\n```python\ndef add(a, b):\n    return a + b  # sum\n```\n\nand in shell:\n\n"
              "```bash\necho \"hi\" | wc -c\n```\n\nDocs at https://docs.python.org/3/.")


def dark_palette() -> QPalette:
    p = QPalette()
    for role, colour in ((QPalette.ColorRole.Window, "#202124"), (QPalette.ColorRole.Base, "#1b1b1d"),
                         (QPalette.ColorRole.Text, "#e8e8e8"), (QPalette.ColorRole.WindowText, "#e8e8e8"),
                         (QPalette.ColorRole.Link, "#8ab4f8"), (QPalette.ColorRole.Highlight, "#3d6fd6")):
        p.setColor(role, QColor(colour))
    return p


def light_palette() -> QPalette:
    p = QPalette()
    for role, colour in ((QPalette.ColorRole.Window, "#efefef"), (QPalette.ColorRole.Base, "#ffffff"),
                         (QPalette.ColorRole.Text, "#1a1a1a"), (QPalette.ColorRole.Link, "#0b57d0")):
        p.setColor(role, QColor(colour))
    return p


def fragment_colours(body) -> dict[str, str]:
    """Each run of text in a message body → its foreground colour."""
    out = {}
    block = body.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            out.setdefault(frag.text().strip(), frag.charFormat().foreground().color().name())
            it += 1
        block = block.next()
    return out


def anchor_point(body, href: str) -> QPoint:
    """Where the link ``href`` is drawn in a message body's viewport."""
    doc = body.document()
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            if frag.charFormat().anchorHref() == href:
                cursor = QTextCursor(doc)
                cursor.setPosition(frag.position() + 1)
                return body.cursorRect(cursor).center()
            it += 1
        block = block.next()
    raise AssertionError(f"no link {href!r} in the message")


# code blocks ----------------------------------------------------------------------------------------------
def test_code_blocks_are_highlighted_labelled_and_each_copy_link_copies_exactly_its_code(qtbot):
    view = TranscriptView()
    qtbot.addWidget(view)
    view.copy_requested.connect(copy_to_clipboard)
    view.resize(700, 600)
    view.show()
    w = view.add(3, "assistant", CODE_REPLY)
    assert w.codes == ['def add(a, b):\n    return a + b  # sum', 'echo "hi" | wc -c']
    text = w.body.toPlainText()
    assert "python" in text and "bash" in text and text.count("Copy") == 2  # the label and link per block
    # highlighted: the keyword is drawn in a colour of its own, unlike the plain text around it
    colours = fragment_colours(w.body)
    # the keyword, the function's name, a string and a comment each in a colour of its own
    assert len({colours["def"], colours["add"], colours['"hi"'], colours["# sum"], colours["Two ways:"]}) == 5
    QGuiApplication.clipboard().setText("")
    qtbot.waitUntil(lambda: w.body.height() > 100, timeout=TIMEOUT)
    qtbot.mouseClick(w.body.viewport(), Qt.MouseButton.LeftButton, pos=anchor_point(w.body, "copy:1"))
    assert QGuiApplication.clipboard().text() == 'echo "hi" | wc -c'
    qtbot.mouseClick(w.body.viewport(), Qt.MouseButton.LeftButton, pos=anchor_point(w.body, "copy:0"))
    assert QGuiApplication.clipboard().text() == 'def add(a, b):\n    return a + b  # sum'


def test_a_copy_link_to_a_block_that_does_not_exist_copies_nothing(qtbot):
    w = MessageWidget(1, "assistant", CODE_REPLY)
    qtbot.addWidget(w)
    copied = []
    w.copy_requested.connect(copied.append)
    w.body.anchorClicked.emit(QUrl("copy:7"))  # a forged link in model output: not one of this message's blocks
    w.body.anchorClicked.emit(QUrl("copy:-1"))
    assert copied == []
    w.body.anchorClicked.emit(QUrl("copy:0"))
    assert copied == ['def add(a, b):\n    return a + b  # sum']


def test_code_colours_come_from_the_palette_and_stay_readable_on_light_and_dark(qapp):
    for palette in (light_palette(), dark_palette()):
        html = render(CODE_REPLY, palette).html
        background = QColor(code_background(palette))
        assert f'bgcolor="{background.name()}"' in html  # the block's shade is mixed from Base and Text
        colours = set(re.findall(r"color:(#[0-9a-f]{6});", html))
        assert len(colours) >= 3
        for colour in colours:
            assert contrast(QColor(colour), background) >= 4.0, (colour, background.name())
    # a dark palette gets a dark block, a light one a light block: never a fixed white or black
    assert QColor(code_background(dark_palette())).lightness() < 60
    assert QColor(code_background(light_palette())).lightness() > 200


def test_a_new_palette_redraws_the_code_colours(qtbot):
    w = MessageWidget(1, "assistant", CODE_REPLY)
    qtbot.addWidget(w)
    w.setPalette(light_palette())
    assert f'bgcolor="{code_background(light_palette())}"' in w.body.toHtml()
    w.setPalette(dark_palette())  # the theme switched to dark
    assert f'bgcolor="{code_background(dark_palette())}"' in w.body.toHtml()


def test_an_unknown_language_is_shown_plain_and_escaped(qapp):
    rendered = render("```nosuchlanguage\n<b>x</b> & y\n```", qapp.palette())
    assert "&lt;b&gt;x&lt;/b&gt; &amp; y" in rendered.html and "<b>x</b>" not in rendered.html
    assert "nosuchlanguage" in rendered.html and rendered.codes == ["<b>x</b> & y"]


def test_a_streamed_reply_does_not_highlight_its_finished_blocks_again(qapp):
    palette = qapp.palette()
    finished = "```python\n" + "\n".join(f"x{i} = {i}" for i in range(40)) + "\n```\n\n"
    highlight.cache_clear()
    render(finished + "```python\nprint(1", palette)
    misses = highlight.cache_info().misses
    render(finished + "```python\nprint(1)\nprint(2", palette)  # the next 50 ms tick: one block grew
    info = highlight.cache_info()
    assert info.hits == 1 and info.misses == misses + 1


# links ----------------------------------------------------------------------------------------------------
def test_bare_urls_become_links_without_their_trailing_punctuation(qapp):
    html = render("See https://example.com/a_b?x=1. Mail mailto:me@example.com, or `https://in.code`.",
                  qapp.palette()).html
    assert '<a href="https://example.com/a_b?x=1">https://example.com/a_b?x=1</a>.' in html
    assert '<a href="mailto:me@example.com">mailto:me@example.com</a>,' in html
    assert '<code>https://in.code</code>' in html  # code stays code


def test_only_http_https_and_mailto_links_are_opened(qapp):
    for bad in ("file:///etc/passwd", "javascript:alert(1)", "hearth:thing", "ftp://example.com/x"):
        assert open_link(QUrl(bad)) is False


# defect 3: the over-long message -------------------------------------------------------------------------
def test_defect3_over_long_message_is_an_error_block_with_actions_and_no_empty_reply(qtbot, windows):
    w = windows()
    other = w.new_chat()
    use_settings(w, STOP)
    send(qtbot, w, "hello")
    wait_idle(qtbot, w)
    conv = w.new_chat()
    use_settings(w, STOP)
    long_message = "word " * 300  # the tiny model reads 256 tokens
    w.composer.setPlainText(long_message)
    w.composer.submit()
    block = w.transcript.context_limit
    qtbot.waitUntil(block.isVisible, timeout=TIMEOUT)
    wait_idle(qtbot, w)
    assert "too long" in block.title.text() and "but the model reads at most 256" in block.message.text()
    assert block.edit_button.isVisible()
    assert w.transcript.messages == []  # no empty "…" reply, no unstored message left behind
    assert w.transcript.empty_hint.isHidden()  # not "Start the conversation below." above the error
    assert w.store.messages(conv) == [] and w.composer.toPlainText() == long_message
    assert not w.transcript.horizontalScrollBar().isVisible()
    assert w.transcript.widget().width() <= w.transcript.viewport().width()
    # Edit: the caret goes to the end of the message, given back in the message box
    w.composer.moveCursor(QTextCursor.MoveOperation.Start)
    qtbot.mouseClick(block.edit_button, Qt.MouseButton.LeftButton)
    assert w.composer.textCursor().position() == len(long_message)
    # away and back: the block is still there, not a message that silently went nowhere
    w.sidebar.setCurrentItem(w.sidebar.item_for(other))
    assert w.current == other and block.isHidden()
    w.sidebar.setCurrentItem(w.sidebar.item_for(conv))
    qtbot.waitUntil(block.isVisible, timeout=TIMEOUT)
    assert "but the model reads at most 256" in block.message.text()


def test_defect3_long_unbroken_text_wraps_and_never_scrolls_sideways(qtbot):
    view = TranscriptView()
    qtbot.addWidget(view)
    view.resize(600, 500)
    view.show()
    user = view.add(1, "user", "x" * 4000)
    reply = view.add(2, "assistant", "```text\n" + "y" * 800 + "\n```\n" + "z" * 600)
    reply.set_note("⚠ " + "a very long note about what went wrong " * 10)
    qtbot.waitUntil(lambda: reply.body.height() > 100, timeout=TIMEOUT)
    assert not view.horizontalScrollBar().isVisible()
    width = view.viewport().width()
    assert view.widget().width() <= width
    for message in (user, reply):
        assert message.body.document().idealWidth() <= message.body.viewport().width() + 1
    # the Copy button stays inside the message, however long the note
    assert reply.copy_button.geometry().right() <= reply.width()


def test_defect3_coming_back_to_an_unanswered_message_offers_to_answer_or_edit_it(qtbot, windows):
    w = windows()
    conv = w.new_chat()
    use_settings(w, STOP)
    w.store.append(conv, "user", "hello there")  # its turn never finished (the app closed, the turn failed)
    other = w.new_chat()
    assert w.current == other
    w.sidebar.setCurrentItem(w.sidebar.item_for(conv))
    block = w.transcript.unanswered
    qtbot.waitUntil(block.isVisible, timeout=TIMEOUT)
    assert block.answer_button.isVisible() and block.edit_button.isVisible()
    # Edit: the message is edited in place
    qtbot.mouseClick(block.edit_button, Qt.MouseButton.LeftButton)
    assert w.chat.editing == w.store.messages(conv)[0].seq and w.composer.toPlainText() == "hello there"
    w.chat.cancel_edit()
    # Answer it: a reply is written and stored; the block goes
    qtbot.mouseClick(block.answer_button, Qt.MouseButton.LeftButton)
    wait_idle(qtbot, w)
    assert [m.role for m in w.store.messages(conv)] == ["user", "assistant"]
    assert block.isHidden() and [m.role for m in w.transcript.messages] == ["user", "assistant"]


def test_defect3_a_reply_stopped_before_its_first_word_leaves_a_block_not_an_empty_reply(qtbot, windows):
    w = windows()
    conv = w.new_chat()
    use_settings(w, STOP)
    w.store.append(conv, "user", "hello there")
    w.chat.show_chat(conv)
    # Stop pressed before the model wrote a word (before it even began)
    w.turns.events.on(TurnStarted, lambda e: w.turns.stop(e.conversation))
    w.turns.answer(conv)
    wait_idle(qtbot, w)
    assert [m.role for m in w.store.messages(conv)] == ["user"]
    assert w.transcript.unanswered.isVisible() and "stopped" in w.transcript.unanswered.reason.text()
    assert [m.role for m in w.transcript.messages] == ["user"]  # no empty reply under it


# defect 14: edit mode -------------------------------------------------------------------------------------
def test_defect14_edit_mode_puts_the_caret_at_the_end_and_highlights_the_message(qtbot, windows):
    w = windows()
    conv = w.new_chat()
    use_settings(w, STOP)
    send(qtbot, w, "first question")
    wait_idle(qtbot, w)
    user, reply = w.transcript.messages
    edit = next(b for b in user.findChildren(type(user.copy_button)) if b.text() == "Edit")
    qtbot.mouseClick(edit, Qt.MouseButton.LeftButton)
    assert w.chat.editing == w.store.messages(conv)[0].seq
    assert w.composer.textCursor().position() == len("first question")
    highlight_colour = w.palette().color(QPalette.ColorRole.Highlight).name()
    assert user.editing and highlight_colour in user.styleSheet()
    assert not reply.editing and reply.styleSheet() == ""
    # the hint is normal text, not the disabled grey, and says how to save and cancel
    assert w.edit_note.isVisible() and w.edit_note.isEnabled()
    assert "Enter" in w.edit_note.text() and "Esc" in w.edit_note.text()
    w.chat.escape()
    assert w.chat.editing is None and not user.editing and user.styleSheet() == ""
    assert not w.edit_note.isVisible()


def test_the_new_controls_have_accessible_names(qtbot):
    from PySide6.QtWidgets import QPushButton

    from app.context_blocks import ContextLimitBlock, UnansweredBlock

    for block in (ContextLimitBlock(), UnansweredBlock()):
        qtbot.addWidget(block)
        buttons = block.findChildren(QPushButton)
        assert buttons and all(b.accessibleName() for b in buttons)
        assert block.accessibleName()


def test_a_streamed_reply_appends_what_it_can_and_shows_the_same_as_drawing_it_whole(qtbot):
    streamed, whole = MessageWidget(-1, "assistant", ""), MessageWidget(-1, "assistant", "")
    for w in (streamed, whole):
        qtbot.addWidget(w)
        w.resize(700, 400)
    for at in range(1, len(CODE_REPLY) + 1, 7):  # the reply arrives a few characters at a time
        part = CODE_REPLY[:at]
        streamed.show_partial(part)
        whole.set_text(part)
        # (a code line's newline shows at once when appended; drawn whole, it waits for the next line)
        assert streamed.body.toPlainText().rstrip("\n") == whole.body.toPlainText().rstrip("\n"), part
    midway = CODE_REPLY[:CODE_REPLY.index("return")]  # inside the first code block
    whole.set_text(midway)
    assert "python · writing…" in whole.body.toPlainText()  # the open block: no Copy link yet
    streamed.set_text(CODE_REPLY)  # the end of the stream: drawn whole, highlighted, with its Copy links
    assert streamed.codes == ['def add(a, b):\n    return a + b  # sum', 'echo "hi" | wc -c']


def test_only_growth_that_renders_the_same_is_appended(qapp):
    from app.markdown_view import appendable

    assert appendable("Hello wor", "Hello world and") == "ld and"
    assert appendable("```py\nx = 1", "```py\nx = 1\ny = 2") == "\ny = 2"  # more lines of an open block
    assert appendable("```py\nx = 1\n", "```py\nx = 1\n```") is None  # the block closed
    assert appendable("Hello wor", "Hello **world") is None  # Markdown may apply
    assert appendable("Hello wor", "Goodbye") is None  # not a continuation: drawn whole
    assert appendable("Hello", "Hello\nthere") is None  # a new line outside code
    assert appendable("see ht", "see http://x") is None  # a URL in the making
    assert appendable("", "Hi") is None


def test_clicking_a_bare_url_opens_it_through_the_desktop(qtbot):
    from PySide6.QtCore import QObject, Slot
    from PySide6.QtGui import QDesktopServices

    class Opened(QObject):  # Qt's own hook for where a scheme's URLs go (instead of a browser, in a test)
        def __init__(self):
            super().__init__()
            self.urls: list[str] = []

        @Slot(QUrl)
        def open(self, url: QUrl) -> None:
            self.urls.append(url.toString())

    opened = Opened()
    QDesktopServices.setUrlHandler("https", opened, "open")
    try:
        view = TranscriptView()
        qtbot.addWidget(view)
        view.resize(700, 500)
        view.show()
        w = view.add(2, "assistant", "Docs at https://docs.python.org/3/.")
        href = "https://docs.python.org/3/"
        qtbot.waitUntil(lambda: w.body.anchorAt(anchor_point(w.body, href)) == href, timeout=TIMEOUT)
        qtbot.mouseClick(w.body.viewport(), Qt.MouseButton.LeftButton, pos=anchor_point(w.body, href))
        assert opened.urls == ["https://docs.python.org/3/"]
    finally:
        QDesktopServices.unsetUrlHandler("https")


def test_the_highlighting_warm_up_knows_every_language_it_names_and_ends():
    import threading

    from pygments.lexers import get_lexer_by_name

    from app.markdown_view import COMMON_LANGUAGES, warm_up_highlighting

    for language in COMMON_LANGUAGES:
        get_lexer_by_name(language)  # a misspelt name would raise ClassNotFound here
    warm_up_highlighting()
    for t in [t for t in threading.enumerate() if t.name == "hearth-pygments-warm-up"]:
        t.join(timeout=30)
        assert not t.is_alive()
