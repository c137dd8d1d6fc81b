"""pearl.config: an error names where the bad value came from, the file or a ``--set``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pearl import config as config_mod
from pearl.config import format_gpus, parse_gpus
from pearl.core.errors import ConfigError
from pearl.core.policy import PD, Borrow

ROOT = Path(__file__).resolve().parents[1]

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "sim-32.toml"


@pytest.mark.parametrize(
    "override, words",
    [
        ("engine.sim.time_scal=1", "unknown key engine.sim.time_scal; did you mean 'time_scale'?"),
        ("engine.vlm.port=1", "unknown key engine.vlm; did you mean 'vllm'?"),
        ("engine.nonsense=1", "unknown key engine.nonsense"),
        ("engin.kind=sim", "unknown section [engin]; did you mean 'engine'?"),
        ("engine.sim.time_scale=abc", "engine.sim.time_scale: expected float"),
    ],
)
@pytest.mark.parametrize("path", [CONFIG, None], ids=["file", "defaults"])
def test_a_bad_override_is_blamed_on_its_set(path: Path | None, override: str, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        config_mod.load(path, ["daemon.tick_s=0.1", override])
    msg = str(e.value)
    assert msg.startswith(f"--set {override}: ") and words in msg, msg
    assert str(CONFIG) not in msg, msg  # the file is not at fault


def test_a_bad_key_in_the_file_is_blamed_on_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(CONFIG.read_text() + "\n[engine.sim]\ntime_scal = 1\n")
    with pytest.raises(ConfigError, match=r"bad\.toml: unknown key engine\.sim\.time_scal; did"):
        config_mod.load(bad, ["engine.kind=sim"])  # an override of the same section is fine
    with pytest.raises(ConfigError, match=r"bad\.toml: unknown key engine\.sim\.time_scal; did"):
        config_mod.load(bad, ["engine.sim.start_s=1"])  # ... or of the same table


def test_an_override_of_a_known_key_still_applies() -> None:
    assert config_mod.load(CONFIG, ["engine.sim.time_scale=0.5"]).engine.sim.time_scale == 0.5


@pytest.mark.parametrize(
    "ids, text", [([], "-"), ([3], "3"), ([0, 1, 2, 3, 8], "0-3,8"), ([9, 4, 5], "4-5,9")]
)
def test_format_gpus_is_the_inverse_of_parse_gpus(ids: list[int], text: str) -> None:
    assert format_gpus(ids) == text
    if ids:
        assert parse_gpus(text) == tuple(sorted(ids))


@pytest.mark.parametrize(
    ("budget", "words"),
    [
        ("x", "not STEP:COUNT"),
        ("0:1", "not STEP:COUNT"),
        ("1:-1", "not STEP:COUNT"),
        ("3:0,2:1", "steps must increase"),
        ("1:0,5:4", "asks for 4 preemptible GPUs"),
    ],
)
def test_a_bad_demo_budget_says_what_is_wrong(budget: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        config_mod.load(ROOT / "configs" / "local-cpu.toml", [f"demo.budget={budget}"])


def test_the_demo_budget_parses_and_the_pd_demo_config_loads() -> None:
    cfg = config_mod.load(ROOT / "configs" / "local-cpu-pd.toml")
    assert config_mod.parse_budget(cfg.demo.budget, 3) == [(1, 0), (5, 3), (11, 0)]
    assert (cfg.demo.env, cfg.demo.warm_start, cfg.rl.env) == ("", False, "swe_like_small")


@pytest.mark.parametrize(
    "override, words",
    [
        ("daemon.borrow=gatd", "daemon.borrow = 'gatd'; expected one of gated, always, never"),
        ("daemon.pd=colocate", "expected one of adaptive, colocated, disaggregated"),
        ("engine.kind=torchh", "engine.kind = 'torchh'; expected one of sim, torch, sglang, vllm"),
        ("engine.kind=1", "engine.kind = 1; expected one of"),
        ("daemon.launcher=k8s", "daemon.launcher = 'k8s'; expected one of local, ray"),
    ],
)
def test_a_bad_choice_names_the_choices_and_its_origin(override: str, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        config_mod.load(CONFIG, [override])
    assert str(e.value).startswith(f"--set {override}: ") and words in str(e.value), str(e.value)


def test_choices_are_parsed_into_enum_members_once_at_the_edge() -> None:
    cfg = config_mod.load(
        CONFIG, ["engine.kind=torch", "daemon.borrow=never", "daemon.pd=colocated"]
    )
    assert cfg.engine.kind is config_mod.EngineKind.TORCH
    assert cfg.daemon.borrow is Borrow.NEVER and cfg.daemon.pd is PD.COLOCATED
    # a section built directly, or copied through JSON to a worker host, is parsed the same way
    copy = config_mod.EngineConfig(**json.loads(json.dumps(dataclasses.asdict(cfg.engine))))
    assert copy == cfg.engine and copy.kind is config_mod.EngineKind.TORCH
    with pytest.raises(ConfigError, match="did you mean 'always'"):
        config_mod.DaemonConfig(borrow="alway")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "old, new",
    [
        ("engine.vllm_model_path", "engine.vllm.model_path"),
        ("engine.sglang_router_port", "engine.sglang.router_port"),
        ("engine.preset", "engine.torch.preset"),
        ("engine.device_share", "engine.torch.device_share"),
        ("engine.time_scale", "engine.sim.time_scale"),
        ("engine.sim_start_s", "engine.sim.start_s"),
    ],
)
def test_a_flat_engine_key_of_before_names_the_key_it_moved_to(
    tmp_path: Path, old: str, new: str
) -> None:
    with pytest.raises(ConfigError) as e:
        config_mod.load(CONFIG, [f"{old}=1"])
    assert str(e.value).startswith(f"--set {old}=1: {old} moved to {new}; did you mean"), e.value
    flat = tmp_path / "flat.toml"
    flat.write_text(f"[engine]\nkind = 'sim'\n{old.split('.')[1]} = 1\n")
    with pytest.raises(ConfigError, match=rf"^{flat}: {old} moved to {new}"):
        config_mod.load(flat)


def test_each_engine_has_its_table_in_files_and_on_the_command_line(tmp_path: Path) -> None:
    f = tmp_path / "vllm.toml"
    f.write_text("[engine]\nkind = 'vllm'\n\n[engine.vllm]\nmodel_path = '/m'\nport = 4000\n")
    cfg = config_mod.load(f, ["engine.vllm.port=5000", "engine.torch.threads=2"])
    e = cfg.engine
    assert (e.kind, e.vllm.model_path, e.vllm.port, e.torch.threads) == ("vllm", "/m", 5000, 2)
    assert e.sglang == config_mod.SGLangConfig() and e.sim == config_mod.SimConfig()
    with pytest.raises(ConfigError, match=r"^--set engine.vllm=3: engine.vllm is a table"):
        config_mod.load(None, ["engine.vllm=3"])
    with pytest.raises(ConfigError, match=r"^--set engine.vllm.port=x: engine.vllm.port: expected"):
        config_mod.load(f, ["engine.vllm.port=x"])
    with pytest.raises(ConfigError, match="expected section.key=value"):
        config_mod.load(None, ["engine..port=1"])
