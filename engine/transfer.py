"""Export conversations to Markdown or JSON, and import JSON back, validated, all or nothing.

The JSON format (``hearth.conversations``, version 1) holds everything needed to recreate a
conversation exactly: ids, titles, system prompts, settings, model label, timestamps and messages; a
reply also carries the model that wrote it (``"model"``, "" when not known) and why it ended
(``"finish_reason"``, a StopReason value or null). Both are optional: documents from before them import
with neither, and readers from before ignore them (so the version stays 1).
A user message with attached files (engine/documents.py) also carries ``"typed_text"`` (the person's words)
and ``"attachments"``: a list of ``{"name", "size", "sha256", "kind", "pages", "text"}``; its ``"content"`` is
the composed text the model read, and an import checks that it is exactly ``compose_message(typed_text,
attachments)`` (so what the chat shows and what the model reads cannot differ), within the caps of
engine/documents.py. Optional too: older readers import the composed content alone.
An agent's turns (issue 30) carry optional fields too: a reply its thinking (``"reasoning"``, and
``"thought_ms"``, how long it thought) and the calls it made (``"tool_calls"``, OpenAI's list, arguments a JSON
string), and a message of role ``"tool"`` (a tool's result) the ``"tool_call_id"`` it answers and the tool's
``"name"``, each bounded as the store bounds them (engine/tool_messages.py). A reader from before refuses the
role "tool" by name; documents without them import as before.
A regenerated reply is exported as the version the chat continues with; its earlier versions (the
``alternatives`` table) stay behind, so documents and bundles keep this format and old ones import as before.
Exporting, importing into an empty store and exporting again gives the same document. An import is
checked completely before anything is written; the first problem is reported with its place in the
file (``conversations[3].messages[7].role``) and nothing is imported.

Limits, checked before anything is written: the file is at most ``MAX_IMPORT_BYTES`` (256 MiB, checked
before it is read), nests no deeper than the parser's own guard allows (about 1,000 levels; the
document itself needs 5, and a conversation's settings at most ``MAX_SETTINGS_DEPTH`` more), and holds
only real Unicode text (a lone UTF-16 surrogate such as ``"\\ud800"`` cannot be stored). The checked
conversations then go in by ``engine.importer``: in batches, hidden until the last one, removed on
failure or Cancel.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

from engine import documents, tool_messages
from engine.conversations import MODEL_CHARS, ConversationStore, agent_row
from engine.db_schema import ID_PATTERN, ROLES
from engine.errors import AttachmentError, ConversationError, TransferError
from engine.fsutil import atomic_write, open_regular
from engine.importer import import_conversations
from engine.reply_notes import reply_caption
from engine.types import Attachment, CancelToken, Message, ReplyFacts, StopReason, openai_tool_calls

FORMAT, VERSION = "hearth.conversations", 1
MAX_IMPORT_BYTES = 256 << 20  # a bigger file is refused before it is read (1,000,000 small chats are ~115 MB)
MAX_CONVERSATIONS = 1_000_000
MAX_SETTINGS_DEPTH = 32  # a conversation's settings are a flat dict in practice
_SURROGATE = re.compile("[\ud800-\udfff]")
_SHA256 = re.compile("[0-9a-f]{64}")
_MD_SPECIAL = re.compile(r"[\\`*_\[\]<>#]")
FINISHES = frozenset(str(r) for r in StopReason)


def to_document(store: ConversationStore, ids: list[str]) -> dict:
    convs = []
    for cid in ids:
        c = store.require(cid)
        facts = store.reply_facts(cid)
        convs.append({"id": c.id, "title": c.title, "system_prompt": c.system_prompt, "settings": c.settings,
                      "model": c.model, "created_ms": c.created_ms, "updated_ms": c.updated_ms,
                      "messages": [_message(m, facts.get(m.seq)) for m in store.messages(cid)]})
    return {"format": FORMAT, "version": VERSION, "exported_ms": int(time.time() * 1000), "conversations": convs}


def _message(m: Message, facts: ReplyFacts | None) -> dict:
    """A message as exported; a reply also says which model wrote it ("" when not known) and why it ended
    (a StopReason value, null when not known): optional fields, so version 1 readers before them ignore
    them and documents without them import as before."""
    out = {"role": m.role, "content": m.content, "created_ms": m.created_ms}
    if m.attachments:
        out |= {"typed_text": m.typed_text,
                "attachments": [{"name": a.name, "size": a.size, "sha256": a.sha256, "kind": a.kind, "pages": a.pages,
                                 "text": a.text} for a in m.attachments]}
    if facts is not None:
        out |= {"model": facts.model, "finish_reason": facts.finish}
    if m.reasoning:
        out |= {"reasoning": m.reasoning, "thought_ms": m.thought_ms}
    if m.tool_calls:
        out["tool_calls"] = openai_tool_calls(m.tool_calls)
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    if m.name:
        out["name"] = m.name
    return out


def export_json(store: ConversationStore, ids: list[str], path: Path) -> int:
    data = json.dumps(to_document(store, ids), ensure_ascii=False, indent=1).encode("utf-8")
    with atomic_write(Path(path)) as fh:
        fh.write(data)
    return len(ids)


def to_markdown(store: ConversationStore, ids: list[str]) -> str:
    names = {"user": "You", "assistant": "Hearth", "system": "System", "tool": "Tool result"}
    parts = []
    for cid in ids:
        c = store.require(cid)
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(c.created_ms / 1000))
        parts.append(f"# {c.title or 'New chat'}\n\n*{when}{' · ' + c.model if c.model else ''}*\n")
        if c.system_prompt:
            parts.append(f"> **System prompt:** {c.system_prompt}\n")
        facts = store.reply_facts(cid)
        for m in store.messages(cid):
            if m.attachments:
                files = "".join(_md_attachment(a) for a in m.attachments)
                parts.append(f"## {names.get(m.role, m.role)}\n\n{files}{m.typed_text}\n")
            else:
                heading = f"{names['tool']}: {_md_escaped(m.name)}" if m.role == "tool" and m.name else names.get(m.role, m.role)
                parts.append(f"## {heading}\n\n{_md_agent(m)}{m.content}\n")
            if m.seq in facts and (caption := reply_caption(facts[m.seq].finish, facts[m.seq].model)):
                parts.append(f"_{_md_escaped(caption)}_\n")
    return "\n".join(parts)


def _md_attachment(a: Attachment) -> str:
    """An attached file as a readable section: its name, what it is, then its text in a fence no line of
    the text can close."""
    facts = [a.kind.upper() if a.kind in ("pdf", "docx", "csv", "json", "html") else a.kind, f"{a.size:,} bytes"]
    if a.pages is not None:
        facts.insert(1, f"{a.pages:,} page{'s' if a.pages != 1 else ''}")
    return f"### Attached: {_md_escaped(a.name)}\n\n*{' · '.join(facts)} · SHA-256 {a.sha256}*\n\n{_fenced(a.text)}\n"


def _md_agent(m: Message) -> str:
    """A reply's thinking (as a quote) and its tool calls (name, then the arguments in a fence), before its text;
    a tool result in a fence of its own is left to its content (it is the chat's text)."""
    out = ""
    if m.reasoning:
        took = f" for {m.thought_ms / 1000:.0f} s" if m.thought_ms is not None else ""
        quoted = "\n".join(f"> {line}" if line else ">" for line in m.reasoning.strip("\n").splitlines())
        out += f"> **Thought{took}**\n>\n{quoted}\n\n"
    for c in m.tool_calls:
        out += f"**Tool call:** `{c.name}`\n\n{_fenced(tool_messages.pretty_arguments(c.arguments), 'json')}\n"
    return out


def _fenced(text: str, info: str = "text") -> str:
    """``text`` in a code fence no line of it can close."""
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text.rstrip(chr(10))}\n{fence}\n"


