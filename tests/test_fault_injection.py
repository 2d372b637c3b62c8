"""Damage every region of a checkpoint and check that each case is caught with the right reason (or is
harmless), the session is rebuilt, the reply equals a clean run's, nothing escapes, and a hostile
header cannot make the reader allocate beyond the file. Every case runs on each storage tier (the file
store and the in-memory tier, tests/tier_helpers.py): a record is verified where it is opened, whatever
holds its bytes."""

from __future__ import annotations

import shutil
import struct
import tracemalloc
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from engine.checkpoint.format import (
    HEADER_CHECKED,
    HEADER_SIZE,
    RECORD_HEADER_SIZE,
    Reason,
    RecordInfo,
    pack_header,
    pack_record_header,
    unpack_header,
    xxh,
)
from engine.checkpoint.reader import CheckpointReader
from engine.checkpoint.store import CheckpointStore
from engine.generation import Engine
from engine.model.convert import ensure_converted
from engine.model.synthetic import SyntheticSpec, write_synthetic_gguf
from engine.session import DISK, REBUILT, ChatSessions
from engine.text.chat_template import ChatTemplate
from tests.checkpoint_names import conv_path
from tests.dialogues import GREEDY, SYSTEM, TURN1, TURN2, TURN3
from tests.tier_helpers import TIER_KINDS, Tiers

OTHER = [SYSTEM, {"role": "user", "content": "another chat entirely"}]
OTHER2 = OTHER + [{"role": "assistant", "content": "sure"}, {"role": "user", "content": "more of it"}]
MAX_PEAK = 4 << 20  # the tiny model's whole KV is 64 KiB; a hostile header would ask for gigabytes


@dataclass
class Lab:
    engine: Engine
    golden: bytes  # conversation "c": record 0 = TURN1's prompt, record 1 = TURN2's suffix
    other: bytes  # conversation "other", the same shape of file
    records: list[RecordInfo]
    other_records: list[RecordInfo]
    prefix_name: str
    prefix: bytes
    prefix_tokens: int
    clean: list[int]  # the reply to TURN3 with no checkpoint at all
    tiers: Tiers  # the storage tier each case runs on

    @property
    def conv_name(self) -> str:
        """The name of conversation "c"'s record under the lab's model."""
        return conv_path(Path("."), self.engine).name


def write_conversation(engine: Engine, root: Path, conv: str, *turns: list[dict]) -> bytes:
    s = ChatSessions(engine, CheckpointStore(root), adaptive=False)
    for msgs in turns:
        s.sync(conv, msgs)
        s.save("turn")
    return conv_path(root, engine, conv).read_bytes()


def scan(data: bytes, tmp: Path) -> list[RecordInfo]:
    path = tmp / "scan.hkv"
    path.write_bytes(data)
    with CheckpointReader(path) as r:
        r.read_header()
        records, problem = r.scan()
    assert problem is None
    return records


@pytest.fixture(scope="module", params=TIER_KINDS)
def lab(request, tiny_converted, tmp_path_factory) -> Lab:
    engine = Engine.load(tiny_converted("int4"), "cpu")
    tmp = tmp_path_factory.mktemp("golden")
    golden = write_conversation(engine, tmp, "c", TURN1, TURN2)
    other = write_conversation(engine, tmp, "other", OTHER, OTHER2)
    (prefix,) = CheckpointStore(tmp).entries(kind="prefix")
    clean = ChatSessions(engine, CheckpointStore(tmp / "clean")).generate("c", TURN3, GREEDY, 12)
    return Lab(engine, golden, other, scan(golden, tmp), scan(other, tmp), prefix.name,
               (tmp / prefix.name).read_bytes(), prefix.tokens, clean.generation.tokens, Tiers(request.param))


def fresh_case(lab: Lab, tmp: Path, data: bytes | None, with_prefix: bool = False) -> tuple[ChatSessions, Path]:
    """Sessions on a new store (of the lab's tier) holding ``data`` as conversation "c"'s record."""
    root = tmp / "case"
    shutil.rmtree(root, ignore_errors=True)
    lab.tiers.forget(root)
    root.mkdir()
    if data is not None:
        lab.tiers.plant(root, lab.conv_name, data)
    if with_prefix:
        lab.tiers.plant(root, lab.prefix_name, lab.prefix)
    return ChatSessions(lab.engine, lab.tiers.open(root), adaptive=False), root


