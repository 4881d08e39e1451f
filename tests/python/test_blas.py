"""adaps.blas: which BLAS torch runs on, and a loud warning on the reference one."""
import json
import os
import subprocess
import sys

import pytest

_REFERENCE_DIR = "/usr/lib/x86_64-linux-gnu/blas"
_PROBE = ("import json, sys, adaps.blas as b; i = b.blas_info(); "
          "b.warn_if_reference(i); print(json.dumps(i))")


def _probe(extra_env=None):
    env = dict(os.environ, **(extra_env or {}))
    r = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def test_the_test_command_installs_an_optimized_blas_and_torch_runs_on_it():
    info, err = _probe()
    assert info["kind"] != "reference", (info, "deploy/install-deps.sh must install "
                                         "libopenblas0-pthread")
    assert info["gflops_1thread"] > 0
    assert "WARNING" not in err


def _torch_links_the_system_blas():
    import torch
    return "blas_info=mkl" not in torch.__config__.show().lower()


@pytest.mark.skipif(not os.path.exists(os.path.join(_REFERENCE_DIR, "libblas.so.3")),
                    reason="Debian's reference BLAS (libblas3) is not installed")
@pytest.mark.skipif(not _torch_links_the_system_blas(),
                    reason="this torch carries its own BLAS (the package index's MKL build)")
def test_a_run_on_the_reference_blas_is_named_and_warned_about():
    # The reference library first on the search path: what a machine without OpenBLAS runs.
    info, err = _probe({"LD_LIBRARY_PATH": _REFERENCE_DIR})
    assert info["kind"] == "reference", info
    assert info["library"].startswith(_REFERENCE_DIR), info
    assert "WARNING: PyTorch runs on the reference BLAS" in err


@pytest.mark.skipif(_torch_links_the_system_blas(), reason="Debian's torch links libblas.so.3")
def test_the_package_index_torch_is_named_by_its_own_blas():
    # numpy's bundled OpenBLAS is mapped too, but torch's products run on its MKL.
    info, err = _probe()
    assert info["kind"] == "mkl", info
    assert "inside torch" in info["library"], info
