"""Print (or check) the README's settings tables of every role, made from the settings classes.

`python scripts/settings_tables.py` prints them; `--check README.md` exits 1 if the README's
copy between the markers differs (tests/test_readme_settings.py runs it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from raftmq.broker import settings as broker_settings  # noqa: E402
from raftmq.common import tls  # noqa: E402
from raftmq.common.settings import settings_markdown  # noqa: E402
from raftmq.controller import settings as controller_settings  # noqa: E402
from raftmq.namesrv import settings as namesrv_settings  # noqa: E402
from raftmq.proxy import settings as proxy_settings  # noqa: E402

BEGIN = "<!-- settings-tables:begin (scripts/settings_tables.py) -->"
END = "<!-- settings-tables:end -->"


def tables() -> str:
    roles = [
        ("NameServer", "namesrv", namesrv_settings.NameServerSettings, namesrv_settings.ENV_PREFIX),
        ("Broker node", "broker", broker_settings.BrokerSettings, broker_settings.ENV_PREFIX),
        (
            "Controller",
            "controller",
            controller_settings.ControllerSettings,
            controller_settings.ENV_PREFIX,
        ),
        ("Proxy", "proxy", proxy_settings.ProxySettings, proxy_settings.ENV_PREFIX),
    ]
    parts = []
    for title, section, cls, prefix in roles:
        parts.append(
            f"### {title} (`[{section}]` in a `--config` file, `{prefix}<KEY>`, or `--<key>`)\n\n"
            + settings_markdown(cls, prefix)
        )
    parts.append(
        "### TLS of every role and of the `raftmq` command (`--tls-<key>`, "
        f"`{tls.ENV_PREFIX}<KEY>`; `cluster up` passes them from `[security.tls]`)\n\n"
        + settings_markdown(tls.TlsSettings, tls.ENV_PREFIX)
    )
    return "\n\n".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", type=Path, help="a README whose tables must match")
    args = ap.parse_args()
    text = f"{BEGIN}\n{tables()}\n{END}"
    if args.check is None:
        print(text)
        return 0
    readme = args.check.read_text()
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < 0 or readme[start : end + len(END)] != text:
        print(f"{args.check}: settings tables are stale; run python scripts/settings_tables.py")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
