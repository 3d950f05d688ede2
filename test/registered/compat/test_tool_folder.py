"""The folders that tests install tools into (`sglang_aux.test.tool_folder`): an install that
fails, by pip or by an import, leaves nothing behind and the next run builds it; a checked
install is reused; one that no longer imports, or an older install of ours, is rebuilt; a
folder with files and no stamp is named, not deleted. The installs here write a real package
whose import the folder's check runs in a real interpreter."""

import os
import sys
from pathlib import Path

import pytest

from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.tool_folder import STAMP, ToolFolder, ToolImportError

register_cpu_ci(est_time=15, suite="default")

MODULE = "tool_under_test"


class Installs:
    """An install that writes `MODULE` (importing `needs`, when given), counting its runs."""

    def __init__(self, needs: str | None = None, pip_fails: bool = False):
        self.needs, self.pip_fails, self.runs = needs, pip_fails, 0

    def __call__(self, folder: Path) -> None:
        self.runs += 1
        package = folder / MODULE
        package.mkdir()
        (package / "__init__.py").write_text(f"import {self.needs}\n" if self.needs else "")
        if self.pip_fails:
            raise RuntimeError("pip could not install it")


def _folder(path: Path, install: Installs) -> ToolFolder:
    return ToolFolder(path, install, (MODULE,), lambda _: [sys.executable],
                      lambda folder: {**os.environ, "PYTHONPATH": str(folder)})


@pytest.mark.parametrize("failure", [
    Installs(needs="a_package_nobody_installed"), Installs(pip_fails=True)])
def test_a_failed_install_leaves_nothing_and_the_next_run_builds_it(tmp_path, failure):
    target = tmp_path / "tools" / "tool"
    error = ToolImportError if failure.needs else RuntimeError
    with pytest.raises(error) as raised:
        _folder(target, failure).ready()
    if failure.needs:
        message = str(raised.value)
        assert "a_package_nobody_installed" in message and str(target) in message
    assert list((tmp_path / "tools").iterdir()) == []
    good = Installs()
    assert _folder(target, good).ready() == target
    assert good.runs == 1
    assert (target / STAMP).read_text().split() == [MODULE]
    assert (target / MODULE / "__init__.py").is_file()


def test_a_checked_install_is_reused(tmp_path):
    install = Installs()
    _folder(tmp_path / "tool", install).ready()
    _folder(tmp_path / "tool", install).ready()
    assert install.runs == 1


def test_an_install_that_no_longer_imports_is_rebuilt(tmp_path):
    install = Installs()
    target = _folder(tmp_path / "tool", install).ready()
    (target / MODULE / "__init__.py").unlink()
    (target / MODULE).rmdir()
    assert _folder(target, install).ready() == target
    assert install.runs == 2
    assert (target / MODULE / "__init__.py").is_file()


@pytest.mark.parametrize("stamp, text", [(".installed-0.5.23", "ok\n"), (STAMP, "ok\n")])
def test_an_older_install_of_ours_is_rebuilt(tmp_path, stamp, text):
    target = tmp_path / "tool"
    target.mkdir()
    (target / stamp).write_text(text)
    (target / "half_installed.py").write_text("")
    install = Installs()
    _folder(target, install).ready()
    assert install.runs == 1
    assert sorted(p.name for p in target.iterdir()) == sorted([STAMP, MODULE])


def test_a_folder_without_a_stamp_is_named_not_deleted(tmp_path):
    target = tmp_path / "tool"
    target.mkdir()
    (target / "notes.txt").write_text("someone's")
    with pytest.raises(FileExistsError, match=f"{target} holds files but no"):
        _folder(target, Installs()).ready()
    assert (target / "notes.txt").read_text() == "someone's"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
