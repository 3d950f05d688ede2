"""Code tasks from documented functions (`code_tasks.py`): parsed, never imported; bounded,
deduplicated, both forms, the same tasks for the same seed; saved and read back whole, a bad
file named with its line; the shipped file the code + chat recipe reads: 3,000 distinct tasks
of both forms, none holding a HumanEval prompt's signature or docstring."""

import sys

import pytest

from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.humaneval import read_problems
from sglang_aux.tools.dflash_training.code_tasks import (
    MIN_DOC_CHARS,
    MORE_TASKS_FILE,
    TASKS_FILE,
    code_tasks,
    functions_of,
    load_tasks,
    main,
    python_files,
    save_tasks,
    source_roots,
)
from sglang_aux.tools.dflash_training.contamination import normalized

register_cpu_ci(est_time=6, suite="default")

DOC = "Return the sum of the squares of the numbers, ignoring any that are negative."


def _module(i: int) -> str:
    return (f'raise SystemExit("imported")\n\n\ndef sum_sq_{i}(xs: list[int]) -> int:\n'
            f'    """{DOC} Variant {i}."""\n    return 0\n\n\n'
            'def _private(x):\n    """A private helper that is never a task, however long its '
            'docstring grows to be."""\n\n\ndef short(x):\n    """Too short."""\n')


@pytest.fixture
def root(tmp_path):
    for i in range(6):
        (tmp_path / f"pkg{i}").mkdir()
        (tmp_path / f"pkg{i}" / "mod.py").write_text(_module(i))
    (tmp_path / "pkg0" / "copy.py").write_text(_module(0))  # the same docstring again
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_mod.py").write_text(_module(99))
    (tmp_path / "broken.py").write_text("def f(:\n")
    return tmp_path


def test_public_documented_functions_within_bounds_only(root):
    found = list(functions_of(root / "pkg3" / "mod.py", root))
    assert found == [("pkg3/mod.py:sum_sq_3", "def sum_sq_3(xs: list[int]) -> int:",
                      f"{DOC} Variant 3.")]
    assert list(functions_of(root / "broken.py", root)) == []
    assert root / "tests" / "test_mod.py" not in python_files([root])


def test_tasks_are_distinct_of_both_forms_and_seeded(root):
    tasks = code_tasks(10, seed=1, roots=[root])
    assert len(tasks) == 6  # six distinct docstrings; the copy and the test folder add none
    assert len({t.docstring for t in tasks}) == 6
    assert {t.form for t in tasks} == {"completion", "instruction"}
    assert code_tasks(10, seed=1, roots=[root]) == tasks
    assert [t.name for t in code_tasks(3, seed=2, roots=[root])] != [t.name for t in tasks[:3]]
    t = tasks[0]
    assert t.completion_prompt().startswith(f'{t.signature}\n    """\n    {DOC}')
    assert t.instruction().startswith(f"Write a Python function `{t.signature[:-1]}`")


def test_a_second_draw_leaves_out_the_functions_of_the_first(root, tmp_path, capsys):
    """`exclude` (`--exclude FILE`): a second set of tasks holds no docstring or signature of
    the first's, whatever the seed."""
    first = code_tasks(3, seed=1, roots=[root])
    second = code_tasks(10, seed=1, roots=[root], exclude=first)
    assert len(second) == 3  # the six functions less the first three
    assert not {t.docstring for t in first} & {t.docstring for t in second}
    save_tasks(first, tmp_path / "first.jsonl")
    main(["--num", "10", "--seed", "2", "--root", str(root), "--exclude",
          str(tmp_path / "first.jsonl"), "--out", str(tmp_path / "second.jsonl")])
    again = load_tasks(tmp_path / "second.jsonl")
    assert {t.docstring for t in again} == {t.docstring for t in second}


def test_a_task_holding_an_evaluation_signature_is_not_drawn(root):
    """`avoid` (the command: HumanEval's signatures): a task whose signature and docstring
    hold one, whitespace runs as one space, is left out; the trainer would refuse its
    prompt."""
    tasks = code_tasks(10, seed=1, roots=[root], avoid=["def   sum_sq_3(xs:\n list[int])"])
    assert len(tasks) == 5 and "def sum_sq_3" not in " ".join(t.signature for t in tasks)
    assert len(code_tasks(10, seed=1, roots=[root], avoid=["VARIANT 2.", "Variant 4."])) == 4


def test_no_documented_function_is_an_error_naming_the_folder(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match=str(tmp_path)):
        code_tasks(2, seed=0, roots=[tmp_path])


def test_the_standard_library_gives_tasks():
    stdlib = [r for r in source_roots() if (r / "json" / "__init__.py").is_file()]
    tasks = code_tasks(4, seed=0, roots=stdlib)
    assert len(tasks) == 4 and all(len(t.docstring) >= MIN_DOC_CHARS for t in tasks)
    assert all(t.signature.startswith(("def ", "async def ")) for t in tasks)


def test_saved_tasks_read_back_whole_and_a_bad_file_is_named(root, tmp_path, capsys):
    tasks = code_tasks(4, seed=3, roots=[root])
    for name in ("t.jsonl", "t.jsonl.xz"):
        save_tasks(tasks, tmp_path / name)
        assert load_tasks(tmp_path / name) == tasks
    main(["--num", "2", "--seed", "3", "--root", str(root), "--out", str(tmp_path / "cli.jsonl")])
    assert "code tasks ->" in capsys.readouterr().out and load_tasks(tmp_path / "cli.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text((tmp_path / "t.jsonl").read_text() + '{"name": "x"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:5: not a code task"):
        load_tasks(bad)
    with pytest.raises(ValueError, match="not a readable code tasks file"):
        load_tasks(tmp_path / "missing.jsonl.xz")


def test_the_shipped_tasks_are_distinct_of_both_forms_and_not_humaneval():
    """Both shipped files: the mix's 3,000 and the 3,260 more, whose first 3,000 its second
    set of prompts takes (half of each form), none of a function of the first file."""
    tasks = load_tasks(TASKS_FILE)
    more = load_tasks(MORE_TASKS_FILE)
    assert len(tasks) == 3_000 and len(more) == 3_260
    for some in (tasks, more):
        assert len({t.name for t in some}) == len(some)
        assert [t.form for t in some[:3_000]].count("completion") == 1_500
        text = "\0".join(normalized(t.signature + " " + t.docstring) for t in some)
        for problem in read_problems():
            assert normalized(problem.signature()) not in text, problem.task_id
    keys = {normalized(k) for t in tasks for k in (t.docstring, t.signature)}
    assert not keys & {normalized(k) for t in more for k in (t.docstring, t.signature)}


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
