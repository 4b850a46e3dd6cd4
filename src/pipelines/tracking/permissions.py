"""A team's permission plan on an MLflow server behind its login (``mlflow server --app-name model-training-auth``,
docs/team.md), applied through MLflow's public auth client (``mlflow.server.get_app_client("basic-auth")``):

- the admin creates the experiments and reserves the registered model names (creates them, with no version), so no
  teammate's first run creates one and holds MANAGE on it;
- members get EDIT on the experiments (they log runs) and READ on the registered models;
- the release role gets EDIT on the experiments and MANAGE on the registered models: it alone creates versions and
  moves their aliases, ``champion`` included, whose code ``predict`` and ``mlflow models serve`` load and run.

``apply_plan`` is idempotent: a permission already as planned is left alone, one that differs is replaced (alice's
MANAGE on the experiment her run created becomes EDIT when she is a member). It runs as whoever the tracking
credentials name (``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``, as every MLflow client): only the
server's admin may grant; a refusal is told by ``tracking.login.refused_login``. No password is read or printed here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from mlflow.server import get_app_client

from pipelines.tracking.links import without_credentials
from trainlib.redaction import redact

EXPERIMENT, REGISTERED_MODEL = "experiment", "registered_model"  # MLflow's resource types
MEMBER = {EXPERIMENT: "EDIT", REGISTERED_MODEL: "READ"}
RELEASE = {EXPERIMENT: "EDIT", REGISTERED_MODEL: "MANAGE"}
RESERVED_DESCRIPTION = "Reserved by the team's admin (kedro team permissions): the release role registers its versions."


class PlanError(ValueError):
    """A plan that cannot be applied as written: a user in both roles, a user the server does not know."""


@dataclass(frozen=True)
class PermissionPlan:
    """Who gets what on which experiments and registered models (the module docstring)."""

    experiments: tuple[str, ...]
    registered_models: tuple[str, ...]
    members: tuple[str, ...] = ()
    release: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        both = sorted(set(self.members) & set(self.release))
        if both:
            # one permission per user and resource: MANAGE would silently win over EDIT and READ
            raise PlanError(f"{', '.join(both)} both in --members and --release: name each user in one role")

    def roles(self) -> dict[str, dict[str, str]]:
        """Each user's permission per resource type."""
        return {**{user: MEMBER for user in self.members}, **{user: RELEASE for user in self.release}}


@dataclass(frozen=True)
class Resource:
    kind: str  # EXPERIMENT or REGISTERED_MODEL
    key: str  # what MLflow's permissions name it by: an experiment's id, a registered model's name
    name: str

    def __str__(self) -> str:
        if self.kind == EXPERIMENT:
            return f"experiment {self.name!r} (id {self.key})"
        return f"registered model {self.name!r}"


def apply_plan(plan: PermissionPlan, tracking_uri: str) -> list[str]:
    """Apply ``plan`` on the server at ``tracking_uri``; one line per resource and per user's permission, saying
    what changed (``granted``, ``was READ``) or ``unchanged``."""
    if not tracking_uri.startswith(("http://", "https://")):
        # a local store (sqlite:///mlflow.db, mlruns) has no users: whoever can write its file can do anything
        raise PlanError(f"permissions need an MLflow server behind its login; {redact(tracking_uri)} is a local store")
    client, auth = MlflowClient(tracking_uri), get_app_client("basic-auth", tracking_uri=tracking_uri)
    _users_exist(auth, plan.roles(), tracking_uri)
    lines, resources = [], []
    for name in plan.experiments:
        resource, line = _experiment(client, name)
        resources.append(resource)
        lines.append(line)
    for name in plan.registered_models:
        resource, line = _registered_model(client, name)
        resources.append(resource)
        lines.append(line)
    for user, permissions in plan.roles().items():
        for resource in resources:
            lines.append(f"{user}: {_set_permission(auth, user, resource, permissions[resource.kind])}")
    return lines


def _users_exist(auth, users: Iterable[str], tracking_uri: str) -> None:
    for user in users:
        try:
            auth.get_user(user)
        except MlflowException as error:
            if error.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            # checked before any change, so a typo leaves the server as it was
            raise PlanError(
                f"user {user!r} does not exist on the MLflow server {without_credentials(tracking_uri)}: the admin "
                "creates it first (MLflow's users API, docs/team.md)"
            ) from error


def _experiment(client: MlflowClient, name: str) -> tuple[Resource, str]:
    found = client.get_experiment_by_name(name)
    if found is None:
        try:
            key = client.create_experiment(name)
            return Resource(EXPERIMENT, key, name), f"experiment {name!r} created (id {key})"
        except MlflowException as error:
            if error.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            found = client.get_experiment_by_name(name)  # a teammate's run created it meanwhile
    resource = Resource(EXPERIMENT, found.experiment_id, name)
    if found.lifecycle_stage == "deleted":
        # a deleted experiment keeps its name, and runs logged to it fail until it is restored
        client.restore_experiment(found.experiment_id)
        return resource, f"{resource} restored"
    return resource, f"{resource} exists"


def _registered_model(client: MlflowClient, name: str) -> tuple[Resource, str]:
    resource = Resource(REGISTERED_MODEL, name, name)
    try:
        client.get_registered_model(name)
    except MlflowException as error:
        if error.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
    else:
        # created before the plan by whoever registered first: that user keeps MANAGE on it unless named here
        return resource, f"{resource} exists"
    try:
        client.create_registered_model(name, description=RESERVED_DESCRIPTION)
    except MlflowException as error:
        if error.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return resource, f"{resource} exists"
    return resource, f"{resource} reserved"


def _set_permission(auth, user: str, resource: Resource, permission: str) -> str:
    """``user``'s own grant on ``resource`` set to ``permission``; what changed, in words."""
    before = auth.get_user_permission(user, resource.kind, resource.key).permission
    try:
        auth.grant_user_permission(user, resource.kind, resource.key, permission)
        outcome = f"{permission} on {resource}: granted (was {before})"
    except MlflowException as error:
        if error.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        if before == permission:
            return f"{permission} on {resource}: unchanged"
        # MLflow 3.17's public client grants (insert) and revokes, with no update: the user is without this grant
        # between the two requests, for milliseconds
        auth.revoke_user_permission(user, resource.kind, resource.key)
        auth.grant_user_permission(user, resource.kind, resource.key, permission)
        outcome = f"{permission} on {resource}: was {before}"
    after = auth.get_user_permission(user, resource.kind, resource.key).permission
    if after != permission:
        # MLflow folds the grants of all a user's roles (the highest wins, DENY over all): a role the admin gave
        # the user still decides, and the line says so rather than claiming the plan holds
        outcome += f", but the server resolves {after} (another role of the user's decides)"
    return outcome
