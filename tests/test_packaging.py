"""The packaged build's pieces that run from source: the bundled read-only model directory, the model
staging, ``hearth --self-test`` and ``hearth --startup-probe``.

The PyInstaller build, the .deb and its install test take minutes and are not part of this suite: ``.ci/run``
runs them after it (``packaging/ci-package.sh``; see packaging/README.md).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.errors import HearthError, ModelFileError
from engine.paths import BUNDLED_MODEL_ENV, bundled_model_dir, resolve_paths

REPO = Path(__file__).resolve().parent.parent


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "packaging" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tree_state(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and mtime: proof that nothing was written there."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def run_hearth(*args: str, env: dict | None = None, timeout: int = 240) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k not in (BUNDLED_MODEL_ENV, "HEARTH_HOME")}
    full_env.update({"QT_QPA_PLATFORM": "offscreen", **(env or {})})
    return subprocess.run([sys.executable, "-m", "app.main", *args], capture_output=True, text=True, cwd=REPO,
                          env=full_env, timeout=timeout)


@pytest.fixture(scope="module")
def bundle(real_home, tmp_path_factory) -> Path:
    """The default model staged exactly as a packaged build ships it (from the test cache: no network)."""
    stage_model = load_script("stage_model")
    return stage_model.stage(tmp_path_factory.mktemp("bundle") / "model", ["int4"], explicit_from=str(real_home))


# where the bundled model is found -----------------------------------------------------------------------------
def test_no_bundled_model_when_running_from_source(monkeypatch):
    monkeypatch.delenv(BUNDLED_MODEL_ENV, raising=False)
    assert not getattr(sys, "frozen", False)
    assert bundled_model_dir() is None


def test_the_environment_names_the_bundled_model(monkeypatch, tmp_path):
    monkeypatch.setenv(BUNDLED_MODEL_ENV, str(tmp_path))
    assert bundled_model_dir() == tmp_path.resolve()


def test_a_frozen_build_looks_in_model_inside_its_bundle(monkeypatch, tmp_path):
    monkeypatch.delenv(BUNDLED_MODEL_ENV, raising=False)
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    assert bundled_model_dir() is None  # a build without a model: the user fetches it as with pip
    (tmp_path / "model").mkdir()
    assert bundled_model_dir() == tmp_path / "model"


def test_a_bundled_model_dir_that_does_not_exist_is_a_clear_error(monkeypatch, tmp_path):
    from engine.loader import resolve_gguf

    monkeypatch.setenv(BUNDLED_MODEL_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(ModelFileError, match=f"{BUNDLED_MODEL_ENV}=.*nowhere is not a directory"):
        bundled_model_dir()
    with pytest.raises(ModelFileError, match="is not a directory"):
        resolve_gguf(resolve_paths(tmp_path / "home").ensure())


@pytest.mark.real_model
def test_the_engine_runs_the_bundled_model_without_converting_or_writing_there(bundle, monkeypatch, tmp_path):
    from engine.arch import llama
    from engine.loader import find_default_gguf, load_engine, resolve_gguf
    from engine.model.convert import model_fingerprint
    from engine.model.fetch import default_model
    from engine.model.precision import get_precision

    entry = default_model()
    before = tree_state(bundle)
    assert sorted(p.name for p in bundle.iterdir()) == ["converted", "tokenizer"]  # no GGUF weights twice
    assert (bundle / "tokenizer" / entry.filename).stat().st_size < 4 << 20
    assert all(p.stat().st_mode & 0o004 for p in bundle.rglob("*"))  # readable by every user
    paths = resolve_paths(tmp_path / "home").ensure()
    monkeypatch.setenv(BUNDLED_MODEL_ENV, str(bundle))
    assert find_default_gguf(paths) is None
    with pytest.raises(ModelFileError, match="not installed"):  # commands that need the GGUF's weights say so
        resolve_gguf(paths)
    engine, converted, _ = load_engine(paths, weights="int4", provider="cpu")
    assert converted.onnx_path.is_relative_to(bundle) and converted.gguf_path == bundle / "tokenizer" / entry.filename
    # the same fingerprint as a conversion of the full GGUF: saved context moves between the two installs
    assert converted.fingerprint == model_fingerprint(entry.gguf_sha256, get_precision("int4").weights_id, llama.NAME,
                                                      llama.GRAPH_VERSION)
    assert engine.generate(engine.prompt_tokens([{"role": "user", "content": "Hi"}]), max_new_tokens=2).tokens
    assert list(paths.converted.iterdir()) == []  # nothing converted into the data dir
    assert tree_state(bundle) == before  # and nothing written into the bundle


@pytest.mark.real_model
def test_a_precision_the_bundle_lacks_asks_for_the_full_model(bundle, monkeypatch, tmp_path):
    from engine.loader import default_model_available, load_engine

    paths = resolve_paths(tmp_path / "home").ensure()
    monkeypatch.setenv(BUNDLED_MODEL_ENV, str(bundle))
    assert default_model_available(paths, "int4") and not default_model_available(paths, "fp32")
    with pytest.raises(ModelFileError, match=r"not installed .*\(this build ships it converted, but not for fp32\); "
                                             r"run 'hearth-cli model fetch' first"):
        load_engine(paths, weights="fp32", provider="cpu")
    assert list(paths.converted.iterdir()) == []


@pytest.mark.real_model
def test_a_fetched_gguf_still_uses_the_bundled_conversion(bundle, monkeypatch, real_model_home):
    from engine.loader import load_engine

    monkeypatch.setenv(BUNDLED_MODEL_ENV, str(bundle))
    paths = resolve_paths(real_model_home).ensure()
    _, converted, _ = load_engine(paths, weights="int4", provider="cpu")
    assert converted.gguf_path.is_relative_to(real_model_home) and converted.onnx_path.is_relative_to(bundle)


@pytest.mark.real_model
def test_a_full_gguf_bundle_ships_the_gguf_with_a_valid_hash_sidecar(real_home, monkeypatch, tmp_path):
    from engine.loader import find_default_gguf
    from engine.model.convert import gguf_digest
    from engine.model.fetch import default_model

    stage_model = load_script("stage_model")
    out = stage_model.stage(tmp_path / "model", ["int4"], explicit_from=str(real_home), full_gguf=True)
    gguf = out / "models" / default_model().filename
    assert gguf.stat().st_mtime_ns % 1_000_000_000 == 0  # whole seconds survive dpkg and tar
    sidecar = json.loads(gguf.with_name(gguf.name + ".sha256.json").read_text())
    assert sidecar["stamp"]["mtime_ns"] == gguf.stat().st_mtime_ns
    before = tree_state(out)
    assert gguf_digest(gguf) == default_model().gguf_sha256 and tree_state(out) == before  # no rehash, no write
    monkeypatch.setenv(BUNDLED_MODEL_ENV, str(out))
    assert find_default_gguf(resolve_paths(tmp_path / "home")) == gguf


def test_staging_from_a_dir_without_the_model_says_so(tmp_path):
    stage_model = load_script("stage_model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(HearthError, match="does not hold SmolLM2-135M-Instruct.Q4_1.gguf"):
        stage_model.stage(tmp_path / "out", ["int4"], explicit_from=str(tmp_path / "empty"))
    proc = subprocess.run([sys.executable, str(REPO / "packaging" / "stage_model.py"), str(tmp_path / "out"),
                           "--from", str(tmp_path / "empty")], capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.startswith("stage_model: error: ") and "does not hold" in proc.stderr


def test_icons_render_at_every_hicolor_size(qapp, tmp_path):  # qapp: a QApplication, not the script's own
    render_icons = load_script("render_icons")
    made = render_icons.render(tmp_path)
    from PySide6.QtGui import QImage

    for n in render_icons.SIZES:
        image = QImage(str(tmp_path / f"{n}x{n}" / "apps" / "hearth.png"))
        assert (image.width(), image.height()) == (n, n)
        assert image.pixelColor(n // 2, n // 2).alpha() == 255 and image.pixelColor(0, 0).alpha() == 0
    assert (tmp_path / "scalable" / "apps" / "hearth.svg") in made
    assert render_icons.main([]) == 2


# hearth --self-test ---------------------------------------------------------------------------------------------
@pytest.mark.real_model
def test_self_test_passes_on_the_bundled_model_in_a_throwaway_dir(bundle, real_home, tmp_path):
    before = tree_state(bundle)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    # HEARTH_HOME holds a fetched copy of the same model: the packaged build still tests the one it ships
    proc = run_hearth("--self-test", "--provider", "cpu",
                      env={BUNDLED_MODEL_ENV: str(bundle), "TMPDIR": str(scratch), "HEARTH_HOME": str(real_home)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for step in ("modules", "model", "window", "chat turn", "save", "verify", "restore"):
        assert f"  ok  {step}" in out
    assert "(bundled: " in out and "throwaway, removed afterwards" in out and out.rstrip().endswith("self-test passed")
    assert "tokens from disk" in out and "next-token logits match a cold prefill" in out
    # The throwaway data dir is gone. (ONNX Runtime's telemetry SDK leaves its own "$TMPDIR/.ses" file.)
    assert [p.name for p in scratch.iterdir() if p.name.startswith("hearth")] == []
    assert tree_state(bundle) == before


@pytest.mark.real_model
def test_self_test_with_a_data_dir_uses_it_and_keeps_the_conversation(real_model_home):
    from engine.conversations import ConversationStore

    proc = run_hearth("--self-test", "--provider", "cpu", "--data-dir", str(real_model_home))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(installed: " in proc.stdout and "(kept)" in proc.stdout
    store = ConversationStore(real_model_home / "conversations.sqlite3")
    try:
        [conv] = store.list()
        assert conv.title == "Self-test" and [m.role for m in store.messages(conv.id)] == ["user", "assistant"]
    finally:
        store.close()


@pytest.mark.real_model
def test_self_test_without_a_data_dir_finds_the_fetched_model(real_home, tmp_path):
    """Issue 27 item 24: from a source install, ``hearth --self-test`` (no --data-dir) failed with "no
    model to test with" though ``hearth-cli model fetch`` had put the model in the platform's cache."""
    cache, data, scratch = tmp_path / "cache", tmp_path / "data", tmp_path / "tmp"
    (cache / "hearth").mkdir(parents=True)
    scratch.mkdir()
    for sub in ("models", "converted"):  # where model fetch puts them: ~/.cache/hearth/{models,converted}
        (real_home / sub).mkdir(parents=True, exist_ok=True)
        (cache / "hearth" / sub).symlink_to(real_home / sub)
    proc = run_hearth("--self-test", "--provider", "cpu",
                      env={"XDG_CACHE_HOME": str(cache), "XDG_DATA_HOME": str(data), "TMPDIR": str(scratch)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(installed: " in proc.stdout and "throwaway, removed afterwards" in proc.stdout
    assert not (data / "hearth" / "conversations.sqlite3").exists()  # the user's data dir is not touched
    assert [p.name for p in scratch.iterdir() if p.name.startswith("hearth")] == []


def test_self_test_without_a_model_fails_and_says_why(tmp_path):
    proc = run_hearth("--self-test", "--data-dir", str(tmp_path))
    assert proc.returncode == 1
    assert "hearth: self-test FAILED at model: no model to test with" in proc.stderr
    assert "the default model is not installed" in proc.stderr and "HEARTH_BUNDLED_MODEL" in proc.stderr
    assert not (tmp_path / "conversations.sqlite3").exists()  # it stopped before opening anything


def test_self_test_with_a_broken_model_fails_at_the_window(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + bytes(64))
    proc = run_hearth("--self-test", "--model", str(bad), "--provider", "cpu")
    assert proc.returncode == 1
    assert "self-test FAILED at window: the model could not be loaded: broken.gguf" in proc.stderr


def test_self_test_on_a_data_dir_that_is_a_file_fails(tmp_path, capsys):
    from app.self_test import run_self_test

    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    assert run_self_test(str(not_a_dir)) == 1
    assert "self-test FAILED at data dir: cannot use" in capsys.readouterr().err


def test_self_test_refuses_a_data_dir_another_hearth_has_open(qapp, tmp_path, tiny_gguf, capsys):
    from app.self_test import run_self_test
    from app.single_instance import SingleInstance

    running = SingleInstance(resolve_paths(tmp_path).data)
    assert running.listen()
    try:
        assert run_self_test(str(tmp_path), model=str(tiny_gguf), provider="cpu") == 1
    finally:
        running.close()
    assert "self-test FAILED at window: Hearth is already running on" in capsys.readouterr().err


def test_self_test_cannot_be_combined_with_other_modes():
    from app.main import main

    for other in ("--terminal", "--browse", "--startup-probe"):
        with pytest.raises(SystemExit) as exc:
            main(["--self-test", other])
        assert exc.value.code == 2


def test_every_module_of_the_source_tree_is_listed_and_imports(capsys):
    from app.self_test import SelfTestReport, check_modules, own_modules

    names = own_modules()
    assert {"engine.api", "engine.arch.llama", "app.main_window", "app.self_test"} <= set(names)
    assert len(names) == len(list((REPO / "engine").rglob("*.py")) + list((REPO / "app").rglob("*.py")))
    report = SelfTestReport(REPO, throwaway=False)
    check_modules(report)
    assert report.lines == [("modules", f"all {len(names)} of Hearth's modules import")]


def test_a_module_a_packaged_build_left_out_fails_the_self_test_naming_it(monkeypatch, tmp_path):
    from app.self_test import SelfTestFailed, SelfTestReport, check_modules

    # A frozen build reads its list from the bundle; this one names a module that was not collected.
    (tmp_path / "hearth-modules.txt").write_text("engine.api\nengine.arch.not_collected\n")
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    with pytest.raises(SelfTestFailed, match=r"1 of 2 modules cannot be imported: engine\.arch\.not_collected "
                                             r"\(ModuleNotFoundError: No module named 'engine\.arch\.not_collected'\)"):
        check_modules(SelfTestReport(tmp_path, throwaway=False))


def test_a_packaged_build_without_its_module_list_fails_the_self_test(monkeypatch, tmp_path):
    from app.self_test import SelfTestFailed, SelfTestReport, check_modules

    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    with pytest.raises(SelfTestFailed, match="the build's module list is missing") as exc:
        check_modules(SelfTestReport(tmp_path, throwaway=False))
    assert exc.value.step == "modules"


def test_waiting_fails_with_the_reported_problem_or_on_timeout(qapp):
    from app.self_test import SelfTestFailed, _wait

    with pytest.raises(SelfTestFailed, match="timed out after 50 ms waiting for nothing") as exc:
        _wait(lambda: False, 0.05, "step", "nothing")
    assert exc.value.step == "step"
    with pytest.raises(SelfTestFailed, match="^boom$"):
        _wait(lambda: False, 30, "step", "nothing", lambda: "boom")


# the checks after the window closed, on the tiny model: what a damaged or mismatched saved context gives ------------
@pytest.fixture
def saved_turn(tmp_path, tiny_gguf, tiny_dir, tiny_converted):
    """A data dir with one stored conversation and its saved context (one turn through the engine API)."""
    from app.config import AppConfig
    from engine.api import Hearth
    from engine.types import SamplingParams, TurnRequest

    tiny_converted("int4")
    home = tmp_path / "home"
    home.mkdir()
    (home / "converted").symlink_to(tiny_dir / "converted")
    config = AppConfig(resolve_paths(home).ensure(), model=str(tiny_gguf), weights="int4", provider="cpu")
    hearth = Hearth(config.paths, model=str(tiny_gguf), weights="int4", provider="cpu")
    try:
        hearth.load()
        conv = hearth.conversations.create().id
        turn = hearth.run_turn(TurnRequest(conv, "hello there", SamplingParams(temperature=0.0), max_new_tokens=6))
        assert turn.local.save is not None and turn.local.save.ok
    finally:
        hearth.close()
    return config, conv


def test_verify_and_restore_pass_on_a_good_saved_context(saved_turn):
    from app.self_test import SelfTestReport, verify_and_restore

    config, conv = saved_turn
    report = SelfTestReport(config.paths.data, throwaway=False)
    verify_and_restore(config, conv, report)
    assert [step for step, _ in report.lines] == ["verify", "restore"]
    assert report.lines[0][1].endswith("every checksum and fingerprint valid")
    assert "tokens from disk" in report.lines[1][1] and "next-token logits match a cold prefill" in report.lines[1][1]


def test_a_damaged_saved_context_fails_verification(saved_turn):
    from app.self_test import SelfTestFailed, SelfTestReport, verify_and_restore

    from .checkpoint_names import only_conv_path
    from .qt_helpers import flip_byte

    config, conv = saved_turn
    flip_byte(only_conv_path(config.paths.checkpoints, conv), 0.7, 0x10)
    with pytest.raises(SelfTestFailed, match="the saved context is damaged") as exc:
        verify_and_restore(config, conv, SelfTestReport(config.paths.data, throwaway=False))
    assert exc.value.step == "verify"


def test_a_saved_context_that_no_longer_matches_the_conversation_fails_the_restore(saved_turn):
    from app.self_test import SelfTestFailed, SelfTestReport, verify_and_restore
    from engine.conversations import ConversationStore

    config, conv = saved_turn
    store = ConversationStore(config.paths.conversations_db)
    store.edit(conv, store.messages(conv)[0].seq, "a different first message")
    store.close()
    with pytest.raises(SelfTestFailed, match="expected the context from disk, got") as exc:
        verify_and_restore(config, conv, SelfTestReport(config.paths.data, throwaway=False))
    assert exc.value.step == "restore"


def test_no_saved_context_fails_verification(saved_turn):
    from app.self_test import SelfTestFailed, SelfTestReport, verify_and_restore

    config, _ = saved_turn
    with pytest.raises(SelfTestFailed, match="no saved context for never-saved in "):
        verify_and_restore(config, "never-saved", SelfTestReport(config.paths.data, throwaway=False))


# hearth --startup-probe -----------------------------------------------------------------------------------------
def test_startup_probe_reports_the_window_before_the_model(tmp_path, tiny_gguf):
    proc = run_hearth("--startup-probe", "--data-dir", str(tmp_path), "--model", str(tiny_gguf), "--provider", "cpu")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    assert data["probe"] == "startup" and data["error"] is None and data["provider"] == "cpu"
    assert data["process_start_unix"] <= data["window_interactive_unix"] <= data["model_ready_unix"]
    assert 0 < data["window_interactive_ms"] <= data["model_ready_ms"]


def test_startup_probe_with_a_model_that_cannot_load_exits_1(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + bytes(64))
    proc = run_hearth("--startup-probe", "--data-dir", str(tmp_path / "home"), "--model", str(bad), "--provider", "cpu")
    assert proc.returncode == 1
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    assert data["model_ready_unix"] is None and "broken.gguf" in data["error"]
    assert "hearth: startup probe: " in proc.stderr


# the .deb's dependencies, read from ELF files ------------------------------------------------------------------
needs_dpkg = pytest.mark.skipif(not all(map(shutil.which, ("dpkg", "readelf", "ldconfig"))),
                                reason="needs a Debian system with binutils")


@needs_dpkg
def test_deb_depends_names_the_packages_of_the_libraries_a_bundle_needs(tmp_path):
    deb_depends = load_script("deb_depends")
    shutil.copy("/usr/bin/xz", tmp_path / "xz")  # an ELF that needs liblzma.so.5 and libc
    (tmp_path / "libbundled.so").write_bytes(b"not an ELF")
    required, recommended, missing = deb_depends.depends(tmp_path)
    assert "liblzma5" in required and "libc6" not in required and recommended == [] and missing == []


@needs_dpkg
def test_deb_depends_refuses_a_library_no_package_provides(tmp_path, capsys):
    deb_depends = load_script("deb_depends")
    elf = bytearray(Path("/usr/bin/xz").read_bytes())
    at = elf.index(b"liblzma.so.5\x00")
    elf[at:at + 12] = b"libnope.so.5"  # the same length: the ELF stays well-formed, its NEEDED entry names nothing
    (tmp_path / "xz").write_bytes(bytes(elf))
    assert deb_depends.main([str(tmp_path)]) == 1
    assert "no installed package provides libnope.so.5" in capsys.readouterr().err
    assert deb_depends.main([str(tmp_path / "missing")]) == 2


# make package's prerequisites ------------------------------------------------------------------------------
PREREQS = Path(__file__).resolve().parent.parent / "packaging" / "prereqs.py"


def _prereqs(tmp_path, *packages: str, install: bool = False):
    deps = tmp_path / "deps.txt"
    deps.write_text("# a comment line\n" + "\n".join(f"{p}  # why" for p in packages) + "\n")
    args = [sys.executable, str(PREREQS), "--deps", str(deps)] + (["--install"] if install else [])
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


def test_prereqs_pass_when_every_package_is_installed(tmp_path):
    proc = _prereqs(tmp_path, "dpkg", "coreutils")  # essential on every Debian system
    assert proc.returncode == 0 and proc.stderr == ""


def test_prereqs_name_the_one_apt_line_for_what_is_missing(tmp_path):
    proc = _prereqs(tmp_path, "dpkg", "hearth-no-such-package", "hearth-nor-this-one")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "sudo apt install hearth-no-such-package hearth-nor-this-one" in proc.stderr
    assert "dpkg" not in proc.stderr.split("apt install", 1)[1]  # only what is missing


def test_prereqs_install_failure_is_reported_not_hidden(tmp_path):
    """--install as root runs apt-get (which cannot find this package); as another user it only names the
    line. Either way: exit 1, the package named, no traceback."""
    proc = _prereqs(tmp_path, "hearth-no-such-package", install=True)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "apt install hearth-no-such-package" in proc.stderr
    if os.geteuid() == 0:  # a fresh container's missing package lists are updated once before giving up
        assert "updating the package lists and trying again" in proc.stderr


def test_the_build_deps_list_names_the_tools_build_sh_uses():
    names = set(PREREQS.with_name("build-deps.txt").read_text().split())
    assert {"fakeroot", "dpkg-dev", "binutils", "xz-utils"} <= names
    assert "packaging/prereqs.py --install" in PREREQS.with_name("build.sh").read_text()


# the package's own tests (packaging/test-bundle.sh, test-lib.sh, ci-package.sh) -----------------------------------
PACKAGING = REPO / "packaging"


def _bash(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", script, *args], capture_output=True, text=True, timeout=60, cwd=REPO)


def test_bundle_test_refuses_what_is_not_a_bundle(tmp_path):
    proc = _bash(str(PACKAGING / "test-bundle.sh"), str(tmp_path))
    assert proc.returncode == 2
    assert f"test-bundle.sh: error: no hearth and hearth-cli executables in {tmp_path}" in proc.stdout


def test_bundle_test_refuses_an_archive_it_cannot_unpack(tmp_path):
    bad = tmp_path / "hearth.tar.gz"
    bad.write_bytes(b"not a tarball")
    proc = _bash(str(PACKAGING / "test-bundle.sh"), str(bad))
    assert proc.returncode == 2 and f"test-bundle.sh: error: cannot unpack {bad}" in proc.stdout


def test_bundle_test_refuses_an_unknown_provider_or_argument(tmp_path):
    proc = _bash(str(PACKAGING / "test-bundle.sh"), str(tmp_path), "--provider", "rocm")
    assert proc.returncode == 2 and "--provider must be cpu or cuda, not 'rocm'" in proc.stdout
    proc = _bash(str(PACKAGING / "test-bundle.sh"))
    assert proc.returncode == 2 and proc.stdout.startswith("usage: packaging/test-bundle.sh")
    proc = _bash(str(PACKAGING / "test-bundle.sh"), str(tmp_path), "--fast")
    assert proc.returncode == 2 and "usage:" in proc.stdout


def test_a_resource_missing_from_a_bundle_fails_the_check_naming_it(tmp_path):
    internal = tmp_path / "_internal"
    (internal / "resources").mkdir(parents=True)
    shutil.copy(REPO / "resources" / "models.json", internal / "resources")
    check = f'REPO="{REPO}"; . packaging/test-lib.sh; check_resources "{internal}"; exit $FAILED'
    proc = subprocess.run(["bash", "-c", check], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 1
    assert "FAIL  resources missing from the bundle: __init__.py hearth.svg" in proc.stdout
    shutil.copytree(REPO / "resources", internal / "resources", dirs_exist_ok=True)
    proc = subprocess.run(["bash", "-c", check], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0 and "PASS  every file of resources/ is in the bundle" in proc.stdout


def test_ci_builds_and_install_tests_the_package_after_the_suite():
    ci = (REPO / ".ci" / "run").read_text()
    assert ci.index("python -m pytest") < ci.rindex("packaging/ci-package.sh")
    script = (PACKAGING / "ci-package.sh").read_text()
    assert "make package" in script and "packaging/test-install.sh" in script and "packaging/test-bundle.sh" in script


@pytest.mark.parametrize(("resume", "verdict"), [
    ('{"source": "disk", "restored_tokens": 51, "restore_estimate_ms": 3.2, "prefill_estimate_ms": 63.7}',
     "PASS  the second turn resumed from the saved context on disk (51 tokens)"),
    # a few dozen tokens on a GPU: re-reading them was estimated faster, which is the engine's own choice
    ('{"source": "cold", "restored_tokens": 0, "restore_estimate_ms": 2.5, "prefill_estimate_ms": 1.7}',
     "PASS  the second turn re-read its context: estimated faster (1.7 ms) than restoring it (2.5 ms)"),
    ('{"source": "cold", "restored_tokens": 0, "restore_estimate_ms": 2.5, "prefill_estimate_ms": 3.7}',
     "FAIL  the second turn did not resume from its saved context"),
    ('{"source": "rebuilt", "reason": "checksum", "restore_estimate_ms": null, "prefill_estimate_ms": null}',
     "FAIL  the second turn did not resume from its saved context"),
    ("", "FAIL  the second turn did not resume from its saved context: no resume report"),
])
def test_the_install_checks_tell_a_resumed_turn_from_one_that_was_not(resume, verdict):
    script = f"REPO='{REPO}'; . packaging/test-lib.sh; check_resumed '\"resume\": {resume}'; exit $FAILED"
    if not resume:
        script = f"REPO='{REPO}'; . packaging/test-lib.sh; check_resumed ''; exit $FAILED"
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert verdict in proc.stdout
    assert proc.returncode == (0 if verdict.startswith("PASS") else 1)


def test_the_server_runs_the_model_a_packaged_build_ships_converted(bundle, tmp_path, monkeypatch):
    """A CPU package ships the default model converted, without its GGUF: `hearth-cli serve` must offer and
    run it (the library lists it as not downloaded). Found by serving from the built package."""
    import httpx

    from engine.api import resolve_paths
    from tests.server_helpers import LiveServer

    monkeypatch.setenv(BUNDLED_MODEL_ENV, str(bundle))
    paths = resolve_paths(tmp_path / "user-home").ensure()  # nothing downloaded here
    server = LiveServer(paths, None)
    try:
        name = server.host.default_model
        assert [m["id"] for m in httpx.get(server.base + "/v1/models", timeout=30).json()["data"]] == [name]
        r = httpx.post(server.base + "/v1/chat/completions", timeout=120,
                       json={"model": name, "max_tokens": 4, "messages": [{"role": "user", "content": "Hello"}]})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"]
    finally:
        server.close()