def run_case(lab: Lab, tmp: Path, data: bytes | None, with_prefix: bool = False, measure: bool = False):
    sessions, root = fresh_case(lab, tmp, data, with_prefix)
    if measure:
        tracemalloc.start()
    try:
        turn = sessions.generate("c", TURN3, GREEDY, 12)
    finally:
        peak = tracemalloc.get_traced_memory()[1] if measure else 0
        if measure:
            tracemalloc.stop()
    assert turn.generation.tokens == lab.clean, "the rebuilt session must answer exactly like a clean one"
    assert turn.save is not None and turn.save.ok  # the rebuilt state is saved again
    return turn.resume, peak, root


def flip(data: bytes, offset: int, mask: int = 0x10) -> bytes:
    out = bytearray(data)
    out[offset] ^= mask
    return bytes(out)


def resign_header(data: bytes, **fields) -> bytes:
    header = unpack_header(data[:HEADER_SIZE])
    for k, v in fields.items():
        setattr(header, k, v)
    return pack_header(header) + data[HEADER_SIZE:]


def resign_record(data: bytes, record: RecordInfo, chain: int, **fields) -> bytes:
    packed = pack_record_header(replace(record, **fields), chain)
    return data[: record.offset] + packed + data[record.offset + RECORD_HEADER_SIZE :]


def region_reason(offset: int, lab: Lab) -> set[str | None]:
    """What a flipped bit at ``offset`` must be reported as."""
    if offset < 8:
        return {Reason.BAD_MAGIC}
    if offset < 10:
        return {Reason.VERSION}
    if offset < HEADER_CHECKED + 8:
        return {Reason.CHECKSUM}
    if offset < HEADER_SIZE:
        return {None}  # the usage slot and reserved bytes: statistics at most
    return {Reason.CHECKSUM}


# the intact file and the fallback chain -------------------------------------------------------------
def test_intact_checkpoint_resumes_and_answers_like_a_clean_run(lab, tmp_path):
    report, _, _ = run_case(lab, tmp_path, lab.golden)
    assert report.source == DISK and report.reason is None
    assert report.restored_tokens == lab.records[-1].end


def test_damage_in_the_last_record_falls_back_to_the_older_frontier(lab, tmp_path):
    last = lab.records[-1]
    damaged = flip(lab.golden, last.payload_offset + 4 * last.n_tokens + 5)  # a K row of record 1
    report, _, root = run_case(lab, tmp_path, damaged)
    assert report.source == REBUILT and report.reason == Reason.CHECKSUM
    assert report.restored_tokens == lab.records[0].end  # record 0 still served
    assert "checksum" in report.plain


def test_damage_everywhere_falls_back_to_the_shared_prefix(lab, tmp_path):
    report, _, root = run_case(lab, tmp_path, flip(lab.golden, 300), with_prefix=True)
    assert report.source == REBUILT and report.reason == Reason.CHECKSUM
    assert report.restored_tokens == lab.prefix_tokens


def test_a_file_damaged_beyond_repair_is_deleted_and_rewritten(lab, tmp_path):
    sessions, root = fresh_case(lab, tmp_path, flip(lab.golden, 20))
    _, report = sessions.prepare("c", TURN3)
    assert report.reason == Reason.CHECKSUM and not lab.tiers.has(root, lab.conv_name)


def test_a_damaged_tail_is_cut_back_to_the_last_good_record(lab, tmp_path):
    sessions, root = fresh_case(lab, tmp_path, flip(lab.golden, lab.records[-1].offset + 40))
    _, report = sessions.prepare("c", TURN3)
    assert report.reason == Reason.CHECKSUM
    assert len(lab.tiers.read_bytes(root, lab.conv_name)) == lab.records[0].end_offset
    assert sessions.store.entry(lab.conv_name).bytes == lab.records[0].end_offset  # and the index says so


# sweeps over the whole file ----------------------------------------------------------------------
def test_bit_flips_across_every_region(lab, tmp_path):
    offsets = sorted(set(range(0, len(lab.golden), 173)) | {0, 7, 8, 9, 10, 12, 16, 20, 40, 56, 88, 120, 128, 176,
                                                         183, 184, 200, 255, 256, 260, 384, len(lab.golden) - 1})
    for off in offsets:
        report, _, _ = run_case(lab, tmp_path, flip(lab.golden, off))
        expected = region_reason(off, lab)
        assert report.reason in expected, f"bit flip at byte {off}: {report.reason} not in {expected}"
        if off >= lab.records[-1].offset:
            assert report.restored_tokens == lab.records[0].end, f"byte {off}: record 0 should still serve"


