"""Issue 18, defect 17: ``hearth-cli tokenize`` and ``model info`` read the GGUF's tokenizer and metadata
only. Proved by running them where the model's ONNX conversion is absent or damaged, and by what the
process imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.model.convert import conversion_dir, gguf_digest
from engine.model.fetch import default_model

from .test_cli import assert_clean_error, run_cli

TEXTS = ("hello world", "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n", "naïve café — ünïcödé 🙂 tabs\tand  spaces")


@pytest.fixture
def model_only_home(real_home, tmp_path) -> Path:
    """A data dir with the real GGUF and no conversion of it."""
    home = tmp_path / "home"
    (home / "converted").mkdir(parents=True)
    (home / "models").symlink_to(real_home / "models")
    return home


@pytest.fixture
def damaged_conversion_home(model_only_home) -> Path:
    """The data dir above with a conversion whose ONNX files are garbage: loading it would fail."""
    gguf = model_only_home / "models" / default_model().filename
    folder = conversion_dir(model_only_home / "converted", gguf_digest(gguf), "int4")
    folder.mkdir(parents=True)
    for name in ("model.onnx", "model.onnx.data", "complete.json"):
        (folder / name).write_bytes(b"\x00not an onnx model\xff" * 64)
    return model_only_home


def tokenize(home: Path, text: str) -> list[int]:
    proc = run_cli("tokenize", text, "--json", home=home)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["ids"]


@pytest.mark.real_model
def test_defect17_tokenize_gives_the_engines_ids_without_an_onnx_model(real_engine, model_only_home):
    for text in TEXTS:
        assert tokenize(model_only_home, text) == real_engine.tokenizer.encode(text)
    assert list((model_only_home / "converted").iterdir()) == []  # nothing was converted to answer


@pytest.mark.real_model
def test_defect17_tokenize_and_model_info_work_beside_a_damaged_onnx_model(real_engine, damaged_conversion_home):
    before = {p.name: p.read_bytes() for p in (damaged_conversion_home / "converted").rglob("*") if p.is_file()}
    assert tokenize(damaged_conversion_home, TEXTS[1]) == real_engine.tokenizer.encode(TEXTS[1])
    proc = run_cli("model", "info", "--json", home=damaged_conversion_home)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["config"]["n_layers"] == 30 and info["text"]["tokenizer"] == "gpt2"
    after = {p.name: p.read_bytes() for p in (damaged_conversion_home / "converted").rglob("*") if p.is_file()}
    assert after == before  # neither read it as a model nor replaced it


@pytest.mark.real_model
def test_defect17_tokenize_imports_no_model_runtime(model_only_home):
    """In-process: after ``tokenize`` neither the engine nor ONNX / ONNX Runtime is imported."""
    script = ("import sys; from engine.cli import main; "
              f"code = main(['tokenize', '--data-dir', {str(model_only_home)!r}, 'hello world']); "
              "print([m for m in ('engine.generation', 'onnx', 'onnxruntime') if m in sys.modules], code)")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[] 0"


def test_defect17_tokenize_of_a_damaged_gguf_is_one_clear_error(tmp_path, tiny_gguf):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[:4096])  # the header promises more than the file holds
    proc = run_cli("tokenize", "--data-dir", str(tmp_path / "home"), "--model", str(cut), "hello")
    assert_clean_error(proc, "cut.gguf")


@pytest.fixture(scope="module")
def bundle(real_home, tmp_path_factory) -> Path:
    """The default model staged as a packaged build ships it: converted, plus its tokenizer, no GGUF."""
    from .test_packaging import load_script

    return load_script("stage_model").stage(tmp_path_factory.mktemp("bundle") / "model", ["int4"],
                                            explicit_from=str(real_home))


@pytest.mark.real_model
def test_defect17_a_packaged_build_tokenizes_from_its_tokenizer_file(real_engine, bundle, tmp_path):
    """A packaged build has no GGUF weights: ``tokenize`` reads the tokenizer file beside the conversion."""
    env = {"HEARTH_BUNDLED_MODEL": str(bundle)}
    proc = run_cli("tokenize", TEXTS[1], "--json", "--data-dir", str(tmp_path / "home"), env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ids"] == real_engine.tokenizer.encode(TEXTS[1])
    named = run_cli("tokenize", "hi", "--model", "no-such-model.gguf", "--data-dir", str(tmp_path / "home"), env=env)
    assert_clean_error(named, "no-such-model.gguf")  # a model named but missing is not answered by the bundle


def test_hearth_cli_says_its_version():
    import engine

    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"hearth-cli {engine.__version__}"


def test_the_engines_face_imports_no_mcp_sdk_until_a_tool_host_starts(tmp_path):
    """Every hearth-cli start imports engine.api; the MCP SDK (and its HTTP client) load only with a ToolHost."""
    sdk = ("mcp", "mcp_types", "httpx2", "anyio")
    script = ("import sys, engine.api; "
              f"print([m for m in {sdk!r} if m in sys.modules]); "
              f"host = engine.api.ToolHost(engine.api.ToolRegistry({str(tmp_path)!r})); "
              "print('mcp' in sys.modules); host.close()")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[]", "True"]  # none before; the host brought the SDK in


def reference_merges(tokens, types, scores):
    """The merges as first written (a key function over every split): what the faster loop must equal."""
    from engine.text.sentencepiece import NORMAL

    normal = {t for t, k in zip(tokens, types.tolist(), strict=True) if k == NORMAL}
    ranked = []
    for i, (piece, kind) in enumerate(zip(tokens, types.tolist(), strict=True)):
        if kind != NORMAL or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            if piece[:cut] in normal and piece[cut:] in normal:
                ranked.append((-float(scores[i]), i, piece[:cut], piece[cut:]))
    ranked.sort(key=lambda r: (r[0], r[1]))
    return [(left, right) for _, _, left, right in ranked]


def test_sentencepiece_merges_equal_the_reference_on_gemma(gemma_gguf):
    import numpy as np

    from engine.model.gguf_file import GGUFModel
    from engine.text.sentencepiece import merges_by_score

    model = GGUFModel(gemma_gguf)
    tokens, types = model.string_array("tokenizer.ggml.tokens"), model.int_array("tokenizer.ggml.token_type")
    scores = np.asarray(model.value("tokenizer.ggml.scores"), dtype=np.float32)
    assert merges_by_score(tokens, types, scores) == reference_merges(tokens, types, scores)


def test_sentencepiece_merges_break_score_ties_by_id_then_by_cut():
    import numpy as np

    from engine.text.sentencepiece import NORMAL, merges_by_score

    tokens = ["a", "b", "c", "ab", "bc", "abc"]
    types = np.full(len(tokens), NORMAL)
    scores = np.array([0, 0, 0, -1, -1, -1], dtype=np.float32)  # one score for every joined piece
    assert merges_by_score(tokens, types, scores) == reference_merges(tokens, types, scores) == \
        [("a", "b"), ("b", "c"), ("a", "bc"), ("ab", "c")]
