"""AUTOCLUST_FLAGS parsing: values, overrides, errors that list the known flags."""

import pytest

from autoclust import flags
from autoclust.errors import FlagError


def test_defaults():
    f = flags.parse("")
    assert f.auto_jit == 2
    assert f.min_cluster_size == 4
    assert f.device == "cpu"
    assert f.dump_to == ""
    assert f.must_compile is False
    assert f.ops_to_cluster == ()


@pytest.mark.parametrize("text, name, value", [
    ("--auto_jit=1", "auto_jit", 1),
    ("--must_compile", "must_compile", True),
    ("--must_compile=false", "must_compile", False),
    ("--dump_to=/tmp/x", "dump_to", "/tmp/x"),
    ("--cluster_exclude_ops=Exp,MATMUL", "cluster_exclude_ops", ("Exp", "MATMUL")),
    ("--device=interpreter", "device", "interpreter"),
    ("--clustering_fuel=0", "clustering_fuel", 0),
    ("  --min_cluster_size=1   --auto_jit=0 ", "min_cluster_size", 1),
])
def test_parse_values(text, name, value):
    assert getattr(flags.parse(text), name) == value


def test_env_and_overrides(monkeypatch):
    monkeypatch.setenv(flags.ENV_VAR, "--auto_jit=1 --min_cluster_size=3")
    f = flags.parse(min_cluster_size=7)
    assert f.auto_jit == 1 and f.min_cluster_size == 7


@pytest.mark.parametrize("text, fragment", [
    ("--no_such_flag=1", "unknown flag --no_such_flag"),
    ("--auto_jit=5", "--auto_jit=5 is not one of: 0, 1, 2"),
    ("--auto_jit=fast", "--auto_jit takes an integer"),
    ("--must_compile=maybe", "--must_compile takes true or false"),
    ("--device=tpu", "not one of: cpu, gpu, interpreter"),
    ("auto_jit=1", "flags look like --name=value"),
    ("--dump_to", "--dump_to needs a value"),
])
def test_errors(text, fragment):
    with pytest.raises(FlagError) as info:
        flags.parse(text)
    assert fragment in str(info.value)


def test_unknown_flag_lists_known_flags():
    with pytest.raises(FlagError) as info:
        flags.parse("--autojit=1")
    message = str(info.value)
    for spec in flags.SPECS:
        assert f"--{spec.name}" in message


def test_unknown_keyword_override():
    with pytest.raises(FlagError, match="unknown flag --bogus"):
        flags.parse("", bogus=1)


def test_table_lists_every_flag_with_default():
    text = flags.table()
    for spec in flags.SPECS:
        assert f"--{spec.name}" in text
    assert "min_cluster_size  int" in text.replace("   ", "  ") or "--min_cluster_size" in text


def test_to_string_round_trips():
    f = flags.parse("--auto_jit=1 --cluster_exclude_ops=Exp,Tanh --must_compile")
    assert flags.parse(f.to_string()) == f


def test_code_key_contains_only_code_changing_flags():
    f = flags.parse("--device=interpreter --dump_to=/tmp/a")
    names = {n for n, _ in f.code_key()}
    assert "device" in names and "dump_to" not in names


def test_env_requests_jit(monkeypatch):
    monkeypatch.delenv(flags.ENV_VAR, raising=False)
    assert not flags.env_requests_jit()
    monkeypatch.setenv(flags.ENV_VAR, "--auto_jit=0")
    assert not flags.env_requests_jit()
    monkeypatch.setenv(flags.ENV_VAR, "--auto_jit=2 --dump_to=/tmp/x")
    assert flags.env_requests_jit()
