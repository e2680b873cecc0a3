#!/usr/bin/env bash
# Installs what the Node.js client tests need (tests/proxy/test_nodejs_client.py): Node.js and npm
# (Debian's packages, only when the machine has no `node`/`npm`: a Node.js that ships its own npm
# is not replaced), then the locked npm packages of DIR with `npm ci`.
# An npm registry that cannot be reached is the one failure that does not stop the build: the
# tests then skip with a message saying so. Any other npm failure does.
set -euo pipefail
dir=${1:?usage: ensure_node.sh DIR (the folder with package.json and package-lock.json)}
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  "$here/ensure_debs.sh" nodejs npm
fi
cd "$dir"
if npm ci --no-audit --no-fund --loglevel=error; then
  exit 0
fi
if ! npm ping >/dev/null 2>&1; then
  echo "ensure_node.sh: the npm registry cannot be reached; the Node.js client tests" \
    "(tests/proxy/test_nodejs_client.py) will be skipped" >&2
  exit 0
fi
echo "ensure_node.sh: npm ci failed in $dir (the registry answers): see above" >&2
exit 1
