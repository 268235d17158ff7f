#!/bin/bash
# ansible/tests/venv.sh - sourced by run.sh and v2.sh: the Python venv with ansible-core and
# ansible-lint (tests/requirements.txt) in $VENV (default /var/tmp/shoal-ansible-venv),
# made on first use and reused while it matches the requirements; puts it first on PATH.
VENV=${SHOAL_ANSIBLE_VENV:-/var/tmp/shoal-ansible-venv}
shoal_ansible_venv() {
  local req py=/usr/bin/python3
  req=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/requirements.txt
  if ! cmp -s "$req" "$VENV/.shoal-requirements.txt"; then
    [ -x $py ] || py=$(command -v python3)
    if ! $py -c 'import ensurepip' 2>/dev/null; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    fi
    rm -rf "$VENV"
    $py -m venv "$VENV"
    timeout 600 "$VENV/bin/pip" install -q --disable-pip-version-check -r "$req"
    cp "$req" "$VENV/.shoal-requirements.txt"
  fi
  export PATH=$VENV/bin:$PATH
}
