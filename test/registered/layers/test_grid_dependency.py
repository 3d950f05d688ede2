"""Programmatic dependent launch's switch off the GPU (`triton_ops/grid_dependency.py`): by
default (`auto`) launches are plain where the device lacks PDL (the CPU, the interpreter), `0`
keeps them plain, `1` and `pdl=True` there are refused in one line, and an unknown value names
the choices. On the H200: test_grid_dependency_cuda.py."""

import sys

import pytest
import torch

from sglang_aux.srt.layers.triton_ops.grid_dependency import ENV_VAR, resolve_pdl
from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="default")


def test_auto_is_off_without_the_hardware(monkeypatch):
    x = torch.zeros(1)
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert resolve_pdl(None, x) is False
    monkeypatch.setenv(ENV_VAR, "auto")
    assert resolve_pdl(None, x) is False and resolve_pdl(False, x) is False
    monkeypatch.setenv(ENV_VAR, "0")
    assert resolve_pdl(None, x) is False


def test_asking_for_it_without_the_hardware_is_refused(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "1")
    with pytest.raises(ValueError, match="needs compiled Triton on a CUDA device"):
        resolve_pdl(None, torch.zeros(1))
    monkeypatch.delenv(ENV_VAR)
    with pytest.raises(ValueError, match="needs compiled Triton on a CUDA device"):
        resolve_pdl(True, torch.zeros(1))
    monkeypatch.setenv(ENV_VAR, "yes")
    with pytest.raises(ValueError, match=f"{ENV_VAR}='yes'; choose from auto, 0, 1"):
        resolve_pdl(None, torch.zeros(1))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
