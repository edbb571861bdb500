"""Under torchrun the plan's node layout must be the launched one: checked from the launcher's
environment variables before any process group starts, so no real torchrun here."""

from __future__ import annotations

import argparse
import socket

import pytest

from spindle_dsl.backends.base import RunConfig
from spindle_dsl.backends.torch import TorchBackend
from spindle_dsl.backends.torch.launch import LaunchTopology, check_topology, launched_topology
from spindle_dsl.cli import cmd_train, main
from spindle_dsl.cli.common import load_compiled
from spindle_dsl.cost import make_cost_model
from spindle_dsl.errors import ExecutionError
from spindle_dsl.language import compile_file
from spindle_dsl.planner import make_plan


def test_the_launch_is_read_from_the_launchers_variables():
    assert launched_topology({"WORLD_SIZE": "8"}) is None  # a launcher that does not say
    t = launched_topology({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"})
    assert t == LaunchTopology(8, 4) and t.nodes == 2
    with pytest.raises(ExecutionError, match="same --nproc-per-node on every node"):
        launched_topology({"WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "4"})
    with pytest.raises(ExecutionError, match="must be integers"):
        launched_topology({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "four"})


def _plan(spec_dir, devices: int, per_node: int):
    graph = compile_file(
        spec_dir / "tiny_mm.spindle",
        cluster_overrides={"devices": devices, "devices_per_node": per_node},
    ).graph
    return graph, make_plan(graph, make_cost_model(graph.cluster), scheduler="paper")


def test_a_plan_for_another_node_layout_is_refused(spec_dir):
    _, plan = _plan(spec_dir, 4, 4)
    check_topology(plan.cluster, LaunchTopology(4, 4))  # as planned: fine
    with pytest.raises(ExecutionError) as err:
        check_topology(plan.cluster, LaunchTopology(4, 2))
    message = str(err.value)
    assert "4 devices, 4 per node (1 nodes)" in message
    assert "4 processes, 2 per node (2 nodes)" in message
    assert "torchrun --nnodes 1 --nproc-per-node 4" in message
    assert "--devices 4 --devices-per-node 2" in message


def test_the_backend_checks_before_any_process_group(spec_dir, monkeypatch):
    graph, plan = _plan(spec_dir, 4, 4)
    for k, v in {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
    }.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("MASTER_ADDR", raising=False)  # nothing could start a group anyway
    with pytest.raises(ExecutionError, match="torchrun started 4 processes, 2 per node"):
        TorchBackend().train(graph, plan, RunConfig(steps=1))


def test_a_plan_made_by_rank_zero_is_checked_too(spec_dir, monkeypatch):
    """Without a plan, rank 0 plans inside the process group; a plan for another layout is
    an error every rank gets (here the only rank)."""
    graph, plan = _plan(spec_dir, 4, 4)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ExecutionError, match="the plan just made is for 4 devices"):
        TorchBackend().train(graph, None, RunConfig(steps=1, device="cpu"), planner=lambda: plan)


def test_train_with_a_mismatched_plan_says_what_to_change(tmp_path, spec_dir, monkeypatch, capfd):
    spec = str(spec_dir / "tiny_mm.spindle")
    plan = tmp_path / "plan.json"
    assert main(["plan", spec, "--out", str(plan), "--quiet", "--scheduler", "paper"]) == 0
    capfd.readouterr()
    for k, v in {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "1",
    }.items():
        monkeypatch.setenv(k, v)
    assert main(["train", spec, "--plan", str(plan), "--steps", "1"]) == 1
    err = capfd.readouterr().err
    assert "4 devices, 4 per node" in err and "4 processes, 1 per node (4 nodes)" in err
    assert "Traceback" not in err


def test_train_without_a_plan_plans_for_the_launched_nodes(spec_dir, monkeypatch, capfd):
    parser = argparse.ArgumentParser()
    cmd_train.add_arguments(parser)
    args = parser.parse_args([str(spec_dir / "tiny_mm.spindle")])
    args.devices = 4  # as run() sets it from WORLD_SIZE
    compiled = load_compiled(args)
    assert compiled.graph.cluster.devices_per_node == 4  # the spec's default: one node
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    launched = cmd_train._for_launched_nodes(args, compiled, lead=True).graph
    assert (launched.cluster.devices, launched.cluster.devices_per_node) == (4, 2)
    err = capfd.readouterr().err
    assert "note: planning for the launched topology, 2 node(s) x 2 devices" in err
    assert "the spec says 4 per node" in err
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # the spec's layout: nothing to say
    args.devices_per_node = None
    assert cmd_train._for_launched_nodes(args, compiled, lead=True) is compiled
    assert capfd.readouterr().err == ""