def _md_escaped(text: str) -> str:
    """Plain text inside Markdown emphasis: a model's name may hold _ or * (qwen2_5-0_5b)."""
    return _MD_SPECIAL.sub(lambda hit: "\\" + hit.group(), text)


def export_markdown(store: ConversationStore, ids: list[str], path: Path) -> int:
    with atomic_write(Path(path)) as fh:
        fh.write(to_markdown(store, ids).encode("utf-8"))
    return len(ids)


# import --------------------------------------------------------------------------------------------------
def read_document(path: Path) -> list[dict]:
    """Read and fully validate an export; return its conversations, or raise TransferError."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise TransferError(f"cannot read {path.name}: {exc.strerror or exc}") from None
    if size > MAX_IMPORT_BYTES:
        raise TransferError(f"{path.name} is {size >> 20} MiB; an import may be at most {MAX_IMPORT_BYTES >> 20} MiB")
    try:
        with open_regular(path) as fh:  # a FIFO or device would hang the read or never end
            data = fh.read(MAX_IMPORT_BYTES + 1)  # the file may have grown since stat
    except OSError as exc:
        raise TransferError(f"cannot read {path.name}: {exc.strerror or exc}") from None
    if len(data) > MAX_IMPORT_BYTES:
        raise TransferError(f"{path.name} is over {MAX_IMPORT_BYTES >> 20} MiB, the most an import may be")
    try:
        doc = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise TransferError(f"{path.name} is not UTF-8 text") from None
    except RecursionError:  # the C parser's guard: no crash, and nothing deeper than ~1,000 levels is read
        raise TransferError(f"{path.name} nests lists or objects too deeply (thousands of levels); "
                            "a Hearth export needs only a few") from None
    except ValueError as exc:
        raise TransferError(f"{path.name} is not valid JSON: {exc}") from None
    finally:
        del data  # the parsed document is what stays in memory
    return validate_document(doc)


def validate_document(doc: object) -> list[dict]:
    if not isinstance(doc, dict):
        raise TransferError("the file must hold a JSON object, not " + type(doc).__name__)
    if doc.get("format") != FORMAT:
        raise TransferError(f'not a Hearth export: "format" is {doc.get("format")!r}, expected {FORMAT!r}')
    if doc.get("version") != VERSION:
        raise TransferError(f'"version" is {doc.get("version")!r}; this Hearth reads version {VERSION}')
    convs = doc.get("conversations")
    if not isinstance(convs, list):
        raise TransferError('"conversations" must be a list')
    if len(convs) > MAX_CONVERSATIONS:
        raise TransferError(f"{len(convs)} conversations is more than {MAX_CONVERSATIONS}")
    seen: set[str] = set()
    return [_conversation(c, f"conversations[{i}]", seen) for i, c in enumerate(convs)]


def _need(obj: dict, key: str, kind: type | tuple, where: str):
    if key not in obj:
        raise TransferError(f"{where}: missing {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TransferError(f"{where}.{key}: expected {getattr(kind, '__name__', 'a value')}, got {type(value).__name__}")
    if kind is str:
        _text(value, f"{where}.{key}")
    return value


def _text(value: str, where: str) -> None:
    """JSON may spell a lone surrogate (``"\\ud800"``); SQLite cannot store it as UTF-8: refuse it here."""
    if not value.isascii() and (bad := _SURROGATE.search(value)):
        raise TransferError(f"{where}: character {bad.start()} is a lone UTF-16 surrogate "
                            f"(U+{ord(bad.group()):04X}), which is not valid Unicode text")


def _settings(c: dict, where: str) -> dict:
    """The settings object: nested at most MAX_SETTINGS_DEPTH deep, every key and string real text
    (walked with a stack, not recursion)."""
    settings = _need(c, "settings", dict, where)
    stack: list[tuple[object, str, int]] = [(settings, f"{where}.settings", 1)]
    while stack:
        value, at, depth = stack.pop()
        if isinstance(value, str):
            _text(value, at)
        elif isinstance(value, (dict, list)):
            if depth > MAX_SETTINGS_DEPTH:
                raise TransferError(f"{at}: nested more than {MAX_SETTINGS_DEPTH} levels deep")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for k, v in items:
                if isinstance(k, str):
                    _text(k, f"{at} key {k!r}")
                stack.append((v, f"{at}[{k!r}]", depth + 1))
    return settings


def _conversation(c: object, where: str, seen: set[str]) -> dict:
    if not isinstance(c, dict):
        raise TransferError(f"{where}: expected an object")
    cid = c.get("id")
    if cid is not None and (not isinstance(cid, str) or not ID_PATTERN.fullmatch(cid)):
        raise TransferError(f"{where}.id: {cid!r} is not a valid conversation id")
    if cid in seen:
        raise TransferError(f"{where}.id: {cid!r} appears twice in the file")
    if cid:
        seen.add(cid)
    out = {"id": cid, "title": _need(c, "title", str, where), "system_prompt": _need(c, "system_prompt", str, where),
           "settings": _settings(c, where), "model": _need(c, "model", str, where),
           "created_ms": _time(c, "created_ms", where), "updated_ms": _time(c, "updated_ms", where)}
    msgs = _need(c, "messages", list, where)
    out["messages"] = []
    for j, m in enumerate(msgs):
        mw = f"{where}.messages[{j}]"
        if not isinstance(m, dict):
            raise TransferError(f"{mw}: expected an object")
        role = _need(m, "role", str, mw)
        if role not in ROLES:
            raise TransferError(f"{mw}.role: {role!r} is not one of {', '.join(ROLES)}")
        content = _need(m, "content", str, mw)
        out["messages"].append({"role": role, "content": content, "created_ms": _time(m, "created_ms", mw),
                                **_reply_facts(m, role, mw), **_attachments(m, role, content, mw),
                                **_agent(m, role, mw)})
    return out


def _attachments(m: dict, role: str, content: str, where: str) -> dict:
    """A user message's optional "typed_text" and "attachments", bounded as a file read here would be, and
    the content exactly what they compose (older exports have neither)."""
    if "attachments" not in m and "typed_text" not in m:
        return {}
    if role != "user":
        raise TransferError(f"{where}: only a user message has attachments, not a {role!r} message")
    listed = _need(m, "attachments", list, where)
    if len(listed) > documents.MAX_ATTACHMENTS:
        raise TransferError(f"{where}.attachments: {len(listed)} files; a message can carry at most "
                            f"{documents.MAX_ATTACHMENTS}")
    typed = _need(m, "typed_text", str, where)
    files = []
    for k, a in enumerate(listed):
        aw = f"{where}.attachments[{k}]"
        if not isinstance(a, dict):
            raise TransferError(f"{aw}: expected an object")
        name = _need(a, "name", str, aw)
        if name != documents.clean_name(name):
            raise TransferError(f"{aw}.name: {name[:80]!r} is not a file name (no folders or control characters, "
                                f"at most {documents.MAX_NAME_CHARS} characters)")
        size = _need(a, "size", int, aw)
        if not 0 <= size <= documents.MAX_FILE_BYTES:
            raise TransferError(f"{aw}.size: {size} is not a size up to {documents.MAX_FILE_BYTES:,} bytes")
        sha = _need(a, "sha256", str, aw)
        if not _SHA256.fullmatch(sha):
            raise TransferError(f"{aw}.sha256: expected 64 lowercase hex digits")
        kind = _need(a, "kind", str, aw)
        if kind not in documents.KINDS:
            raise TransferError(f"{aw}.kind: {kind!r} is not one of {', '.join(documents.KINDS)}")
        pages = a.get("pages")
        if pages is not None and (not isinstance(pages, int) or isinstance(pages, bool)
                                  or not 0 <= pages <= documents.MAX_PDF_PAGES):
            raise TransferError(f"{aw}.pages: expected null or a page count up to {documents.MAX_PDF_PAGES:,}")
        text = _need(a, "text", str, aw)
        if len(text) > documents.MAX_TEXT_CHARS:
            raise TransferError(f"{aw}.text: {len(text):,} characters; a file may hold at most "
                                f"{documents.MAX_TEXT_CHARS:,}")
        files.append(Attachment(name, size, sha, kind, text, pages))
    try:
        composed = documents.compose_message(typed, files)
    except AttachmentError as exc:
        raise TransferError(f"{where}: {exc}") from None
    if composed != content:
        raise TransferError(f"{where}.content: is not the attached files' text and typed_text as Hearth composes "
                            "them (docs/documents.md), so what the chat shows would differ from what the model reads")
    return {"typed_text": typed, "attachments": tuple(files)} if files else {}


def _reply_facts(m: dict, role: str, where: str) -> dict:
    """A reply's optional "model" and "finish_reason" (older exports have neither); a person's message has none."""
    facts = {}
    if "model" in m:
        model = _need(m, "model", str, where)
        if len(model) > MODEL_CHARS:
            raise TransferError(f"{where}.model: {len(model):,} characters; a model's name may have at most {MODEL_CHARS}")
        facts["model"] = model
    if m.get("finish_reason") is not None:
        finish = _need(m, "finish_reason", str, where)
        if finish not in FINISHES:
            raise TransferError(f"{where}.finish_reason: {finish!r} is not one of {', '.join(sorted(FINISHES))} "
                                "(or null)")
        facts["finish_reason"] = finish
    if facts and role != "assistant":
        raise TransferError(f"{where}: only a reply (role 'assistant') has a model or finish_reason, not a {role!r} message")
    return facts


def _agent(m: dict, role: str, where: str) -> dict:
    """A message's optional agent fields (a reply's thinking and calls, a tool result's call id and tool name),
    checked as the store checks them (``agent_row``) so the import cannot fail half-way."""
    fields: dict = {}
    if "reasoning" in m:
        fields["reasoning"] = _need(m, "reasoning", str, where)
    if m.get("thought_ms") is not None:
        fields["thought_ms"] = _time(m, "thought_ms", where)
    try:
        if "tool_calls" in m:
            fields["tool_calls"] = tool_messages.from_openai(m["tool_calls"])
    except ValueError as exc:
        raise TransferError(f"{where}.tool_calls: {exc}") from None
    for key in ("tool_call_id", "name"):
        if key in m:
            fields[key] = _need(m, key, str, where)
    try:
        agent_row(role, fields.get("reasoning", ""), fields.get("thought_ms"), fields.get("tool_calls", ()),
                  fields.get("tool_call_id", ""), fields.get("name", ""))
    except ConversationError as exc:
        raise TransferError(f"{where}: {exc}") from None
    return fields


def _time(obj: dict, key: str, where: str) -> int:
    value = _need(obj, key, int, where)
    if not 0 <= value < 1 << 53:
        raise TransferError(f"{where}.{key}: {value} is not a time in milliseconds")
    return value


def import_json(store: ConversationStore, path: Path, *, progress: Callable[[int, int], None] | None = None,
                cancel: CancelToken | None = None) -> list[str]:
    """Import every conversation in ``path``: validated first, then stored in batches, all or nothing
    (see ``engine.importer``); ``progress(done, total)`` after each batch. Returns the ids used."""
    return import_conversations(store, read_document(path), progress=progress, cancel=cancel)
