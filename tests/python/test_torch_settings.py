"""adaps.torch.Settings: every setting through the Settings object, the keyword arguments,
the environment and adaps.launch's flags has the same effect; the effective settings are
printed once, on rank 0."""
import json
import os
import re
import warnings

import pytest
import torch
import torch.nn as nn

import adaps.torch
from adaps import torch_settings
from conftest import run_launch

# Every setting that has an environment variable, as a value and as the variable's text.
VALUES = {"server_optimizer": "mean", "compression": "adacomp", "pull": "sparse",
          "bin_size": 250, "conv_bin_size": 25, "topk_fraction": 0.01, "lr": 0.02,
          "exchange": "update", "second_moment": "local", "own_updates": "all",
          "bin_schedule": "off", "row_sparse": "off", "local_steps": 2,
          "phase_bins": "keep", "outer": "nesterov"}
ENV = {"ADAPS_" + k.upper(): str(v) for k, v in VALUES.items()}
# adaps.launch's flag of each (outer has none: ADAPS_OUTER is set by hand).
FLAGS = ["--server-optimizer", "mean", "--compression", "adacomp", "--pull", "sparse",
         "--bin-size", "250", "--conv-bin-size", "25", "--topk-fraction", "0.01",
         "--lr", "0.02", "--exchange", "update", "--second-moment", "local",
         "--own-updates", "all", "--bin-schedule", "off", "--row-sparse", "off",
         "--local-steps", "2", "--phase-bins", "keep"]


@pytest.fixture
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("ADAPS_") and name[len("ADAPS_"):].lower() in torch_settings.NAMES:
            monkeypatch.delenv(name)
    return monkeypatch


def test_the_object_the_environment_and_replace_resolve_alike(clean_env):
    explicit = adaps.torch.Settings(**VALUES)
    assert explicit != adaps.torch.Settings()
    assert adaps.torch.Settings().replace(**VALUES) == explicit
    for k, v in ENV.items():
        clean_env.setenv(k, v)
    assert adaps.torch.Settings() == explicit
    assert adaps.torch.Settings().as_dict() == dict(explicit.as_dict())
    # The names that have no variable: only explicitly.
    more = adaps.torch.Settings(mode="local", bin_sizes={"0.weight": 7},
                                momentum_correction=False)
    assert (more.mode, more.bin_sizes, more.momentum_correction) == \
        ("local", {"0.weight": 7}, False)


def test_defaults_and_checks(clean_env):
    s = adaps.torch.Settings()
    assert (s.compression, s.bin_size, s.conv_bin_size, s.topk_fraction, s.second_moment,
            s.bin_schedule, s.row_sparse, s.local_steps, s.phase_bins, s.outer) == \
        ("adacomp", 500, 50, 0.001, "global", "auto", "exact", 1, "scale", "average")
    assert s.pull is None and s.exchange is None and s.own_updates is None
    with pytest.raises(TypeError, match="'bin_szie'"):
        adaps.torch.Settings(bin_szie=3)
    m = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="'bin_szie'"):
        adaps.torch.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m,
                                         object(), bin_szie=3)
    with pytest.raises(ValueError, match="unknown pull 'sometimes'"):
        adaps.torch.Settings(pull="sometimes")
    with pytest.raises(ValueError, match="local_steps must be an int >= 1"):
        adaps.torch.Settings(local_steps=0)
    with pytest.raises(ValueError, match="unknown phase_bins 'follow' \\(keep or scale\\)"):
        adaps.torch.Settings(phase_bins="follow")
    with pytest.raises(ValueError, match="local mode needs servers with --optimizer=mean"):
        adaps.torch.Settings(mode="local", server_optimizer="sgd")
    clean_env.setenv("ADAPS_BIN_SIZE", "big")
    with pytest.raises(ValueError, match="ADAPS_BIN_SIZE='big' is not a valid bin_size"):
        adaps.torch.Settings()


def test_an_explicit_value_over_a_different_exported_one_warns_once(clean_env):
    clean_env.setenv("ADAPS_BIN_SIZE", "250")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        s = adaps.torch.Settings(bin_size=100).replace(lr=0.5)
    said = [str(w.message) for w in seen if "overrides" in str(w.message)]
    assert s.bin_size == 100 and len(said) == 1 and "ADAPS_BIN_SIZE=250" in said[0], said
    m = nn.Linear(2, 2)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(Exception):  # worker=object(): fails at the first collective
            adaps.torch.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m,
                                             object(), server_optimizer="mean", bin_size=100)
    said = [w for w in seen if "overrides" in str(w.message)]
    assert len(said) == 1 and said[0].filename == __file__, [str(w.message) for w in said]


_SCRIPT = r'''
import json, sys
import torch, torch.nn as nn
import adaps.torch
how, values = sys.argv[1], json.loads(sys.argv[2])
model = nn.Linear(20, 5)
inner = torch.optim.Adam(model.parameters(), lr=0.01)
if how == "kwargs":
    opt = adaps.torch.DistributedOptimizer(inner, model, **values)
elif how == "settings":
    opt = adaps.torch.DistributedOptimizer(inner, model,
                                           settings=adaps.torch.Settings(**values))
else:
    opt = adaps.torch.DistributedOptimizer(inner, model)
for _ in range(2):
    opt.zero_grad()
    model(torch.randn(8, 20)).sum().backward()
    opt.step()
print("EFFECTIVE %s lr=%g" % (json.dumps(sorted(opt.settings.as_dict().items())),
                             opt.param_groups[0]["lr"]))
opt.worker.stop()
'''


def test_every_channel_reaches_the_optimizer_alike_and_rank_0_says_so_once(tmp_path,
                                                                          clean_env):
    script = tmp_path / "settings_worker.py"
    script.write_text(_SCRIPT)
    values = json.dumps(VALUES)
    runs = {}
    for how, launch_flags, env in (
            ("kwargs", ["--server-optimizer", "mean"], {}),
            ("settings", ["--server-optimizer", "mean"], {}),
            ("env", [], ENV),
            ("flags", FLAGS, {"ADAPS_OUTER": "nesterov"})):
        for k in ENV:
            clean_env.delenv(k, raising=False)
        for k, v in env.items():
            clean_env.setenv(k, v)
        code, out = run_launch(["-n", "2"] + launch_flags + [str(script), how, values],
                               timeout=90)
        assert code == 0, (how, out)
        effective = re.findall(r"EFFECTIVE (.*)", out)
        assert len(effective) == 2 and effective[0] == effective[1], (how, out)
        said = re.findall(r"adaps\.torch: local mode, update exchange, .*", out)
        assert len(said) == 1, (how, out)
        assert ("compression=adacomp, pull=sparse, bin_size=250, conv_bin_size=25, "
                "topk_fraction=0.01, server_optimizer=mean, lr=0.02") in said[0], said
        assert ("second_moment=local, own_updates=all, bin_schedule=off, row_sparse=off, "
                "local_steps=2, phase_bins=keep, outer=nesterov") in said[0], said
        runs[how] = (effective[0], said[0])
    assert len(set(runs.values())) == 1, runs
    assert runs["kwargs"][0].endswith("lr=0.02"), runs