def test_truncation_at_many_offsets(lab, tmp_path):
    r0, r1 = lab.records
    cuts = sorted(set(range(0, len(lab.golden), 311)) | {0, 1, 7, 8, 100, HEADER_SIZE - 1, HEADER_SIZE,
                                                       HEADER_SIZE + 1, r0.payload_offset, r0.end_offset - 1,
                                                       r0.end_offset, r0.end_offset + 1, r1.payload_offset,
                                                       len(lab.golden) - 1})
    for cut in cuts:
        report, _, _ = run_case(lab, tmp_path, lab.golden[:cut])
        if cut == r0.end_offset:  # exactly one whole record: a shorter, valid checkpoint
            assert report.source == DISK and report.reason is None
        elif cut >= 8:
            assert report.reason == Reason.TRUNCATED, f"cut at {cut}: {report.reason}"
        else:
            assert report.reason in {Reason.TRUNCATED, Reason.BAD_MAGIC}, f"cut at {cut}: {report.reason}"
        if cut > r0.end_offset:
            assert report.restored_tokens == r0.end


def test_zero_filled_ranges(lab, tmp_path):
    for start in list(range(0, len(lab.golden), 997)) + [lab.records[1].offset]:
        data = bytearray(lab.golden)
        end = min(len(data), start + 64)
        data[start:end] = bytes(end - start)
        if bytes(data) == lab.golden:
            continue  # the range was already zero
        report, _, _ = run_case(lab, tmp_path, bytes(data))
        harmless = start >= HEADER_CHECKED + 8 and end <= HEADER_SIZE
        assert report.reason in ({None} if harmless else {Reason.BAD_MAGIC, Reason.CHECKSUM}), f"zeros at {start}"


def test_records_swapped_between_two_files(lab, tmp_path):
    a0, a1 = lab.records
    b0, b1 = lab.other_records
    other_second = lab.other[b1.offset : b1.end_offset]
    report, _, _ = run_case(lab, tmp_path, lab.golden[: a1.offset] + other_second)
    assert report.reason == Reason.CHECKSUM and report.restored_tokens == a0.end
    other_first = lab.other[b0.offset : b0.end_offset]
    report, _, _ = run_case(lab, tmp_path, lab.golden[:HEADER_SIZE] + other_first + lab.golden[a1.offset :])
    assert report.reason == Reason.CHECKSUM and report.restored_tokens == 0
    swapped_order = lab.golden[:HEADER_SIZE] + lab.golden[a1.offset :] + lab.golden[a0.offset : a0.end_offset]
    report, _, _ = run_case(lab, tmp_path, swapped_order)
    assert report.reason == Reason.CHECKSUM


# another model, precision, tokenizer -----------------------------------------------------------------
def test_a_checkpoint_from_another_model(lab, tiny_dir, tmp_path):
    gguf = write_synthetic_gguf(tiny_dir / "other-seed.gguf", SyntheticSpec(seed=7))
    other_engine = Engine.load(ensure_converted(gguf, "int4", tiny_dir / "converted"), "cpu")
    data = write_conversation(other_engine, tmp_path / "w", "c", TURN1, TURN2)
    report, _, _ = run_case(lab, tmp_path, data)
    assert report.reason == Reason.MODEL_MISMATCH and "different model" in report.plain


def test_a_checkpoint_from_another_precision(lab, tiny_converted, tmp_path):
    fp32 = Engine.load(tiny_converted("fp32"), "cpu")
    report, _, _ = run_case(lab, tmp_path, write_conversation(fp32, tmp_path / "w", "c", TURN1, TURN2))
    assert report.reason == Reason.MODEL_MISMATCH


def test_a_checkpoint_from_another_tokenizer_or_template(lab, tiny_converted, tmp_path):
    variant = Engine.load(tiny_converted("int4"), "cpu")
    t = variant.template
    variant.template = ChatTemplate(t.source + "{# another template revision #}", t.bos_token, t.eos_token)
    report, _, _ = run_case(lab, tmp_path, write_conversation(variant, tmp_path / "w", "c", TURN1, TURN2))
    assert report.reason == Reason.TOKENIZER_MISMATCH


