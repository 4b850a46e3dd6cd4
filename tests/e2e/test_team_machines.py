"""Two machines, one tuning (docs/team.md): two network namespaces, each with its own address and host name, run
``kedro run --pipelines=study`` in projects of their own on one PostgreSQL tuning database (the session's
``postgres``) and one MLflow server of the test's own, both reached over a bridge at this host's address. That server
has no login: behind MLflow's, every request checks the password hash (about a second on 2 busy cores) and
kedro-mlflow logs each parameter with a request of its own, so each machine's study run spent minutes on them.
Machine 1 is killed (-9) in its second trial: machine 0 finds that trial's heartbeat stale, fails it (not counted),
trains its values again, and ends FAILED the dead trial's MLflow run and machine 1's study run. The tuning ends
with exactly ``TRIALS`` COMPLETE trials, from both hosts, each trial one MLflow child run. Needs root (``ip
netns``); skipped where that is not permitted, except under CI."""

from __future__ import annotations

import secrets
import subprocess
import sys
import urllib.parse
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import mlflow
import optuna
import yaml

from tests.support.netns import Node, bridged_hosts, forwarded
from tests.support.processes import Watched
from tests.support.projects import TINY_PARAMS, make_project
from tests.support.servers import mlflow_server
from tests.support.trees import write_image_tree

TRIALS = 4
# seconds: machine 0 fails the dead trial half a minute after its last heartbeat; a live trial's heartbeat thread
# never waits that long, even while MindSpore compiles on a busy machine
HEARTBEAT = {"heartbeat_interval": 2, "grace_period": 30, "max_retry": 1}
SPACE = {"baseline": {"lr": {"peak": [0.01, 0.1], "warmup_epochs": None}, "weight_decay": None}}
MACHINES = ("machine0", "machine1")


def machine_project(root: Path, tree: Path, study: dict, tracking_uri: str, credentials: dict) -> Path:
    """A machine's own copy of the project: the shared tuning (its password in credentials.yml) and MLflow server."""
    data = {**TINY_PARAMS["data"], "root": str(tree), "step_eval_images": 6}
    project = make_project(root, {**TINY_PARAMS, "data": data, "study": study})
    local = project / "conf" / "local"
    (local / "mlflow.yml").write_text(yaml.safe_dump({"server": {"mlflow_tracking_uri": tracking_uri}}))
    (local / "credentials.yml").write_text(yaml.safe_dump(credentials))
    return project


def on_machine(node: Node, hostname: str, *command: str) -> list[str]:
    """``command`` in ``node``'s namespace under its own host name (a UTS namespace of its own), as on a machine
    called ``hostname``."""
    named = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hostname]
    return ["ip", "netns", "exec", node.namespace, *named, *command]


def test_two_machines_share_one_tuning_and_a_killed_machines_trial_is_retried(tmp_path, postgres):
    tag = secrets.token_hex(3)
    db_user, db_password, database = f"machines_{tag}", secrets.token_urlsafe(12), f"machines_{tag}"
    postgres.add_user(db_user, db_password, database)
    study_name = f"machines_{tag}"
    tree = write_image_tree(tmp_path / "tree", classes=("cat", "dog", "fox"), per_class={"train": 8, "val": 3})
    credentials = {"tuning_db": {"PGPASSWORD": db_password}}

    with ExitStack() as stack:
        server = stack.enter_context(mlflow_server(tmp_path / "mlflow.db", tmp_path / "mlflow.log", tmp_path / "store"))
        host_address, nodes = stack.enter_context(bridged_hosts(2))
        db = stack.enter_context(forwarded(host_address, postgres.port))
        tracking = stack.enter_context(forwarded(host_address, urllib.parse.urlsplit(server).port))
        study = {
            "recipes": ["baseline"],
            "seeds": [0],
            "epochs": 1,
            "eval_every_steps": 2,
            "tuning": {
                "trials": TRIALS,
                "seeds": [100],
                "sampler": "qmc",
                "storage": f"postgresql://{db_user}@{db}/{database}",
                "credentials": "tuning_db",
                "name": study_name,
                "spaces": SPACE,
                **HEARTBEAT,
            },
        }
        projects = [
            machine_project(tmp_path / name, tree, study, f"http://{tracking}", credentials) for name in MACHINES
        ]
        command = (sys.executable, "-m", "kedro", "run", "--pipelines=study")
        # machine 0's output to a file: a pipe nobody reads meanwhile would fill and stop it
        output0 = stack.enter_context((projects[0] / "output.txt").open("w"))
        machine0 = subprocess.Popen(
            on_machine(nodes[0], MACHINES[0], *command), cwd=projects[0], stdout=output0, stderr=subprocess.STDOUT
        )
        stack.callback(machine0.kill)  # a failed test leaves no machine running
        machine1 = Watched(on_machine(nodes[1], MACHINES[1], *command), cwd=projects[1])
        stack.callback(machine1.process.kill)
        # machine 1 finishes a trial, starts its next one, and dies in that trial's first steps
        machine1.wait_for("tuning baseline: trial")
        machine1.wait_for("epoch 1/1 step 1/")
        assert "waiting for" not in machine1.output, machine1.output[-3000:]  # a trial, not the fresh seed
        machine1.kill_group()
        assert machine0.wait(timeout=900) == 0, (projects[0] / "output.txt").read_text()[-5000:]

        output = (projects[0] / "output.txt").read_text()
        storage = postgres.url(db_user, database, db_password, "postgresql+psycopg")
        trials = optuna.load_study(study_name=f"{study_name}/baseline", storage=storage).trials
        states = Counter(trial.state.name for trial in trials)
        assert states == {"COMPLETE": TRIALS, "FAIL": 1}, states  # the dead trial not counted, none counted twice
        (dead,) = [trial for trial in trials if trial.state == optuna.trial.TrialState.FAIL]
        assert dead.user_attrs["host"] == MACHINES[1] and "error" not in dead.user_attrs
        (retry,) = [trial for trial in trials if trial.system_attrs.get("failed_trial") == dead.number]
        assert (
            retry.state.name == "COMPLETE" and retry.params == dead.params and retry.user_attrs["host"] == MACHINES[0]
        )
        assert {trial.user_attrs["host"] for trial in trials if trial.state.name == "COMPLETE"} == set(MACHINES)
        assert f"trial {dead.number} of {study_name}/baseline stopped with its process" in output

        client = mlflow.MlflowClient(server)
        experiment = client.get_experiment_by_name("resnet-recipes").experiment_id
        trial_runs = client.search_runs([experiment], f"tags.tuning_study = '{study_name}/baseline'")
        assert Counter(int(run.data.tags["trial"]) for run in trial_runs) == Counter(t.number for t in trials)
        for run in trial_runs:
            trial = trials[int(run.data.tags["trial"])]
            assert run.data.tags["trial_state"] == trial.state.name
            assert run.data.tags["host"] == trial.user_attrs["host"]
            assert run.info.status == ("FAILED" if trial is dead else "FINISHED")
        (dead_run,) = [run for run in trial_runs if run.data.tags["trial"] == str(dead.number)]
        assert dead_run.data.tags["trial_error"] == "stale"
        study_runs = {run.data.tags["mlflow.parentRunId"] for run in trial_runs}
        assert sorted((run.data.tags["host"], run.info.status) for run in map(client.get_run, study_runs)) == [
            (MACHINES[0], "FINISHED"),
            (MACHINES[1], "FAILED"),
        ]
