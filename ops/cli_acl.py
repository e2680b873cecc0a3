"""`raftmq acl user create|list|delete|update` and `raftmq acl policy set|list|delete` (issue 19):
the users and policies the controllers replicate, through `Admin.acl`. Secrets are read from
`--secret-key` or the environment, never printed."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from rich.table import Table

from raftmq.client.admin import Admin
from raftmq.common.acl import PolicyEntry, parse_entries
from raftmq.common.auth import (
    ENV_ACCESS_KEY,
    ENV_ADMIN_ACCESS_KEY,
    ENV_ADMIN_SECRET_KEY,
    ENV_SECRET_KEY,
)
from raftmq.common.errors import InvalidArgumentError
from raftmq.ops.cluster_spec import ClusterSpec
from raftmq.ops.terminal_text import literal, make_console

console = make_console()
DEFAULT_CONTROLLERS = "127.0.0.1:9881,127.0.0.1:9882,127.0.0.1:9883"
ENV_USER_SECRET = "RAFTMQ_ACL_USER_SECRET"


def _admin(args: argparse.Namespace) -> Admin:
    return Admin(getattr(args, "namesrv", "127.0.0.1:9876"), controllers=args.controllers)


def _secret(args: argparse.Namespace) -> str:
    secret = args.user_secret or os.environ.get(ENV_USER_SECRET, "")
    if not secret:
        raise InvalidArgumentError(
            f"give the user's secret key: --user-secret or env {ENV_USER_SECRET}"
        )
    return str(secret)


def user_create(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        v = admin.acl.create_user(args.name, _secret(args), args.type)
    console.print(f"user {literal(args.name)} created ({args.type}); acl version {v}")
    return 0


def user_update(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        v = admin.acl.update_user(args.name, _secret(args), args.type)
    console.print(f"user {literal(args.name)} updated ({args.type}); acl version {v}")
    return 0


def user_delete(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        v = admin.acl.delete_user(args.name)
    console.print(f"user {literal(args.name)} deleted with its policy; acl version {v}")
    return 0


def user_list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        users = admin.acl.users()
    if args.json:
        print(json.dumps([{"name": u.name, "type": u.type} for u in users]))
        return 0
    t = Table(title="users")
    t.add_column("name (access key)")
    t.add_column("type")
    for u in users:
        t.add_row(literal(u.name), literal(u.type))
    console.print(t)
    return 0


def policy_set(args: argparse.Namespace) -> int:
    entries = _entries(args)
    with _admin(args) as admin:
        v = admin.acl.set_policy(args.subject, entries)
    console.print(f"policy of {literal(args.subject)}: {len(entries)} entries; acl version {v}")
    return 0


def policy_add(args: argparse.Namespace) -> int:
    """`acl policy add`: entries added to the user's policy, the others kept (what a denial's
    message proposes); `acl policy remove`: the given entries taken out."""
    entries = _entries(args)
    removing = args.acl_policy_command == "remove"
    with _admin(args) as admin:
        v, policy = admin.acl.add_to_policy(
            args.subject, remove=entries if removing else (), add=() if removing else entries
        )
    console.print(
        f"policy of {literal(args.subject)}: {len(policy)} entries; acl version {v}",
        highlight=False,
    )
    return 0


def _entries(args: argparse.Namespace) -> tuple[PolicyEntry, ...]:
    entries = parse_entries(args.allow or (), "Allow") + parse_entries(args.deny or (), "Deny")
    if not entries:
        raise InvalidArgumentError(
            "give at least one entry: RESOURCE=ACTIONS, e.g. Topic:orders*=Pub "
            "(--deny RESOURCE=ACTIONS for a Deny)"
        )
    return entries


def policy_delete(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        v = admin.acl.delete_policy(args.subject)
    console.print(f"policy of {literal(args.subject)} deleted; acl version {v}")
    return 0


def policy_list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        policies = admin.acl.policies()
    if args.subject:
        policies = {s: es for s, es in policies.items() if s == args.subject}
    if args.json:
        print(json.dumps({s: [e.to_dict() for e in es] for s, es in policies.items()}))
        return 0
    t = Table(title="policies")
    for col in ("subject", "resource", "actions", "decision"):
        t.add_column(col)
    for subject, entries in policies.items():
        for e in entries:
            t.add_row(
                literal(subject),
                literal(str(e.resource)),
                literal(",".join(sorted(a.value for a in e.actions))),
                literal(e.decision.value),
            )
    console.print(t)
    return 0


OPEN_CLUSTER = (
    "auth is off: anyone who reaches a port can produce, consume, reset offsets, delete topics "
    "and move leaders; turn on [security.auth] (see deploy/secure.toml)"
)


def prepare_cluster_auth(spec: ClusterSpec) -> str | None:
    """For `raftmq cluster up`: the warning line of an open cluster, or, when auth is on, make
    this process's own calls (health checks) sign with the admin's keys unless the user gave
    credentials (RAFTMQ_ACCESS_KEY / RAFTMQ_SECRET_KEY)."""
    if not spec.auth.get("auth_enabled"):
        return OPEN_CLUSTER
    ak = spec.auth.get("auth_admin_access_key") or os.environ.get(ENV_ADMIN_ACCESS_KEY, "")
    sk = spec.auth.get("auth_admin_secret_key") or os.environ.get(ENV_ADMIN_SECRET_KEY, "")
    if ak and sk and not os.environ.get(ENV_ACCESS_KEY):
        os.environ[ENV_ACCESS_KEY], os.environ[ENV_SECRET_KEY] = str(ak), str(sk)
    return None


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    acl = subparsers.add_parser(
        "acl", help="users and policies (access keys, Allow/Deny on topics and groups)"
    )
    acl.add_argument(
        "--controllers",
        default=os.environ.get("RAFTMQ_CONTROLLERS", DEFAULT_CONTROLLERS),
        help="controller addresses as host:port, separated by ',' or ';' (env RAFTMQ_CONTROLLERS)",
    )
    what = acl.add_subparsers(dest="acl_command", required=True)
    user = what.add_parser("user", help="users: an access key and a secret key each")
    us = user.add_subparsers(dest="acl_user_command", required=True)
    for name, fn, text in (
        ("create", user_create, "add a user"),
        ("update", user_update, "change a user's secret key or type"),
    ):
        p = us.add_parser(name, help=text)
        p.add_argument("name", help="the user's name, its access key")
        p.add_argument(
            "--user-secret", default="", help=f"the user's secret key (or env {ENV_USER_SECRET})"
        )
        p.add_argument("--type", default="Normal", choices=("Normal", "Super"))
        p.set_defaults(func=fn)
    p = us.add_parser("delete", help="remove a user and its policy")
    p.add_argument("name")
    p.set_defaults(func=user_delete)
    p = us.add_parser("list", help="the users (never their secrets)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=user_list)

    policy = what.add_parser("policy", help="what a user may do: Allow/Deny entries")
    ps = policy.add_subparsers(dest="acl_policy_command", required=True)
    for name, fn, text in (
        (
            "set",
            policy_set,
            "replace a user's whole policy, e.g. `raftmq acl policy set alice Topic:orders*=Pub "
            "--deny Topic:orders-secret=Pub`",
        ),
        ("add", policy_add, "add entries to a user's policy, keeping the others"),
        ("remove", policy_add, "remove these entries from a user's policy, keeping the others"),
    ):
        p = ps.add_parser(name, help=text)
        p.add_argument("subject", help="the user")
        p.add_argument(
            "allow",
            nargs="*",
            help="Allow entries RESOURCE=ACTIONS: resources Topic:NAME, Topic:PREFIX*, "
            "Group:NAME, Cluster:*, *; actions Pub, Sub, Create, Update, Delete, Get, List, All",
        )
        p.add_argument("--deny", action="append", help="a Deny entry RESOURCE=ACTIONS (repeatable)")
        p.set_defaults(func=fn)
    p = ps.add_parser("delete", help="remove a user's policy (it may then do nothing)")
    p.add_argument("subject")
    p.set_defaults(func=policy_delete)
    p = ps.add_parser("list", help="every policy, or one user's")
    p.add_argument("subject", nargs="?", default="")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=policy_list)
