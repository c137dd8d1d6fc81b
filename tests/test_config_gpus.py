"""GPU lists are bounded before they are expanded: a range such as ``24-2000000000`` is one line,
at once and in little memory, from every place that reads one (``--gpus``, config files, Ray node
labels, a worker host's ``--gpus``); issue 35 saw the CLI grow to 21.5 GB on it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from actors.ray_nodes import RayNode, held
from pearl import config as config_mod
from pearl.config import parse_gpus
from pearl.core.bounds import MAX_GPU_ID, MAX_GPUS
from pearl.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
HUGE = "24-2000000000"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (HUGE, f"'{HUGE}' is out of range: GPU ids are 0-{MAX_GPU_ID}"),
        (f"0-{MAX_GPU_ID + 1}", "is out of range"),
        ("0-" + "9" * 4000, "is out of range"),  # int() takes it; never expanded
        ("0-" + "9" * 5000, "is not a GPU id or range"),  # beyond int()'s digit limit
        (f"0-{MAX_GPUS}", f"more than {MAX_GPUS} GPU ids"),
        ("0-40000,100000-140000", f"more than {MAX_GPUS} GPU ids (at '100000-140000')"),
        (",".join(map(str, range(MAX_GPUS + 1))), f"more than {MAX_GPUS} GPU ids"),
        ([0, MAX_GPU_ID + 1], f"GPU id {MAX_GPU_ID + 1} is out of range"),
        ([-1], "GPU id -1 is out of range"),
        (list(range(MAX_GPUS + 1)), f"at most {MAX_GPUS} in one list"),
        ("5-3", "runs backwards"),
        ("x", "is not a GPU id or range like 0-15"),
    ],
    ids=lambda v: str(v)[:24],
)
def test_a_gpu_list_out_of_bounds_is_one_line_at_once(value: object, words: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as e:
        parse_gpus(value, "--gpus")
    assert time.monotonic() - t0 < 1.0
    msg = str(e.value)
    assert msg.startswith("--gpus: ") and words in msg and "\n" not in msg, msg
    assert len(msg) < 200, msg  # a long argument is shortened, not echoed


def test_the_largest_lists_and_ids_within_bounds_parse() -> None:
    assert parse_gpus(f"0-{MAX_GPUS - 1}") == tuple(range(MAX_GPUS))
    assert parse_gpus(f"{MAX_GPU_ID}") == (MAX_GPU_ID,)
    assert parse_gpus([MAX_GPU_ID, 0]) == (0, MAX_GPU_ID)


def test_a_config_file_range_is_bounded(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    text = (ROOT / "configs" / "sim-32.toml").read_text()
    bad.write_text(text.replace('preemptible_gpus = "20-31"', f'preemptible_gpus = "{HUGE}"'))
    with pytest.raises(ConfigError) as e:
        config_mod.load(bad)
    msg = str(e.value)
    assert "bad.toml" in msg and "out of range: GPU ids are 0-" in msg and "\n" not in msg, msg


def test_a_ray_node_label_is_bounded() -> None:
    cfg = config_mod.load(
        None,
        [
            "cluster.tp=1",
            "cluster.training_gpus=8-9",
            "cluster.reserved_gpus=0-1",
            "cluster.preemptible_gpus=2-7",
            "daemon.launcher=ray",
        ],
    )
    node = RayNode(node_id="1", address="10.0.0.1", alive=True, gpus=2, labels={"pearl-gpus": HUGE})
    with pytest.raises(ConfigError, match=r"label pearl-gpus: '24-2000000000' is out of range"):
        held(cfg, node)


# Runs the CLI from a fresh interpreter and prints its exit code and peak RSS (KB): forked from
# pytest itself, the child's ru_maxrss would count pytest's memory too. At most 2 GB may be mapped:
# the unbounded parser asked for ~16 GB on this range at once.
MEASURE = """
import resource, subprocess, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
r = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.stderr.write(r.stderr)
"""


def test_the_cli_refuses_a_huge_range_in_one_line_and_little_memory(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "pearl", "event", "gpus-added", "--gpus", HUGE]
    r = subprocess.run(
        [sys.executable, "-c", MEASURE, *cmd],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PEARL_ENDPOINT": f"ipc://{tmp_path}/nobody.sock"},
        timeout=60,
    )
    rc, rss_kb = map(int, r.stdout.split())
    lines = r.stderr.strip().splitlines()
    assert rc == 1, lines
    assert lines == [
        f"pearl event: --gpus: '{HUGE}' is out of range: GPU ids are 0-{MAX_GPU_ID}"
    ], lines
    assert rss_kb < 100 * 1024, rss_kb  # the interpreter and its imports
