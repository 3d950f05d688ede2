"""The speculative flags of `server_args.py`: one field for the verify width under every
SGLang spelling, the verify mode as a flag (SGLang's variable its documented default), and
the refusals of flags that would do nothing, named before any model loads. SGLang's attention
backend names start on the default backend with a warning; other names are refused."""

import argparse
import logging
import sys

import pytest

from sglang_aux.srt.server_args import (
    RAGGED_VERIFY_MODE_ENV,
    SGLANG_ATTENTION_BACKENDS,
    ServerArgs,
)
from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="default")

DFLASH = ["--model-path", "m", "--speculative-algorithm", "DFLASH",
          "--speculative-draft-model-path", "d"]
DSPARK = ["--model-path", "m", "--speculative-algorithm", "DSPARK",
          "--speculative-draft-model-path", "d"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="launch_server")
    ServerArgs.add_cli_args(parser)
    return parser


def _args(argv: list[str]) -> ServerArgs:
    parser = _parser()
    return ServerArgs.from_parsed(parser, parser.parse_args(argv))


@pytest.fixture(autouse=True)
def _no_sglang_variable(monkeypatch):
    monkeypatch.delenv(RAGGED_VERIFY_MODE_ENV, raising=False)


@pytest.mark.parametrize("flags,width", [
    (["--speculative-verify-width", "5"], 5),
    (["--speculative-num-draft-tokens", "5"], 5),
    (["--speculative-dflash-block-size", "5"], 5),
    (["--speculative-dspark-block-size", "4"], 5),  # proposals: the width is one more
    (["--speculative-dspark-block-size", "4", "--speculative-num-draft-tokens", "5"], 5),
    ([], None),  # the draft config's
])
def test_every_spelling_sets_the_one_verify_width(flags, width):
    args = _args([*DSPARK, *flags])
    assert args.speculative_verify_width == width