# hostile but well-signed headers ----------------------------------------------------------------------
def test_wrong_version_and_layout(lab, tmp_path):
    data = bytearray(lab.golden)
    struct.pack_into("<H", data, 8, 2)
    struct.pack_into("<Q", data, HEADER_CHECKED, xxh(bytes(data[:HEADER_CHECKED]), 0))
    assert run_case(lab, tmp_path, bytes(data))[0].reason == Reason.VERSION
    for offset, fmt, value in ((12, "<I", 7), (16, "<B", 9), (10, "<H", 4096)):  # layout id, dtype code, header size
        data = bytearray(lab.golden)
        struct.pack_into(fmt, data, offset, value)
        struct.pack_into("<Q", data, HEADER_CHECKED, xxh(bytes(data[:HEADER_CHECKED]), 0))
        assert run_case(lab, tmp_path, bytes(data))[0].reason == Reason.LAYOUT, (offset, value)


@pytest.mark.parametrize("field,value", [("n_layers", 2**31 - 1), ("n_kv_heads", 2**20), ("head_dim", 2**30),
                                         ("context_length", 2**31)])
def test_huge_header_counts_allocate_nothing(lab, tmp_path, field, value):
    header = unpack_header(lab.golden[:HEADER_SIZE])
    data = resign_header(lab.golden, shape=replace(header.shape, **{field: value}))
    report, peak, _ = run_case(lab, tmp_path, data, measure=True)
    assert report.reason == Reason.LAYOUT
    assert peak < MAX_PEAK


@pytest.mark.parametrize("field,value,reason", [
    ("end", 2**31, Reason.TOO_LARGE),
    ("payload_bytes", 2**62, Reason.TOO_LARGE),
    ("payload_bytes", 3, Reason.LAYOUT),
    ("text_len", 2**62, Reason.PREFIX_MISMATCH),
    ("start", 5, Reason.LAYOUT),
])
def test_huge_record_counts_allocate_nothing(lab, tmp_path, field, value, reason):
    seed = unpack_header(lab.golden[:HEADER_SIZE]).seed
    data = resign_record(lab.golden, lab.records[0], seed, **{field: value})
    report, peak, _ = run_case(lab, tmp_path, data, measure=True)
    assert report.reason == reason
    assert peak < MAX_PEAK


def test_a_well_signed_second_record_claiming_too_much_keeps_the_first(lab, tmp_path):
    first, second = lab.records
    data = resign_record(lab.golden, second, first.header_xxh, end=2**31)
    report, peak, _ = run_case(lab, tmp_path, data, measure=True)
    assert report.reason == Reason.TOO_LARGE and report.restored_tokens == first.end and peak < MAX_PEAK


def test_unreadable_and_foreign_files(lab, tmp_path):
    assert run_case(lab, tmp_path, b"")[0].reason in {Reason.TRUNCATED, Reason.BAD_MAGIC}
    assert run_case(lab, tmp_path, b"GGUF" + bytes(1000))[0].reason == Reason.BAD_MAGIC
    assert run_case(lab, tmp_path, lab.golden[:HEADER_SIZE])[0].reason == Reason.TRUNCATED


def test_rows_of_a_failed_record_do_not_linger_in_the_cache(lab, tmp_path):
    last = lab.records[-1]
    sessions, _ = fresh_case(lab, tmp_path, flip(lab.golden, last.end_offset - 3))
    _, report = sessions.prepare("c", TURN3)
    assert report.reason == Reason.CHECKSUM and lab.engine.cache.length == lab.records[0].end
    for block in lab.engine.cache.host_blocks(last.start, last.end):
        assert not block.any()  # zeroed, not the unverified bytes


def test_a_checkpoint_that_cannot_be_read_is_an_io_error(lab, tmp_path):
    if lab.tiers.kind != "file":
        pytest.skip("a directory where the file should be: only the file tier can hold one")
    root = tmp_path / "case"
    root.mkdir()
    conv_path(root, lab.engine).mkdir()  # something unreadable where the file should be
    sessions = ChatSessions(lab.engine, CheckpointStore(root), adaptive=False)
    turn = sessions.generate("c", TURN3, GREEDY, 12)
    assert turn.resume.reason == Reason.IO_ERROR and turn.resume.source == REBUILT
    assert turn.generation.tokens == lab.clean  # the reply still comes, from a full prefill
    assert not turn.save.ok and "could not save" in turn.save.error  # and saving says why it cannot
