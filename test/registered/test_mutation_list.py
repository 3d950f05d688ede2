"""scripts/mutation_check.py's mutations still apply: each one's text occurs exactly once in its
file, its replacement differs, and the tests it names exist. A refactor that moves a mutated
line would otherwise leave the mutation unapplied (the check reports it only when run)."""

import sys
from pathlib import Path

import pytest

from sglang_aux.test.bench_script import load_bench
from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="default")

REPO = Path(__file__).resolve().parents[2]
check = load_bench(REPO / "scripts/mutation_check.py")


def test_every_mutation_applies_once_and_names_tests_that_exist():
    names = [m.name for m in check.MUTATIONS]
    assert len(names) == len(set(names)) > 100
    for m in check.MUTATIONS:
        assert (REPO / m.path).read_text().count(m.old) == 1, m.name
        assert m.new != m.old, m.name
        for test in m.tests:
            file, _, node = test.partition("::")
            text = (REPO / file).read_text()
            assert not node or f"def {node.split('[')[0]}(" in text, (m.name, test)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