def test_spellings_that_disagree_are_refused(capsys):
    with pytest.raises(SystemExit) as e:
        _args([*DFLASH, "--speculative-num-draft-tokens", "4",
               "--speculative-dflash-block-size", "8"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--speculative-num-draft-tokens and --speculative-dflash-block-size give " \
           "different verify widths (4 and 8" in err


def test_the_smallest_widths():
    with pytest.raises(ValueError, match="--speculative-verify-width must be >= 2 with DFLASH"):
        ServerArgs(**dict(_kw(DFLASH), speculative_verify_width=1))
    with pytest.raises(ValueError, match="--speculative-verify-width must be >= 3 with DSPARK"):
        ServerArgs(**dict(_kw(DSPARK), speculative_verify_width=2))


def _kw(argv: list[str]) -> dict:
    return {"model_path": "m", "speculative_algorithm": argv[3],
            "speculative_draft_model_path": "d"}


def test_verify_mode_is_a_flag_whose_help_names_the_variable():
    assert _args(DFLASH).speculative_verify_mode == "static"
    assert _args([*DFLASH, "--speculative-verify-mode", "compact"]).speculative_verify_mode \
        == "compact"
    text = " ".join(_parser().format_help().split())
    assert "--speculative-verify-mode {static,compact}" in text
    assert f"default: SGLang's environment variable {RAGGED_VERIFY_MODE_ENV} when set, else " \
           "static" in text
    for flag in ("--compact-verify-budget-frac", "--compact-verify-max-tokens",
                 "--speculative-dspark-align-verify-tokens-to-graph-tier"):
        assert f"{flag}" in text
    assert "--speculative-num-draft-tokens" in text and "--speculative-dspark-block-size" in text


def test_sglang_variable_is_the_default_and_the_flag_wins(monkeypatch):
    monkeypatch.setenv(RAGGED_VERIFY_MODE_ENV, "compact")
    args = _args(DFLASH)
    assert args.speculative_verify_mode == "compact"
    assert args.compact_verify_budget_frac == 0.5  # compact's default budget
    assert _args([*DFLASH, "--speculative-verify-mode", "static"]).speculative_verify_mode \
        == "static"
    monkeypatch.setenv(RAGGED_VERIFY_MODE_ENV, "cap-accept")
    with pytest.raises(ValueError, match="SGLANG_RAGGED_VERIFY_MODE='cap-accept' is not "
                                         "supported"):
        ServerArgs(**_kw(DFLASH))


@pytest.mark.parametrize("flag", [["--compact-verify-budget-frac", "0.25"],
                                  ["--compact-verify-max-tokens", "64"],
                                  ["--speculative-dspark-align-verify-tokens-to-graph-tier"]])
def test_compact_only_flags_with_static_verify_are_refused(flag, capsys):
    with pytest.raises(SystemExit):
        _args([*DSPARK, *flag])
    err = capsys.readouterr().err
    assert f"{flag[0]} only act with --speculative-verify-mode compact" in err
    args = _args([*DSPARK, "--speculative-verify-mode", "compact", *flag])
    assert args.speculative_verify_mode == "compact"


def test_compact_budgets_are_one_or_the_other():
    with pytest.raises(ValueError, match="--compact-verify-budget-frac and "
                                         "--compact-verify-max-tokens are two budgets"):
        ServerArgs(**_kw(DFLASH), speculative_verify_mode="compact",
                   compact_verify_budget_frac=0.5, compact_verify_max_tokens=64)
    args = ServerArgs(**_kw(DFLASH), speculative_verify_mode="compact",
                      compact_verify_max_tokens=64)
    assert args.compact_verify_budget_frac is None and args.compact_verify_max_tokens == 64


@pytest.mark.parametrize("flag", [["--speculative-verify-mode", "compact"],
                                  ["--speculative-verify-width", "4"],
                                  ["--compact-verify-max-tokens", "64"]])
def test_speculative_flags_without_a_speculative_algorithm_are_refused(flag, capsys):
    with pytest.raises(SystemExit):
        _args(["--model-path", "m", "--speculative-algorithm", "NONE", *flag])
    assert f"{flag[0]} only act with --speculative-algorithm DFLASH or DSPARK" in \
        capsys.readouterr().err


@pytest.mark.parametrize("name", ["flashinfer", "fa3"])
def test_sglang_attention_backends_run_the_default_with_a_warning(name, caplog):
    assert name in SGLANG_ATTENTION_BACKENDS
    with caplog.at_level(logging.WARNING, logger="sglang_aux.srt.server_args"):
        args = _args(["--model-path", "m", "--attention-backend", name])
    assert args.attention_backend is None
    assert args.resolved_attention_backend() in ("triton", "torch_native")
    [record] = [r for r in caplog.records if "--attention-backend" in r.getMessage()]
    assert record.getMessage() == (f"--attention-backend {name}: SGLang's, not built in this "
                                   "runtime; running the default (triton on CUDA, "
                                   "torch_native on CPU)")
    assert _args(["--model-path", "m", "--attention-backend", "triton"]).attention_backend \
        == "triton"


def test_unknown_attention_backend_is_refused(capsys):
    with pytest.raises(SystemExit):
        _args(["--model-path", "m", "--attention-backend", "flashattn9"])
    assert "invalid choice: 'flashattn9'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--attention-backend must be one of"):
        ServerArgs(model_path="m", attention_backend="flashattn9")



CUDA = ["--device", "cuda"]  # a named device: nothing probes for a GPU


@pytest.mark.parametrize("argv,mixed", [
    ([*CUDA, "--model-path", "m"], True),  # the default on CUDA, target-only
    ([*CUDA, *DFLASH], True),  # static verify
    ([*CUDA, *DSPARK, "--speculative-verify-mode", "compact"], False),  # no mixed forward
    ([*CUDA, *DFLASH, "--disable-mixed-chunk"], False),
    (["--device", "cpu", *DFLASH], False),  # the CPU's default
    (["--device", "cpu", *DFLASH, "--enable-mixed-chunk"], True),  # SGLang's flag, kept
])
def test_mixed_steps_are_on_by_default_where_they_win(argv, mixed):
    args = _args(argv)
    assert args.enable_mixed_chunk is mixed
    # resolved once: what the scheduler process and the ranks rebuild stays the same
    assert ServerArgs(**vars(args)).enable_mixed_chunk is mixed


def test_mixed_steps_asked_of_compact_verify_or_both_ways_are_refused(capsys):
    with pytest.raises(SystemExit):
        _args([*DFLASH, "--enable-mixed-chunk", "--disable-mixed-chunk"])
    assert "not allowed with argument --enable-mixed-chunk" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _args([*DFLASH, "--speculative-verify-mode", "compact", "--enable-mixed-chunk"])
    assert "--enable-mixed-chunk with --speculative-verify-mode compact" in \
        capsys.readouterr().err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
